"""Broker settings that reach the store: `warmMapedFileEnable` with each flush type."""

import pytest

from ferrymq.broker.config import BrokerConfig
from ferrymq.config import ConfigError, build_config, parse_properties


def _store_warm(conf: str) -> bool:
    config, ignored = build_config(BrokerConfig, parse_properties(conf))
    assert ignored == []
    return config.store_config().warm_segments


def test_sync_flush_warms_segments_by_default() -> None:
    assert _store_warm("flushDiskType=SYNC_FLUSH\n")


def test_warm_mapped_files_can_be_turned_off() -> None:
    assert not _store_warm("flushDiskType=SYNC_FLUSH\nwarmMapedFileEnable=false\n")


def test_async_flush_never_warms_segments() -> None:
    assert not _store_warm("flushDiskType=ASYNC_FLUSH\nwarmMapedFileEnable=true\n")
    assert not _store_warm("")


def test_a_bad_warm_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="warmMapedFileEnable"):
        build_config(BrokerConfig, {"warmMapedFileEnable": "sometimes"})
