"""`decode_columns` (C and pure Python) gives what `decode_record` gives, record by record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import ProtocolError
from ferrymq.wire import records
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import (
    BatchItem,
    RecordColumns,
    decode_columns,
    decode_columns_py,
    decode_record,
    encode_record,
    encode_records_py,
    pack_host,
    peek_record_size,
)

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12)
_props = st.dictionaries(_text, _text, max_size=4)
hosts = st.sampled_from([pack_host("127.0.0.1", 1), pack_host("::1", 2)])


def _expected(data: bytes) -> RecordColumns:
    """The columns, one `decode_record` at a time (the consumer's path)."""
    columns = RecordColumns()
    position = 0
    while position < len(data):
        size, _ = peek_record_size(data, position)
        record = decode_record(data, position)
        columns.queue_offsets.append(record.queue_offset)
        columns.born_timestamps_ms.append(record.born_timestamp_ms)
        columns.store_timestamps_ms.append(record.store_timestamp_ms)
        columns.bodies.append(record.body)
        # the generated properties survive a decode and re-encode unchanged (CRC32 last)
        columns.properties.append(encode_properties(record.properties).decode())
        position += size
    return columns


def _records(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, born: bytes, store: bytes
) -> bytes:
    items = [BatchItem.of(b, p) for b, p in zip(bodies, properties, strict=False)]
    parts, _ = encode_records_py(
        items,
        topic=topic,
        queue_id=3,
        first_queue_offset=40,
        assign_queue_offsets=True,
        first_log_offset=1000,
        sys_flag=0,
        born_timestamp_ms=1_700_000_000_123,
        born_host=born,
        store_timestamp_ms=1_700_000_000_456,
        store_host=store,
    )
    return b"".join(parts)


@given(
    st.lists(st.binary(max_size=200), max_size=6),
    st.lists(_props, min_size=6, max_size=6),
    st.sampled_from(["T", "t" * 200, "Tópico"]),
    hosts,
    hosts,
)
def test_columns_equal_decoded_records(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, born: bytes, store: bytes
) -> None:
    data = _records(bodies, properties, topic, born, store)
    expected = _expected(data)
    assert decode_columns_py(data) == expected
    assert decode_columns(data) == expected
    assert expected.queue_offsets == list(range(40, 40 + len(bodies)))


def test_records_without_the_record_crc_property_decode_too() -> None:
    record = records.MessageRecord(
        topic="T", body=b"hello", queue_offset=9, properties={"KEYS": "a b"}
    )
    data = encode_record(record) * 2
    columns = decode_columns(data)
    assert columns == decode_columns_py(data)
    assert columns.queue_offsets == [9, 9]
    assert columns.properties == ["KEYS\x01a b\x02"] * 2


def _damaged() -> list[bytes]:
    good = _records([b"abc", b"defg"], [{"KEYS": "k"}, {}], "T", *[pack_host("127.0.0.1", 1)] * 2)
    first, _ = peek_record_size(good, 0)
    body_at = first + 48 + 8 + 8 + 8 + 12 + 4
    flipped_body = bytearray(good)
    flipped_body[body_at] ^= 1
    flipped_header = bytearray(good)
    flipped_header[20] ^= 1  # the first record's queue offset: only the record CRC sees it
    bad_props = bytearray(good)
    bad_props[first - 20] = 0xFF  # a properties byte: invalid UTF-8 (and a record CRC miss)
    return [
        good[:-1],
        good + b"\x00" * 4,
        bytes(flipped_body),
        bytes(flipped_header),
        bytes(bad_props),
        b"\x00\x00\x00\x10\xcb\xd4\x31\x94" + b"\x00" * 8,  # a blank record
    ]


@pytest.mark.parametrize("data", _damaged())
def test_malformed_data_raises_the_reference_error(data: bytes) -> None:
    with pytest.raises(ProtocolError) as reference:
        decode_columns_py(data)
    with pytest.raises(ProtocolError) as accelerated:
        decode_columns(data)
    assert str(accelerated.value) == str(reference.value)


def test_invalid_utf8_properties_fail_like_the_consumer() -> None:
    record = records.MessageRecord(topic="T", body=b"x", properties={"A": "b"})
    data = bytearray(encode_record(record))
    data[-3] = 0xFF  # "A\x01b\x02": the value byte
    with pytest.raises(ProtocolError, match="not UTF-8"):
        decode_columns(bytes(data))
    with pytest.raises(ProtocolError, match="not UTF-8"):
        decode_columns_py(bytes(data))


def test_without_the_accelerator_the_python_reference_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _records([b"a", b"b"], [{}, {"TAGS": "t"}], "T", *[pack_host("127.0.0.1", 1)] * 2)
    monkeypatch.setattr(records, "_accel", None)
    assert decode_columns(data) == _expected(data)


def test_columns_take_and_extend() -> None:
    data = _records([b"a", b"b", b"c"], [{}, {}, {}], "T", *[pack_host("127.0.0.1", 1)] * 2)
    columns = decode_columns(data)
    picked = columns.take([2, 0])
    assert picked.queue_offsets == [42, 40]
    assert picked.bodies == [b"c", b"a"]
    picked.extend(columns)
    assert len(picked) == 5
