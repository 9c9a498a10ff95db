"""Stored message records, producer batches, properties, message ids and tag hashes."""

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import ProtocolError
from ferrymq.wire.msgid import UniqueIdGenerator, decode_offset_msg_id, offset_msg_id
from ferrymq.wire.properties import decode_properties, encode_properties
from ferrymq.wire.records import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    BatchItem,
    MessageRecord,
    body_crc,
    decode_batch,
    decode_record,
    encode_batch,
    encode_record,
    encode_records,
    java_string_hash,
    pack_host,
    peek_record_size,
    record_crc_of,
    record_info,
    store_timestamp_of,
    tags_hash,
    unpack_host,
    verify_record_crc,
)

_prop_text = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x01\x02"),
    max_size=10,
)
properties = st.dictionaries(_prop_text, _prop_text, max_size=5)
hosts = st.sampled_from(
    [pack_host("127.0.0.1", 10911), pack_host("::1", 7), pack_host("127.0.0.2", 0)]
)
topics = st.text("abcXYZ019_-%|", min_size=1, max_size=300)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)

records = st.builds(
    MessageRecord,
    topic=topics,
    body=st.binary(max_size=300),
    queue_id=i32,
    flag=i32,
    queue_offset=i64,
    log_offset=i64,
    sys_flag=st.integers(0, 0xFFFF).map(
        lambda f: f & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    ),
    born_timestamp_ms=i64,
    born_host=hosts,
    store_timestamp_ms=i64,
    store_host=hosts,
    reconsume_times=i32,
    prepared_transaction_offset=i64,
    properties=properties,
)


def _normalized(record: MessageRecord) -> MessageRecord:
    """What decoding gives back: host flags set, CRC filled in."""
    flags = record.sys_flag
    flags |= SYSFLAG_BORNHOST_V6 if len(record.born_host) == 20 else 0
    flags |= SYSFLAG_STOREHOST_V6 if len(record.store_host) == 20 else 0
    return MessageRecord(
        **{
            **{f: getattr(record, f) for f in MessageRecord.__dataclass_fields__},
            "sys_flag": flags,
            "body_crc": body_crc(record.body),
        }
    )


@given(records)
def test_records_round_trip(record: MessageRecord) -> None:
    data = encode_record(record)
    assert peek_record_size(data, 0) == (
        len(data),
        MAGIC_V2 if len(record.topic.encode()) > 127 else MAGIC_V1,
    )
    assert decode_record(data) == _normalized(record)
    assert verify_record_crc(data)
    assert store_timestamp_of(data) == record.store_timestamp_ms


@given(records, st.integers(1, 4))
def test_the_append_path_encodes_exactly_what_the_record_codec_does(
    record: MessageRecord, count: int
) -> None:
    items = [
        BatchItem(record.body + bytes([i]), encode_properties(record.properties), record.flag)
        for i in range(count)
    ]
    parts, sizes = encode_records(
        items,
        topic=record.topic,
        queue_id=record.queue_id,
        first_queue_offset=100,
        assign_queue_offsets=True,
        first_log_offset=5000,
        sys_flag=record.sys_flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
        store_timestamp_ms=record.store_timestamp_ms,
        store_host=record.store_host,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.prepared_transaction_offset,
    )
    data = b"".join(parts)
    pos = 0
    for i, size in enumerate(sizes):
        expected = MessageRecord(
            **{
                **{f: getattr(record, f) for f in MessageRecord.__dataclass_fields__},
                "body": record.body + bytes([i]),
                "queue_offset": 100 + i,
                "log_offset": 5000 + pos,
            }
        )
        assert data[pos : pos + size] == encode_record(expected, record_crc=True)
        assert record_crc_of(data[pos : pos + size]) is not None
        info = record_info(data, pos, require_record_crc=True)
        assert (info.queue_offset, info.log_offset, info.size) == (100 + i, 5000 + pos, size)
        assert info.tags_code == tags_hash(record.properties.get("TAGS"))
        pos += size
    assert pos == len(data)


@given(records, st.data())
def test_truncated_or_flipped_records_raise_only_protocol_error(
    record: MessageRecord, data: st.DataObject
) -> None:
    raw = bytearray(encode_record(record))
    cut = data.draw(st.integers(0, len(raw)))
    damaged = raw[:cut]
    if damaged and data.draw(st.booleans()):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_record(damaged)
    except ProtocolError:
        return
    assert bytes(damaged) == bytes(raw) or decoded.body == record.body


@given(st.binary(max_size=400), st.integers(0, 8))
def test_random_bytes_raise_only_protocol_error(data: bytes, pos: int) -> None:
    for decode in (decode_record, record_info):
        with contextlib.suppress(ProtocolError):
            decode(data, pos)
    with contextlib.suppress(ProtocolError):
        decode_batch(data)


@given(records, st.data())
def test_any_flipped_byte_of_an_append_path_record_is_detected(
    record: MessageRecord, data: st.DataObject
) -> None:
    raw = bytearray(encode_record(record, record_crc=True))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ProtocolError):
        record_info(raw, 0, require_record_crc=True)
    assert not verify_record_crc(raw, require_record_crc=True) or at < 8


