"""Server configuration from RocketMQ-style `key=value` files and flags.

A server's config is one frozen dataclass whose field names are the snake_case of RocketMQ's keys
(`brokerClusterName` -> `broker_cluster_name`), in RocketMQ's units (`*Millis` stay
milliseconds; the server converts them to seconds where it uses them). `build_config` turns
string values into field types and names the key of any value it cannot convert; keys the
dataclass does not have are returned so the server can log them once as ignored (a RocketMQ
`broker.conf` must start).
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ferrymq.errors import FerryError

__all__ = ["ConfigError", "build_config", "config_keys", "parse_properties", "rocketmq_key"]

C = TypeVar("C")

_SPECIAL_KEYS = {"broker_ip1": "brokerIP1", "broker_ip2": "brokerIP2"}


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


def config_keys(config_type: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    """RocketMQ key -> dataclass field, for every field of a config class."""
    return {rocketmq_key(f.name): f for f in dataclasses.fields(config_type)}


def parse_properties(text: str, source: str = "config") -> dict[str, str]:
    """Parse `java.util.Properties` text: `key=value` or `key: value`, `#`/`!` comments.

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
                values[line] = ""
                continue
            raise ConfigError(f"{source}:{number}", f"cannot parse {raw!r}")
        values[match.group(1)] = match.group(2).strip()
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
        ConfigError: a value does not convert; the message names the key.
    """
    fields = config_keys(config_type)
    hints = typing.get_type_hints(config_type)
    kwargs: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in values.items():
        found = fields.get(key)
        if found is None:
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
