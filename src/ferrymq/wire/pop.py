"""RocketMQ 5 POP consumption on the wire: request and response headers, bodies, receipt handles.

Field names are RocketMQ's (`PopMessageRequestHeader`, `PopMessageResponseHeader`,
`AckMessageRequestHeader`, `ChangeInvisibleTimeRequestHeader` and its response,
`BatchAckMessageRequestBody` / `BatchAck`, `NotificationRequestHeader`,
`PeekMessageRequestHeader`, `PollingInfoRequestHeader` and its response). A receipt handle is
RocketMQ's `extraInfo` string (`ExtraInfoUtil.buildExtraInfo`), space separated:

    ckQueueOffset popTime invisibleTime reviveQid topicFlag brokerName queueId queueOffset

`topicFlag` is "1" when the message was popped from the group's POP retry topic
(`%RETRY%<group>_<topic>`, RocketMQ `KeyBuilder.buildPopRetryTopicV1`), else "0". A broker
answers a pop with the stored records unchanged and three strings from which the client builds
each message's handle: `startOffsetInfo` ("flag queueId startOffset" per queue, `;` between),
`msgOffsetInfo` ("flag queueId o1,o2,..." per queue) and, for orderly pops, `orderCountInfo`
("flag qo<queueId>%<queueOffset> count" per message: how often it was delivered before).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.wire.headers import I32, I64, CommandHeader

__all__ = [
    "MAX_BATCH_ACK_BITS",
    "NORMAL_FLAG",
    "POP_ORDER_REVIVE_QUEUE",
    "RETRY_FLAG",
    "AckMessageRequestHeader",
    "BatchAck",
    "BatchAckMessageRequestBody",
    "ChangeInvisibleTimeRequestHeader",
    "ChangeInvisibleTimeResponseHeader",
    "NotificationRequestHeader",
    "NotificationResponseHeader",
    "PeekMessageRequestHeader",
    "PollingInfoRequestHeader",
    "PollingInfoResponseHeader",
    "PopMessageRequestHeader",
    "PopMessageResponseHeader",
    "ReceiptHandle",
    "encode_bit_set",
    "format_msg_offset_info",
    "format_order_count_info",
    "format_start_offset_info",
    "parse_info",
    "pop_retry_topic",
]

NORMAL_FLAG: Final = "0"
RETRY_FLAG: Final = "1"
POP_ORDER_REVIVE_QUEUE: Final = 999
"""The revive queue id an orderly pop's handles carry (RocketMQ `KeyBuilder`)."""
POP_RETRY_PREFIX: Final = "%RETRY%"
MAX_BATCH_ACK_BITS: Final = 65536
"""The most offsets one `BatchAck` may name (a RocketMQ checkpoint holds far fewer)."""


def pop_retry_topic(group: str, topic: str) -> str:
    """The retry topic POP revives `topic`'s unacknowledged messages of `group` into."""
    return f"{POP_RETRY_PREFIX}{group}_{topic}"


class PopMessageRequestHeader(CommandHeader):
    """POP_MESSAGE (200050). `queueId` -1: any queue of the topic."""

    consumer_group: str
    topic: str
    queue_id: I32
    max_msg_nums: I32
    invisible_time: I64
    poll_time: I64
    born_time: I64
    init_mode: I32
    """0: a queue never popped starts at its first entry (MIN); otherwise at its end (MAX)."""
    exp_type: str | None = None
    exp: str | None = None
    order: bool | None = None
    attempt_id: str | None = None


class PopMessageResponseHeader(CommandHeader):
    """Answer to POP_MESSAGE."""

    pop_time: I64
    invisible_time: I64
    revive_qid: I32
    rest_num: I64
    start_offset_info: str | None = None
    msg_offset_info: str | None = None
    order_count_info: str | None = None


class AckMessageRequestHeader(CommandHeader):
    """ACK_MESSAGE (200051): `topic` is the popped topic, `extraInfo` the receipt handle."""

    consumer_group: str
    topic: str
    queue_id: I32
    extra_info: str
    offset: I64


class ChangeInvisibleTimeRequestHeader(CommandHeader):
    """CHANGE_MESSAGE_INVISIBLETIME (200053)."""

    consumer_group: str
    topic: str
    queue_id: I32
    extra_info: str
    offset: I64
    invisible_time: I64


class ChangeInvisibleTimeResponseHeader(CommandHeader):
    """Answer to CHANGE_MESSAGE_INVISIBLETIME: the new handle's pop and invisible times."""

    pop_time: I64
    invisible_time: I64
    revive_qid: I32


class PeekMessageRequestHeader(CommandHeader):
    """PEEK_MESSAGE (200052): what a pop would hand out, left where it is. `queueId` -1: any."""

    consumer_group: str
    topic: str
    queue_id: I32
    max_msg_nums: I32


class PollingInfoRequestHeader(CommandHeader):
    """POLLING_INFO (200055): how many pops wait for messages of a topic's queue for a group."""

    consumer_group: str
    topic: str
    queue_id: I32


class PollingInfoResponseHeader(CommandHeader):
    """Answer to POLLING_INFO."""

    polling_num: I32


class NotificationRequestHeader(CommandHeader):
    """NOTIFICATION (200054): wait until a pop would find a message, or `pollTime` passes."""

    consumer_group: str
    topic: str
    queue_id: I32
    poll_time: I64
    born_time: I64
    order: bool | None = None
    attempt_id: str | None = None


