"""Server configuration from RocketMQ-style `key=value` files and flags.

A server's config is one frozen dataclass whose field names are the snake_case of RocketMQ's keys
(`brokerClusterName` -> `broker_cluster_name`), in RocketMQ's units (`*Millis` stay
milliseconds; the server converts them to seconds where it uses them). `build_config` turns
string values into field types and names the key of any value it cannot convert; keys the
dataclass does not have are returned so the server can log them once as ignored (a RocketMQ
`broker.conf` must start).

Security keys fail closed (issue 23): a RocketMQ security key (`SECURITY_KEYS`) that the config
class does not have, set to a value that would turn security on, is a `ConfigError` naming the key,
never an ignored key. A key moves from refused to honoured by becoming a field of the server's
config class.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from ferrymq.errors import FerryError

__all__ = [
    "SECURITY_KEYS",
    "ConfigError",
    "build_config",
    "config_keys",
    "parse_properties",
    "rocketmq_key",
]

C = TypeVar("C")

_SPECIAL_KEYS = {
    "broker_ip1": "brokerIP1",
    "broker_ip2": "brokerIP2",
    "transaction_timeout": "transactionTimeOut",
}

KEY_ALIASES: Final = {"transactionTimeout": "transactionTimeOut"}
"""Spellings ferrymq took before it used RocketMQ's own: still read, as the RocketMQ key."""


def _is_true(value: str) -> bool:
    return value.strip().lower() == "true"


def _is_set(value: str) -> bool:
    return value.strip() != ""


def _is_not(off: str) -> typing.Callable[[str], bool]:
    return lambda value: value.strip().lower() not in ("", off)


SECURITY_KEYS: Final[Mapping[str, typing.Callable[[str], bool]]] = types.MappingProxyType(
    {
        # ACL 1.0 (BrokerConfig.aclEnable), RocketMQ Connect's worker key of the same name
        "aclEnable": _is_true,
        # ACL 2.0 (auth/config/AuthConfig.java), on broker, NameServer, controller and proxy;
        # honoured on brokers (BrokerConfig fields): authenticationEnabled,
        # authorizationEnabled, initAuthenticationUser, the two whitelists and
        # innerClientAuthenticationCredentials; NameServers (NamesrvConfig) all but the
        # last; standalone controllers all six (security.acl2guard.Acl2Config)
        "authenticationEnabled": _is_true,
        "authorizationEnabled": _is_true,
        "migrateAuthFromV1Enabled": _is_true,
        "authConfigPath": _is_set,
        "authenticationProvider": _is_set,
        "authenticationMetadataProvider": _is_set,
        "authenticationStrategy": _is_set,
        "authenticationWhitelist": _is_set,
        "initAuthenticationUser": _is_set,
        "innerClientAuthenticationCredentials": _is_set,
        "authorizationProvider": _is_set,
        "authorizationMetadataProvider": _is_set,
        "authorizationStrategy": _is_set,
        "authorizationWhitelist": _is_set,
        # proxy (ProxyConfig.java): internal calls signed, TLS
        "enableAclRpcHookForClusterMode": _is_true,
        "enableAclRpcHookForClusterInternal": _is_true,
        "tlsTestModeEnable": _is_true,
        "tlsKeyPath": _is_set,
        "tlsCertPath": _is_set,
        # TLS (remoting/netty/TlsSystemConfig.java, NettyClientConfig.useTLS)
        "tlsEnable": _is_true,
        "useTLS": _is_true,
        "tls.enable": _is_true,
        "tls.test.mode.enable": _is_true,
        "tls.server.mode": _is_not("disabled"),
        "tls.config.file": _is_set,
        "tls.server.need.client.auth": _is_not("none"),
        "tls.server.keyPath": _is_set,
        "tls.server.keyPassword": _is_set,
        "tls.server.certPath": _is_set,
        "tls.server.authClient": _is_true,
        "tls.server.trustCertPath": _is_set,
        "tls.client.keyPath": _is_set,
        "tls.client.keyPassword": _is_set,
        "tls.client.certPath": _is_set,
        "tls.client.authServer": _is_true,
        "tls.client.trustCertPath": _is_set,
    }
)
"""RocketMQ's security keys -> whether a value turns that security on."""


