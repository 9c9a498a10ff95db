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

Batches are built from `RecordColumns` (the pulled records decoded straight into column lists,
by the C accelerator when built): no per-message objects, and the properties text is split only
for a record that has a KEYS property or when headers or ferrymq columns are asked for.
`read()` yields `pyarrow.RecordBatch`es whose schema must equal Spark's Arrow form of the read
schema (same names, order, types and nullability), so batches are built against exactly that.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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

from ferrymq.wire import properties as props
from ferrymq.wire.records import RecordColumns

__all__ = ["arrow_schema", "property_map", "read_schema", "to_batch"]

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


_KEYS_ITEM = props.KEYS + props.NAME_VALUE_SEPARATOR


def property_map(text: str) -> dict[str, str]:
    """A record's properties text as a consumer sees them (`decode_properties`, minus CRC32)."""
    found: dict[str, str] = {}
    for item in text.split(props.PROPERTY_SEPARATOR):
        name_value = item.split(props.NAME_VALUE_SEPARATOR)
        if len(name_value) == 2:
            found[name_value[0]] = name_value[1]
    found.pop(props.PROPERTY_CRC32, None)
    return found


def _key(text: str) -> bytes | None:
    if _KEYS_ITEM not in text:  # most records: no KEYS property, nothing to split
        return None
    keys = property_map(text).get(props.KEYS)
    return keys.encode() if keys else None


def _headers(properties: dict[str, str]) -> list[dict[str, object]] | None:
    if not properties:
        return None
    return [{"key": k, "value": v.encode()} for k, v in sorted(properties.items())]


def _timestamps(millis: list[int], kind: Any) -> Any:
    return pc.multiply_checked(pa.array(millis, pa.int64()), 1000).cast(kind)


def to_batch(records: RecordColumns, topic: str, partition: int, schema: Any) -> Any:
    """One Arrow record batch of records of one partition, in `schema` (from `arrow_schema`)."""
    names = set(schema.names)
    count = len(records)
    columns: dict[str, Any] = {
        "key": [_key(text) for text in records.properties],
        "value": records.bodies,
        "topic": [topic] * count,
        "partition": [partition] * count,
        "offset": records.queue_offsets,
        "timestamp": _timestamps(records.born_timestamps_ms, schema.field("timestamp").type),
        "timestampType": [0] * count,
    }
    if "headers" in names or "msgId" in names:
        maps = [property_map(text) for text in records.properties]
        columns["headers"] = [_headers(m) for m in maps]
        columns["tags"] = [m.get(props.TAGS) for m in maps]
        columns["keys"] = [props.keys_of(m) or None for m in maps]
        columns["msgId"] = [m.get(props.UNIQ_KEY) or None for m in maps]
    if "storeTimestamp" in names:
        columns["storeTimestamp"] = _timestamps(
            records.store_timestamps_ms, schema.field("storeTimestamp").type
        )
    arrays = [
        column if isinstance(column, pa.Array) else pa.array(column, type=field.type)
        for field in schema
        for column in (columns[field.name],)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