class NotificationResponseHeader(CommandHeader):
    """Answer to NOTIFICATION."""

    has_msg: bool
    polling_full: bool | None = None


class BatchAck(msgspec.Struct, forbid_unknown_fields=False):
    """One checkpoint's acks in a BATCH_ACK_MESSAGE body (RocketMQ `BatchAck`, short names).

    `b` is the bit set of acked offsets relative to `so`: RocketMQ sends a `java.util.BitSet`
    (fastjson writes its `toByteArray()` as base64); a list of set bit indexes is taken too.
    """

    c: str
    t: str
    r: str
    so: int
    q: int
    rq: int
    pt: int
    it: int
    b: str | list[int]

    @property
    def offsets(self) -> list[int]:
        """The acked queue offsets.

        Raises:
            ProtocolError: not base64, or more than `MAX_BATCH_ACK_BITS` bits.
        """
        if isinstance(self.b, list):
            if len(self.b) > MAX_BATCH_ACK_BITS:
                raise ProtocolError(
                    f"BatchAck names {len(self.b)} offsets, over {MAX_BATCH_ACK_BITS}"
                )
            return [self.so + bit for bit in self.b]
        if len(self.b) > (MAX_BATCH_ACK_BITS // 8 + 2) // 3 * 4:
            raise ProtocolError(f"BatchAck bit set of {len(self.b)} characters is too long")
        try:
            raw = base64.b64decode(self.b, validate=True)
        except ValueError:
            raise ProtocolError(f"BatchAck bit set {self.b[:64]!r} is not base64") from None
        # byte by byte (little-endian bits, as BitSet.toByteArray): linear in the set's size
        return [
            self.so + index * 8 + bit
            for index, byte in enumerate(raw)
            if byte
            for bit in range(8)
            if byte >> bit & 1
        ]


def encode_bit_set(bits: Iterable[int]) -> str:
    """A `BatchAck.b` bit set with `bits` set, as RocketMQ sends it.

    That is base64 of `BitSet.toByteArray`: little-endian bytes and bits, no trailing zero byte.

    Raises:
        ValueError: a negative bit.
    """
    raw = bytearray()
    for bit in bits:
        if bit < 0:
            raise ValueError(f"a bit set has no bit {bit}")
        index = bit // 8
        if index >= len(raw):
            raw.extend(bytes(index + 1 - len(raw)))
        raw[index] |= 1 << bit % 8
    return base64.b64encode(bytes(raw)).decode("ascii")


class BatchAckMessageRequestBody(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    """BATCH_ACK_MESSAGE (200151) body."""

    acks: list[BatchAck]
    broker_name: str | None = None


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """RocketMQ's `extraInfo`: which pop delivered a message, and so whom to ack."""

    ck_queue_offset: int
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    retry: bool
    broker_name: str
    queue_id: int
    queue_offset: int

    def __str__(self) -> str:
        flag = RETRY_FLAG if self.retry else NORMAL_FLAG
        return (
            f"{self.ck_queue_offset} {self.pop_time_ms} {self.invisible_ms} {self.revive_qid} "
            f"{flag} {self.broker_name} {self.queue_id} {self.queue_offset}"
        )

    @property
    def is_orderly(self) -> bool:
        """Whether an orderly pop delivered it."""
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        """Read an `extraInfo` string.

        Raises:
            ProtocolError: not RocketMQ's eight fields.
        """
        parts = text.split(" ")
        if len(parts) != 8:
            raise ProtocolError(f"receipt handle {text!r} does not have 8 fields")
        try:
            return cls(
                int(parts[0]),
                int(parts[1]),
                int(parts[2]),
                int(parts[3]),
                parts[4] == RETRY_FLAG,
                parts[5],
                int(parts[6]),
                int(parts[7]),
            )
        except ValueError:
            raise ProtocolError(f"receipt handle {text!r} has a non-numeric field") from None


def _flag(retry: bool) -> str:
    return RETRY_FLAG if retry else NORMAL_FLAG


def format_start_offset_info(entries: list[tuple[bool, int, int]]) -> str:
    """`startOffsetInfo` from (retry, queue id, start offset) per queue."""
    return ";".join(f"{_flag(r)} {q} {o}" for r, q, o in entries)


def format_msg_offset_info(entries: list[tuple[bool, int, list[int]]]) -> str:
    """`msgOffsetInfo` from (retry, queue id, queue offsets) per queue."""
    return ";".join(f"{_flag(r)} {q} {','.join(map(str, os))}" for r, q, os in entries)


def format_order_count_info(entries: list[tuple[bool, int, int, int]]) -> str:
    """`orderCountInfo` from (retry, queue id, queue offset, earlier deliveries) per message."""
    return ";".join(f"{_flag(r)} qo{q}%{o} {n}" for r, q, o, n in entries)


def parse_info(text: str | None) -> dict[str, str]:
    """Split one of the three info strings into {"flag@key": value}.

    Raises:
        ProtocolError: an entry is not three space-separated fields.
    """
    found: dict[str, str] = {}
    if not text:
        return found
    for entry in text.split(";"):
        parts = entry.split(" ")
        if len(parts) != 3:
            raise ProtocolError(f"bad pop info entry {entry!r}")
        found[f"{parts[0]}@{parts[1]}"] = parts[2]
    return found
