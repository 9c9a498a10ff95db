"""Consume queues: per topic and queue id, one 20-byte entry per message (RocketMQ `ConsumeQueue`).

Spec: reference/rocketmq-controller-spec.md section 7.2. Entry i (the message at queue offset i)
sits at byte i * 20 of the chain `consumequeue/<topic>/<queue_id>/`:
`int64 log_offset | int32 size | int64 tags_code`. An entry is valid when its log offset is >= 0 and
its size > 0; zeros mark the end (segments are sparse files).

The queue is derived data: the dispatcher rebuilds it from the commit log, so recovery may cut it
freely and re-dispatch. `min_queue_offset` moves forward when retention deletes the commit-log
bytes its first entries point to.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ferrymq.store.segment import SegmentChain

__all__ = ["BLANK_ENTRY_SIZE", "ENTRY_BYTES", "ConsumeQueue", "QueueEntry", "pack_entries"]

log = logging.getLogger(__name__)

ENTRY_BYTES: Final = 20
BLANK_ENTRY_SIZE: Final = 0x7FFFFFFF
"""Size of a filler entry (`fillPreBlank`): valid for recovery, never a message."""
_ENTRY: Final = struct.Struct(">qiq")
_FILLER: Final = _ENTRY.pack(0, BLANK_ENTRY_SIZE, 0)


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One consume-queue entry, with the queue offset it sits at."""

    queue_offset: int
    log_offset: int
    size: int
    tags_code: int

    @property
    def is_message(self) -> bool:
        """Whether the entry points at a message (not a filler or a zero entry)."""
        return _is_valid(self.log_offset, self.size) and self.size != BLANK_ENTRY_SIZE


def pack_entries(entries: list[tuple[int, int, int]]) -> bytes:
    """Pack (log_offset, size, tags_code) triples as consecutive entries."""
    return b"".join(_ENTRY.pack(*entry) for entry in entries)


def _is_valid(log_offset: int, size: int) -> bool:
    return log_offset >= 0 and size > 0


