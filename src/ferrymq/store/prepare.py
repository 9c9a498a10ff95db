"""Commit-log segments made ahead of need: allocated or zero-filled spare files.

RocketMQ's `AllocateMappedFileService` (the next file created before it is needed) with its warm
mapped files (`warmMapedFileEnable`), as one spare file.

A segment created sparse (ftruncate) gets its disk blocks only when data lands in it. Each write
into it then makes the filesystem reserve blocks page by page (ext4 delayed allocation), and on
ext4 and XFS every fdatasync after an append also commits a journal transaction for the
allocation. Two ways to move that off the append path (`SegmentFill`):

- ALLOCATED: `posix_fallocate` the spare (unwritten extents, no data written). A 64 KiB write
  into it costs 7.6 us against 13 on a sparse file on this project's test VM; the extents are
  converted to written ones at writeback, off the append path. What async-flush brokers use.
- ZEROED: write zeros over the whole spare and sync them. An fdatasync after an append then only
  writes the data: half the time of a 64 KiB write+fdatasync on the test VM (455 to 190 us;
  `docs/benchmarks.md`), the way PostgreSQL zero-fills its WAL segments (`wal_init_zero`). Costs
  one write of zeros per segment, so only sync-flush brokers use it.

Writes into either cannot fail for lack of disk space.

One spare file at a time, in a directory beside the commit log (`<commitlog>.prepared/`), so the
commit log directory holds segments only. A spare is position-independent (its bytes are zeros):
the commit log renames it to the name of whatever segment it needs next. Its name says how it was
prepared (`spare-allocated`, `spare-zeroed`); a store opened with another fill deletes it.

Rules:
1. A spare becomes visible under its final name only after it is fsynced, so a crash leaves
   either no spare, a complete one, or a `.partial` file that the next open deletes.
2. The background thread never blocks the writer: `take` returns False when no spare is ready,
   and the commit log creates that segment sparse instead.
3. An error while preparing (a full disk) is logged and leaves no file; the next roll tries again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Final

from ferrymq.store.atomic import fsync_dir
from ferrymq.store.config import SegmentFill

__all__ = ["SegmentPreparer"]

log = logging.getLogger(__name__)

_ZEROS: Final = bytes(1 << 20)
_SYNC_EVERY: Final = 32 << 20
"""Sync the spare every 32 MiB of zeros, so its writeback never lands on the disk in one burst."""


class SegmentPreparer:
    """Keeps one allocated or zero-filled, synced spare segment file ready for the commit log."""

    def __init__(self, directory: Path, segment_bytes: int, fill: SegmentFill) -> None:
        if fill is SegmentFill.SPARSE:
            raise ValueError("sparse segments need no preparer")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fill = fill
        self._spare = directory / f"spare-{fill.value}"
        self._partial = directory / f"spare-{fill.value}.partial"
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def open(self, segments_dir: Path) -> bool:
        """Delete half-done spares, spares of another fill and one of another size.

        Returns False when unusable: this directory is on another filesystem than
        `segments_dir`, where a spare could not be renamed into place (logged).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        segments_dir.mkdir(parents=True, exist_ok=True)
        if self.directory.stat().st_dev != segments_dir.stat().st_dev:
            log.warning(
                "%s is on another filesystem than %s: segments are created sparse",
                self.directory,
                segments_dir,
            )
            return False
        for other in self.directory.glob("spare*"):
            if other != self._spare and other.is_file():
                log.info("deleting %s (spares here are %s)", other, self._spare.name)
                other.unlink()
        try:
            size = self._spare.stat().st_size
        except FileNotFoundError:
            return True
        if size != self.segment_bytes:
            log.info(
                "deleting a spare segment of %d bytes (segments are %d)", size, self.segment_bytes
            )
            self._spare.unlink()
        return True

    @property
    def ready(self) -> bool:
        """Whether a spare is ready to take."""
        return self._spare.exists()

    def request(self) -> None:
        """Start preparing a spare in the background unless one is ready or under way."""
        with self._lock:
            if self._stop.is_set() or self._spare.exists():
                return
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._prepare, name="ferrymq-segment-preparer", daemon=True
            )
            self._thread.start()

    def prepare_now(self) -> None:
        """Prepare a spare in the caller's thread (the first segment of an empty log)."""
        self.wait()
        if not self._spare.exists():
            self._prepare()

    def wait(self) -> None:
        """Wait for a preparation under way to finish."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def take(self, target: Path) -> bool:
        """Move the ready spare to `target` (a new segment's path); False when none is ready."""
        with self._lock:
            try:
                os.rename(self._spare, target)
            except FileNotFoundError:
                return False
        return True

    def close(self) -> None:
        """Stop a preparation under way (its partial file is deleted) and wait for the thread."""
        self._stop.set()
        self.wait()

    def _prepare(self) -> None:
        started = time.monotonic()
        try:
            fd = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                finished = self._fill(fd) if self.fill is SegmentFill.ZEROED else self._allocate(fd)
            finally:
                os.close(fd)
            if not finished:
                self._partial.unlink(missing_ok=True)
                return
            with self._lock:
                os.rename(self._partial, self._spare)
            fsync_dir(self.directory)
        except OSError as exc:
            log.warning("could not prepare a spare commit-log segment: %s", exc)
            with contextlib.suppress(OSError):
                self._partial.unlink(missing_ok=True)
            return
        log.info(
            "prepared a spare segment (%s) of %d bytes in %.2f s",
            self.fill.value,
            self.segment_bytes,
            time.monotonic() - started,
        )

    def _allocate(self, fd: int) -> bool:
        """Allocate the whole file's blocks, unwritten (they read as zeros), and sync that."""
        os.posix_fallocate(fd, 0, self.segment_bytes)
        os.fdatasync(fd)
        return not self._stop.is_set()

    def _fill(self, fd: int) -> bool:
        """Write and sync zeros over the whole file; False when told to stop first."""
        position = 0
        unsynced = 0
        while position < self.segment_bytes:
            if self._stop.is_set():
                return False
            length = min(len(_ZEROS), self.segment_bytes - position)
            written = os.pwrite(fd, memoryview(_ZEROS)[:length], position)
            position += written
            unsynced += written
            if unsynced >= _SYNC_EVERY:
                os.fdatasync(fd)
                unsynced = 0
        os.fdatasync(fd)
        return True
