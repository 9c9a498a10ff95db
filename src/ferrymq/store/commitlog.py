"""The commit log: every message of every queue, appended in RocketMQ's record layout.

Spec: reference/rocketmq-controller-spec.md sections 7.1-7.3. Records are placed by
`reserve` then `write`: the caller encodes records with the log offset `reserve` returned, so the
stored bytes carry their own position. A record never straddles two segments: when it does not fit
(it must leave room for an 8-byte blank), the segment is closed with a blank record
(`int32 remaining, int32 BLANK_MAGIC`) and the log rolls to the next one.

`scan` walks stored bytes and validates every record (magic, size, body CRC, stored log offset
equal to its position); recovery and slave replay use it.

The last bytes written (up to `_RECENT_MAX`) are also kept in memory: reads of the log's tail,
which is what a master pushes to its slaves and what a caught-up consumer pulls, are served from
there without a read syscall.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ferrymq.errors import MessageTooLargeError, ProtocolError, StoreError
from ferrymq.store.prepare import SegmentPreparer
from ferrymq.store.segment import Segment, SegmentChain
from ferrymq.wire.records import (
    BLANK_MAGIC,
    BLANK_RECORD_BYTES,
    RecordInfo,
    record_info,
    record_infos,
)

__all__ = ["CommitLog", "ScanResult"]

_BLANK: Final = struct.Struct(">ii")
_SCAN_CHUNK: Final = 4 * 1024 * 1024
_NEVER: Final = 1 << 63
_RECENT_MAX: Final = 512 * 1024
"""At most this many of the last written bytes are kept for reads (`_RECENT_KEEP` after a cut)."""
_RECENT_KEEP: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Where a scan stopped and why."""

    end_log_offset: int
    """Just past the last valid record (or blank)."""
    corruption: str | None
    """None when the scan ended on zeros (a clean end); else what was wrong at `end_log_offset`."""
    records: int