class ConsumeQueue:
    """The consume queue of one (topic, queue id)."""

    def __init__(
        self, directory: Path, topic: str, queue_id: int, entries_per_segment: int
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.chain = SegmentChain(directory, entries_per_segment * ENTRY_BYTES)
        self.min_queue_offset = 0
        self.max_queue_offset = 0
        """The queue offset the next entry goes to (= number of entries ever written)."""
        self.next_queue_offset = 0
        """The queue offset the next appended message takes; ahead of `max_queue_offset` while
        appended records wait for dispatch (RocketMQ's `topicQueueTable`)."""

    @property
    def max_log_offset(self) -> int:
        """Log offset just past the record of the last entry (0 when empty)."""
        entry = self.entry(self.max_queue_offset - 1) if self.max_queue_offset else None
        return entry.log_offset + entry.size if entry else 0

    def load(self) -> None:
        """Open the segment files; the queue ends after its last non-zero entry.

        Entries are not validated here: after a clean shutdown they are all valid, and after a
        crash the store's recovery cuts them back to the last one it can verify
        (`truncate_log` with a check) and rebuilds the rest from the commit log.
        """
        self.chain.load()
        segments = self.chain.segments
        if not segments:
            return
        end_bytes = segments[0].start_offset
        for segment in reversed(segments):
            used = len(segment.read(0, segment.size).rstrip(b"\x00"))
            if used:
                end_bytes = segment.start_offset + used + -used % ENTRY_BYTES
                break
        self.chain.truncate(end_bytes)
        self.max_queue_offset = self.next_queue_offset = end_bytes // ENTRY_BYTES
        self.min_queue_offset = self._first_valid(self.chain.min_offset // ENTRY_BYTES)

    def _first_valid(self, from_queue_offset: int, min_log_offset: int = 0) -> int:
        queue_offset = from_queue_offset
        while queue_offset < self.max_queue_offset:
            batch = self.entries(queue_offset, 1024)
            for entry in batch:
                if entry.is_message and entry.log_offset >= min_log_offset:
                    return entry.queue_offset
            if not batch:
                return self.max_queue_offset
            queue_offset = batch[-1].queue_offset + 1
        return self.max_queue_offset

    def put(self, queue_offset: int, packed: bytes) -> None:
        """Write packed entries starting at `queue_offset`.

        Entries below `max_queue_offset` are already there (recovery re-dispatches) and are
        skipped; a gap above it is filled with filler entries, as RocketMQ's `fillPreBlank`.
        """
        count = len(packed) // ENTRY_BYTES
        if queue_offset + count <= self.max_queue_offset:
            return
        if queue_offset < self.max_queue_offset:
            skip = self.max_queue_offset - queue_offset
            packed = packed[skip * ENTRY_BYTES :]
            queue_offset = self.max_queue_offset
        if self.chain.is_empty and queue_offset > 0:
            segment_entries = self.chain.segment_bytes // ENTRY_BYTES
            first = queue_offset // segment_entries * segment_entries
            self.min_queue_offset = queue_offset
            self.max_queue_offset = first
            packed = _FILLER * (queue_offset - first) + packed
            queue_offset = first
        elif queue_offset > self.max_queue_offset:
            log.warning(
                "%s/%d: gap from queue offset %d to %d filled with filler entries",
                self.topic,
                self.queue_id,
                self.max_queue_offset,
                queue_offset,
            )
            packed = _FILLER * (queue_offset - self.max_queue_offset) + packed
            queue_offset = self.max_queue_offset
        position = queue_offset * ENTRY_BYTES
        view = memoryview(packed)
        segment_bytes = self.chain.segment_bytes
        while view:
            segment = self.chain.find(position)
            if segment is None:
                segment = self.chain.create(position // segment_bytes * segment_bytes)
            rel = position - segment.start_offset
            length = min(len(view), segment.size - rel)
            segment.write(rel, view[:length])
            view = view[length:]
            position += length
        self.max_queue_offset = position // ENTRY_BYTES
        self.next_queue_offset = max(self.next_queue_offset, self.max_queue_offset)

    def entry_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """The stored bytes of up to `max_count` entries from `queue_offset`, within one segment."""
        if queue_offset < 0 or queue_offset >= self.max_queue_offset or max_count <= 0:
            return b""
        count = min(max_count, self.max_queue_offset - queue_offset)
        return self.chain.read(queue_offset * ENTRY_BYTES, count * ENTRY_BYTES)

    def entries(self, queue_offset: int, max_count: int) -> list[QueueEntry]:
        """Up to `max_count` entries from `queue_offset`, within one segment."""
        data = self.entry_bytes(queue_offset, max_count)
        return [
            QueueEntry(queue_offset + i, log_offset, size, tags_code)
            for i, (log_offset, size, tags_code) in enumerate(_ENTRY.iter_unpack(data))
        ]

    def entry(self, queue_offset: int) -> QueueEntry | None:
        """The entry at `queue_offset`, or None if there is none."""
        found = self.entries(queue_offset, 1)
        return found[0] if found else None

    def truncate_log(
        self, log_offset: int, is_genuine: Callable[[QueueEntry], bool] | None = None
    ) -> None:
        """Drop the entries whose records start at or after `log_offset` (a commit-log cut).

        Walks back from the end and keeps everything below the first entry that points below
        `log_offset` and, when `is_genuine` is given, passes it. After a crash the entries written
        since the last flush may be torn (zeros, or a half-written log offset), so recovery passes
        a check against the commit-log record the entry claims to index.
        """
        keep = self.max_queue_offset
        floor = self.chain.min_offset // ENTRY_BYTES
        while keep > floor:
            entry = self.entry(keep - 1)
            if (
                entry is not None
                and entry.is_message
                and entry.log_offset < log_offset
                and (is_genuine is None or is_genuine(entry))
            ):
                break
            keep -= 1
        if keep < self.max_queue_offset:
            log.info(
                "%s/%d: cut queue offsets %d..%d at log offset %d",
                self.topic,
                self.queue_id,
                keep,
                self.max_queue_offset,
                log_offset,
            )
            self.chain.truncate(keep * ENTRY_BYTES)
            self.max_queue_offset = self.next_queue_offset = keep
            self.min_queue_offset = self._first_valid(floor)

    def correct_min(self, min_log_offset: int) -> None:
        """Move `min_queue_offset` past entries whose records retention deleted."""
        self.min_queue_offset = self._first_valid(self.min_queue_offset, min_log_offset)

    def delete_expired(self, min_log_offset: int) -> int:
        """Delete whole segments whose records are all below `min_log_offset`; return the count."""
        deleted = 0
        segment_entries = self.chain.segment_bytes // ENTRY_BYTES
        while len(self.chain.segments) > 1:
            first = self.chain.segments[0]
            last_entry = self.entry(first.start_offset // ENTRY_BYTES + segment_entries - 1)
            if last_entry is None or last_entry.log_offset + last_entry.size > min_log_offset:
                break
            self.chain.delete_first()
            deleted += 1
        self.correct_min(min_log_offset)
        return deleted

    def search_time(
        self, timestamp_ms: int, store_timestamp_of: Callable[[int], int | None]
    ) -> int:
        """The first queue offset whose message was stored at or after `timestamp_ms`.

        Binary search over the queue; `store_timestamp_of(log_offset)` reads the commit log.
        Returns `max_queue_offset` when every message is older.
        """
        low, high = self.min_queue_offset, self.max_queue_offset
        while low < high:
            middle = (low + high) // 2
            entry = self.entry(middle)
            stored = store_timestamp_of(entry.log_offset) if entry else None
            if stored is None or stored < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def close(self) -> None:
        """Close the segment files."""
        self.chain.close()
