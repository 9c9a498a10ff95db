"""RocketMQ remoting frames: the command type, both header serializations, and the decoder.

Spec: reference/rocketmq-controller-spec.md section 6 (`RemotingCommand`, `RocketMQSerializable`).

```
int32 total_length        = 4 + header_length + body_length (not counting itself)
int32 type_and_length     = serialize_type << 24 | header_length
bytes header[header_length]    JSON (type 0) or ROCKETMQ binary (type 1)
bytes body[...]                the rest of the frame
```

Rules:
1. Sans-IO: bytes in, `RemotingCommand`s out; no sockets, no clock.
2. Every malformed input raises `ProtocolError` (or its subclass `FrameTooLargeError`), and the
   decoder that raised refuses further input: the caller closes that connection.
3. `ext_fields` are strings, as in Java. A JSON header may carry numbers or booleans there (the
   C++ client sends `"flag": 0`); they are turned into the strings Java's `toString` would give.
4. A response goes back in the serialize type its request came in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import msgspec

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.wire.codes import LanguageCode, SerializeType

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "ROCKETMQ_VERSION",
    "FrameDecoder",
    "RemotingCommand",
    "decode_frame",
    "encode_frame",
    "encode_frame_parts",
]

DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
"""RocketMQ's default `com.rocketmq.remoting.frameMaxLength`."""

ROCKETMQ_VERSION: Final = 479
"""The `version` ferrymq puts in its headers: RocketMQ 5.3.3's `MQVersion` ordinal."""

FLAG_RESPONSE: Final = 1
"""Flag bit 0 (`RPC_TYPE`): the command is a response."""

FLAG_ONEWAY: Final = 2
"""Flag bit 1 (`RPC_ONEWAY`): the request expects no response."""

_PREFIX: Final = struct.Struct(">iI")
_BINARY_FIXED: Final = struct.Struct(">hbhii")
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_MAX_HEADER_LENGTH: Final = 0xFFFFFF


@dataclass(slots=True)
class RemotingCommand:
    """One remoting request or response (RocketMQ `RemotingCommand`)."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: LanguageCode = LanguageCode.PYTHON
    version: int = ROCKETMQ_VERSION
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        """Whether this command answers a request."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """Whether this request expects no response."""
        return bool(self.flag & FLAG_ONEWAY)

    def make_response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """Build the response to this request: same opaque and serialize type, response flag."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=ext_fields if ext_fields is not None else {},
            body=body,
            serialize_type=self.serialize_type,
        )


class _JsonHeaderOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON header as FastJSON writes it: keys in alphabetical order, nulls left out."""

    code: int
    extFields: dict[str, str] | None = None  # noqa: N815 - RocketMQ's wire name
    flag: int
    language: str
    opaque: int
    remark: str | None = None
    serializeTypeCurrentRPC: str  # noqa: N815 - RocketMQ's wire name
    version: int


_ExtValue = str | int | float | bool | None
_V = TypeVar("_V")


class _JsonHeaderIn(msgspec.Struct, Generic[_V]):
    """The JSON header as any client may send it; unknown keys are ignored.

    `_JsonHeaderIn[str]` decodes headers whose extFields are all strings (Java's and ferrymq's)
    with no conversion pass; `_JsonHeaderIn[_ExtValue]` takes numbers, booleans and nulls too.
    """

    code: int
    extFields: dict[str, _V] | None = None  # noqa: N815 - RocketMQ's wire name
    flag: int = 0
    language: str = "JAVA"
    opaque: int = 0
    remark: str | None = None
    version: int = 0


_LANGUAGES: Final = {language.name: language for language in LanguageCode}
"""A JSON header's language name -> code (a dict lookup; `LanguageCode[name]` is slower)."""
_json_encoder: Final = msgspec.json.Encoder()
_json_decoder: Final = msgspec.json.Decoder(_JsonHeaderIn[_ExtValue])
_string_json_decoder: Final = msgspec.json.Decoder(_JsonHeaderIn[str])


