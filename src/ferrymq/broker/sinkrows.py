"""How a prepared row of an exactly-once sink is stored, and read back without a full decode.

A row prepared for a sink batch (`broker/sink.py`) is stored in `SINK_TOPIC` with properties
laid out as: the row's own properties as sent (any of the sink's own names dropped), then the
batch's tags (`FERRY_SINK`, `FERRY_SINK_BATCH`, `FERRY_SINK_TXN`, `REAL_TOPIC`, `REAL_QID`, in
that order, encoded once per prepare), then the CRC32 item the store appends. So the sink log's
follower and the commit find a row's batch, transaction, key and target queue by one search for
the first tag's name and one parse per distinct tags string, instead of decoding and re-encoding
every row (which cost most of a prepare and a commit). Anything in another layout (rows stored
before this one, decisions) is left to the full decode: the functions here answer None.

Every answer equals what `decode_properties` gives; tests check it on generated properties.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Final, NamedTuple

from ferrymq.wire import properties as props
from ferrymq.wire.properties import CRC32_RESERVED_LEN, decode_properties, encode_properties
from ferrymq.wire.records import BatchItem

__all__ = [
    "OWN_PROPERTIES",
    "Tags",
    "encode_tags",
    "parse_tags",
    "places",
    "prepared",
    "runs",
    "split_row",
    "uniq_key",
]

SINK: Final = "FERRY_SINK"
BATCH: Final = "FERRY_SINK_BATCH"
TXN: Final = "FERRY_SINK_TXN"
OWN_PROPERTIES: Final = frozenset(
    {SINK, BATCH, TXN, props.REAL_TOPIC, props.REAL_QUEUE_ID, props.PROPERTY_CRC32}
)
"""Properties a committed row never carries: the tags, and the store's CRC32."""

_TAG_NAMES: Final = (SINK, BATCH, TXN, props.REAL_TOPIC, props.REAL_QUEUE_ID)
_OWN_ITEM: Final = re.compile(
    b"|".join(re.escape(f"{name}{props.NAME_VALUE_SEPARATOR}".encode()) for name in OWN_PROPERTIES)
)
"""Where an item of one of the sink's own properties may start, in stored property bytes."""
_SINK_ITEM: Final = f"{SINK}{props.NAME_VALUE_SEPARATOR}".encode()
_UNIQ_ITEM: Final = f"{props.UNIQ_KEY}{props.NAME_VALUE_SEPARATOR}".encode()
_CRC_ITEM: Final = f"{props.PROPERTY_CRC32}{props.NAME_VALUE_SEPARATOR}".encode()
_ITEM_END: Final = props.PROPERTY_SEPARATOR.encode()
_VALUE_START: Final = props.NAME_VALUE_SEPARATOR.encode()
_SPAN_BYTES: Final = 1 << 20
"""The most bytes of back-to-back rows `runs` groups for one read."""


class Tags(NamedTuple):
    """The sink's tags of a prepared row: its batch, its transaction, where it is committed to."""

    sink: str
    batch: int
    txn: str
    topic: str
    queue_id: int


def encode_tags(tags: Tags) -> bytes:
    """The tags as stored after a row's own properties."""
    values = (tags.sink, str(tags.batch), tags.txn, tags.topic, str(tags.queue_id))
    return encode_properties(dict(zip(_TAG_NAMES, values, strict=True)))


def prepared(item: BatchItem, tags: bytes) -> BatchItem:
    """A row as prepared: its own properties as sent (the sink's names dropped), then `tags`."""
    own = item.properties
    if (own and not own.endswith(_ITEM_END)) or _OWN_ITEM.search(own):
        own = encode_properties(
            {k: v for k, v in item.property_map.items() if k not in OWN_PROPERTIES}
        )
    return BatchItem(item.body, own + tags, item.flag)


@functools.lru_cache(maxsize=1024)
def parse_tags(tags: bytes) -> Tags | None:
    """The tags `encode_tags` wrote (every row of one prepare has the same), or None."""
    try:
        items = tags.decode().split(props.PROPERTY_SEPARATOR)
    except UnicodeDecodeError:
        return None
    pairs = [item.split(props.NAME_VALUE_SEPARATOR) for item in items[:-1]]
    if items[-1] or [p[0] for p in pairs] != list(_TAG_NAMES) or any(len(p) != 2 for p in pairs):
        return None
    sink, batch, txn, topic, queue_id = (p[1] for p in pairs)
    if not (batch.lstrip("-").isdigit() and queue_id.isdigit()):
        return None
    return Tags(sink, int(batch), txn, topic, int(queue_id))


def split_row(properties: bytes) -> tuple[bytes, Tags] | None:
    """A stored prepared row's own properties and its tags; None for anything else."""
    start = properties.find(_SINK_ITEM)
    if start < 0 or (start and properties[start - 1] != _ITEM_END[0]):
        return None
    end = len(properties)
    crc = end - CRC32_RESERVED_LEN
    if properties.startswith(_CRC_ITEM, crc) and properties.endswith(_ITEM_END):
        end = crc
    tags = parse_tags(properties[start:end])
    own = properties[:start]
    if tags is None or _OWN_ITEM.search(own):
        return None
    return own, tags


def uniq_key(own: bytes) -> str | None:
    """The UNIQ_KEY property of property bytes, as `decode_properties` reads it."""
    at = own.rfind(_UNIQ_ITEM)
    if at < 0:
        return None
    stop = own.find(_ITEM_END, at)
    value = own[at + len(_UNIQ_ITEM) : stop if stop >= 0 else len(own)]
    if (at and own[at - 1] != _ITEM_END[0]) or _VALUE_START in value:
        return decode_properties(own).get(props.UNIQ_KEY)  # a longer name ends so, or junk
    return value.decode()


def places(start: int, sizes: list[int]) -> Iterator[tuple[int, int]]:
    """(log offset, size) of records back to back from `start`."""
    for size in sizes:
        yield start, size
        start += size


def runs(rows: Iterable[tuple[int, int]]) -> Iterator[tuple[int, list[int]]]:
    """(log offset, sizes) of runs of records that lie back to back, from (log offset, size).

    A run stops growing once it holds 1 MiB.
    """
    start, sizes, end = 0, list[int](), -1
    for log_offset, size in rows:
        if log_offset != end or end - start >= _SPAN_BYTES:
            if sizes:
                yield start, sizes
            start, sizes, end = log_offset, [], log_offset
        sizes.append(size)
        end += size
    if sizes:
        yield start, sizes
