r"""Small value types and naming rules every layer shares.

Names that arrive from the network (topics, consumer groups) become directory names in the store,
so they are validated here, once, against RocketMQ's rules (`TopicValidator`): the characters
`[%|a-zA-Z0-9_-]`, not empty, at most 127 bytes for a topic and 255 for a group. The charset
excludes `.`, `/` and `\\`, so a valid name can never be `.`, `..` or contain a path separator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ferrymq.errors import InvalidNameError

__all__ = [
    "GROUP_MAX_LENGTH",
    "TOPIC_MAX_LENGTH",
    "MessageQueue",
    "format_address",
    "parse_address",
    "validate_group",
    "validate_topic",
]

TOPIC_MAX_LENGTH: Final = 127
"""RocketMQ's default topic length limit; longer topics need the V2 record magic."""

GROUP_MAX_LENGTH: Final = 255

_NAME_CHARS: Final = re.compile(r"[%|a-zA-Z0-9_-]+")


def _validate(kind: str, name: str, max_length: int) -> str:
    if not name:
        raise InvalidNameError(kind, name, "must not be empty")
    if len(name) > max_length:
        raise InvalidNameError(kind, name, f"longer than {max_length} characters")
    if _NAME_CHARS.fullmatch(name) is None:
        raise InvalidNameError(kind, name, "only letters, digits and %|_- are allowed")
    return name


def validate_topic(name: str, max_length: int = TOPIC_MAX_LENGTH) -> str:
    """Return `name` if it is a legal topic name, else raise `InvalidNameError`."""
    return _validate("topic", name, max_length)


def validate_group(name: str) -> str:
    """Return `name` if it is a legal consumer or producer group name."""
    return _validate("group", name, GROUP_MAX_LENGTH)


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker group (RocketMQ `MessageQueue`)."""

    topic: str
    broker_name: str
    queue_id: int


def parse_address(address: str) -> tuple[str, int]:
    """Split `host:port` (or `[v6]:port`) into host and port.

    Raises:
        ValueError: the address has no port or the port is not in 0..65535.
    """
    host, sep, port_text = address.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"address {address!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """`host:port`, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
