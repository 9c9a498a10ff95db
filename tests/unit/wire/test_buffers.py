"""`decode_buffers` (C and pure Python) gives what `decode_record` gives, record by record."""

from __future__ import annotations

import itertools
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import ProtocolError
from ferrymq.wire import records
from ferrymq.wire.properties import PROPERTY_CRC32, decode_properties, encode_properties
from ferrymq.wire.records import (
    BatchItem,
    RecordBuffers,
    decode_buffers,
    decode_buffers_py,
    decode_record,
    encode_record,
    pack_host,
    peek_record_size,
)

from .stored import split_records, stored

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12)
_names = _text.filter(lambda name: name != PROPERTY_CRC32) | st.just("KEYS")
_props = st.dictionaries(_names, _text, max_size=4)
hosts = st.sampled_from([pack_host("127.0.0.1", 1), pack_host("::1", 2)])


def _expected(data: bytes) -> RecordBuffers:
    """The buffers, built from one `decode_record` at a time (the consumer's path)."""
    offsets, born, stored, bodies, properties, keys = [], [], [], [], [], []
    position = 0
    while position < len(data):
        size, _ = peek_record_size(data, position)
        record = decode_record(data, position)
        offsets.append(record.queue_offset)
        born.append(record.born_timestamp_ms)
        stored.append(record.store_timestamp_ms)
        bodies.append(record.body)
        # the generated properties survive a decode and re-encode unchanged (CRC32 last)
        properties.append(encode_properties(record.properties))
        keys.append(record.properties.get("KEYS", "").encode())
        position += size
    ends = [0, *itertools.accumulate(map(len, bodies))]
    property_ends = [0, *itertools.accumulate(map(len, properties))]
    return RecordBuffers(
        len(offsets),
        array("q", offsets).tobytes(),
        array("q", born).tobytes(),
        array("q", stored).tobytes(),
        array("i", ends).tobytes(),
        b"".join(bodies),
        array("i", property_ends).tobytes(),
        b"".join(properties),
        bytes(
            sum(1 << (i % 8) for i in range(j, min(j + 8, len(keys))) if keys[i])
            for j in range(0, len(keys), 8)
        ),
        array("i", [0, *itertools.accumulate(map(len, keys))]).tobytes(),
        b"".join(keys),
    )


def _records(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, born: bytes, store: bytes
) -> bytes:
    items = [BatchItem.of(b, p) for b, p in zip(bodies, properties, strict=False)]
    return stored(
        items,
        topic=topic,
        queue_id=3,
        first_queue_offset=40,
        first_log_offset=1000,
        born_host=born,
        store_host=store,
        born_timestamp_ms=1_700_000_000_123,
        store_timestamp_ms=1_700_000_000_456,
    )


@given(
    st.lists(st.binary(max_size=200), max_size=6),
    st.lists(_props, min_size=6, max_size=6),
    st.sampled_from(["T", "t" * 200, "Tópico"]),
    hosts,
    hosts,
)
def test_buffers_equal_decoded_records(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, born: bytes, store: bytes
) -> None:
    data = _records(bodies, properties, topic, born, store)
    expected = _expected(data)
    assert decode_buffers_py(data) == expected
    assert decode_buffers(data) == expected
    assert [expected.queue_offset(i) for i in range(len(bodies))] == list(
        range(40, 40 + len(bodies))
    )


def test_records_without_the_record_crc_property_decode_too() -> None:
    record = records.MessageRecord(
        topic="T", body=b"hello", queue_offset=9, properties={"KEYS": "a b"}
    )
    data = encode_record(record) * 2
    buffers = decode_buffers(data)
    assert buffers == decode_buffers_py(data) == _expected(data)
    assert [buffers.queue_offset(0), buffers.queue_offset(1)] == [9, 9]
    assert buffers.properties == b"KEYS\x01a b\x02" * 2


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
        decode_buffers_py(data)
    with pytest.raises(ProtocolError) as accelerated:
        decode_buffers(data)
    assert str(accelerated.value) == str(reference.value)


