"""The read schema (Spark's Kafka source columns, plus opt-in ferrymq columns) and Arrow batches.

| column | type | from |
|---|---|---|
| key | binary | the KEYS property (UTF-8), null without keys |
| value | binary | the body |
| topic | string | |
| partition | int | the queue's stable partition number (`plan.stable_partition`) |
| offset | long | queue offset |
| timestamp | timestamp | born (producer) time |
| timestampType | int | 0 (CreateTime) |
| headers | array<struct<key:string,value:binary>> | every property, by name; with includeHeaders |
| tags, keys | string, array<string> | with includeFerryColumns |
| msgId, storeTimestamp | string, timestamp | with includeFerryColumns |
| brokerName, queueId | string, int | broker group, queue id; with includeFerryColumns |

Batches are built from `RecordBuffers` (the pulled records decoded straight into Arrow's buffer
layout, by the C accelerator when built): the arrays are wrapped around those buffers with no
per-message object (the key column too: the decoder extracts each record's KEYS property), and
the properties text is split only when headers or ferrymq columns are asked for.
`read()` yields `pyarrow.RecordBatch`es whose schema must equal Spark's Arrow form of the read
schema (same names, order, types and nullability), so batches are built against exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ferrymq.spark.plan import QueueRange
from ferrymq.wire import properties as props
from ferrymq.wire.records import RecordBuffers

__all__ = [
    "RANGE_SCHEMA",
    "arrow_schema",
    "property_map",
    "range_batch",
    "range_of",
    "read_schema",
    "to_batch",
]

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def read_schema(*, include_headers: bool, include_ferry_columns: bool) -> StructType:
    """The columns a read returns."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(_HEADER)))
    if include_ferry_columns:
        fields += [
            StructField("tags", StringType()),
            StructField("keys", ArrayType(StringType())),
            StructField("msgId", StringType()),
            StructField("storeTimestamp", TimestampType()),
            StructField("brokerName", StringType()),
            StructField("queueId", IntegerType()),
        ]
    return StructType(fields)


RANGE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("brokerName", StringType(), False),
        StructField("queueId", IntegerType(), False),
        StructField("startOffset", LongType(), False),
        StructField("endOffset", LongType(), False),
    ]
)
"""The rows of `rowsAs=ranges`: one per planned queue range (`startOffset` -2: the queue's min
offset when the range is read)."""


def range_batch(queue: QueueRange) -> Any:
    """One queue range as a one-row Arrow batch of `RANGE_SCHEMA`."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([queue.topic], pa.string()),
            pa.array([queue.partition], pa.int32()),
            pa.array([queue.broker_name], pa.string()),
            pa.array([queue.queue_id], pa.int32()),
            pa.array([queue.start], pa.int64()),
            pa.array([queue.end], pa.int64()),
        ],
        schema=arrow_schema(RANGE_SCHEMA),
    )


def range_of(row: dict[str, Any]) -> QueueRange:
    """The queue range a `RANGE_SCHEMA` row names."""
    return QueueRange(
        row["topic"],
        row["partition"],
        row["brokerName"],
        row["queueId"],
        row["startOffset"],
        row["endOffset"],
    )


def arrow_schema(schema: StructType) -> Any:
    """The Arrow schema Spark expects batches of `schema` to have."""
    return to_arrow_schema(schema, timezone="UTC")


def property_map(text: str) -> dict[str, str]:
    """A record's properties text as a consumer sees them (`decode_properties`, minus CRC32)."""
    found: dict[str, str] = {}
    for item in text.split(props.PROPERTY_SEPARATOR):
        name_value = item.split(props.NAME_VALUE_SEPARATOR)
        if len(name_value) == 2:
            found[name_value[0]] = name_value[1]
    found.pop(props.PROPERTY_CRC32, None)
    return found


def _headers(properties: dict[str, str]) -> list[dict[str, object]] | None:
    if not properties:
        return None
    return [{"key": k, "value": v.encode()} for k, v in sorted(properties.items())]


def _over(kind: Any, count: int, validity: bytes | None, *buffers: bytes) -> Any:
    """An Arrow array over `RecordBuffers` columns: int64 values, or int32 ends and data."""
    bitmap = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(kind, count, [bitmap, *(pa.py_buffer(b) for b in buffers)])


def _timestamps(millis: bytes, count: int, kind: Any) -> Any:
    """Milliseconds as `kind` (microseconds): a cast that refuses what would overflow."""
    return _over(pa.timestamp("ms", tz=kind.tz), count, None, millis).cast(kind)


def _chunk(records: RecordBuffers, queue: QueueRange, schema: Any) -> list[Any]:
    names = set(schema.names)
    count = records.count
    columns: dict[str, Any] = {
        "key": _over(pa.binary(), count, records.key_validity, records.key_ends, records.keys),
        "value": _over(pa.binary(), count, None, records.body_ends, records.bodies),
        "topic": pa.repeat(pa.scalar(queue.topic, pa.string()), count),
        "partition": pa.repeat(pa.scalar(queue.partition, pa.int32()), count),
        "offset": _over(pa.int64(), count, None, records.queue_offsets),
        "timestampType": pa.repeat(pa.scalar(0, pa.int32()), count),
    }
    if "timestamp" in names:
        columns["timestamp"] = _timestamps(
            records.born_timestamps_ms, count, schema.field("timestamp").type
        )
    if "headers" in names or "msgId" in names:
        properties = _over(pa.string(), count, None, records.property_ends, records.properties)
        maps = [property_map(text) for text in properties.to_pylist()]
        columns["headers"] = [_headers(m) for m in maps]
        columns["tags"] = [m.get(props.TAGS) for m in maps]
        columns["keys"] = [props.keys_of(m) or None for m in maps]
        columns["msgId"] = [m.get(props.UNIQ_KEY) or None for m in maps]
    if "brokerName" in names:
        columns["brokerName"] = pa.repeat(pa.scalar(queue.broker_name, pa.string()), count)
        columns["queueId"] = pa.repeat(pa.scalar(queue.queue_id, pa.int32()), count)
    if "storeTimestamp" in names:
        columns["storeTimestamp"] = _timestamps(
            records.store_timestamps_ms, count, schema.field("storeTimestamp").type
        )
    return [
        column if isinstance(column, pa.Array) else pa.array(column, type=field.type)
        for field in schema
        for column in (columns[field.name],)
    ]


def to_batch(pulls: Sequence[RecordBuffers], queue: QueueRange, schema: Any) -> Any:
    """One Arrow record batch of pulled records of one queue's range, in `schema`."""
    chunks = [_chunk(records, queue, schema) for records in pulls]
    if len(chunks) == 1:
        return pa.RecordBatch.from_arrays(chunks[0], schema=schema)
    return pa.RecordBatch.from_arrays(
        [pa.concat_arrays(list(column)) for column in zip(*chunks, strict=True)], schema=schema
    )
