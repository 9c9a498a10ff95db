"""The C accelerator gives exactly what the pure-Python reference gives."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.wire.records import (
    BatchItem,
    MessageRecord,
    encode_record,
    encode_records_py,
    java_string_hash_py,
    pack_host,
    topic_field,
    verify_record_crc_py,
)

accel = pytest.importorskip("ferrymq.wire.accel", reason="the C accelerator is not built")

_props = st.binary(max_size=60).filter(lambda b: b"\x01" not in b)
items = st.lists(
    st.builds(BatchItem, st.binary(max_size=300), _props, st.integers(-(2**31), 2**31 - 1)),
    min_size=1,
    max_size=5,
)
hosts = st.sampled_from([pack_host("127.0.0.1", 1), pack_host("::1", 2)])


def test_the_accelerator_uses_zlib_ng_for_crc() -> None:
    assert accel.crc_source() == "zlib-ng"


@given(
    items,
    st.text("abcXYZ_-%|", min_size=1, max_size=200),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.integers(0, 2**40),
    st.integers(0, 0xFFFF),
    hosts,
    hosts,
    st.integers(0, 2**45),
)
def test_c_records_equal_python_records(
    batch: list[BatchItem],
    topic: str,
    queue_id: int,
    assign: bool,
    log_offset: int,
    sys_flag: int,
    born_host: bytes,
    store_host: bytes,
    timestamp: int,
) -> None:
    parts, sizes = encode_records_py(
        batch,
        topic=topic,
        queue_id=queue_id,
        first_queue_offset=7,
        assign_queue_offsets=assign,
        first_log_offset=log_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=timestamp,
        born_host=born_host,
        store_timestamp_ms=timestamp + 1,
        store_host=store_host,
        reconsume_times=3,
        prepared_transaction_offset=log_offset // 2,
    )
    magic, topic_part = topic_field(topic)
    data, c_sizes = accel.encode_records(
        batch,
        topic_part,
        magic,
        queue_id,
        7,
        int(assign),
        log_offset,
        sys_flag,
        timestamp,
        born_host,
        timestamp + 1,
        store_host,
        3,
        log_offset // 2,
    )
    assert data == b"".join(parts)
    assert c_sizes == sizes


@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=50))
def test_c_java_hash_equals_python(text: str) -> None:
    assert accel.java_string_hash(text) == java_string_hash_py(text)


def test_bad_arguments_raise_python_errors() -> None:
    with pytest.raises(AttributeError):
        accel.encode_records([object()], b"\x01T", 0, 0, 0, 1, 0, 0, 0, b"x" * 8, 0, b"x" * 8, 0, 0)
    with pytest.raises(ValueError, match="hosts"):
        accel.encode_records([], b"\x01T", 0, 0, 0, 1, 0, 0, 0, b"x" * 7, 0, b"x" * 8, 0, 0)
    big = BatchItem(b"", b"k\x01" + b"v" * 40000 + b"\x02")
    with pytest.raises(ValueError, match="properties"):
        accel.encode_records([big], b"\x01T", 0, 0, 0, 1, 0, 0, 0, b"x" * 8, 0, b"x" * 8, 0, 0)
    with pytest.raises(TypeError):
        accel.java_string_hash(b"bytes")


@given(
    st.binary(max_size=120),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3),
    st.integers(0, 40),
    st.booleans(),
    st.booleans(),
)
def test_c_record_check_equals_python(
    body: bytes, flips: list[tuple[int, int]], cut: int, with_crc: bool, require: bool
) -> None:
    host = pack_host("127.0.0.1", 1)
    if with_crc:
        parts, _ = encode_records_py(
            [BatchItem.of(body, {"KEYS": "k"})],
            topic="T",
            queue_id=0,
            first_queue_offset=0,
            assign_queue_offsets=True,
            first_log_offset=0,
            sys_flag=0,
            born_timestamp_ms=1,
            born_host=host,
            store_timestamp_ms=2,
            store_host=host,
        )
        record = bytearray(b"".join(parts))
    else:
        record = bytearray(encode_record(MessageRecord(topic="T", body=body)))
    for at, mask in flips:
        record[at % len(record)] ^= mask
    data = bytes(record[: len(record) - cut])
    expected = verify_record_crc_py(data, require_record_crc=require)
    assert accel.verify_record_crc(data, require) is expected
    if not flips and not cut:
        assert expected is (with_crc or not require)