class CommitLog:
    """Segments of records; one owner writes, readers are served from the same files."""

    def __init__(
        self, directory: Path, segment_bytes: int, preparer: SegmentPreparer | None = None
    ) -> None:
        self.chain = SegmentChain(directory, segment_bytes)
        self.write_offset = 0
        """The log offset the next record goes to."""
        self._recent = bytearray()
        self._recent_at = 0
        """The log offset of `_recent[0]`. Reads use `_recent` only while it ends at
        `write_offset` (anything that moves the end otherwise, a blank or a recovery, leaves it
        behind until the next write starts it anew)."""
        self.preparer = preparer
        """Makes segments ahead of need (`segment_fill`), or None: sparse ones."""
        self._spare_at = _NEVER
        """The log offset at which the next spare segment is requested (half the last one)."""

    @property
    def segment_bytes(self) -> int:
        """The fixed size of every segment."""
        return self.chain.segment_bytes

    @property
    def min_offset(self) -> int:
        """The first log offset still stored."""
        return self.chain.min_offset if not self.chain.is_empty else self.write_offset

    def load(self) -> None:
        """Open the segment files; `recover` must then set the write offset.

        With a preparer, an empty log gets its first spare now (the caller waits for it), so
        even the first segment is a prepared one.
        """
        self.chain.load()
        self.write_offset = self.chain.max_offset
        if self.preparer is not None and not self.preparer.open(self.chain.directory):
            self.preparer = None
        if self.preparer is not None:
            if self.chain.is_empty:
                self.preparer.prepare_now()
            self._arm_spare()

    def _arm_spare(self) -> None:
        last = self.chain.last
        if self.preparer is None or last is None:
            self._spare_at = _NEVER
        else:
            self._spare_at = last.start_offset + last.size // 2

    def _segment_for_write(self) -> Segment:
        last = self.chain.last
        if last is None or self.write_offset >= last.start_offset + last.size:
            size = self.segment_bytes
            start = self.write_offset // size * size
            preparer = self.preparer
            if preparer is None:
                return self.chain.create(start)
            if self.chain.is_empty and not preparer.ready:
                preparer.prepare_now()  # the first segment, after a truncation to nothing
            segment = self.chain.create(start, preparer.take)
            self._arm_spare()
            return segment
        return last

    def reserve(self, length: int) -> int:
        """Return the log offset where `length` record bytes will be written.

        Rolls to a new segment, after writing a blank record, when the bytes do not fit in the
        current one with 8 bytes to spare.
        """
        if length + BLANK_RECORD_BYTES > self.segment_bytes:
            raise MessageTooLargeError(length, self.segment_bytes - BLANK_RECORD_BYTES)
        segment = self._segment_for_write()
        pos = self.write_offset - segment.start_offset
        if segment.write_pos != pos:
            raise StoreError(f"commit log write position {pos} disagrees with {segment.write_pos}")
        remaining = segment.size - pos
        if length + BLANK_RECORD_BYTES > remaining:
            segment.write(pos, _BLANK.pack(remaining, BLANK_MAGIC))
            segment.write_pos = segment.size
            self.write_offset = segment.start_offset + segment.size
            self._segment_for_write()
        return self.write_offset

    def write(self, log_offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write encoded records at `log_offset`, which `reserve` returned."""
        if log_offset != self.write_offset:
            raise StoreError(f"write at {log_offset}, but the log ends at {self.write_offset}")
        segment = self._segment_for_write()
        segment.write(log_offset - segment.start_offset, data)
        self.write_offset = log_offset + len(data)
        self._remember(log_offset, data)
        if self.write_offset >= self._spare_at:
            self._request_spare()

    def _remember(self, log_offset: int, data: bytes | bytearray | memoryview) -> None:
        """Keep what was just written at `log_offset` among the recent bytes."""
        recent = self._recent
        if self._recent_at + len(recent) != log_offset:  # not contiguous (a blank, a roll)
            recent.clear()
            self._recent_at = log_offset
        recent += data
        if len(recent) > _RECENT_MAX:
            cut = len(recent) - _RECENT_KEEP
            del recent[:cut]
            self._recent_at += cut

    def _request_spare(self) -> None:
        assert self.preparer is not None
        self._spare_at = _NEVER  # until the next segment is created
        self.preparer.request()

    def append_raw(self, log_offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write replicated bytes (records and blanks) at `log_offset`, within one segment."""
        if log_offset != self.write_offset:
            raise StoreError(
                f"replica bytes for {log_offset}, but the log ends at {self.write_offset}"
            )
        segment = self._segment_for_write()
        pos = log_offset - segment.start_offset
        if pos + len(data) > segment.size:
            raise StoreError(f"replica bytes at {log_offset} cross the end of a segment")
        segment.write(pos, data)
        self.write_offset = log_offset + len(data)
        self._remember(log_offset, data)
        if self.write_offset >= self._spare_at:
            self._request_spare()

    def read(self, log_offset: int, length: int) -> bytes:
        """Read up to `length` stored bytes at `log_offset`, never past a segment or the log end."""
        end = self.write_offset
        if log_offset < self.min_offset or log_offset >= end:
            return b""
        recent = self._recent
        at = log_offset - self._recent_at
        if at >= 0 and self._recent_at + len(recent) == end:
            # the tail, from memory; segments are `segment_bytes` apart from offset 0
            segment_end = log_offset - log_offset % self.segment_bytes + self.segment_bytes
            stop = min(log_offset + length, end, segment_end)
            return bytes(recent[at : at + stop - log_offset])
        return self.chain.read(log_offset, min(length, end - log_offset))

    def truncate(self, log_offset: int) -> None:
        """Cut the log at `log_offset`: later bytes are zeroed or deleted, durably."""
        self._recent.clear()
        self._recent_at = log_offset
        self.chain.truncate(log_offset)
        self.write_offset = log_offset
        self._arm_spare()

    def scan(
        self,
        from_offset: int,
        on_records: Callable[[list[RecordInfo]], None],
        *,
        check_crc: bool = True,
        require_record_crc: bool = True,
        until: int | None = None,
    ) -> ScanResult:
        """Validate and visit every record from `from_offset` to the end of the stored data.

        Stops at the first zero header (a clean end), the first invalid byte (corruption), or at
        `until` when given (a caller that knows where the bytes it wrote end).
        Records are handed to `on_records` in log order, a chunk at a time. The write offset is
        not changed; the caller truncates at `end_log_offset`.
        """
        batch: list[RecordInfo] = []
        try:
            return self._scan(from_offset, batch, on_records, check_crc, require_record_crc, until)
        finally:
            on_records(batch)

    def _scan(
        self,
        from_offset: int,
        batch: list[RecordInfo],
        on_records: Callable[[list[RecordInfo]], None],
        check_crc: bool,
        require_record_crc: bool,
        until: int | None,
    ) -> ScanResult:
        pos = from_offset
        records = 0
        want = _SCAN_CHUNK
        while True:
            if until is not None and pos >= until:
                return ScanResult(pos, None, records)
            segment = self.chain.find(pos)
            if segment is None:
                return ScanResult(pos, None, records)
            base = pos - segment.start_offset
            chunk = segment.read(base, want if until is None else min(want, until - pos))
            want = _SCAN_CHUNK
            i = 0
            while base + i < segment.size:
                here = segment.start_offset + base + i
                if segment.size - (base + i) < BLANK_RECORD_BYTES:
                    return ScanResult(
                        here, "no room for a blank record at the segment end", records
                    )
                if i + BLANK_RECORD_BYTES > len(chunk):
                    break
                total, magic = _BLANK.unpack_from(chunk, i)
                if total == 0 and magic == 0:
                    return ScanResult(here, None, records)
                if magic == BLANK_MAGIC:
                    if total != segment.size - (base + i):
                        return ScanResult(
                            here, f"blank record of {total} bytes mid-segment", records
                        )
                    i += total
                    break
                if total <= 0 or base + i + total > segment.size:
                    return ScanResult(
                        here, f"record size {total} does not fit the segment", records
                    )
                if i + total > len(chunk):
                    want = max(_SCAN_CHUNK, total)
                    break
                # the records that follow, as long as they are whole and valid, in one call;
                # the per-record checks below take whatever it stops at
                found, stop = record_infos(
                    chunk,
                    i,
                    min(len(chunk), segment.size - base),
                    check_crc=check_crc,
                    require_record_crc=require_record_crc,
                    log_offset=here,
                )
                if found:
                    batch += found
                    records += len(found)
                    i = stop
                    continue
                try:
                    info = record_info(
                        chunk, i, check_crc=check_crc, require_record_crc=require_record_crc
                    )
                except ProtocolError as exc:
                    return ScanResult(here, str(exc), records)
                if info.log_offset != here:
                    return ScanResult(
                        here, f"record stores log offset {info.log_offset} at {here}", records
                    )
                batch.append(info)
                records += 1
                i += total
            pos = segment.start_offset + base + i
            if len(batch) >= 1024:
                on_records(batch[:])
                batch.clear()

    def close(self) -> None:
        """Stop preparing spares and close every segment file."""
        if self.preparer is not None:
            self.preparer.close()
        self.chain.close()
