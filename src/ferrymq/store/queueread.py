"""The per-entry loops of reading a queue by queue offset (`Store.get`), in C when built.

A read walks consume-queue entries (`consumequeue.py`) and returns the records they point at.
Both loops run once per message, so the C accelerator (`ferrymq.wire.accel`) does them when it
is built; the functions here ending in `_py` are the references, and tests check that both give
the same answers:

- `scan_entries`: which entries of a chunk a read returns (messages only, none below the
  commit log's min offset, tags codes matched, within the count, scan and byte limits), grouped
  in runs of consecutive entries whose records lie back to back in the commit log, so a run is
  one commit-log read;
- `split_span`: a run's records cut out of that read by the entries' sizes, each CRC-checked.
"""

from __future__ import annotations

import struct
from collections.abc import Set
from dataclasses import dataclass
from types import ModuleType
from typing import Final

from ferrymq.store.consumequeue import BLANK_ENTRY_SIZE, ENTRY_BYTES
from ferrymq.wire.records import verify_record_crc_py

_accel: ModuleType | None
try:
    from ferrymq.wire import accel as _accel
except ImportError:  # built without a C compiler
    _accel = None

__all__ = [
    "EntryRun",
    "EntryScan",
    "entry_at",
    "scan_entries",
    "scan_entries_py",
    "split_span",
    "split_span_py",
]

_ENTRY: Final = struct.Struct(">qiq")


@dataclass(frozen=True, slots=True)
class EntryRun:
    """Chosen entries `[first, first + count)` of a chunk, whose records fill `[start, end)`."""

    start_log_offset: int
    end_log_offset: int
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class EntryScan:
    """What `scan_entries` chose from one chunk of entries."""

    scanned: int
    """Entries looked at: the next read starts this many entries further."""
    chosen: int
    used_bytes: int
    """Bytes of the records chosen so far (this chunk's added to `used_bytes` given)."""
    byte_limited: bool
    """The next message would have gone over `max_bytes`: the read is full."""
    saw_removed: bool
    """An entry pointed below the commit log's min offset (its segment was deleted)."""
    runs: list[EntryRun]


def scan_entries(
    entries: bytes,
    *,
    max_chosen: int,
    max_scan: int,
    max_bytes: int,
    used_bytes: int,
    have_chosen: bool,
    min_log_offset: int,
    codes: Set[int] | None,
    span_bytes: int,
) -> EntryScan:
    """Choose from a chunk of consume-queue entries (see `scan_entries_py`)."""
    if _accel is None or not (codes is None or isinstance(codes, set | frozenset)):
        return scan_entries_py(
            entries,
            max_chosen=max_chosen,
            max_scan=max_scan,
            max_bytes=max_bytes,
            used_bytes=used_bytes,
            have_chosen=have_chosen,
            min_log_offset=min_log_offset,
            codes=codes,
            span_bytes=span_bytes,
        )
    scanned, chosen, used, byte_limited, saw_removed, runs = _accel.scan_entries(
        entries,
        max_chosen,
        max_scan,
        max_bytes,
        used_bytes,
        have_chosen,
        min_log_offset,
        codes,
        span_bytes,
    )
    return EntryScan(
        scanned, chosen, used, bool(byte_limited), bool(saw_removed), [EntryRun(*r) for r in runs]
    )


def scan_entries_py(
    entries: bytes,
    *,
    max_chosen: int,
    max_scan: int,
    max_bytes: int,
    used_bytes: int,
    have_chosen: bool,
    min_log_offset: int,
    codes: Set[int] | None,
    span_bytes: int,
) -> EntryScan:
    """Walk the entries until `max_chosen` are chosen or `max_scan` looked at.

    An entry is chosen when it is a message (not a filler), at or above `min_log_offset`, and
    its tags code is in `codes` (None: any). The scan stops before an entry that would take the
    chosen records past `max_bytes`, unless nothing is chosen yet (the first record always
    fits). A run grows while its entries are consecutive, back to back in the log, and its
    bytes are below `span_bytes`.
    """
    scanned = chosen = 0
    used = used_bytes
    byte_limited = saw_removed = False
    runs: list[EntryRun] = []
    run: list[int] | None = None  # start, end, first, count
    for i, (log_offset, size, tags_code) in enumerate(_ENTRY.iter_unpack(entries)):
        if chosen >= max_chosen or scanned >= max_scan:
            break
        if (have_chosen or chosen) and used + size > max_bytes:
            byte_limited = True
            break
        scanned += 1
        if log_offset < 0 or size <= 0 or size == BLANK_ENTRY_SIZE:
            continue
        if log_offset < min_log_offset:
            saw_removed = True
            continue
        if codes is not None and tags_code not in codes:
            continue
        chosen += 1
        used += size
        if (
            run is not None
            and run[2] + run[3] == i
            and log_offset == run[1]
            and run[1] - run[0] < span_bytes
        ):
            run[1] += size
            run[3] += 1
            continue
        if run is not None:
            runs.append(EntryRun(*run))
        run = [log_offset, log_offset + size, i, 1]
    if run is not None:
        runs.append(EntryRun(*run))
    return EntryScan(scanned, chosen, used, byte_limited, saw_removed, runs)


def split_span(
    span: bytes, entries: bytes, run: EntryRun, *, check_crc: bool, require_record_crc: bool
) -> tuple[list[bytes], int]:
    """The run's records out of its commit-log span (see `split_span_py`)."""
    if _accel is None:
        return split_span_py(
            span, entries, run, check_crc=check_crc, require_record_crc=require_record_crc
        )
    result: tuple[list[bytes], int] = _accel.split_span(
        span, entries, run.first, run.count, check_crc, require_record_crc
    )
    return result


def split_span_py(
    span: bytes, entries: bytes, run: EntryRun, *, check_crc: bool, require_record_crc: bool
) -> tuple[list[bytes], int]:
    """Cut `span` (the bytes at the run's start) into its records by the entries' sizes.

    Returns the records and -1, or, with `check_crc`, the records before the first whose body
    or record CRC fails and that record's index in the run.

    Raises:
        ValueError: the run is not within `entries`, or `span` is shorter than its records.
    """
    if run.first < 0 or run.count < 0 or (run.first + run.count) * ENTRY_BYTES > len(entries):
        raise ValueError("the run is not within the entries")
    records: list[bytes] = []
    position = 0
    for k in range(run.count):
        _, size, _ = _ENTRY.unpack_from(entries, (run.first + k) * ENTRY_BYTES)
        if size <= 0 or position + size > len(span):
            raise ValueError("the span is shorter than the run's entries")
        record = span[position : position + size]
        if check_crc and not verify_record_crc_py(record, require_record_crc=require_record_crc):
            return records, k
        records.append(record)
        position += size
    return records, -1


def entry_at(entries: bytes, index: int) -> tuple[int, int]:
    """(log offset, size) of the chunk's entry `index`."""
    log_offset, size, _ = _ENTRY.unpack_from(entries, index * ENTRY_BYTES)
    return log_offset, size
