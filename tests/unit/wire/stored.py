"""Stored records for tests: the bytes the broker's append path writes, from a few arguments."""

from __future__ import annotations

from ferrymq.wire.records import BatchItem, encode_records_py, pack_host, peek_record_size

HOST = pack_host("127.0.0.1", 1)


def stored(
    items: list[BatchItem],
    *,
    topic: str = "T",
    queue_id: int = 0,
    first_queue_offset: int = 0,
    first_log_offset: int = 0,
    born_host: bytes = HOST,
    store_host: bytes = HOST,
    born_timestamp_ms: int = 1,
    store_timestamp_ms: int = 2,
) -> bytes:
    """The items as consecutive stored records of one queue (with their CRC32 properties)."""
    parts, _ = encode_records_py(
        items,
        topic=topic,
        queue_id=queue_id,
        first_queue_offset=first_queue_offset,
        assign_queue_offsets=True,
        first_log_offset=first_log_offset,
        sys_flag=0,
        born_timestamp_ms=born_timestamp_ms,
        born_host=born_host,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
    )
    return b"".join(parts)


def split_records(data: bytes) -> list[bytes]:
    """Records back to back, one by one."""
    records = []
    position = 0
    while position < len(data):
        size, _ = peek_record_size(data, position)
        records.append(data[position : position + size])
        position += size
    return records