def test_a_record_without_the_crc_property_is_refused_when_required() -> None:
    raw = encode_record(MessageRecord(topic="T", body=b"x"))
    assert record_info(raw).size == len(raw)
    with pytest.raises(ProtocolError, match="no whole-record CRC"):
        record_info(raw, require_record_crc=True)


def test_a_body_crc_mismatch_is_detected() -> None:
    raw = bytearray(encode_record(MessageRecord(topic="T", body=b"payload")))
    raw[raw.index(b"payload")] ^= 1
    with pytest.raises(ProtocolError, match="CRC"):
        decode_record(raw)
    assert not verify_record_crc(raw)
    assert decode_record(raw, check_crc=False).body == b"qayload"


def test_a_blank_record_is_recognized_but_is_not_a_message() -> None:
    blank = struct.pack(">ii", 64, BLANK_MAGIC) + bytes(56)
    assert peek_record_size(blank, 0) == (64, BLANK_MAGIC)
    with pytest.raises(ProtocolError, match="blank"):
        decode_record(blank)


def test_record_layout_positions_match_rocketmq() -> None:
    record = MessageRecord(
        topic="T",
        body=b"x",
        queue_offset=7,
        log_offset=1234,
        store_timestamp_ms=99,
        sys_flag=0,
    )
    raw = encode_record(record)
    assert struct.unpack_from(">q", raw, 20)[0] == 7  # QUEUEOFFSET
    assert struct.unpack_from(">q", raw, 28)[0] == 1234  # PHYSICALOFFSET
    assert struct.unpack_from(">q", raw, 56)[0] == 99  # STORETIMESTAMP, IPv4 born host
    assert struct.unpack_from(">i", raw, 4)[0] == MAGIC_V1 == -626843481
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw) == 84 + 4 + 1 + 2 + 2


@given(st.lists(st.builds(BatchItem.of, st.binary(max_size=100), properties, i32), max_size=6))
def test_batches_round_trip(items: list[BatchItem]) -> None:
    assert decode_batch(encode_batch(items)) == items


def test_batch_item_layout_is_rocketmq_encode_message() -> None:
    data = encode_batch([BatchItem.of(b"ab", {"K": "v"}, flag=5)])
    assert data == struct.pack(">iiiii", 20 + 2 + 2 + 4, 0, 0, 5, 2) + b"ab" + b"\x00\x04K\x01v\x02"


@pytest.mark.parametrize(
    "body",
    [
        struct.pack(">iiiii", 10, 0, 0, 0, 0),
        struct.pack(">iiiii", 100, 0, 0, 0, 0) + b"\x00\x00",
        struct.pack(">iiiii", 22, 0, 0, 0, 5) + b"\x00\x00",
        struct.pack(">iiiii", 22, 0, 0, 0, 0) + b"\x00\x05",
        b"\x00\x00",
    ],
)
def test_malformed_batches_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="batch item at 0"):
        decode_batch(body)


@given(properties)
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


def test_properties_skip_malformed_items_like_java() -> None:
    assert decode_properties(b"A\x011\x02junk\x02B\x01x\x01y\x02C\x013") == {"A": "1", "C": "3"}


def test_properties_with_separators_are_refused() -> None:
    with pytest.raises(ValueError, match="separator"):
        encode_properties({"K": "a\x02b"})
    with pytest.raises(ProtocolError):
        decode_properties(b"\xff\x01x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("hello", 99162322), ("TagA", 2598919), ("", 0), ("polygenelubricants", -(2**31))],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_tags_hash_is_zero_without_tags() -> None:
    assert tags_hash(None) == tags_hash("") == 0
    assert tags_hash("TagA") == 2598919


def test_offset_message_ids_encode_store_host_and_log_offset() -> None:
    host = pack_host("127.0.0.1", 10911)
    msg_id = offset_msg_id(host, 1)
    assert msg_id == "7F00000100002A9F0000000000000001"
    assert decode_offset_msg_id(msg_id) == (host, 1)
    v6 = pack_host("::1", 5)
    assert decode_offset_msg_id(offset_msg_id(v6, 2**40)) == (v6, 2**40)
    assert unpack_host(v6) == ("::1", 5)


@pytest.mark.parametrize("bad", ["", "XYZ", "7F0000010000" * 3, "G" * 32])
def test_bad_message_ids_are_protocol_errors(bad: str) -> None:
    with pytest.raises(ProtocolError):
        decode_offset_msg_id(bad)


def test_unique_ids_are_32_hex_digits_and_distinct() -> None:
    generator = UniqueIdGenerator(bytes([10, 1, 2, 3]), pid=0x12345, seed=1)
    now = 1_700_000_000_000
    ids = [generator.next_id(now) for _ in range(65537)]
    assert len(set(ids[:65536])) == 65536
    assert ids[65536] == ids[0]  # the 16-bit counter wraps within one millisecond
    assert all(len(i) == 32 for i in ids[:10])
    assert ids[0].startswith("0A0102032345")
    month_start = generator.next_id(1_698_796_800_000)  # 2023-11-01T00:00:00Z
    assert month_start[20:28] == "00000000"
