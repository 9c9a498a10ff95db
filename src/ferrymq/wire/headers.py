"""Typed custom headers, mapped to and from a command's string `extFields`.

Java flattens a custom header into `extFields` by calling `toString()` on every non-null field, and
parses the strings back into the field types on the other side. `CommandHeader` subclasses are
msgspec structs whose encode names are RocketMQ's field names; `to_ext_fields` and `from_ext_fields`
do the two directions. A missing or mistyped field raises `HeaderFieldError` naming the header
and the field, so a server can answer with a clear remark.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Final, TypeVar

import msgspec

from ferrymq.errors import HeaderFieldError

__all__ = ["I32", "I64", "CommandHeader", "from_ext_fields", "to_ext_fields"]

I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
"""A Java `int` field."""

I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""A Java `long` field."""


class CommandHeader(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=False):
    """Base of every custom header; fields are snake_case, wire names camelCase."""


H = TypeVar("H", bound=CommandHeader)

_FIELD_AT: Final = re.compile(r"at `\$\.([^`\[]+)")
_MISSING: Final = re.compile(r"missing required field `([^`]+)`")


def _to_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


@functools.cache
def _wire_names(header_type: type[CommandHeader]) -> tuple[tuple[str, str], ...]:
    """(attribute, wire name) of each field; computed once per class (it evaluates annotations)."""
    return tuple((info.name, info.encode_name) for info in msgspec.structs.fields(header_type))


def to_ext_fields(header: CommandHeader) -> dict[str, str]:
    """Flatten `header` into `extFields`: every non-None field as the string Java would send."""
    ext: dict[str, str] = {}
    for name, wire_name in _wire_names(type(header)):
        value = getattr(header, name)
        if value is not None:
            ext[wire_name] = value if type(value) is str else _to_str(value)
    return ext


def from_ext_fields(header_type: type[H], ext_fields: dict[str, str]) -> H:
    """Parse `extFields` into `header_type`, raising `HeaderFieldError` naming a bad field."""
    try:
        return msgspec.convert(ext_fields, header_type, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _FIELD_AT.search(message) or _MISSING.search(message)
        field = found.group(1) if found else "?"
        reason = message.split(" - at ")[0]
        raise HeaderFieldError(header_type.__name__, field, reason) from None
