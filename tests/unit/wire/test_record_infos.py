"""`record_infos` (C and pure Python): what `record_info` gives record by record, stopping alike.

The scan of replicated bytes and of recovery takes records back to back in one call while they
are whole, valid and where their log offsets say; it stops at the first it cannot take (the
caller's per-record checks report that one), so both versions must stop at the same byte.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import ProtocolError
from ferrymq.wire import records
from ferrymq.wire.properties import PROPERTY_CRC32
from ferrymq.wire.records import (
    BLANK_MAGIC,
    BatchItem,
    RecordInfo,
    pack_host,
    peek_record_size,
    record_info,
    record_infos,
    record_infos_py,
)

from .stored import stored

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12)
_names = _text.filter(lambda name: name != PROPERTY_CRC32) | st.sampled_from(
    ["KEYS", "TAGS", "UNIQ_KEY"]
)
_props = st.dictionaries(_names, _text, max_size=4)
_hosts = st.sampled_from([pack_host("127.0.0.1", 1), pack_host("::1", 2)])

_FIRST_LOG_OFFSET = 1000


def _records(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, host: bytes
) -> bytes:
    return stored(
        [BatchItem.of(b, p) for b, p in zip(bodies, properties, strict=False)],
        topic=topic,
        queue_id=3,
        first_queue_offset=40,
        first_log_offset=_FIRST_LOG_OFFSET,
        born_host=host,
        store_host=host,
        store_timestamp_ms=1_700_000_000_456,
    )


def _one_by_one(data: bytes, limit: int) -> tuple[list[RecordInfo], int]:
    """What the scan's per-record path takes: `record_info` until it cannot."""
    infos: list[RecordInfo] = []
    at = 0
    while at + 8 <= limit:
        total, magic = struct.unpack_from(">ii", data, at)
        if magic == BLANK_MAGIC or total <= 0 or at + total > limit:
            break
        try:
            info = record_info(data[:limit], at, require_record_crc=True)
        except ProtocolError:
            break
        if info.log_offset != _FIRST_LOG_OFFSET + at:
            break
        infos.append(info)
        at += total
    return infos, at


def _both(data: bytes, limit: int) -> tuple[list[RecordInfo], int]:
    python = record_infos_py(
        data, 0, limit, check_crc=True, require_record_crc=True, log_offset=_FIRST_LOG_OFFSET
    )
    accelerated = record_infos(
        data, 0, limit, check_crc=True, require_record_crc=True, log_offset=_FIRST_LOG_OFFSET
    )
    assert accelerated == python
    return python


@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=6),
    st.lists(_props, min_size=6, max_size=6),
    st.sampled_from(["T", "t" * 200, "Tópico"]),
    _hosts,
)
def test_valid_records_give_what_record_info_gives(
    bodies: list[bytes], properties: list[dict[str, str]], topic: str, host: bytes
) -> None:
    data = _records(bodies, properties, topic, host)
    infos, stop = _both(data, len(data))
    assert (infos, stop) == _one_by_one(data, len(data))
    assert stop == len(data)
    assert [i.queue_offset for i in infos] == list(range(40, 40 + len(bodies)))
    for info, props in zip(infos, properties, strict=False):
        assert info.keys == [k for k in props.get("KEYS", "").split(" ") if k]
        assert info.uniq_key == props.get("UNIQ_KEY")
        assert info.tags_code == records.tags_hash(props.get("TAGS"))


@given(
    st.lists(st.binary(max_size=60), min_size=2, max_size=4),
    st.data(),
)
def test_damaged_bytes_stop_both_at_the_same_record(
    bodies: list[bytes], data: st.DataObject
) -> None:
    good = _records(bodies, [{"KEYS": "a b", "TAGS": "t"}] * len(bodies), "T", pack_host("::1", 2))
    damaged = bytearray(good)
    damage = data.draw(st.sampled_from(["flip", "cut", "zero", "blank", "offset"]))
    at = data.draw(st.integers(0, len(good) - 1))
    limit = len(good)
    if damage == "flip":
        damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    elif damage == "cut":
        limit = at
    elif damage in ("zero", "blank"):
        first, _ = peek_record_size(good, 0)
        magic = 0 if damage == "zero" else BLANK_MAGIC
        size = 0 if damage == "zero" else len(good) - first
        struct.pack_into(">ii", damaged, first, size, magic)
    else:  # a record stored where its log offset does not say
        damaged = bytearray(good[peek_record_size(good, 0)[0] :])
        limit = len(damaged)
    infos, stop = _both(bytes(damaged), limit)
    assert (infos, stop) == _one_by_one(bytes(damaged), limit)
    assert stop < len(good) or damage == "flip"


def test_properties_that_are_not_utf8_index_nothing() -> None:
    data = bytearray(_records([b"x"], [{"KEYS": "k", "TAGS": "t"}], "T", pack_host("::1", 2)))
    props_at = data.index(b"KEYS\x01k")
    data[props_at + 5] = 0xFF  # the KEYS value is no UTF-8 any more (the body CRC still holds)
    infos, stop = record_infos(
        bytes(data), 0, len(data), check_crc=False, require_record_crc=False, log_offset=1000
    )
    assert (infos, stop) == record_infos_py(
        bytes(data), 0, len(data), check_crc=False, require_record_crc=False, log_offset=1000
    )
    assert stop == len(data)
    assert (infos[0].keys, infos[0].uniq_key, infos[0].tags_code) == ([], None, 0)


def test_without_the_accelerator_the_python_reference_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _records([b"a", b"b"], [{}, {}], "T", pack_host("::1", 2))
    monkeypatch.setattr(records, "_accel", None)
    infos, stop = record_infos(
        data, 0, len(data), check_crc=True, require_record_crc=True, log_offset=_FIRST_LOG_OFFSET
    )
    assert stop == len(data)
    assert len(infos) == 2
