"""Fixed-size segment files and the chain of them (RocketMQ `MappedFile`, `MappedFileQueue`).

A segment is one file of exactly `segment_bytes` bytes, named by the 20-digit zero-padded offset of
its first byte (`00000000001073741824`). Segments of one chain are contiguous: each starts where
the previous one ends. Files are created sparse (ftruncate) so a never-written tail reads as zeros,
written with pwrite and read with pread; there is no mmap, so a full disk is an `OSError` on a
write, never a SIGBUS.

Rules:
1. One owner thread writes. A flusher thread may sync concurrently: `sync_handles` hands it
   duplicated file descriptors, so a segment the owner deletes can never be synced through a
   reused descriptor.
2. `write_pos` is the end of the written data inside a segment; recovery sets it.
3. Truncation zeroes the cut bytes and syncs them, so bytes past a cut can never be read back as
   data after a later crash.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ferrymq.errors import StoreError
from ferrymq.store.atomic import fsync_dir

__all__ = ["Segment", "SegmentChain", "segment_name"]

log = logging.getLogger(__name__)

_NAME: Final = re.compile(r"\d{20}")
_ZERO_CHUNK: Final = 1 << 20


def segment_name(start_offset: int) -> str:
    """The file name of a segment starting at `start_offset` (`UtilAll.offset2FileName`)."""
    return f"{start_offset:020d}"


class Segment:
    """One fixed-size file of a chain; offsets given to its methods are relative to its start."""

    __slots__ = ("_fd", "path", "size", "start_offset", "synced_pos", "write_pos")

    def __init__(self, path: Path, start_offset: int, size: int, fd: int) -> None:
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self._fd = fd
        self.write_pos = 0
        self.synced_pos = 0

    @classmethod
    def open(cls, path: Path, start_offset: int, size: int) -> Segment:
        """Open or create the segment file, extending a short file with zeros."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual > size:
                raise StoreError(
                    f"{path} is {actual} bytes, more than the configured segment size {size}"
                )
            if actual < size:
                if actual:
                    log.warning(
                        "segment %s is %d bytes short; extending with zeros", path, size - actual
                    )
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, start_offset, size, fd)

    @property
    def end_offset(self) -> int:
        """Absolute offset just past the written data."""
        return self.start_offset + self.write_pos

    @property
    def remaining(self) -> int:
        """Bytes left after the written data."""
        return self.size - self.write_pos

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write `data` at relative `pos` and advance `write_pos` past it."""
        if pos < 0 or pos + len(data) > self.size:
            raise StoreError(f"write of {len(data)} bytes at {pos} overruns segment {self.path}")
        self._pwrite_all(data, pos)
        end = pos + len(data)
        if end > self.write_pos:
            self.write_pos = end

    def read(self, pos: int, length: int) -> bytes:
        """Read up to `length` bytes at relative `pos` (fewer at the end of the file)."""
        length = max(0, min(length, self.size - pos))
        if length == 0:
            return b""
        data = os.pread(self._fd, length, pos)
        while len(data) < length:
            more = os.pread(self._fd, length - len(data), pos + len(data))
            if not more:
                break
            data += more
        return data

    def zero(self, pos: int, end: int) -> None:
        """Make [pos, end) read as zeros, writing only where the file holds data (not holes)."""
        at = pos
        while at < end:
            try:
                at = os.lseek(self._fd, at, os.SEEK_DATA)
                hole = os.lseek(self._fd, at, os.SEEK_HOLE)
            except OSError:  # ENXIO: nothing but a hole from here
                return
            stop = min(hole, end)
            while at < stop:
                length = min(_ZERO_CHUNK, stop - at)
                self._pwrite_all(bytes(length), at)
                at += length

    def _pwrite_all(self, data: bytes | bytearray | memoryview, at: int) -> None:
        written = os.pwrite(self._fd, data, at)
        if written == len(data):  # the usual case: one call wrote it all
            return
        view = memoryview(data)[written:]
        at += written
        while view:
            written = os.pwrite(self._fd, view, at)
            view = view[written:]
            at += written

    def has_data_from(self, pos: int) -> bool:
        """Whether any byte at or after relative `pos` is non-zero (holes are skipped)."""
        while pos < self.size:
            try:
                pos = os.lseek(self._fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole remains
                return False
            chunk = self.read(pos, _ZERO_CHUNK * 4)
            if not chunk:
                return False
            if chunk.strip(b"\x00"):
                return True
            pos += len(chunk)
        return False

    def sync(self) -> None:
        """Make everything written so far durable."""
        os.fdatasync(self._fd)
        self.synced_pos = self.write_pos

    def dup_fd(self) -> int:
        """A duplicate descriptor the flusher can sync and close on its own."""
        return os.dup(self._fd)

    def close(self) -> None:
        """Close the file; the segment must not be used afterwards."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentChain:
    """The contiguous segments of one log (the commit log or one consume queue)."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        if segment_bytes <= 0:
            raise StoreError(f"segment size must be positive, not {segment_bytes}")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        self._lock = threading.Lock()  # guards the list against the flusher's snapshots

    def load(self) -> None:
        """Open the existing segment files; they must be contiguous."""
        if not self.directory.exists():
            return
        names = sorted(p.name for p in self.directory.iterdir() if _NAME.fullmatch(p.name))
        segments: list[Segment] = []
        for name in names:
            start = int(name)
            if segments and start != segments[-1].start_offset + self.segment_bytes:
                for segment in segments:
                    segment.close()
                raise StoreError(
                    f"{self.directory}: segment {name} does not follow "
                    f"{segment_name(segments[-1].start_offset)} (segment size {self.segment_bytes})"
                )
            segment = Segment.open(self.directory / name, start, self.segment_bytes)
            segment.write_pos = segment.synced_pos = self.segment_bytes
            segments.append(segment)
        with self._lock:
            self.segments = segments
            self._starts = [s.start_offset for s in segments]

    @property
    def is_empty(self) -> bool:
        """Whether the chain has no segment."""
        return not self.segments

    @property
    def last(self) -> Segment | None:
        """The segment being written, if any."""
        return self.segments[-1] if self.segments else None

    @property
    def min_offset(self) -> int:
        """Start of the first segment (0 when empty)."""
        return self.segments[0].start_offset if self.segments else 0

    @property
    def max_offset(self) -> int:
        """End of the written data."""
        last = self.last
        return last.end_offset if last else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding absolute `offset`, or None."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        segment = self.segments[i]
        return segment if offset < segment.start_offset + segment.size else None

    def create(
        self, start_offset: int, take_spare: Callable[[Path], bool] | None = None
    ) -> Segment:
        """Append a new empty segment starting at `start_offset`.

        `take_spare(path)`, when given, may move a prepared zero-filled file of the segment size
        to `path` (and say so); otherwise the file is created sparse.
        """
        if self.segments and start_offset != self.segments[-1].start_offset + self.segment_bytes:
            raise StoreError(f"new segment at {start_offset} would not be contiguous")
        if start_offset % self.segment_bytes:
            raise StoreError(f"segment start {start_offset} is not a multiple of the segment size")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / segment_name(start_offset)
        if take_spare is not None and not path.exists():
            take_spare(path)
        segment = Segment.open(path, start_offset, self.segment_bytes)
        fsync_dir(self.directory)
        with self._lock:
            self.segments.append(segment)
            self._starts.append(start_offset)
        return segment

    def read(self, offset: int, length: int) -> bytes:
        """Read up to `length` bytes at `offset`, within one segment and below the written end."""
        segment = self.find(offset)
        if segment is None:
            return b""
        pos = offset - segment.start_offset
        return segment.read(pos, min(length, segment.write_pos - pos))

    def truncate(self, offset: int) -> None:
        """Cut everything at and after `offset`: zero it in its segment, delete later segments."""
        with self._lock:
            doomed = [s for s in self.segments if s.start_offset >= offset]
            keep = [s for s in self.segments if s not in doomed]
            self.segments = keep
            self._starts = [s.start_offset for s in keep]
        for gone in doomed:
            gone.delete()
        if doomed:
            fsync_dir(self.directory)
        segment = self.find(offset)
        if segment is not None:
            pos = offset - segment.start_offset
            if segment.write_pos > pos:
                segment.zero(pos, segment.write_pos)
                segment.sync()
            segment.write_pos = pos
            segment.synced_pos = min(segment.synced_pos, pos)

    def delete_first(self) -> Segment:
        """Remove the oldest segment (retention); it must not be the last one."""
        with self._lock:
            if len(self.segments) < 2:
                raise StoreError("refusing to delete the segment being written")
            segment = self.segments.pop(0)
            self._starts.pop(0)
        segment.delete()
        return segment

    def sync_handles(self, from_offset: int) -> list[tuple[int, int]]:
        """(dup'd fd, end offset) of each segment with data at or after `from_offset`."""
        with self._lock:
            return [
                (s.dup_fd(), s.end_offset)
                for s in self.segments
                if s.start_offset + s.size > from_offset and s.write_pos > 0
            ]

    def close(self) -> None:
        """Close every segment."""
        with self._lock:
            for segment in self.segments:
                segment.close()
