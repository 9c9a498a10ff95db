"""FastJSON's map form with object keys: what RocketMQ writes for `Map<MessageQueue, V>` fields.

RocketMQ serializes bodies with FastJSON (`RemotingSerializable.toJson` is
`JSON.toJSONString(obj)`), which writes a map key that is an object as that object's JSON, inline
and unquoted, and a number key unquoted:

    {"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"maxOffset":8,...}}}
    {"brokerAddrs":{0:"127.0.0.1:10911"}}

This is not standard JSON, but it is exactly what Apache's Java tools (mqadmin, the Dashboard,
rocketmq-exporter) decode with `JSON.parseObject(body, ConsumeStats.class)`, so the bodies
whose Java type keys a map by `MessageQueue` (TopicStatsTable, ConsumeStats, ResetOffsetBody,
ConsumerRunningInfo's mqTable) are written this way. FastJSON writes a bean's fields sorted
by name, as `mq_key` does for MessageQueue (`brokerName`, `queueId`, `topic`).

Rules:
1. `encode_object_map` writes the keys verbatim; the caller gives each key as compact JSON.
2. `loads` reads standard JSON and this form: an object or number key becomes a string holding
   its compact JSON text (`'{"brokerName":"b","queueId":0,"topic":"T"}'`, `'0'`), which
   `parse_mq_key` turns back into a queue. Depth and size are bounded; anything else malformed
   is a `ProtocolError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from ferrymq.errors import ProtocolError

__all__ = ["encode_object_map", "encode_sorted", "loads", "mq_key", "parse_mq_key"]

MAX_DEPTH: Final = 64
"""Nesting allowed in a tolerant parse (RocketMQ bodies nest 4 deep)."""
_STOP: Final = frozenset(",:]} \t\r\n")
_encoder: Final = msgspec.json.Encoder(order="sorted")


def encode_sorted(body: object) -> bytes:
    """JSON with every object's fields sorted by name, as FastJSON writes a Java bean.

    A map with number keys (broker ids) is written with them quoted, in text order (`"0"`,
    `"1"`, `"10"`, `"2"`); FastJSON writes `{0:...}` unquoted, which Java reads alike.
    """
    try:
        return _encoder.encode(body)
    except TypeError:  # msgspec sorts only str keys: quote the number keys first
        return _encoder.encode(msgspec.to_builtins(body, str_keys=True))


def mq_key(topic: str, broker_name: str, queue_id: int) -> bytes:
    """A MessageQueue as FastJSON writes it (fields sorted by name), for a map key."""
    return _encoder.encode({"brokerName": broker_name, "queueId": queue_id, "topic": topic})


def encode_object_map(entries: Iterable[tuple[bytes, Any]]) -> bytes:
    """`{KEY:VALUE,...}` with each key written as given (compact JSON) and values as JSON."""
    return b"{" + b",".join(key + b":" + _encoder.encode(value) for key, value in entries) + b"}"


def parse_mq_key(key: str) -> tuple[str, str, int]:
    """(topic, broker name, queue id) of a MessageQueue map key as `loads` gives it.

    Raises:
        ProtocolError: the key is not a MessageQueue object.
    """
    try:
        found = json.loads(key)
        return str(found["topic"]), str(found["brokerName"]), int(found["queueId"])
    except (ValueError, TypeError, KeyError) as exc:
        raise ProtocolError(f"bad MessageQueue map key {key[:120]!r}: {exc}") from None


def loads(data: bytes) -> Any:
    """Parse standard JSON, or FastJSON's form with object and number map keys.

    Raises:
        ProtocolError: neither; the message says where.
    """
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec raises the latter in a key
        pass  # FastJSON's own form: rewrite its keys as strings, then parse
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"bad JSON body: {exc}") from None
    parser = _Parser(text)
    standard = parser.value(0)
    parser.skip_space()
    if parser.pos != len(text):
        raise ProtocolError(f"bad JSON body: trailing data at {parser.pos}")
    try:
        return json.loads(standard)
    except ValueError as exc:
        raise ProtocolError(f"bad JSON body: {exc}") from None


class _Parser:
    """Copies a FastJSON text into standard JSON, quoting object and number keys."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        text = self.text
        while self.pos < len(text) and text[self.pos] in " \t\r\n":
            self.pos += 1

    def _peek(self) -> str:
        self.skip_space()
        if self.pos >= len(self.text):
            raise ProtocolError("bad JSON body: ends too early")
        return self.text[self.pos]

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise ProtocolError(f"bad JSON body: {char!r} expected at {self.pos}")
        self.pos += 1

    def value(self, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise ProtocolError(f"bad JSON body: nested deeper than {MAX_DEPTH}")
        char = self._peek()
        if char == "{":
            return self._object(depth)
        if char == "[":
            return self._array(depth)
        if char == '"':
            return self._string()
        return self._scalar()

    def _string(self) -> str:
        text = self.text
        start = self.pos
        pos = start + 1
        while pos < len(text):
            if text[pos] == "\\":
                pos += 2
                continue
            if text[pos] == '"':
                self.pos = pos + 1
                return text[start : pos + 1]
            pos += 1
        raise ProtocolError("bad JSON body: unterminated string")

    def _scalar(self) -> str:
        text = self.text
        start = self.pos
        while self.pos < len(text) and text[self.pos] not in _STOP:
            self.pos += 1
        if self.pos == start:
            raise ProtocolError(f"bad JSON body: a value expected at {start}")
        return text[start : self.pos]

    def _array(self, depth: int) -> str:
        self._expect("[")
        items: list[str] = []
        if self._peek() == "]":
            self.pos += 1
            return "[]"
        while True:
            items.append(self.value(depth + 1))
            if self._peek() == ",":
                self.pos += 1
                continue
            self._expect("]")
            return "[" + ",".join(items) + "]"

    def _object(self, depth: int) -> str:
        self._expect("{")
        fields: list[str] = []
        if self._peek() == "}":
            self.pos += 1
            return "{}"
        while True:
            char = self._peek()
            if char == '"':
                key = self._string()
            elif char in "{[":
                key = json.dumps(self.value(depth + 1))  # an object key: its JSON, as a string
            else:
                key = json.dumps(self._scalar())  # a number key
            self._expect(":")
            fields.append(key + ":" + self.value(depth + 1))
            if self._peek() == ",":
                self.pos += 1
                continue
            self._expect("}")
            return "{" + ",".join(fields) + "}"
