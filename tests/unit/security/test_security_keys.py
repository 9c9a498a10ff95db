"""Security keys fail closed (issue 23): every key, every server's config class."""

from __future__ import annotations

from typing import Any

import pytest

from ferrymq.broker.config import BrokerConfig
from ferrymq.config import SECURITY_KEYS, ConfigError, build_config, config_keys
from ferrymq.connect.config import WorkerConfig
from ferrymq.controller.config import ControllerConfig
from ferrymq.namesrv.server import NamesrvConfig
from ferrymq.security.acl2guard import Acl2Config

CONFIGS: list[type[Any]] = [
    BrokerConfig,
    NamesrvConfig,
    ControllerConfig,
    Acl2Config,  # a controller's ACL 2.0 keys (`ferry controller --config`)
    WorkerConfig,
]

ON_VALUES = {
    "tls.server.mode": "enforcing",
    "tls.server.need.client.auth": "require",
}
OFF_VALUES = {
    "tls.server.mode": "disabled",
    "tls.server.need.client.auth": "none",
}


def _on(key: str) -> str:
    if key in ON_VALUES:
        return ON_VALUES[key]
    return "true" if SECURITY_KEYS[key]("true") and not SECURITY_KEYS[key]("false") else "x.pem"


@pytest.mark.parametrize("config_type", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("key", sorted(SECURITY_KEYS))
def test_a_security_key_turned_on_without_its_feature_refuses_the_config(
    config_type: type[Any], key: str
) -> None:
    if key in config_keys(config_type):  # honoured: a field of the config, so no longer refused
        _, ignored = build_config(config_type, {key: _on(key)})
        assert key not in ignored
        return
    with pytest.raises(ConfigError, match="refusing to start") as caught:
        build_config(config_type, {key: _on(key)})
    assert caught.value.key == key


@pytest.mark.parametrize("key", sorted(SECURITY_KEYS))
def test_a_security_key_left_off_is_only_ignored(key: str) -> None:
    off = OFF_VALUES.get(key, "" if SECURITY_KEYS[key]("false") else "false")
    _, ignored = build_config(BrokerConfig, {key: off})
    assert ignored == ([] if key in config_keys(BrokerConfig) else [key])


@pytest.mark.parametrize(
    "key",
    sorted(k for k in SECURITY_KEYS if any(p in k.lower() for p in ("password", "credential"))),
)
def test_a_refused_secret_is_not_echoed(key: str) -> None:
    secret = "s3cr3t-never-shown"
    refusing = [c for c in CONFIGS if key not in config_keys(c)]
    assert refusing, f"every config honours {key}: nothing refuses it"
    for config_type in refusing:
        with pytest.raises(ConfigError, match="refusing to start") as caught:
            build_config(config_type, {key: secret})
        assert secret not in str(caught.value)
