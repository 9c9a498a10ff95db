"""The storage engine facade: open (lock, recover), put, get, query, flush, retention, close.

Spec: reference/rocketmq-controller-spec.md sections 7.2-7.3 (`DefaultMessageStore`),
ARCHITECTURE.md section 5. The store is synchronous and has one owner thread (the broker's event
loop); the only other thread is the flusher, which syncs files and writes the checkpoint.

Rules:
1. One indexing path: every record reaches the consume queues and the key index through
   `_dispatch(RecordInfo)`, whether it was just appended, replicated from a master, or found by
   recovery. Appends build the `RecordInfo` from what they encoded; replay and recovery parse it
   from the stored bytes.
2. Recovery trusts nothing it has not checked: from the segment holding the checkpoint's safe
   offset it validates every record (magic, size, CRC, stored position) and cuts the log at the
   first failure. Bytes after a cut that are not zeros are moved to `quarantine/`, never deleted.
3. The abort file exists from open until a clean close, so a crash at any point, recovery
   included, makes the next open recover as after a crash.
4. A record whose CRC fails is never served: `get` raises `CorruptRecordError` instead.
5. With `confirm_gated`, records are indexed only once they end at or below the confirm offset
   (the replication high watermark, kept in the checkpoint), so no reader sees a byte above it;
   records above it wait in `_held`, in log order.
6. Truncation is crash-safe: the target offset is written to `truncating` before any byte is cut
   and removed after; an open that finds the file finishes the cut first.
7. A record is never dropped from indexing: when a consume-queue or index write fails (a full
   disk), the records wait in `_held` too and every later dispatch retries them, so a queue never
   gets a later entry past a missing one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Set
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Final

from ferrymq import testbugs
from ferrymq.errors import (
    CorruptRecordError,
    MessageTooLargeError,
    ProtocolError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
)
from ferrymq.store import ledger
from ferrymq.store.atomic import fsync_dir, read_file, write_atomic
from ferrymq.store.checkpoint import Checkpoint
from ferrymq.store.commitlog import CommitLog
from ferrymq.store.config import FlushDiskType, SegmentFill, StoreConfig
from ferrymq.store.consumequeue import ENTRY_BYTES, ConsumeQueue, QueueEntry, pack_entries
from ferrymq.store.flush import Flusher
from ferrymq.store.index import KeyIndex
from ferrymq.store.prepare import SegmentPreparer
from ferrymq.store.queueread import EntryRun, entry_at, scan_entries, split_span
from ferrymq.store.queues import QueueTable
from ferrymq.wire.properties import TAGS, UNIQ_KEY, index_properties, keys_of
from ferrymq.wire.records import (
    BLANK_MAGIC,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    BatchItem,
    MessageRecord,
    RecordInfo,
    decode_record,
    encode_records,
    measure_items,
    peek_record_size,
    record_info,
    record_infos,
    record_overhead,
    store_timestamp_of,
    tags_hash,
    topic_field,
    transaction_type,
    verify_record_crc,
)

__all__ = ["GetResult", "GetStatus", "PutResult", "RecoveryReport", "Store"]

log = logging.getLogger(__name__)

_NO_QUEUE_ENTRY: Final = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
_OVERHEADS_KEPT: Final = 4096
"""Topics whose record overhead `put` remembers (beyond it, computed every time)."""


@dataclass(slots=True)
class _PendingPut:
    """An append whose records are not indexed yet (not frozen: one per put, see RecordInfo)."""

    topic: str
    queue_id: int
    first_queue_offset: int
    assign: bool
    log_offset: int
    sizes: list[int]
    items: list[BatchItem]
    store_timestamp_ms: int
    sys_flag: int


_MAX_FILTER_SCAN: Final = 16_000
"""RocketMQ `maxFilterMessageCount`: entries one filtered pull may skip over."""
_TIMESTAMP_PROBE: Final = 76
_SPAN_BYTES: Final = 1024 * 1024
"""Adjacent records are read together up to this many bytes."""


@dataclass(slots=True)
class PutResult:
    """Where an append landed (not frozen: one per put, see RecordInfo)."""

    log_offsets: list[int]
    sizes: list[int]
    first_queue_offset: int
    """Queue offset of the first message (0 for prepared or rolled-back transactions)."""
    store_timestamp_ms: int

    @property
    def log_offset(self) -> int:
        """Log offset of the first record."""
        return self.log_offsets[0]

    @property
    def end_log_offset(self) -> int:
        """Log offset just past the last record: what a sync flush waits for."""
        return self.log_offsets[-1] + self.sizes[-1]


class GetStatus(Enum):
    """Outcome of a read by queue offset (RocketMQ `GetMessageStatus`)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(frozen=True, slots=True)
class GetResult:
    """Stored records read by queue offset, with the queue's bounds."""

    status: GetStatus
    next_queue_offset: int
    min_queue_offset: int
    max_queue_offset: int
    records: list[bytes] = field(default_factory=list)
    """Each record exactly as stored: a pull response body is their concatenation."""
    queue_offsets: list[int] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Bytes of all records."""
        return sum(len(record) for record in self.records)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What `Store.open` found and did."""

    after_crash: bool
    scan_from_log_offset: int
    end_log_offset: int
    records_checked: int
    cut_reason: str | None = None
    quarantined: list[Path] = field(default_factory=list)