def _ext_value_to_str(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    return _json_encoder.encode(
        _JsonHeaderOut(
            code=cmd.code,
            extFields=cmd.ext_fields or None,
            flag=cmd.flag,
            language=cmd.language.name,
            opaque=cmd.opaque,
            remark=cmd.remark,
            serializeTypeCurrentRPC="JSON",
            version=cmd.version,
        )
    )


def _decode_json_header(header: bytes, body: bytes) -> RemotingCommand:
    raw: _JsonHeaderIn[str] | _JsonHeaderIn[_ExtValue]
    try:
        raw = _string_json_decoder.decode(header)
        ext_fields = raw.extFields or {}
    except (msgspec.DecodeError, UnicodeDecodeError):
        # numbers, booleans or nulls among extFields (or a bad header): the lenient decoder
        # converts values or raises the error to report
        try:
            raw = _json_decoder.decode(header)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError is one too
            raise ProtocolError(f"bad JSON remoting header: {exc}") from None
        ext_fields = (
            {k: _ext_value_to_str(v) for k, v in raw.extFields.items() if v is not None}
            if raw.extFields
            else {}
        )
    language = _LANGUAGES.get(raw.language)
    if language is None:
        raise ProtocolError(f"bad JSON remoting header: unknown language {raw.language!r}")
    # positional: keyword arguments cost a microsecond more, on every frame
    return RemotingCommand(
        raw.code,
        raw.opaque,
        raw.flag,
        raw.remark,
        ext_fields,
        body,
        language,
        raw.version,
        SerializeType.JSON,
    )


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    parts = [_BINARY_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag)]
    remark = cmd.remark.encode() if cmd.remark else b""
    parts += (_I32.pack(len(remark)), remark)
    fields: list[bytes] = []
    for key, value in cmd.ext_fields.items():
        key_bytes, value_bytes = key.encode(), value.encode()
        fields += (_I16.pack(len(key_bytes)), key_bytes, _I32.pack(len(value_bytes)), value_bytes)
    ext = b"".join(fields)
    parts += (_I32.pack(len(ext)), ext)
    return b"".join(parts)


def _take(view: memoryview, pos: int, length: int, what: str) -> bytes:
    if length < 0 or pos + length > len(view):
        raise ProtocolError(f"bad ROCKETMQ remoting header: {what} runs past the header")
    return bytes(view[pos : pos + length])


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"bad ROCKETMQ remoting header: {what} is not UTF-8") from None


def _decode_binary_header(header: bytes, body: bytes) -> RemotingCommand:
    view = memoryview(header)
    if len(view) < _BINARY_FIXED.size + 8:
        raise ProtocolError(f"bad ROCKETMQ remoting header: {len(view)} bytes is too short")
    code, language_code, version, opaque, flag = _BINARY_FIXED.unpack_from(view, 0)
    try:
        language = LanguageCode(language_code)
    except ValueError:
        raise ProtocolError(f"bad ROCKETMQ remoting header: language {language_code}") from None
    pos = _BINARY_FIXED.size
    (remark_length,) = _I32.unpack_from(view, pos)
    pos += 4
    remark = _utf8(_take(view, pos, remark_length, "remark"), "remark") if remark_length else None
    pos += remark_length
    if pos + 4 > len(view):
        raise ProtocolError("bad ROCKETMQ remoting header: extFields length missing")
    (ext_length,) = _I32.unpack_from(view, pos)
    pos += 4
    ext = memoryview(_take(view, pos, ext_length, "extFields"))
    if pos + ext_length != len(view):
        raise ProtocolError("bad ROCKETMQ remoting header: bytes after extFields")
    ext_fields: dict[str, str] = {}
    ext_pos = 0
    while ext_pos < len(ext):
        if ext_pos + 2 > len(ext):
            raise ProtocolError("bad ROCKETMQ remoting header: truncated extFields key length")
        (key_length,) = _I16.unpack_from(ext, ext_pos)
        key = _utf8(_take(ext, ext_pos + 2, key_length, "extFields key"), "extFields key")
        ext_pos += 2 + key_length
        if ext_pos + 4 > len(ext):
            raise ProtocolError("bad ROCKETMQ remoting header: truncated extFields value length")
        (value_length,) = _I32.unpack_from(ext, ext_pos)
        value = _take(ext, ext_pos + 4, value_length, "extFields value")
        ext_fields[key] = _utf8(value, "extFields value")
        ext_pos += 4 + value_length
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext_fields,
        body=body,
        language=language,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def encode_frame_parts(cmd: RemotingCommand) -> tuple[bytes, bytes]:
    """Encode `cmd` as (prefix and header, body), for `transport.writelines` without a copy."""
    if cmd.serialize_type is SerializeType.JSON:
        header = _encode_json_header(cmd)
    else:
        header = _encode_binary_header(cmd)
    if len(header) > _MAX_HEADER_LENGTH:
        raise ValueError(f"remoting header of {len(header)} bytes does not fit in 24 bits")
    total = 4 + len(header) + len(cmd.body)
    return _PREFIX.pack(total, cmd.serialize_type << 24 | len(header)) + header, cmd.body


