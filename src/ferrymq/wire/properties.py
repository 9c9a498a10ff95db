r"""Message properties: RocketMQ's `k\\x01v\\x02` string codec and the property names it uses.

Spec: RocketMQ `MessageDecoder.messageProperties2String` / `string2messageProperties` and
`MessageConst`. Decoding follows Java: an item that does not split into exactly a name and a
value is skipped, so any byte string decodes (only invalid UTF-8 is an error).
"""

from __future__ import annotations

from typing import Final

from ferrymq.errors import ProtocolError

__all__ = [
    "CRC32_RESERVED_LEN",
    "KEYS",
    "KEY_SEPARATOR",
    "MAX_PROPERTIES_BYTES",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_CRC32",
    "PROPERTY_SEPARATOR",
    "TAGS",
    "UNIQ_KEY",
    "decode_properties",
    "encode_properties",
    "index_properties",
    "is_property_text",
    "keys_of",
]

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
KEY_SEPARATOR: Final = " "
"""Separates several keys in the KEYS property."""

MAX_PROPERTIES_BYTES: Final = 32767
"""The stored properties length is a Java `short`."""

KEYS: Final = "KEYS"
TAGS: Final = "TAGS"
UNIQ_KEY: Final = "UNIQ_KEY"
WAIT_STORE_MSG_OK: Final = "WAIT"
DELAY_TIME_LEVEL: Final = "DELAY"
RETRY_TOPIC: Final = "RETRY_TOPIC"
REAL_TOPIC: Final = "REAL_TOPIC"
REAL_QUEUE_ID: Final = "REAL_QID"
TRANSACTION_PREPARED: Final = "TRAN_MSG"
PRODUCER_GROUP: Final = "PGROUP"
MIN_OFFSET: Final = "MIN_OFFSET"
MAX_OFFSET: Final = "MAX_OFFSET"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME: Final = "CONSUME_START_TIME"
TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
TIMER_OUT_MS: Final = "TIMER_OUT_MS"
"""The delivery time (epoch ms) the broker computed for a timer message."""
SHARDING_KEY: Final = "__SHARDINGKEY"
FENCE_OP: Final = "FERRY_FENCE_OP"
"""ferrymq's fenced topics (`broker/fence.py`): claim, snapshot or write."""
FENCE_EPOCH: Final = "FERRY_FENCE_EPOCH"
FENCE_WRITER: Final = "FERRY_FENCE_WRITER"
FENCE_URL: Final = "FERRY_FENCE_URL"
FENCE_COPY: Final = "FERRY_FENCE_COPY"
"""On a copy the broker made of a fenced record: the original's logical offset."""
FENCE_TAIL: Final = "FERRY_FENCE_TAIL"
"""On the last copy of a copy block: the queue offset of the block's first copy."""
FENCE_MAX_WRITER_CHARS: Final = 255
FENCE_MAX_URL_CHARS: Final = 2048
PROPERTY_CRC32: Final = "CRC32"
"""Whole-record CRC property that the store appends (`MessageConst.PROPERTY_CRC32`)."""
CRC32_RESERVED_LEN: Final = len(PROPERTY_CRC32) + 1 + 10 + 1
"""Bytes of `CRC32\x01` + 10 zero-padded digits + `\x02` at the end of the properties."""


def encode_properties(properties: dict[str, str]) -> bytes:
    r"""Encode properties as `name\\x01value\\x02` items, in the dict's order.

    Raises:
        ValueError: a name or value contains a separator, which would not decode back.
    """
    if not properties:
        return b""
    for name, value in properties.items():
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a \\x01 or \\x02 separator")
    return "".join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
    ).encode()


def decode_properties(data: bytes) -> dict[str, str]:
    r"""Decode stored properties; items that are not exactly `name\\x01value` are skipped."""
    if not data:
        return {}
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ProtocolError("message properties are not UTF-8") from None
    properties: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name_value = item.split(NAME_VALUE_SEPARATOR)
        if len(name_value) == 2:
            properties[name_value[0]] = name_value[1]
    return properties


def is_property_text(text: str) -> bool:
    r"""Whether `text` can be a property name or value: it holds no `\x01` or `\x02`."""
    return NAME_VALUE_SEPARATOR not in text and PROPERTY_SEPARATOR not in text


def index_properties(data: bytes) -> dict[str, str]:
    """The properties an index reads: `decode_properties`, or none when they are not UTF-8.

    Sends refuse such properties (`records.decode_batch`), so only data stored before that check
    holds them; the record is intact (its CRCs hold) and is stored and served, it only has no
    keys or tags to index. Indexing must not stop at it, nor recovery cut the log there.
    """
    try:
        return decode_properties(data)
    except ProtocolError:
        return {}


def keys_of(properties: dict[str, str]) -> list[str]:
    """The message keys a KEYS property lists (space-separated), without empty ones."""
    return [key for key in properties.get(KEYS, "").split(KEY_SEPARATOR) if key]