def _partial_or_end(data: bytes, pos: int) -> bool:
    """Whether `data` ends at `pos` or holds only the start of one more record from there."""
    if pos + 8 > len(data):  # the end, or less than a record header
        return True
    try:
        total, magic = peek_record_size(data, pos)
    except ProtocolError:
        return False
    return magic != BLANK_MAGIC and pos + total > len(data)


class Store:
    """A message store in RocketMQ's formats; use `Store.open`."""

    def __init__(
        self,
        config: StoreConfig,
        clock_ms: Callable[[], int],
        on_dispatch: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.config = config
        self._clock_ms = clock_ms
        self._on_dispatch = on_dispatch
        root = config.root_dir
        preparer = (
            SegmentPreparer(
                config.spare_segment_path, config.commitlog_segment_bytes, config.segment_fill
            )
            if config.segment_fill is not SegmentFill.SPARSE
            else None
        )
        self.commitlog = CommitLog(config.commitlog_path, config.commitlog_segment_bytes, preparer)
        self.queues = QueueTable(root / "consumequeue", config.consume_queue_entries)
        self.index = KeyIndex(root / "index", config.index_slot_count, config.index_max_entries)
        self._checkpoint_path = root / "checkpoint"
        self._abort_path = root / "abort"
        self._truncating_path = root / "truncating"
        self._deleted_topics_path = root / "deletedTopics.json"
        self.deleted_topics: dict[str, int] = {}
        """Topic -> log offset: the topic was deleted there, and none of its records below it is
        indexed again (recovery re-reads the log; without this a deleted topic's queues came
        back at a restart, mixed with those of a topic created again under its name)."""
        self._lock_fd = -1
        self._closed = False
        self._dispatched_log_offset = 0
        self._last_store_timestamp_ms = 0
        self._dirty: dict[ConsumeQueue, int] = {}
        self._pending: list[_PendingPut] = []
        self._overheads: dict[tuple[str, int], int] = {}
        """`record_overhead` by topic and born-host width (the store host is this store's)."""
        self._replicated: list[RecordInfo] = []
        """Replica records `append_replica` validated and stored, in log order, not yet indexed."""
        self._held: list[RecordInfo] = []
        self.dispatch_error: OSError | None = None
        """Why the last dispatch failed (a full disk), until one succeeds; records stay held."""
        self._confirm_limit: int | None = None
        self._dirty_lock = threading.Lock()
        self._checkpoint = Checkpoint()
        self.recovery: RecoveryReport | None = None
        self._flusher: Flusher | None = None
        self.keep_log_offset: Callable[[], int | None] | None = None
        """Retention's guard (`delete_expired`): no segment holding a byte at or after the
        offset it names is deleted (a broker's fenced topics' committed live tails)."""

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        clock_ms: Callable[[], int] | None = None,
        on_dispatch: Callable[[str, int, int], None] | None = None,
    ) -> Store:
        """Lock the directory, recover, start the flusher.

        `on_dispatch(topic, queue_id, max_queue_offset)` hears about every queue that grew.
        """
        store = cls(config, clock_ms or (lambda: time.time_ns() // 1_000_000), on_dispatch)
        try:
            store._lock()
            store._recover()
        except BaseException:
            store._release()
            raise
        flusher = Flusher(
            sync_log=store._sync_log,
            sync_metadata=store._sync_metadata,
            flush_interval=config.flush_interval,
            metadata_interval=config.checkpoint_interval,
            flushed_log_offset=store.commitlog.write_offset,
        )
        store._flusher = flusher
        flusher.start()
        unfinished = read_file(store._truncating_path)
        if unfinished is not None:
            target = int(unfinished.decode())
            log.warning("finishing a truncation to log offset %d cut short by a crash", target)
            store.truncate(target)
        return store

    def _lock(self) -> None:
        root = self.config.root_dir
        root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreLockedError(f"{root} is in use by another process") from None

    def _release(self) -> None:
        self.commitlog.close()
        self.queues.close()
        self.index.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self) -> None:
        """Flush everything, write the checkpoint, remove the abort file, release the lock."""
        if self._closed:
            return
        self.dispatch()
        self._closed = True
        if self._flusher is not None:
            self._flusher.close()
        self._abort_path.unlink(missing_ok=True)
        fsync_dir(self.config.root_dir)
        self._release()

    def flush(self) -> None:
        """Sync the commit log, consume queues and index and write the checkpoint, now."""
        self._check_open()
        self.dispatch()
        assert self._flusher is not None
        self._flusher.flush_all()

    def abandon(self) -> None:
        """Stop as a crash would: no flush, no checkpoint, the abort file stays.

        For fault-injection tests that then cut files to what a power loss would leave.
        """
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            self._flusher.abandon()
        self._release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        after_crash = self._abort_path.exists()
        write_atomic(self._abort_path, str(os.getpid()).encode())
        checkpoint = Checkpoint.load(self._checkpoint_path)
        self._checkpoint = checkpoint or Checkpoint()
        if self.config.confirm_gated:
            self._confirm_limit = self._checkpoint.confirm_log_offset
        self.commitlog.load()
        self.queues.load()
        self.index.load()
        self._load_deleted_topics()
        segments = self.commitlog.chain.segments
        if not segments:
            end = max((q.max_log_offset for q in self.queues), default=0)
            self._finish_recovery(after_crash, end, end, 0, None, [])
            return
        safe = checkpoint.safe_log_offset if checkpoint else segments[0].start_offset
        if checkpoint is None:
            log.warning("no valid checkpoint: checking the whole commit log")
        scan_from = min(max(safe, segments[0].start_offset), segments[-1].start_offset)
        if after_crash:
            self.index.drop_unsynced(self._checkpoint.index_file_stamp)
            if self._checkpoint.index_file_stamp:
                scan_from = min(scan_from, self._checkpoint.index_begin_log_offset)
        scan_from = max(scan_from, segments[0].start_offset)
        found = self.commitlog.chain.find(scan_from)
        scan_from = found.start_offset if found else segments[0].start_offset
        if after_crash:
            # entries written since the last flush may be torn: rebuild them all from the log
            for queue in self.queues:
                queue.truncate_log(scan_from, functools.partial(self._indexes_a_record, queue))
        result = self.commitlog.scan(
            scan_from,
            self._dispatch_confirmed,
            check_crc=not testbugs.SKIP_CRC_ON_RECOVERY,
            require_record_crc=self.config.require_record_crc,
        )
        end = result.end_log_offset
        quarantined = self._quarantine_after(end) if self._has_data_after(end) else []
        reason = result.corruption
        if reason is None and quarantined:
            reason = "zeros followed by data (a torn write)"
        self.commitlog.truncate(end)
        min_log = self.commitlog.min_offset
        for queue in self.queues:
            queue.truncate_log(end)
            queue.correct_min(min_log)
        replay_from = self.index.drop_from(end)
        if replay_from < end:
            self.commitlog.scan(
                replay_from, self._index_only, require_record_crc=self.config.require_record_crc
            )
        self._finish_recovery(after_crash, scan_from, end, result.records, reason, quarantined)

    def _indexes_a_record(self, queue: ConsumeQueue, entry: QueueEntry) -> bool:
        """Whether a consume-queue entry points at a valid record of its own queue and offset."""
        data = self.commitlog.read(entry.log_offset, entry.size)
        try:
            info = record_info(data, 0, require_record_crc=self.config.require_record_crc)
        except ProtocolError:
            return False
        return (
            info.size == entry.size
            and info.log_offset == entry.log_offset
            and info.queue_offset == entry.queue_offset
            and info.topic == queue.topic
            and info.queue_id == queue.queue_id
        )

    def _finish_recovery(
        self,
        after_crash: bool,
        scan_from: int,
        end: int,
        records: int,
        reason: str | None,
        quarantined: list[Path],
    ) -> None:
        self.commitlog.write_offset = end
        self._held = [info for info in self._held if info.log_offset + info.size <= end]
        self._dispatched_log_offset = self._held[0].log_offset if self._held else end
        if self._confirm_limit is not None:
            self._confirm_limit = min(self._confirm_limit, end)
        report = RecoveryReport(after_crash, scan_from, end, records, reason, quarantined)
        self.recovery = report
        if reason is not None:
            log.warning(
                "commit log cut at log offset %d: %s; quarantined %s",
                end,
                reason,
                [str(p) for p in quarantined] or "nothing",
            )
        log.info(
            "store recovered%s: checked %d records from log offset %d, log ends at %d",
            " after a crash" if after_crash else "",
            records,
            scan_from,
            end,
        )

    def _has_data_after(self, log_offset: int) -> bool:
        for segment in self.commitlog.chain.segments:
            if segment.start_offset + segment.size <= log_offset:
                continue
            if segment.has_data_from(max(0, log_offset - segment.start_offset)):
                return True
        return False

    def _quarantine_after(self, log_offset: int) -> list[Path]:
        """Move every stored byte at or after `log_offset` aside, before the log is cut there."""
        directory = self.config.root_dir / "quarantine" / f"{log_offset:020d}"
        directory.mkdir(parents=True, exist_ok=True)
        moved: list[Path] = []
        chain = self.commitlog.chain
        for segment in list(chain.segments):
            if segment.start_offset + segment.size <= log_offset:
                continue
            if segment.start_offset < log_offset:
                target = directory / f"{segment.path.name}.from-{log_offset:020d}"
                pos = log_offset - segment.start_offset
                with target.open("wb") as out:
                    while pos < segment.size:
                        chunk = segment.read(pos, 4 * 1024 * 1024)
                        out.write(chunk)
                        pos += len(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            else:
                target = directory / segment.path.name
                shutil.copyfile(segment.path, target)
            moved.append(target)
        fsync_dir(directory)
        return moved

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, infos: list[RecordInfo]) -> None:
        """Index records in log order: consume-queue entries and keys (one path for all sources).

        Prepared and rolled-back transaction messages get no consume-queue entry (RocketMQ
        `CommitLogDispatcherBuildConsumeQueue`); the entries of one queue that follow each other
        in queue order are written with one call, even when other queues' records come between
        (producers spread over queues interleave them).
        """
        if not infos:
            return
        runs: dict[ConsumeQueue, tuple[int, list[tuple[int, int, int]]]] = {}
        deleted = self.deleted_topics
        for info in infos:
            if deleted and info.log_offset < deleted.get(info.topic, -1):
                continue  # a deleted topic's record (`deleted_topics`)
            if transaction_type(info.sys_flag) not in _NO_QUEUE_ENTRY:
                queue = self.queues.get_or_create(info.topic, info.queue_id)
                found = runs.get(queue)
                if found is None or info.queue_offset != found[0] + len(found[1]):
                    if found is not None:
                        self._put_entries(queue, *found)
                    found = runs[queue] = (info.queue_offset, [])
                found[1].append((info.log_offset, info.size, info.tags_code))
        for queue, (first, run) in runs.items():
            self._put_entries(queue, first, run)
        self._index_only(infos)
        last = infos[-1]
        self._dispatched_log_offset = last.log_offset + last.size

    def _put_entries(
        self, queue: ConsumeQueue, first_queue_offset: int, entries: list[tuple[int, int, int]]
    ) -> None:
        queue.put(first_queue_offset, pack_entries(entries))
        self._mark_dirty(queue, first_queue_offset)
        if self._on_dispatch is not None:
            self._on_dispatch(queue.topic, queue.queue_id, queue.max_queue_offset)

    def _index_only(self, infos: list[RecordInfo]) -> None:
        """Add the keys and unique keys of `infos` to the key index (not of unkeyed topics)."""
        unkeyed = self.config.unkeyed_topics
        self.index.add_many([i for i in infos if (i.keys or i.uniq_key) and i.topic not in unkeyed])

    def _mark_dirty(self, queue: ConsumeQueue, queue_offset: int) -> None:
        with self._dirty_lock:
            known = self._dirty.get(queue)
            if known is None or queue_offset < known:
                self._dirty[queue] = queue_offset

    # ------------------------------------------------------------------ writes

    @property
    def max_log_offset(self) -> int:
        """Log offset just past the last stored record."""
        return self.commitlog.write_offset

    @property
    def min_log_offset(self) -> int:
        """The first log offset still stored."""
        return self.commitlog.min_offset

    @property
    def flushed_log_offset(self) -> int:
        """Every record below this log offset is on disk."""
        return self._flusher.flushed_log_offset if self._flusher else 0

    @property
    def dispatched_log_offset(self) -> int:
        """Every record below this log offset is in its consume queue."""
        return self._dispatched_log_offset

    def observe_flushes(self, observe: Callable[[float], None]) -> None:
        """Call `observe(seconds)` after each commit-log fsync that wrote something.

        It runs on the flusher thread: it must only count (`metrics.Latency.observe`).
        """
        if self._flusher is not None:
            self._flusher.on_flush = observe

    def put(
        self,
        topic: str,
        queue_id: int,
        items: list[BatchItem],
        *,
        born_host: bytes,
        born_timestamp_ms: int,
        sys_flag: int = 0,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> PutResult:
        """Append messages to one queue as consecutive records; `dispatch` indexes them.

        Raises:
            MessageTooLargeError: a body exceeds `max_message_bytes`, or the batch a segment.
            InvalidNameError: the topic name is not legal.
        """
        self._check_open()
        if not items:
            raise ValueError("nothing to put")
        if self._replicated:  # a replica just made master: its last appends own their offsets
            self.dispatch()
        queue = self.queues.get_or_create(topic, queue_id)
        assign = transaction_type(sys_flag) not in _NO_QUEUE_ENTRY
        store_host = self.config.store_host
        overhead = self._overheads.get((topic, len(born_host)))
        if overhead is None:
            _, topic_part = topic_field(topic)
            overhead = record_overhead(topic_part, born_host, store_host)
            if len(self._overheads) < _OVERHEADS_KEPT:
                self._overheads[topic, len(born_host)] = overhead
        total, largest_body = measure_items(items, overhead)
        if largest_body > self.config.max_message_bytes:
            raise MessageTooLargeError(largest_body, self.config.max_message_bytes)
        log_offset = self.commitlog.reserve(total)
        now_ms = self._clock_ms()
        first_queue_offset = queue.next_queue_offset if assign else 0
        parts, sizes = encode_records(
            items,
            topic=topic,
            queue_id=queue_id,
            first_queue_offset=first_queue_offset,
            assign_queue_offsets=assign,
            first_log_offset=log_offset,
            sys_flag=sys_flag,
            born_timestamp_ms=born_timestamp_ms,
            born_host=born_host,
            store_timestamp_ms=now_ms,
            store_host=store_host,
            reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset,
        )
        self.commitlog.write(log_offset, parts[0] if len(parts) == 1 else b"".join(parts))
        if assign:
            queue.next_queue_offset = first_queue_offset + len(items)
        self._pending.append(
            _PendingPut(
                topic,
                queue_id,
                first_queue_offset,
                assign,
                log_offset,
                sizes,
                items,
                now_ms,
                sys_flag,
            )
        )
        self._last_store_timestamp_ms = now_ms
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH and self._flusher:
            self._flusher.wake()
        log_offsets = list(itertools.accumulate(sizes[:-1], initial=log_offset))
        return PutResult(log_offsets, sizes, first_queue_offset, now_ms)

    def dispatch(self) -> None:
        """Index every appended record not yet indexed (below the confirm offset when gated).

        `put` and `append_replica` only append to the commit log (RocketMQ's append path);
        records become readable by queue offset once dispatched. Every read dispatches first; a
        server calls this once per loop turn so that one write per queue covers all the puts of
        that turn, and a slave after it acked what it appended.
        """
        pending, self._pending = self._pending, []
        infos, self._replicated = self._replicated, []  # appended before any pending put
        for put in pending:
            at = put.log_offset
            queue_offset = put.first_queue_offset
            for item, size in zip(put.items, put.sizes, strict=True):
                properties = index_properties(item.properties) if item.properties else {}
                infos.append(
                    RecordInfo(
                        put.topic,
                        put.queue_id,
                        queue_offset,
                        at,
                        size,
                        tags_hash(properties.get(TAGS)),
                        put.store_timestamp_ms,
                        put.sys_flag,
                        keys_of(properties),
                        properties.get(UNIQ_KEY),
                    )
                )
                at += size
                queue_offset += put.assign
        if infos or self._held:
            self._dispatch_confirmed(infos)

    def _dispatch_confirmed(self, infos: list[RecordInfo]) -> None:
        """Dispatch what the confirm offset allows, in log order; hold the rest."""
        limit = self._confirm_limit
        if limit is None and not self._held:
            self._dispatch_or_hold(infos)
            return
        queue = self._held + infos if self._held else infos
        if limit is None:
            ready, self._held = queue, []
        else:
            cut = 0
            while cut < len(queue) and queue[cut].log_offset + queue[cut].size <= limit:
                cut += 1
            ready, self._held = queue[:cut], queue[cut:]
            newly_held = infos[max(0, cut - (len(queue) - len(infos))) :]
            self._reserve_queue_offsets(newly_held)
        self._dispatch_or_hold(ready)

    def _dispatch_or_hold(self, ready: list[RecordInfo]) -> None:
        """Dispatch `ready`; when a write fails, hold all of it to dispatch again later.

        A full disk (ENOSPC on a consume-queue or index write) must not leave a hole in a queue:
        a later record of that queue would be written past it behind filler entries, and
        consumers would skip an acknowledged message. Re-dispatching is idempotent (entries and
        keys already written are skipped), so the retry writes only what is missing. An
        `OSError` is kept in `dispatch_error` and every later dispatch (each put and read)
        retries; anything else is re-raised after the hold.
        """
        try:
            self._dispatch(ready)
        except BaseException as exc:
            self._held = ready + self._held
            self._reserve_queue_offsets(ready)
            if not isinstance(exc, OSError):
                raise
            if self.dispatch_error is None:
                log.warning(
                    "indexing stopped at log offset %d (%s); the records are stored and will be "
                    "indexed once the write succeeds",
                    ready[0].log_offset,
                    exc,
                )
            self.dispatch_error = exc
            return
        if self.dispatch_error is not None:
            log.warning("indexing resumed after: %s", self.dispatch_error)
            self.dispatch_error = None

    def _reserve_queue_offsets(self, held: list[RecordInfo]) -> None:
        """Held records own their queue offsets: a put after a role change continues past them."""
        for info in held:
            if transaction_type(info.sys_flag) not in _NO_QUEUE_ENTRY:
                queue = self.queues.get_or_create(info.topic, info.queue_id)
                if queue.next_queue_offset <= info.queue_offset:
                    queue.next_queue_offset = info.queue_offset + 1

    def held_records(self, topic: str, queue_id: int) -> list[bytes]:
        """One queue's records appended but not yet visible (above the confirm offset), in order.

        For a replica becoming master: its log is the group's from now on, so what it holds of
        its own metadata must be in effect before it answers for it (a watermark it never heard
        of may already cover those records).
        """
        self._check_open()
        self.dispatch()
        return [
            self.read_record(info.log_offset, info.size)
            for info in self._held
            if info.topic == topic and info.queue_id == queue_id
        ]

    def log_offset_of(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """The log offset of a queue's record, visible or held above the confirm offset.

        None when the queue has no such record (never written, or expired).
        """
        self._check_open()
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        if queue is not None and queue.min_queue_offset <= queue_offset < queue.max_queue_offset:
            entry = queue.entry(queue_offset)
            return entry.log_offset if entry is not None and entry.is_message else None
        for info in self._held:
            if (
                info.topic == topic
                and info.queue_id == queue_id
                and info.queue_offset == queue_offset
            ):
                return info.log_offset
        return None

    @property
    def confirm_offset(self) -> int:
        """The replication high watermark: records ending at or below it are committed."""
        if self._confirm_limit is None:
            return self.commitlog.write_offset
        return self._confirm_limit

    def set_confirm_offset(self, log_offset: int | None, *, dispatch: bool = True) -> None:
        """Move the watermark (None: everything appended counts) and index what it now allows.

        Clamped to the end of the local log (a slave may hear of a master's higher watermark).
        With `dispatch=False` the indexing waits for the caller's next `dispatch` (once per
        loop turn in a server).
        """
        self._check_open()
        if log_offset is not None:
            log_offset = min(log_offset, self.commitlog.write_offset)
        self._confirm_limit = log_offset
        if dispatch:
            self.dispatch()

    def wait_flushed(self, log_offset: int) -> Future[int]:
        """A future resolved once every byte below `log_offset` is on disk (group commit)."""
        self._check_open()
        assert self._flusher is not None
        return self._flusher.wait_flushed(log_offset)

    def append_replica(self, log_offset: int, data: bytes) -> int:
        """Append bytes replicated from a master at `log_offset`, validated; `dispatch` indexes.

        Every whole record is checked (size, log offset, CRC) before this returns, so a slave may
        ack the returned offset at once and index afterwards. Returns the log offset up to which
        records were complete and stored; a partial record at the end is not written (the caller
        sends it again with the rest).

        Raises:
            CorruptRecordError: a record failed the checks; nothing of `data` is kept.
        """
        self._check_open()
        self.dispatch()
        # the usual transfer: valid records back to back, perhaps the first part of one more;
        # checked in memory, then written, with no read back
        found, stop = record_infos(
            data,
            0,
            len(data),
            check_crc=True,
            require_record_crc=self.config.require_record_crc,
            log_offset=log_offset,
        )
        if found and _partial_or_end(data, stop):
            self.commitlog.append_raw(log_offset, memoryview(data)[:stop])
            self._replicated += found
            return log_offset + stop
        # anything else (a blank at a segment's end, a bad record): written whole, then scanned
        complete = 0
        while complete < len(data):
            try:
                total, _ = peek_record_size(data, complete)
            except ProtocolError:
                break
            if complete + total > len(data):
                break
            complete += total
        if complete == 0:
            return log_offset
        self.commitlog.append_raw(log_offset, data[:complete])
        valid: list[RecordInfo] = []
        result = self.commitlog.scan(
            log_offset,
            valid.extend,
            require_record_crc=self.config.require_record_crc,
            until=log_offset + complete,
        )
        if result.corruption is not None or result.end_log_offset < log_offset + complete:
            self.commitlog.truncate(log_offset)
            raise CorruptRecordError(
                result.end_log_offset, result.corruption or "short replica data"
            )
        self._replicated += valid
        return log_offset + complete

    def restart_log_at(self, log_offset: int) -> None:
        """Drop every record and make the log continue at `log_offset`, a segment boundary.

        For a replica whose master no longer has the bytes that would follow this log (retention
        deleted them): an empty replica joining late, or one that was away longer than the
        master keeps segments. What is dropped is older than anything the master still serves.
        Crash-safe: a crash before the next append leaves an empty log, which asks again.
        """
        if log_offset % self.commitlog.segment_bytes:
            raise StoreError(
                f"log offset {log_offset} is not a multiple of this store's segment size "
                f"{self.commitlog.segment_bytes}: configure mappedFileSizeCommitLog as the "
                "master's"
            )
        if log_offset < self.commitlog.write_offset:
            raise StoreError(
                f"cannot restart the log at {log_offset}, before its end "
                f"{self.commitlog.write_offset}"
            )
        self.truncate(0)
        assert self._flusher is not None
        with self._flusher.paused():
            self.commitlog.write_offset = log_offset
            self._dispatched_log_offset = log_offset
            self._flusher.reset(log_offset)
            if self._confirm_limit is not None:
                self._confirm_limit = log_offset
        log.warning("log restarted empty at log offset %d", log_offset)

    def truncate(self, log_offset: int) -> None:
        """Cut the commit log and everything derived from it at `log_offset` (slave truncation).

        Crash-safe: `truncating` names the target before anything is cut, so an open after a
        crash mid-way finishes the cut instead of trusting bytes that were meant to go.
        """
        self._check_open()
        self.dispatch()
        assert self._flusher is not None
        write_atomic(self._truncating_path, str(log_offset).encode())
        with self._flusher.paused():
            self.commitlog.truncate(log_offset)
            for queue in self.queues:
                queue.truncate_log(log_offset)
            replay_from = self.index.drop_from(log_offset)
            if replay_from < log_offset:
                self.commitlog.scan(
                    replay_from, self._index_only, require_record_crc=self.config.require_record_crc
                )
            self._held = [i for i in self._held if i.log_offset + i.size <= log_offset]
            for queue in self.queues:
                queue.next_queue_offset = queue.max_queue_offset
            self._reserve_queue_offsets(self._held)
            if self._confirm_limit is not None:
                self._confirm_limit = min(self._confirm_limit, log_offset)
            self._dispatched_log_offset = min(self._dispatched_log_offset, log_offset)
            self._flusher.reset(min(self._flusher.flushed_log_offset, log_offset))
            safe = min(log_offset, self._checkpoint.safe_log_offset)
            confirm = min(log_offset, self._checkpoint.confirm_log_offset)
            self._save_checkpoint(
                dataclasses.replace(
                    self._checkpoint, safe_log_offset=safe, confirm_log_offset=confirm
                )
            )
        self._truncating_path.unlink()
        fsync_dir(self.config.root_dir)

    def _save_checkpoint(self, checkpoint: Checkpoint) -> None:
        checkpoint.save(self._checkpoint_path)
        self._checkpoint = checkpoint

    # ------------------------------------------------------------------ flusher callbacks

    def _sync_log(self) -> int:
        """Flusher thread: fsync the commit log through its current end."""
        target = self.commitlog.write_offset
        for fd, _ in self.commitlog.chain.sync_handles(self.flushed_log_offset):
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        ledger.record_durable(self.config.root_dir, target)
        return target

    def _sync_metadata(self, log_flushed: int) -> None:
        """Flusher thread: flush consume queues and index, then advance the checkpoint."""
        dispatched = self._dispatched_log_offset
        store_ts = self._last_store_timestamp_ms
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
        handles: list[int] = []
        for queue, queue_offset in dirty.items():
            handles += [fd for fd, _ in queue.chain.sync_handles(queue_offset * ENTRY_BYTES)]
        index_handles, index_stamp, index_begin = self.index.sync_handles()
        handles += index_handles
        for fd in handles:
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        self._save_checkpoint(
            dataclasses.replace(
                self._checkpoint,
                physic_msg_timestamp_ms=store_ts,
                logics_msg_timestamp_ms=store_ts,
                index_msg_timestamp_ms=store_ts,
                safe_log_offset=min(dispatched, log_flushed),
                confirm_log_offset=min(self.confirm_offset, log_flushed),
                index_file_stamp=index_stamp,
                index_begin_log_offset=index_begin,
            )
        )

    def start_queue_at(self, topic: str, queue_id: int, queue_offset: int) -> bool:
        """Make an empty queue begin at `queue_offset` (a moved queue's new segment, issue 20).

        Its first message takes that offset and reads below it see an emptied queue, as if
        retention had deleted them. False (nothing done) when the queue holds or owns any
        offset at or above it.
        """
        self._check_open()
        self.dispatch()
        queue = self.queues.get_or_create(topic, queue_id)
        if not queue.chain.is_empty or queue.next_queue_offset >= queue_offset:
            return False
        queue.min_queue_offset = queue.max_queue_offset = queue.next_queue_offset = queue_offset
        return True

    # ------------------------------------------------------------------ reads

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of the queue will get (0 for an unknown queue)."""
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        return queue.max_queue_offset if queue else 0

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still readable (0 for an unknown queue)."""
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        return queue.min_queue_offset if queue else 0

    def read_log(self, log_offset: int, length: int) -> bytes:
        """The commit log's bytes at `[log_offset, log_offset + length)`, unchecked.

        Fewer when they would cross the end of a segment or of the log.
        """
        self._check_open()
        return self.commitlog.read(log_offset, length)

    def read_record(self, log_offset: int, size: int | None = None) -> bytes:
        """The stored bytes of the record at `log_offset`, CRC-checked.

        Raises:
            CorruptRecordError: there is no valid record there.
        """
        self._check_open()
        if size is None:
            head = self.commitlog.read(log_offset, 8)
            try:
                size, _ = peek_record_size(head, 0)
            except ProtocolError as exc:
                raise CorruptRecordError(log_offset, str(exc)) from None
        data = self.commitlog.read(log_offset, size)
        if len(data) != size:
            raise CorruptRecordError(log_offset, f"only {len(data)} of {size} bytes are stored")
        self._check_record(log_offset, data)
        return data

    def get(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        *,
        max_bytes: int = 4 * 1024 * 1024,
        tags_codes: Set[int] | None = None,
    ) -> GetResult:
        """Read up to `max_count` records from a queue (RocketMQ `getMessage`).

        With `tags_codes`, only entries whose tags code is in it are read (the others are
        skipped before any commit-log read).
        """
        self._check_open()
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        low, high = queue.min_queue_offset, queue.max_queue_offset
        if high == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, low, high)
        if queue_offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, low, low, high)
        if queue_offset == high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, queue_offset, low, high)
        if queue_offset > high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, low if low == 0 else high, low, high)
        scan_limit = _MAX_FILTER_SCAN if tags_codes is not None else max_count
        records: list[bytes] = []
        offsets: list[int] = []
        chosen = used_bytes = scanned = 0
        next_offset = queue_offset
        min_log = self.commitlog.min_offset
        saw_removed = False
        while chosen < max_count and scanned < scan_limit and next_offset < high:
            entries = queue.entry_bytes(next_offset, min(scan_limit - scanned, 1024))
            if not entries:
                break
            scan = scan_entries(
                entries,
                max_chosen=max_count - chosen,
                max_scan=scan_limit - scanned,
                max_bytes=max_bytes,
                used_bytes=used_bytes,
                have_chosen=chosen > 0,
                min_log_offset=min_log,
                codes=tags_codes,
                span_bytes=_SPAN_BYTES,
            )
            for run in scan.runs:
                records += self._read_run(entries, run)
                offsets += range(next_offset + run.first, next_offset + run.first + run.count)
            chosen += scan.chosen
            used_bytes = scan.used_bytes
            saw_removed = saw_removed or scan.saw_removed
            next_offset += scan.scanned
            scanned = scan_limit if scan.byte_limited else scanned + scan.scanned
        if records:
            status = GetStatus.FOUND
        elif saw_removed:
            status = GetStatus.OFFSET_FOUND_NULL
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, next_offset, low, high, records, offsets)

    def _read_run(self, entries: bytes, run: EntryRun) -> list[bytes]:
        """The CRC-checked records of a run of entries, in one commit-log read."""
        if run.count == 1:
            return [
                self.read_record(run.start_log_offset, run.end_log_offset - run.start_log_offset)
            ]
        length = run.end_log_offset - run.start_log_offset
        span = self.commitlog.read(run.start_log_offset, length)
        if len(span) != length:  # the span crosses a segment: read one by one
            return [self.read_record(*entry_at(entries, run.first + k)) for k in range(run.count)]
        config = self.config
        records, bad = split_span(
            span,
            entries,
            run,
            check_crc=config.check_crc_on_read,
            require_record_crc=config.require_record_crc,
        )
        if bad >= 0:
            log_offset, _ = entry_at(entries, run.first + bad)
            raise CorruptRecordError(log_offset, "body or record CRC mismatch")
        return records

    def _check_record(self, log_offset: int, record: bytes) -> None:
        if self.config.check_crc_on_read and not verify_record_crc(
            record, require_record_crc=self.config.require_record_crc
        ):
            raise CorruptRecordError(log_offset, "body or record CRC mismatch")

    def store_timestamp_at(self, log_offset: int) -> int | None:
        """The store timestamp of the record at `log_offset`, or None if there is none."""
        head = self.commitlog.read(log_offset, _TIMESTAMP_PROBE)
        if len(head) < 64:
            return None
        return store_timestamp_of(head)

    def search_queue_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            return 0
        return queue.search_time(timestamp_ms, self.store_timestamp_at)

    def earliest_store_time(self, topic: str, queue_id: int) -> int | None:
        """Store timestamp of the oldest readable message of a queue."""
        self.dispatch()
        queue = self.queues.find(topic, queue_id)
        entry = queue.entry(queue.min_queue_offset) if queue else None
        return self.store_timestamp_at(entry.log_offset) if entry and entry.is_message else None

    def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_count: int = 32,
        begin_ms: int = 0,
        end_ms: int = 2**62,
    ) -> list[MessageRecord]:
        """Messages of `topic` whose KEYS or UNIQ_KEY contain `key`, newest first."""
        self._check_open()
        self.dispatch()
        found: list[MessageRecord] = []
        for log_offset in self.index.query(topic, key, max_count * 2, begin_ms, end_ms):
            if log_offset < self.min_log_offset:
                continue
            try:
                record = decode_record(self.read_record(log_offset))
            except (CorruptRecordError, ProtocolError):
                continue
            if record.topic == topic and (
                key in record.keys or record.properties.get(UNIQ_KEY) == key
            ):
                found.append(record)
                if len(found) >= max_count:
                    break
        return found

    # ------------------------------------------------------------------ retention

    def _expired_reason(
        self,
        segment_path: Path,
        now_ms: int,
        reserved_hours: float | None,
        max_used_ratio: float | None,
        force: bool,
    ) -> str | None:
        """Why the first segment may go now (None: it stays)."""
        config = self.config
        reserved_ms = (config.file_reserved_hours if reserved_hours is None else reserved_hours) * (
            3_600_000
        )
        if now_ms - os.stat(segment_path).st_mtime * 1000 > reserved_ms:
            return "expired"
        usage = shutil.disk_usage(config.root_dir)
        ratio = config.disk_max_used_ratio if max_used_ratio is None else max_used_ratio
        if usage.used / usage.total > ratio:
            return "disk full"
        return "forced" if force else None

    def expired_log_offset(
        self,
        *,
        now_ms: int | None = None,
        force: bool = False,
        reserved_hours: float | None = None,
        max_used_ratio: float | None = None,
    ) -> int:
        """Where the segments `delete_expired` would delete now end, ignoring `keep_log_offset`.

        `min_log_offset` when none would go. For a master that must copy what a deletion would
        take before it deletes (`broker/retention.py`).
        """
        self._check_open()
        self.dispatch()
        now_ms = self._clock_ms() if now_ms is None else now_ms
        segments = self.commitlog.chain.segments
        end = self.min_log_offset
        for segment in segments[:-1]:
            if segment.start_offset + segment.size > self.flushed_log_offset:
                break
            if self._expired_reason(segment.path, now_ms, reserved_hours, max_used_ratio, force):
                end = segment.start_offset + segment.size
                force = False
                continue
            break
        return end

    def delete_expired(
        self,
        *,
        now_ms: int | None = None,
        force: bool = False,
        reserved_hours: float | None = None,
        max_used_ratio: float | None = None,
    ) -> int:
        """Delete commit-log segments past their retention, and what pointed into them.

        A segment goes when it is older than `file_reserved_hours` (or `reserved_hours`), or
        (oldest first) while the disk is fuller than `disk_max_used_ratio` (or `max_used_ratio`),
        or when `force`. The segment being written, any segment not yet flushed and any segment
        holding a byte at or after `keep_log_offset()` are never deleted. Returns the number of
        segments deleted.
        """
        self._check_open()
        self.dispatch()
        now_ms = self._clock_ms() if now_ms is None else now_ms
        keep = self.keep_log_offset() if self.keep_log_offset is not None else None
        chain = self.commitlog.chain
        deleted = 0
        while len(chain.segments) > 1:
            first = chain.segments[0]
            if first.start_offset + first.size > self.flushed_log_offset:
                break
            reason = self._expired_reason(first.path, now_ms, reserved_hours, max_used_ratio, force)
            if reason is None:
                break
            if keep is not None and first.start_offset + first.size > keep:
                log.info(
                    "keeping commit-log segment %s (%s): it holds a fenced topic's live tail",
                    first.path.name,
                    reason,
                )
                break
            log.info("deleting commit-log segment %s (%s)", first.path.name, reason)
            chain.delete_first()
            deleted += 1
            force = False
        if deleted:
            min_log = self.commitlog.min_offset
            for queue in self.queues:
                queue.delete_expired(min_log)
            self.index.delete_expired(min_log)
        return deleted

    def delete_topic(self, topic: str, log_offset: int | None = None) -> int:
        """Drop the consume queues of a topic (its records age out of the commit log).

        Its records below `log_offset` (default: every record appended so far) are never
        indexed again, not even by recovery (`deleted_topics`). Returns how many queues went.
        """
        self._check_open()
        self.dispatch()
        cutoff = self.commitlog.write_offset if log_offset is None else log_offset
        if cutoff > self.deleted_topics.get(topic, -1):
            self.deleted_topics[topic] = cutoff
            self._save_deleted_topics()
        with self._dirty_lock:
            for queue in self.queues.queues_of(topic):
                self._dirty.pop(queue, None)
        return self.queues.delete_topic(topic)

    def _load_deleted_topics(self) -> None:
        data = read_file(self._deleted_topics_path)
        if data is None:
            return
        try:
            loaded = json.loads(data)
            cutoffs = {str(t): int(o) for t, o in loaded.items()}
        except (ValueError, TypeError, AttributeError) as exc:  # written atomically: outside damage
            log.error(
                "%s is unreadable (%s): deleted topics may be indexed again",
                self._deleted_topics_path,
                exc,
            )
            return
        # a cutoff at or below the log's start holds nothing back any more
        start = self.commitlog.min_offset
        self.deleted_topics = {t: o for t, o in cutoffs.items() if o > start}

    def _save_deleted_topics(self) -> None:
        start = self.commitlog.min_offset
        self.deleted_topics = {t: o for t, o in self.deleted_topics.items() if o > start}
        write_atomic(self._deleted_topics_path, json.dumps(self.deleted_topics).encode())
