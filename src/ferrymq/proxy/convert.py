"""Pure translation between MessagingService v2 messages and ferrymq's: no I/O, no clock.

Owns: which v2 status code a ferrymq error becomes, how a v2 message's system properties become
RocketMQ message properties (tag, keys, message group, delivery time, transaction flag), which
queue a message group hashes to, and the self-describing transaction ids the endpoint hands out
(so an EndTransaction can reach any endpoint: nothing about a transaction is kept in one).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Final

from ferrymq.errors import (
    ConnectError,
    FerryError,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    NotCommittedError,
    RemoteError,
    SendFailedError,
    SendOutcomeUnknownError,
    TopicNotFoundError,
)
from ferrymq.model import MessageQueue
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode

__all__ = [
    "TX_CLIENT_ID",
    "TxHandle",
    "error_code",
    "fifo_queue",
    "message_properties",
    "timestamp_ms",
]

TX_CLIENT_ID: Final = "__FERRY_TX_CLIENT_ID"
"""ferrymq's own property on a half message the endpoint relays: the x-mq-client-id of the
client that sent it, so the broker's checks go back to that client (RocketMQ names no client in a
message; its proxy asks any producer of the group). Reserved, and never shown to a v2 client."""

_RESERVED: Final = frozenset(
    {
        TX_CLIENT_ID,
        props.UNIQ_KEY,
        props.TAGS,
        props.KEYS,
        props.TRANSACTION_PREPARED,
        props.PRODUCER_GROUP,
        props.DELAY_TIME_LEVEL,
        props.TIMER_DELIVER_MS,
        props.TIMER_DELAY_MS,
        props.REAL_TOPIC,
        props.REAL_QUEUE_ID,
        props.WAIT_STORE_MSG_OK,
        props.SHARDING_KEY,
    }
)
"""RocketMQ system property names a v2 client may not set as user properties."""

MAX_BODY: Final = 4 * 1024 * 1024
"""The largest body the endpoint accepts (RocketMQ's default `maxMessageSize`)."""


def error_code(exc: BaseException) -> str:
    """The v2 `Code` name a client should act on for a failed request."""
    if isinstance(exc, TopicNotFoundError):
        return "TOPIC_NOT_FOUND"
    if isinstance(exc, InvalidNameError):
        return "ILLEGAL_TOPIC"
    if isinstance(exc, MessageTooLargeError):
        return "MESSAGE_BODY_TOO_LARGE"
    if isinstance(exc, InvalidMessageError):
        return (
            "ILLEGAL_DELIVERY_TIME"
            if "deliver" in str(exc) or "delay" in str(exc)
            else "BAD_REQUEST"
        )
    if isinstance(exc, NotCommittedError):
        return "MASTER_PERSISTENCE_TIMEOUT"
    if isinstance(exc, SendOutcomeUnknownError):
        return "PROXY_TIMEOUT"
    if isinstance(exc, RemoteError):
        if exc.code == ResponseCode.SYSTEM_BUSY:
            return "TOO_MANY_REQUESTS"
        if exc.code == ResponseCode.NO_PERMISSION:
            return "FORBIDDEN"
        if exc.code == ResponseCode.TOPIC_NOT_EXIST:
            return "TOPIC_NOT_FOUND"
        return "INTERNAL_SERVER_ERROR"
    if isinstance(exc, SendFailedError):
        text = str(exc)
        if "SYSTEM_BUSY" in text or "busy" in text:
            return "TOO_MANY_REQUESTS"
        if "code 16)" in text or "NO_PERMISSION" in text:  # ResponseCode.NO_PERMISSION
            return "FORBIDDEN"
        return "HA_NOT_AVAILABLE"  # no master, or every master refused or unreachable
    if isinstance(exc, ConnectError):
        return "HA_NOT_AVAILABLE"
    if isinstance(exc, FerryError):
        return "INTERNAL_SERVER_ERROR"
    return "INTERNAL_ERROR"


def timestamp_ms(stamp: Any) -> int:
    """Epoch milliseconds of a `google.protobuf.Timestamp`."""
    return int(stamp.seconds) * 1000 + int(stamp.nanos) // 1_000_000


def fifo_queue(queues: list[MessageQueue], group: str) -> MessageQueue:
    """The queue a message group's messages all go to (a stable hash over a stable list)."""
    return queues[zlib.crc32(group.encode()) % len(queues)]


def message_properties(message: Any, *, transactional: bool) -> dict[str, str]:
    """RocketMQ properties of a v2 `Message` (user properties, then the system ones).

    Raises:
        InvalidMessageError: a reserved property name among the user's, or a property that
            conflicts with the message type.
    """
    system = message.system_properties
    result: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if key in _RESERVED:
            raise InvalidMessageError(f"user property {key!r} is reserved")
        result[str(key)] = str(value)
    if system.tag:
        result[props.TAGS] = system.tag
    if system.keys:
        result[props.KEYS] = props.KEY_SEPARATOR.join(system.keys)
    if system.message_id:
        result[props.UNIQ_KEY] = system.message_id
    if system.message_group:
        if transactional:
            raise InvalidMessageError("a transactional message takes no message group")
        result[props.SHARDING_KEY] = system.message_group
    if system.HasField("delivery_timestamp"):
        if transactional:
            raise InvalidMessageError("a transactional message takes no delivery timestamp")
        result[props.TIMER_DELIVER_MS] = str(timestamp_ms(system.delivery_timestamp))
    return result


@dataclass(frozen=True, slots=True)
class TxHandle:
    """What EndTransaction needs to reach the half message, carried in the transaction id."""

    broker_name: str
    log_offset: int
    queue_offset: int
    msg_id: str

    def encode(self) -> str:
        """`<log offset>:<queue offset>:<msg id>:<broker name>` (the name last: it may hold ':')."""
        return f"{self.log_offset}:{self.queue_offset}:{self.msg_id}:{self.broker_name}"

    @classmethod
    def decode(cls, text: str) -> TxHandle:
        """Parse an id made by `encode`.

        Raises:
            ValueError: not such an id.
        """
        log_offset, queue_offset, msg_id, broker_name = text.split(":", 3)
        if not broker_name or not msg_id:
            raise ValueError(f"not a transaction id of this endpoint: {text!r}")
        return cls(broker_name, int(log_offset), int(queue_offset), msg_id)


_SYSTEM_SHOWN: Final = _RESERVED | {
    props.PROPERTY_CRC32,
    props.MIN_OFFSET,
    props.MAX_OFFSET,
    props.RETRY_TOPIC,
}


def fill_message(
    out: Any,
    *,
    topic: str,
    body: bytes,
    properties: dict[str, str],
    queue_id: int,
    queue_offset: int,
    born_ms: int,
    store_ms: int,
    attempt: int,
    message_type: int,
    receipt_handle: str = "",
) -> None:
    """Fill a v2 `Message` (`out`) from a stored RocketMQ message's parts."""
    out.topic.name = topic
    out.body = body
    for key, value in properties.items():
        if key not in _SYSTEM_SHOWN and not key.startswith("__"):
            out.user_properties[key] = value
    system = out.system_properties
    if tag := properties.get(props.TAGS):
        system.tag = tag
    system.keys.extend(k for k in properties.get(props.KEYS, "").split(props.KEY_SEPARATOR) if k)
    system.message_id = properties.get(props.UNIQ_KEY, "")
    system.body_digest.type = 1  # DigestType.CRC32: 8 upper-case hex digits
    system.body_digest.checksum = format(zlib.crc32(body) & 0xFFFFFFFF, "08X")
    system.body_encoding = 1  # Encoding.IDENTITY
    system.message_type = message_type
    system.born_timestamp.FromMilliseconds(born_ms)
    system.store_timestamp.FromMilliseconds(store_ms)
    system.born_host = "127.0.0.1"
    system.queue_id = queue_id
    system.queue_offset = queue_offset
    system.delivery_attempt = attempt
    if group := properties.get(props.SHARDING_KEY):
        system.message_group = group
    if deliver := properties.get(props.TIMER_DELIVER_MS):
        system.delivery_timestamp.FromMilliseconds(int(deliver))
    if receipt_handle:
        system.receipt_handle = receipt_handle