class ConfigError(FerryError, ValueError):
    """A configuration value is unusable; the message names the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config {key}: {reason}")
        self.key = key
        self.reason = reason


def rocketmq_key(field_name: str) -> str:
    """The RocketMQ key of a config field: `listen_port` -> `listenPort`."""
    if field_name in _SPECIAL_KEYS:
        return _SPECIAL_KEYS[field_name]
    head, *rest = field_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


_SECRET_KEY_PARTS: Final = ("password", "credential", "secret", "authenticationuser")


def _is_secret_key(key: str) -> bool:
    """Whether `key`'s value may hold a secret (a password, credentials): never echoed."""
    return any(part in key.lower() for part in _SECRET_KEY_PARTS)


def config_keys(config_type: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    """RocketMQ key -> dataclass field, for every field of a config class."""
    return {rocketmq_key(f.name): f for f in dataclasses.fields(config_type)}


def properties_text(config: object) -> str:
    """Every key of a config dataclass as sorted `key=value` lines (`MixAll.properties2String`).

    A field declared `repr=False` is a secret (initAuthenticationUser,
    innerClientAuthenticationCredentials): a set value shows as `******`, never in clear.
    """
    lines = []
    for key, found in sorted(config_keys(type(config)).items()):
        value = getattr(config, found.name)
        text = "" if value is None else getattr(value, "value", value)
        if not found.repr and text:
            text = "******"
        if isinstance(text, bool):
            text = "true" if text else "false"
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def parse_properties(text: str, source: str = "config") -> dict[str, str]:
    """Parse `java.util.Properties` text: `key=value` or `key: value`, `#`/`!` comments.

    A key of `KEY_ALIASES` is read as the RocketMQ key it stands for.

    Raises:
        ConfigError: a non-comment line has no key.
    """
    values: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            if re.fullmatch(r"[^=:\s]+", line):
                values[KEY_ALIASES.get(line, line)] = ""
                continue
            raise ConfigError(f"{source}:{number}", f"cannot parse {raw!r}")
        key = match.group(1)
        values[KEY_ALIASES.get(key, key)] = match.group(2).strip()
    return values


def _convert(key: str, value: str, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value == "" and len(options) < len(typing.get_args(annotation)):
            return None
        return _convert(key, value, options[0])
    if annotation is bool:
        lowered = value.lower()
        if lowered not in ("true", "false"):
            raise ConfigError(key, f"expected true or false, not {value!r}")
        return lowered == "true"
    if annotation is int:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(key, f"expected an integer, not {value!r}") from None
    if annotation is float:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(key, f"expected a number, not {value!r}") from None
    if annotation is Path:
        return Path(value).expanduser()
    if annotation is str:
        return value
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        for member in annotation:
            if value.upper() in (member.name, str(member.value).upper()):
                return member
        allowed = ", ".join(m.name for m in annotation)
        raise ConfigError(key, f"expected one of {allowed}, not {value!r}")
    raise ConfigError(key, f"unsupported type {annotation!r}")


def build_config(
    config_type: type[C], values: Mapping[str, str], **overrides: Any
) -> tuple[C, list[str]]:
    """Make a config from RocketMQ-keyed strings, then typed `overrides` (by field name).

    Returns the config and the keys it ignored.

    Raises:
        ConfigError: a value does not convert, or a security key this config does not honour
            would turn security on; the message names the key.
    """
    fields = config_keys(config_type)
    hints = typing.get_type_hints(config_type)
    kwargs: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in values.items():
        found = fields.get(key)
        if found is None:
            turns_on = SECURITY_KEYS.get(key)
            if turns_on is not None and turns_on(value):
                shown = "its value" if _is_secret_key(key) else repr(value)
                raise ConfigError(
                    key,
                    f"{shown} turns on security that ferrymq does not implement here yet; "
                    "refusing to start rather than serve without it",
                )
            ignored.append(key)
            continue
        kwargs[found.name] = _convert(key, value, hints[found.name])
    kwargs.update({name: value for name, value in overrides.items() if value is not None})
    try:
        config = config_type(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("config", str(exc)) from None
    return config, sorted(ignored)
