"""Arrow batches from record buffers hold what the consumer's `Message`s say, column by column."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.client.consumer import decode_messages
from ferrymq.client.message import Message
from ferrymq.spark.plan import QueueRange, stable_partition
from ferrymq.spark.rows import arrow_schema, read_schema, to_batch
from ferrymq.wire import properties as props
from ferrymq.wire.records import (
    BatchItem,
    decode_buffers,
)

from ..unit.wire.stored import split_records, stored

pytestmark = pytest.mark.spark

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=8)
_names = st.sampled_from([props.KEYS, props.TAGS, props.UNIQ_KEY, "XKEYS", "a", ""])
_props = st.dictionaries(_names, _text | st.sampled_from(["k1 k2", " k ", ""]), max_size=4)


def _records(properties: list[dict[str, str]]) -> list[bytes]:
    items = [BatchItem.of(f"body{i}".encode(), p) for i, p in enumerate(properties)]
    data = stored(
        items,
        first_queue_offset=5,
        born_timestamp_ms=1_700_000_000_001,
        store_timestamp_ms=1_700_000_000_002,
    )
    return split_records(data)


def _expected(messages: list[Message], names: list[str]) -> dict[str, list[Any]]:
    """The columns as the Message-based reader built them."""
    rows: dict[str, list[Any]] = {
        "key": [
            m.properties[props.KEYS].encode() if m.properties.get(props.KEYS) else None
            for m in messages
        ],
        "value": [m.body for m in messages],
        "topic": ["T"] * len(messages),
        "partition": [stable_partition("broker-b", 3)] * len(messages),
        "offset": [m.queue_offset for m in messages],
        "timestamp": [m.born_timestamp_ms * 1000 for m in messages],
        "timestampType": [0] * len(messages),
        "headers": [
            [{"key": k, "value": v.encode()} for k, v in sorted(m.properties.items())]
            if m.properties
            else None
            for m in messages
        ],
        "tags": [m.tags for m in messages],
        "keys": [m.keys or None for m in messages],
        "msgId": [m.msg_id or None for m in messages],
        "storeTimestamp": [m.store_timestamp_ms * 1000 for m in messages],
        "brokerName": ["broker-b"] * len(messages),
        "queueId": [3] * len(messages),
    }
    return {name: rows[name] for name in names}


@settings(max_examples=50, deadline=None)
@given(st.lists(_props, min_size=1, max_size=6), st.booleans(), st.booleans(), st.data())
def test_batches_hold_what_messages_hold(
    properties: list[dict[str, str]], headers: bool, ferry: bool, draw: st.DataObject
) -> None:
    records = _records(properties)
    data = b"".join(records)
    schema = arrow_schema(read_schema(include_headers=headers, include_ferry_columns=ferry))
    cut = draw.draw(st.integers(0, len(records) - 1))  # the records came in one or two pulls
    pulls = [b"".join(records[:cut]), b"".join(records[cut:])] if cut else [data]
    queue = QueueRange("T", stable_partition("broker-b", 3), "broker-b", 3, 5, 5 + len(records))
    batch = to_batch([decode_buffers(pull) for pull in pulls], queue, schema)
    assert batch.schema == schema
    got = {
        name: (
            column.cast(pa.int64()) if name in ("timestamp", "storeTimestamp") else column
        ).to_pylist()
        for name, column in zip(schema.names, batch.columns, strict=True)
    }
    assert got == _expected(decode_messages(data, "b"), list(schema.names))
