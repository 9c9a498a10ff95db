"""The read schema (Spark's Kafka source columns, plus opt-in ferrymq columns) and Arrow batches.

| column | type | from |
|---|---|---|
| key | binary | the KEYS property (UTF-8), null without keys |
| value | binary | the body |
| topic | string | |
| partition | int | topic-global queue index |
| offset | long | queue offset |
| timestamp | timestamp | born (producer) time |
| timestampType | int | 0 (CreateTime) |
| headers | array<struct<key:string,value:binary>> | every property, by name; with includeHeaders |
| tags, keys | string, array<string> | with includeFerryColumns |
| msgId, storeTimestamp | string, timestamp | with includeFerryColumns |

`read()` yields `pyarrow.RecordBatch`es whose schema must equal Spark's Arrow form of the read
schema (same names, order, types and nullability), so batches are built against exactly that.
"""

from __future__ import annotations

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

from ferrymq.client.message import Message
from ferrymq.wire import properties as props

__all__ = ["arrow_schema", "read_schema", "to_batch"]

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
        ]
    return StructType(fields)


def arrow_schema(schema: StructType) -> Any:
    """The Arrow schema Spark expects batches of `schema` to have."""
    return to_arrow_schema(schema, timezone="UTC")


def _key(message: Message) -> bytes | None:
    keys = message.properties.get(props.KEYS)
    return keys.encode() if keys else None


def _headers(message: Message) -> list[dict[str, object]] | None:
    if not message.properties:
        return None
    return [{"key": k, "value": v.encode()} for k, v in sorted(message.properties.items())]


def to_batch(messages: list[Message], topic: str, partition: int, schema: Any) -> Any:
    """One Arrow record batch of messages of one partition, in `schema` (from `arrow_schema`)."""
    names = set(schema.names)
    count = len(messages)
    columns: dict[str, list[Any]] = {
        "key": [_key(m) for m in messages],
        "value": [m.body for m in messages],
        "topic": [topic] * count,
        "partition": [partition] * count,
        "offset": [m.queue_offset for m in messages],
        "timestamp": [m.born_timestamp_ms * 1000 for m in messages],
        "timestampType": [0] * count,
    }
    if "headers" in names:
        columns["headers"] = [_headers(m) for m in messages]
    if "msgId" in names:
        columns["tags"] = [m.tags for m in messages]
        columns["keys"] = [m.keys or None for m in messages]
        columns["msgId"] = [m.msg_id or None for m in messages]
        columns["storeTimestamp"] = [m.store_timestamp_ms * 1000 for m in messages]
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
