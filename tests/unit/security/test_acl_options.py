"""Spark options and SDK arguments carry ACL credentials (issue 23), and never show the secret."""

from __future__ import annotations

import os
import pickle

import pytest

pytest.importorskip("pyspark")

from ferrymq.client.credentials import with_credentials
from ferrymq.config import build_config
from ferrymq.connect.config import WorkerConfig
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import (
    export_credentials,
    install_credentials,
    process_credentials,
)
from ferrymq.spark.options import OptionError, parse_read_options, parse_write_options

KEYS = {"accessKey": "spark-user", "secretKey": "spark-secret-1"}


def test_read_and_write_options_take_access_and_secret_keys() -> None:
    read = parse_read_options({"servers": "127.0.0.1:1", "subscribe": "t", **KEYS}, streaming=False)
    write = parse_write_options({"servers": "127.0.0.1:1", "topic": "t", **KEYS})
    for options in (read, write):
        assert options.credentials == Credentials("spark-user", "spark-secret-1")
        assert "spark-secret-1" not in repr(options)
        assert pickle.loads(pickle.dumps(options)) == options  # shipped to executors
    assert parse_write_options({"servers": "127.0.0.1:1"}).credentials is None
    with pytest.raises(OptionError, match="accessKey"):
        parse_write_options({"servers": "127.0.0.1:1", "accessKey": "spark-user"})


async def test_sdk_clients_sign_with_keys_or_credentials_but_not_both() -> None:
    rpc = with_credentials(None, None, None, Credentials("ak-1234567", "sk-1234567"))
    assert rpc.credentials == Credentials("ak-1234567", "sk-1234567")
    await rpc.close()
    with pytest.raises(ValueError, match="not both"):
        with_credentials(None, "ak-1234567", "sk-1234567", Credentials("a-1234567", "b-1234567"))
    with pytest.raises(ValueError, match="both access_key and secret_key"):
        with_credentials(None, "ak-1234567", None)


def test_process_credentials_come_from_the_environment_and_connect_keys_hide_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FERRY_ACCESS_KEY", raising=False)
    monkeypatch.delenv("FERRY_SECRET_KEY", raising=False)
    install_credentials(None)
    assert process_credentials() is None
    monkeypatch.setenv("FERRY_ACCESS_KEY", "env-user")
    assert process_credentials() is None  # one key alone signs nothing
    monkeypatch.setenv("FERRY_SECRET_KEY", "env-secret-1")
    assert process_credentials() == Credentials("env-user", "env-secret-1")
    config, ignored = build_config(
        WorkerConfig, {"namesrvAddr": "127.0.0.1:1", "accessKey": "w-user", "secretKey": "w-sk-1"}
    )
    assert not ignored
    assert "w-sk-1" not in repr(config)
    try:
        export_credentials(Credentials(config.access_key, config.secret_key))
        assert process_credentials() == Credentials("w-user", "w-sk-1")
        assert os.environ["FERRY_SECRET_KEY"] == "w-sk-1"  # for the Spark executors it starts
    finally:
        install_credentials(None)