def encode_frame(cmd: RemotingCommand) -> bytes:
    """Encode `cmd` as one frame."""
    head, body = encode_frame_parts(cmd)
    return head + body


def decode_frame(payload: bytes) -> RemotingCommand:
    """Decode one frame without its leading total-length word."""
    return _decode_payload(payload, 0, len(payload))


def _decode_payload(data: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    """Decode the frame whose payload (after the total-length word) is `data[start:end]`."""
    if end - start < 4:
        raise ProtocolError(f"frame of {end - start} bytes has no header length")
    (type_and_length,) = _I32.unpack_from(data, start)
    serialize_type = (type_and_length >> 24) & 0xFF
    header_length = type_and_length & 0xFFFFFF
    header_end = start + 4 + header_length
    if header_end > end:
        raise ProtocolError(
            f"header length {header_length} exceeds the frame's {end - start - 4} bytes"
        )
    header = bytes(data[start + 4 : header_end])
    body = bytes(data[header_end:end])
    if serialize_type == SerializeType.JSON:
        return _decode_json_header(header, body)
    if serialize_type == SerializeType.ROCKETMQ:
        return _decode_binary_header(header, body)
    raise ProtocolError(f"unknown serialize type {serialize_type}")


class FrameDecoder:
    """Split a byte stream into remoting commands; any chunking yields the same commands."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._broken: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        """Take more bytes; return every command they complete, in order.

        Raises:
            ProtocolError: the stream is malformed; this decoder then refuses all further input.
        """
        if self._broken is not None:
            raise self._broken
        buffer = self._buffer
        # nothing held back (the usual case): frames are cut straight out of `data`, with no
        # copy into the buffer and out again; only an incomplete tail is kept
        if buffer:
            buffer += data  # appended in place: a large frame arrives in many reads
        source: bytes | bytearray = buffer or data
        commands: list[RemotingCommand] = []
        pos = 0
        size = len(source)
        try:
            while size - pos >= 4:
                (total,) = _I32.unpack_from(source, pos)
                if total < 4:
                    raise ProtocolError(f"frame length {total} is below the minimum of 4")
                if total > self._max_frame_bytes:
                    raise FrameTooLargeError(total, self._max_frame_bytes)
                end = pos + 4 + total
                if end > size:
                    break
                commands.append(_decode_payload(source, pos + 4, end))
                pos = end
        except ProtocolError as exc:
            self._broken = exc
            del buffer[:]
            raise
        if source is buffer:
            del buffer[:pos]
        else:
            buffer[:] = source[pos:]
        return commands