def test_invalid_utf8_properties_fail_like_the_consumer() -> None:
    record = records.MessageRecord(topic="T", body=b"x", properties={"A": "b"})
    data = bytearray(encode_record(record))
    data[-3] = 0xFF  # "A\x01b\x02": the value byte
    with pytest.raises(ProtocolError, match="not UTF-8"):
        decode_buffers(bytes(data))
    with pytest.raises(ProtocolError, match="not UTF-8"):
        decode_buffers_py(bytes(data))


def test_without_the_accelerator_the_python_reference_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _records([b"a", b"b"], [{}, {"TAGS": "t"}], "T", *[pack_host("127.0.0.1", 1)] * 2)
    monkeypatch.setattr(records, "_accel", None)
    assert decode_buffers(data) == _expected(data)


def test_buffers_within_and_slice() -> None:
    host = pack_host("127.0.0.1", 1)
    data = _records([b"a", b"bb", b"ccc", b"d"], [{}, {"K": "v"}, {}, {}], "T", host, host)
    buffers = decode_buffers(data)  # queue offsets 40..43
    assert buffers.within(0, 100) == (0, 4)
    assert buffers.within(41, 43) == (1, 3)
    assert buffers.within(44, 50) == (4, 4)
    assert buffers.slice(0, 4) is buffers
    picked = buffers.slice(1, 3)
    assert picked == _expected(b"".join(split_records(data)[1:3]))
    assert picked.bodies == b"bbccc"
    empty = RecordBuffers(0, b"", b"", b"", bytes(4), b"", bytes(4), b"", b"", bytes(4), b"")
    assert buffers.slice(2, 2) == empty


def _with_properties(raw: bytes) -> bytes:
    """One stored record whose properties are `raw` (CRCs right)."""
    return stored([BatchItem(b"x", raw, 0)])


_UTF8_EDGES = [
    "é€😀".encode(),
    b"\xc0\x80",  # overlong NUL
    b"\xed\xa0\x80",  # a surrogate
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xe2\x82",  # cut short
    b"\xf0\x9f\x98",
    b"\x80",
]


@given(st.binary(max_size=12) | st.sampled_from(_UTF8_EDGES))
def test_properties_are_accepted_exactly_when_python_decodes_them(text: bytes) -> None:
    raw = b"A\x01" + text + b"\x02"
    data = _with_properties(raw)
    try:
        raw.decode()
    except UnicodeDecodeError:
        with pytest.raises(ProtocolError, match="not UTF-8"):
            decode_buffers(data)
        with pytest.raises(ProtocolError, match="not UTF-8"):
            decode_buffers_py(data)
        if records._accel is not None:  # the C check itself refuses them (no fallback hides it)
            with pytest.raises(ValueError, match="malformed"):
                records._accel.decode_buffers(data)
    else:
        assert decode_buffers(data) == decode_buffers_py(data)
        assert decode_buffers(data).properties.startswith(raw)


_ITEMS = st.sampled_from(
    ["KEYS\x01k1 k2", "KEYS\x01", "KEYS\x01a\x01b", "XKEYS\x01x", "KEYS", "a\x01b", "é"]
)


@given(st.lists(_ITEMS, max_size=5), st.booleans())
def test_the_key_column_is_the_keys_property_decode_properties_reads(
    items: list[str], trailing: bool
) -> None:
    raw = "\x02".join(items).encode() + (b"\x02" if trailing else b"")
    buffers = decode_buffers(_with_properties(raw))
    assert buffers == decode_buffers_py(_with_properties(raw))
    key = decode_properties(raw).get("KEYS")
    assert (buffers.key_validity[0] & 1, buffers.keys) == ((1, key.encode()) if key else (0, b""))


@given(st.integers(-(2**31), 2**31 - 1), hosts, hosts, st.integers(0, 2**50))
def test_header_readers_give_what_decode_record_gives(
    flag: int, born: bytes, store: bytes, log_offset: int
) -> None:
    one = [BatchItem(b"body", b"A\x01b\x02", flag)]
    data = b"pad" + stored(one, first_log_offset=log_offset, born_host=born, store_host=store)
    record = decode_record(data, 3)
    assert records.record_origin(data, 3) == (record.flag, record.born_host)
    assert records.record_log_offset(data, 3) == record.log_offset == log_offset
