"""A broker's fenced topics: each one's fence, read from its stored records (`fence.py`).

Two views per fenced topic, both the reader state of `fence.FenceLog`:
- committed (every role): what the topic's visible records (at or below the confirm offset)
  say, caught up on demand. It answers GET_FENCE on a slave, and it is what retention keeps:
  `keep_log_offset` names where the earliest committed live tail starts, and the store deletes
  no segment holding a byte at or after it (`Store.keep_log_offset`).
- current (a master only): the committed view plus the records this master holds above the
  confirm offset, then every record it appends. The send path decides on it (`send.py`), with
  no await between the decision and the append, so a master's view includes its own
  uncommitted appends. It is rebuilt whenever this broker becomes master (its log is the
  group's from then on, held records included, as `metalog.MetadataFollower.apply_held`
  does) and dropped when it stops being one.

A view is rebuilt from scratch (`fence.rebuild`) when it starts, when its queue shrank under it
(the topic was deleted and created again) or when records it had not read expired; otherwise it
steps through the new records only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from ferrymq.broker.fence import (
    FenceLog,
    FenceRecord,
    InvalidFenceRecordError,
    is_fenced,
    parse_record,
    rebuild,
)
from ferrymq.broker.metadata import TopicTable
from ferrymq.errors import ProtocolError, StoreError
from ferrymq.store.store import GetStatus, Store
from ferrymq.wire.records import MessageRecord, decode_record

__all__ = ["FencedTopics", "fence_record_of"]

log = logging.getLogger(__name__)

_READ_BATCH: Final = 256
_READ_BYTES: Final = 16 * 1024 * 1024


def fence_record_of(record: MessageRecord) -> FenceRecord | None:
    """The fence properties of a stored record; None (logged) when it has none."""
    try:
        return parse_record(record.properties)
    except InvalidFenceRecordError as exc:
        log.error(
            "%s queue offset %d (log offset %d) is not a fenced record, skipped: %s",
            record.topic,
            record.queue_offset,
            record.log_offset,
            exc,
        )
        return None


@dataclass(slots=True)
class _Committed:
    log: FenceLog
    next_queue_offset: int
    """The next visible record to read."""


class FencedTopics:
    """The fences of one broker's fenced topics (all on queue 0: a fenced topic has one)."""

    def __init__(self, store: Store, topics: TopicTable) -> None:
        self._store = store
        self._topics = topics
        self._committed: dict[str, _Committed] = {}
        self._current: dict[str, FenceLog] | None = None
        """None: this broker is not a master."""

    def names(self) -> list[str]:
        """Every fenced topic, sorted."""
        return sorted(name for name, config in self._topics.configs.items() if is_fenced(config))

    # ------------------------------------------------------------------ reads

    def stored(self, topic: str, from_queue_offset: int) -> list[tuple[MessageRecord, FenceRecord]]:
        """The fenced records of a topic from a queue offset: visible ones, then held ones."""
        found = self._visible(topic, from_queue_offset, self._store.max_queue_offset(topic, 0))
        for raw in self._store.held_records(topic, 0):
            record = decode_record(raw)
            fenced = fence_record_of(record)
            if record.queue_offset >= from_queue_offset and fenced is not None:
                found.append((record, fenced))
        return found

    def _visible(
        self, topic: str, from_queue_offset: int, to_queue_offset: int
    ) -> list[tuple[MessageRecord, FenceRecord]]:
        found: list[tuple[MessageRecord, FenceRecord]] = []
        queue_offset = from_queue_offset
        while queue_offset < to_queue_offset:
            result = self._store.get(
                topic,
                0,
                queue_offset,
                min(_READ_BATCH, to_queue_offset - queue_offset),
                max_bytes=_READ_BYTES,
            )
            if result.status is GetStatus.OFFSET_TOO_SMALL:
                queue_offset = result.next_queue_offset
                continue
            for raw in result.records:
                try:
                    record = decode_record(raw)
                except ProtocolError as exc:
                    log.error("a record of %s does not decode, skipped: %s", topic, exc)
                    continue
                fenced = fence_record_of(record)
                if fenced is not None:
                    found.append((record, fenced))
            if result.next_queue_offset <= queue_offset:
                break
            queue_offset = result.next_queue_offset
        return found

    def committed(self, topic: str) -> FenceLog:
        """The fence the topic's committed records hold (caught up now)."""
        store = self._store
        high = store.max_queue_offset(topic, 0)
        low = store.min_queue_offset(topic, 0)
        view = self._committed.get(topic)
        if view is None or high < view.next_queue_offset or low > view.next_queue_offset:
            records = self._visible(topic, low, high)
            view = _Committed(rebuild([(r.queue_offset, f) for r, f in records]), max(high, low))
            self._committed[topic] = view
        elif high > view.next_queue_offset:
            for record, fenced in self._visible(topic, view.next_queue_offset, high):
                view.log = view.log.step(record.queue_offset, fenced)
            view.next_queue_offset = high
        return view.log

    def keep_log_offset(self) -> int | None:
        """Where the earliest committed live tail of any fenced topic starts (the store's guard).

        None when no fenced topic holds a record.
        """
        store = self._store
        keep: int | None = None
        for topic in self.names():
            try:
                start = self.committed(topic).live_start_queue_offset
            except StoreError as exc:  # never fail open: keep every segment
                log.error("cannot read fenced topic %s, retention deletes nothing: %s", topic, exc)
                return store.min_log_offset
            log_offset = store.log_offset_of(topic, 0, start)
            if log_offset is None:
                if store.max_queue_offset(topic, 0) > start:
                    # the live tail's first record is unreadable: keep everything of the topic
                    log_offset = self._first_log_offset(topic)
                else:
                    continue
            keep = log_offset if keep is None else min(keep, log_offset)
        return keep

    def _first_log_offset(self, topic: str) -> int:
        store = self._store
        low = store.min_queue_offset(topic, 0)
        found = store.log_offset_of(topic, 0, low)
        return store.min_log_offset if found is None else found

    # ------------------------------------------------------------------ the master's view

    @property
    def is_master(self) -> bool:
        """Whether this broker keeps current views (it is a master)."""
        return self._current is not None

    def become_master(self) -> None:
        """Rebuild every fenced topic's view from this log, held records included."""
        self._current = {}
        for topic in self.names():
            fence_log = self.current(topic)
            log.info(
                "fenced topic %s: epoch %d held by %r, live tail from queue offset %d",
                topic,
                fence_log.fence.epoch,
                fence_log.fence.writer,
                fence_log.live_start_queue_offset,
            )

    def stop_master(self) -> None:
        """Drop the current views (this broker is no longer the master)."""
        self._current = None

    def current(self, topic: str) -> FenceLog:
        """A master's view of a fenced topic: what decides its next record."""
        current = self._current
        if current is None:
            return self.committed(topic)
        found = current.get(topic)
        if found is None:
            found = self.committed(topic)
            for record, fenced in self.stored(topic, self._store.max_queue_offset(topic, 0)):
                found = found.step(record.queue_offset, fenced)
            current[topic] = found
        return found

    def appended(self, topic: str, queue_offset: int, record: FenceRecord) -> None:
        """A master stored `record` at `queue_offset` (an accepted send, or a copy)."""
        if self._current is not None:
            self._current[topic] = self.current(topic).step(queue_offset, record)

    def forget(self, topic: str) -> None:
        """The topic was deleted: its views go."""
        self._committed.pop(topic, None)
        if self._current is not None:
            self._current.pop(topic, None)
