"""Broker settings that reach the store: how commit-log segments are made with each flush type."""

import pytest

from ferrymq.broker.config import BrokerConfig
from ferrymq.config import ConfigError, build_config, parse_properties
from ferrymq.store.config import SegmentFill


def _segment_fill(conf: str) -> SegmentFill:
    config, ignored = build_config(BrokerConfig, parse_properties(conf))
    assert ignored == []
    return config.store_config().segment_fill


def test_sync_flush_zero_fills_segments_by_default() -> None:
    assert _segment_fill("flushDiskType=SYNC_FLUSH\n") is SegmentFill.ZEROED


def test_warm_mapped_files_off_leaves_segments_allocated() -> None:
    conf = "flushDiskType=SYNC_FLUSH\nwarmMapedFileEnable=false\n"
    assert _segment_fill(conf) is SegmentFill.ALLOCATED


def test_async_flush_allocates_segments_and_never_zero_fills_them() -> None:
    assert _segment_fill("flushDiskType=ASYNC_FLUSH\nwarmMapedFileEnable=true\n") is (
        SegmentFill.ALLOCATED
    )
    assert _segment_fill("") is SegmentFill.ALLOCATED


def test_preallocation_off_leaves_segments_sparse() -> None:
    assert _segment_fill("preallocateCommitLog=false\n") is SegmentFill.SPARSE
    conf = "flushDiskType=SYNC_FLUSH\nwarmMapedFileEnable=false\npreallocateCommitLog=false\n"
    assert _segment_fill(conf) is SegmentFill.SPARSE


@pytest.mark.parametrize("key", ["warmMapedFileEnable", "preallocateCommitLog"])
def test_a_bad_boolean_names_the_key(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build_config(BrokerConfig, {key: "sometimes"})


def test_acl2_with_the_in_process_endpoint_is_refused() -> None:
    """The endpoint signs what it forwards with the broker's own (admin) credentials and checks
    its clients' ACL 1.0 credentials (the broker's aclFile), and ACL 2.0 users only in controller
    mode (the controllers give out their passwords): elsewhere authenticationEnabled is refused."""
    config, _ = build_config(
        BrokerConfig, {"aclEnable": "true", "aclFile": "/x", "enableProxy": "true"}
    )
    assert config.enable_proxy
    with pytest.raises(ConfigError, match="authenticationEnabled=true"):
        build_config(BrokerConfig, {"authenticationEnabled": "true", "enableProxy": "true"})
    config, _ = build_config(  # in controller mode it checks the controllers' users
        BrokerConfig,
        {
            "authenticationEnabled": "true",
            "enableProxy": "true",
            "enableControllerMode": "true",
            "controllerAddr": "127.0.0.1:9878",
        },
    )
    assert config.enable_proxy
    config, _ = build_config(BrokerConfig, {"aclEnable": "true", "aclFile": "/x"})
    assert config.acl_enable
    assert not config.enable_proxy


@pytest.mark.parametrize("key", ["transactionTimeOut", "transactionTimeout"])
def test_the_transaction_timeout_reads_rocketmqs_key_and_ferrymqs_old_spelling(key: str) -> None:
    config, ignored = build_config(BrokerConfig, parse_properties(f"{key}=1500\n"))
    assert (config.transaction_timeout, ignored) == (1500, [])
