"""The read loops of `Store.get` (store/queueread.py): C and Python agree, and both choose what
the plain one-entry-at-a-time loop chooses."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import CorruptRecordError
from ferrymq.store import queueread
from ferrymq.store.consumequeue import BLANK_ENTRY_SIZE
from ferrymq.store.queueread import (
    EntryRun,
    EntryScan,
    scan_entries,
    scan_entries_py,
    split_span,
    split_span_py,
)
from ferrymq.wire.records import BatchItem, pack_host

from ..wire.stored import split_records, stored
from .conftest import OpenStore

_ENTRY = struct.Struct(">qiq")
_CODES = (3, 5, 8)


@dataclass(frozen=True)
class Entry:
    log_offset: int
    size: int
    tags_code: int


def _entries(draw_list: list[tuple[str, int, int]]) -> list[Entry]:
    """Entries from (kind, size, code): messages back to back, with gaps, fillers and zeros."""
    entries: list[Entry] = []
    position = 1000
    for kind, size, code in draw_list:
        if kind == "filler":
            entries.append(Entry(0, BLANK_ENTRY_SIZE, 0))
        elif kind == "zero":
            entries.append(Entry(0, 0, 0))
        else:
            position += 7 if kind == "gap" else 0  # another queue's record in between
            entries.append(Entry(position, size, code))
            position += size
    return entries


entry_lists = st.lists(
    st.tuples(
        st.sampled_from(["message", "message", "message", "gap", "filler", "zero"]),
        st.integers(1, 300),
        st.sampled_from(_CODES),
    ),
    max_size=60,
).map(_entries)
limits = st.fixed_dictionaries(
    {
        "max_chosen": st.integers(1, 70),
        "max_scan": st.integers(1, 70),
        "max_bytes": st.integers(1, 20_000),
        "used_bytes": st.integers(0, 5_000),
        "have_chosen": st.booleans(),
        "min_log_offset": st.sampled_from([0, 1000, 1500, 3000]),
        "codes": st.none() | st.frozensets(st.sampled_from(_CODES)),
        "span_bytes": st.sampled_from([1, 500, 1 << 20]),
    }
)


def _pack(entries: list[Entry]) -> bytes:
    return b"".join(_ENTRY.pack(e.log_offset, e.size, e.tags_code) for e in entries)


def _plain_choice(entries: list[Entry], limits: dict[str, object]) -> tuple[list[int], bool, int]:
    """The loop `Store.get` ran before: (chosen indexes, saw removed, scanned or -1 when full)."""
    chosen: list[int] = []
    used = limits["used_bytes"]
    scanned = 0
    saw_removed = False
    codes = limits["codes"]
    assert isinstance(used, int)
    assert isinstance(codes, frozenset | None)
    for i, e in enumerate(entries):
        if len(chosen) >= limits["max_chosen"] or scanned >= limits["max_scan"]:  # type: ignore[operator]
            break
        if (limits["have_chosen"] or chosen) and used + e.size > limits["max_bytes"]:  # type: ignore[operator]
            return chosen, saw_removed, -1
        scanned += 1
        if e.log_offset < 0 or e.size <= 0 or e.size == BLANK_ENTRY_SIZE:
            continue
        if e.log_offset < limits["min_log_offset"]:  # type: ignore[operator]
            saw_removed = True
            continue
        if codes is not None and e.tags_code not in codes:
            continue
        chosen.append(i)
        used += e.size
    return chosen, saw_removed, scanned


@given(entry_lists, limits)
def test_the_scan_chooses_what_the_plain_loop_chooses(
    entries: list[Entry], limits: dict[str, object]
) -> None:
    scan = scan_entries_py(_pack(entries), **limits)  # type: ignore[arg-type]
    chosen, saw_removed, scanned = _plain_choice(entries, limits)
    assert [run.first + k for run in scan.runs for k in range(run.count)] == chosen
    assert scan.chosen == len(chosen)
    assert scan.saw_removed == saw_removed
    assert scan.byte_limited == (scanned == -1)
    if scanned >= 0:
        assert scan.scanned == scanned
    assert scan.used_bytes == limits["used_bytes"] + sum(entries[i].size for i in chosen)  # type: ignore[operator]
    for run in scan.runs:  # a run is consecutive entries, back to back in the log
        members = entries[run.first : run.first + run.count]
        assert run.start_log_offset == members[0].log_offset
        assert run.end_log_offset == members[-1].log_offset + members[-1].size
        assert sum(e.size for e in members) == run.end_log_offset - run.start_log_offset
    for before, after in zip(scan.runs, scan.runs[1:], strict=False):
        joinable = (
            before.first + before.count == after.first
            and before.end_log_offset == after.start_log_offset
            and before.end_log_offset - before.start_log_offset < limits["span_bytes"]  # type: ignore[operator]
        )
        assert not joinable, "two runs that are one"


@pytest.mark.skipif(queueread._accel is None, reason="the C accelerator is not built")
@given(entry_lists, limits)
def test_c_scan_equals_python_scan(entries: list[Entry], limits: dict[str, object]) -> None:
    data = _pack(entries)
    expected = scan_entries_py(data, **limits)  # type: ignore[arg-type]
    assert scan_entries(data, **limits) == expected  # type: ignore[arg-type]


def _span(bodies: list[bytes]) -> tuple[bytes, bytes]:
    """Records back to back from log offset 0, and their consume-queue entries."""
    data = stored([BatchItem.of(b, {"TAGS": "t"}) for b in bodies])
    sizes = [len(r) for r in split_records(data)]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return data, _pack([Entry(o, s, 0) for o, s in zip(offsets, sizes, strict=True)])


@given(
    st.lists(st.binary(max_size=80), min_size=1, max_size=12),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_split_stops_at_a_corrupt_record_and_c_equals_python(
    bodies: list[bytes], require: bool, check: bool, data: st.DataObject
) -> None:
    span, entries = _span(bodies)
    count = len(bodies)
    first = data.draw(st.integers(0, count - 1))
    run = EntryRun(0, 0, first, count - first)
    start = _ENTRY.unpack_from(entries, first * 20)[0]
    flips = data.draw(st.lists(st.integers(start, len(span) - 1), max_size=2, unique=True))
    broken = bytearray(span)
    for at in flips:
        broken[at] ^= 0x40
    piece = bytes(broken[start:])
    expected = split_span_py(piece, entries, run, check_crc=check, require_record_crc=require)
    assert split_span(piece, entries, run, check_crc=check, require_record_crc=require) == expected
    records, bad = expected
    if not flips or not check:
        assert bad == -1
    elif require:  # (without, a flip that spoils the CRC property's format leaves body CRCs only)
        assert bad >= 0, "a flipped bit went unnoticed"
    sizes = [_ENTRY.unpack_from(entries, i * 20)[1] for i in range(first, count)]
    assert [len(r) for r in records] == sizes[: len(records)]
    assert b"".join(records) == piece[: sum(len(r) for r in records)]


def test_split_refuses_a_span_shorter_than_its_entries() -> None:
    span, entries = _span([b"a", b"b"])
    run = EntryRun(0, len(span), 0, 2)
    for split in (split_span, split_span_py):
        with pytest.raises(ValueError, match="shorter"):
            split(span[:-1], entries, run, check_crc=True, require_record_crc=True)
        with pytest.raises(ValueError, match="not within"):
            split(span, entries, EntryRun(0, 0, 1, 2), check_crc=True, require_record_crc=True)


def test_without_the_accelerator_the_python_references_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    span, entries = _span([b"x", b"y", b"z"])
    monkeypatch.setattr(queueread, "_accel", None)
    scan = scan_entries(
        entries,
        max_chosen=10,
        max_scan=10,
        max_bytes=1 << 20,
        used_bytes=0,
        have_chosen=False,
        min_log_offset=0,
        codes=None,
        span_bytes=1 << 20,
    )
    assert scan == EntryScan(3, 3, len(span), False, False, [EntryRun(0, len(span), 0, 3)])
    records, bad = split_span(span, entries, scan.runs[0], check_crc=True, require_record_crc=True)
    assert (b"".join(records), bad) == (span, -1)


def test_a_corrupt_record_in_a_span_is_named_by_its_log_offset(open_store: OpenStore) -> None:
    store = open_store()
    host = pack_host("127.0.0.1", 1)
    log_offsets = store.put(
        "T",
        0,
        [BatchItem.of(b"payload-%d" % i, {}) for i in range(5)],
        born_host=host,
        born_timestamp_ms=1,
    ).log_offsets
    # later records of another queue, in the next segment: those five are no longer among the
    # bytes the commit log keeps in memory (its tail), so they are read from the file
    while store.max_log_offset < store.config.commitlog_segment_bytes:
        store.put("Other", 0, [BatchItem.of(b"x" * 1000, {})], born_host=host, born_timestamp_ms=1)
    segment = store.config.commitlog_path / f"{0:020d}"
    with segment.open("r+b") as f:
        raw = f.read(log_offsets[-1] + 200)
        f.seek(raw.index(b"payload-3"))
        f.write(b"X")
    with pytest.raises(CorruptRecordError) as caught:
        store.get("T", 0, 0, 10)
    assert caught.value.log_offset == log_offsets[3]
    assert len(store.get("T", 0, 0, 3).records) == 3  # the records before it are served
