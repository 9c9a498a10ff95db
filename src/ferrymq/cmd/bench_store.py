"""`ferry bench store`: the storage engine measured side by side with raw disk writes.

For each message size and batch size, one run measures, on the same filesystem and with the same
bytes:

- async append (`Store.put`: encode and write to the commit log, ASYNC_FLUSH with the flusher
  running) against raw sequential `os.write` of the record bytes the store writes, as an
  ASYNC_FLUSH broker runs it (segments `posix_fallocate`d ahead, `preallocateCommitLog`) and,
  for comparison, with sparse segments;
- sync append (`Store.put` then waiting for the group-commit fsync) against raw `os.write` +
  `os.fdatasync` per batch, as a SYNC_FLUSH broker runs it (zero-filled segments prepared ahead,
  `warmMapedFileEnable`) and, for comparison, with sparse segments;
- dispatch (`Store.dispatch`: consume-queue entries and key index for the appended records),
  measured apart from the append as RocketMQ's reput is;
- replay: the commit log copied into a second store (`Store.append_replica`: parse, CRC check,
  dispatch), what a slave and crash recovery do;
- reads by queue offset (`Store.get`, 32 messages per call, CRC checked).

The three async and the three sync measurements each run in interleaved slices (`_interleaved`),
since a virtual machine's write and fsync times drift by tens of percent within a minute. Ratios
compare numbers measured in this run only. Nothing here asserts a speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ferrymq.store.config import FlushDiskType, SegmentFill, StoreConfig
from ferrymq.store.store import Store
from ferrymq.wire.msgid import UniqueIdGenerator
from ferrymq.wire.properties import UNIQ_KEY, encode_properties
from ferrymq.wire.records import BatchItem, encode_records, pack_host

__all__ = ["CaseResult", "StoreBenchConfig", "run_store_bench"]

_BORN = pack_host("127.0.0.1", 50000)
_TOPIC = "BenchTopic"
_QUEUES = 4
_SLICES = 10


@dataclass(frozen=True, slots=True)
class StoreBenchConfig:
    """What to measure and for how long."""

    directory: Path
    sizes: tuple[int, ...] = (100, 1024)
    batches: tuple[int, ...] = (1, 64)
    seconds: float = 2.0
    max_bytes: int = 256 * 1024 * 1024
    """Per-measurement cap on bytes written, whatever `seconds` says."""


@dataclass(frozen=True, slots=True)
class Rate:
    """One measured throughput."""

    messages: int
    data_bytes: int
    seconds: float

    @property
    def msg_per_s(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10^6 bytes) per second."""
        return self.data_bytes / self.seconds / 1e6 if self.seconds else 0.0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """All measurements for one (message size, batch size)."""

    size: int
    batch: int
    raw_write: Rate
    async_append: Rate
    async_append_sparse: Rate
    """ASYNC_FLUSH with sparse segments: writes reserve blocks page by page."""
    raw_write_fsync: Rate
    sync_append: Rate
    sync_append_sparse: Rate
    """SYNC_FLUSH with sparse segments: every fsync also commits block allocations."""
    dispatch: Rate
    replay: Rate
    read: Rate

    @property
    def async_ratio(self) -> float:
        """Async append bandwidth over raw write bandwidth."""
        return self.async_append.mb_per_s / self.raw_write.mb_per_s

    @property
    def sync_ratio(self) -> float:
        """Sync append bandwidth over raw write+fdatasync bandwidth at the same batch size."""
        return self.sync_append.mb_per_s / self.raw_write_fsync.mb_per_s

    def as_json(self) -> dict[str, object]:
        """A flat JSON-ready summary."""
        out: dict[str, object] = {"size": self.size, "batch": self.batch}
        for name in (
            "raw_write",
            "async_append",
            "async_append_sparse",
            "raw_write_fsync",
            "sync_append",
            "sync_append_sparse",
            "dispatch",
            "replay",
            "read",
        ):
            rate: Rate = getattr(self, name)
            out[f"{name}_mb_s"] = round(rate.mb_per_s, 2)
            out[f"{name}_msg_s"] = round(rate.msg_per_s, 1)
        out["async_ratio"] = round(self.async_ratio, 3)
        out["sync_ratio"] = round(self.sync_ratio, 3)
        return out


def _items(size: int, batch: int, ids: UniqueIdGenerator) -> list[BatchItem]:
    body = os.urandom(size)
    now_ms = time.time_ns() // 1_000_000
    return [
        BatchItem(body, encode_properties({UNIQ_KEY: ids.next_id(now_ms)})) for _ in range(batch)
    ]


def _record_bytes(items: list[BatchItem]) -> bytes:
    parts, _ = encode_records(
        items,
        topic=_TOPIC,
        queue_id=0,
        first_queue_offset=0,
        assign_queue_offsets=True,
        first_log_offset=0,
        sys_flag=0,
        born_timestamp_ms=0,
        born_host=_BORN,
        store_timestamp_ms=0,
        store_host=_BORN,
    )
    return b"".join(parts)


def _timed(
    rounds: int, seconds: float, step: Callable[[int], int], first: int = 0
) -> tuple[int, int, float]:
    """Run `step(i)` (returning bytes written) until `rounds` or `seconds`; return totals."""
    data_bytes = 0
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while done < rounds:
        data_bytes += step(first + done)
        done += 1
        if done % 16 == 0 and time.perf_counter() > deadline:
            break
    return done, data_bytes, time.perf_counter() - start


def _interleaved(
    steps: list[Callable[[int], int]], rounds: int, seconds: float, slices: int
) -> list[tuple[int, int, float]]:
    """Run each step in turn, `seconds / slices` at a time, until each ran `seconds` or `rounds`.

    The one going first rotates by slice, so drift of the disk's fsync latency during the run
    (large on a virtual disk) weighs on every step alike. Returns (steps, bytes, seconds) each.
    """
    totals = [(0, 0, 0.0) for _ in steps]
    for slice_number in range(slices):
        turn = slice_number % len(steps)
        for index in [*range(turn, len(steps)), *range(turn)]:
            done, data_bytes, elapsed = totals[index]
            if done >= rounds:
                continue
            more = _timed(rounds - done, seconds / slices, steps[index], first=done)
            totals[index] = (done + more[0], data_bytes + more[1], elapsed + more[2])
    return totals


def _raw_step(fd: int, chunk: bytes, fsync: bool) -> Callable[[int], int]:
    def step(_: int) -> int:
        written = os.write(fd, chunk)
        if fsync:
            os.fdatasync(fd)
        return written

    return step


def _store_config(root: Path, flush: FlushDiskType, fill: SegmentFill) -> StoreConfig:
    return StoreConfig(
        root_dir=root,
        flush_disk_type=flush,
        segment_fill=fill,
        commitlog_segment_bytes=256 * 1024 * 1024,
    )


def _append_step(store: Store, items: list[BatchItem]) -> Callable[[int], int]:
    sync = store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def step(i: int) -> int:
        result = store.put(_TOPIC, i % _QUEUES, items, born_host=_BORN, born_timestamp_ms=0)
        if sync:
            store.wait_flushed(result.end_log_offset).result()
        return sum(result.sizes)

    return step


def _side_by_side(
    raw_path: Path,
    prepared: Store,
    sparse: Store,
    chunk: bytes,
    items: list[BatchItem],
    rounds: int,
    seconds: float,
) -> tuple[Rate, Rate, Rate]:
    """Raw writes, appends to `prepared` and appends to `sparse`, interleaved.

    The raw writes go to one file, with an fdatasync after each when the stores sync-flush.
    """
    sync = prepared.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        totals = _interleaved(
            [
                _raw_step(fd, chunk, fsync=sync),
                _append_step(prepared, items),
                _append_step(sparse, items),
            ],
            rounds,
            seconds,
            slices=_SLICES,
        )
    finally:
        os.close(fd)
    raw, prepared_rate, sparse_rate = (
        Rate(done * len(items), data_bytes, elapsed) for done, data_bytes, elapsed in totals
    )
    return raw, prepared_rate, sparse_rate


def _stores(work: Path, flush: FlushDiskType) -> tuple[Store, Store]:
    """A store whose segments are made as a broker with `flush` makes them, and a sparse one.

    A broker zero-fills segments with SYNC_FLUSH (`warmMapedFileEnable`) and allocates them
    otherwise (`preallocateCommitLog`). Opening them (and preparing the first segment) is not
    timed.
    """
    name = flush.value.lower()
    fill = SegmentFill.ZEROED if flush is FlushDiskType.SYNC_FLUSH else SegmentFill.ALLOCATED
    prepared = Store.open(_store_config(work / name, flush, fill))
    try:
        sparse = Store.open(_store_config(work / f"{name}-sparse", flush, SegmentFill.SPARSE))
    except BaseException:
        prepared.close()
        raise
    return prepared, sparse


def _dispatch(store: Store) -> Rate:
    pending = store.max_log_offset
    start = time.perf_counter()
    store.dispatch()
    elapsed = time.perf_counter() - start
    messages = sum(store.max_queue_offset(_TOPIC, q) for q in range(_QUEUES))
    return Rate(messages, pending, elapsed)


def _replay(source: Store, root: Path) -> Rate:
    replica = Store.open(
        dataclasses.replace(source.config, root_dir=root, flush_disk_type=FlushDiskType.ASYNC_FLUSH)
    )
    try:
        end = source.max_log_offset
        position = 0
        elapsed = 0.0
        while position < end:
            data = source.commitlog.read(position, 1024 * 1024)
            start = time.perf_counter()
            position = replica.append_replica(position, data)
            replica.dispatch()
            elapsed += time.perf_counter() - start
        messages = sum(replica.max_queue_offset(_TOPIC, q) for q in range(_QUEUES))
        return Rate(messages, end, elapsed)
    finally:
        replica.close()


def _read(store: Store) -> Rate:
    messages = 0
    data_bytes = 0
    start = time.perf_counter()
    for queue_id in range(_QUEUES):
        offset = 0
        end = store.max_queue_offset(_TOPIC, queue_id)
        while offset < end:
            result = store.get(_TOPIC, queue_id, offset, 32)
            messages += len(result.records)
            data_bytes += result.total_bytes
            offset = result.next_queue_offset
    return Rate(messages, data_bytes, time.perf_counter() - start)


def run_case(config: StoreBenchConfig, size: int, batch: int) -> CaseResult:
    """Measure one (size, batch) case in a fresh directory."""
    work = Path(tempfile.mkdtemp(prefix=f"store-{size}x{batch}-", dir=config.directory))
    try:
        ids = UniqueIdGenerator(bytes([127, 0, 0, 1]), os.getpid())
        items = _items(size, batch, ids)
        chunk = _record_bytes(items)
        rounds = max(16, config.max_bytes // len(chunk))
        with contextlib.ExitStack() as stores:
            async_store, async_sparse_store = (
                stores.enter_context(s) for s in _stores(work, FlushDiskType.ASYNC_FLUSH)
            )
            raw, async_rate, async_sparse = _side_by_side(
                work / "raw", async_store, async_sparse_store, chunk, items, rounds, config.seconds
            )
            dispatch = _dispatch(async_store)
            replay = _replay(async_store, work / "replica")
            read = _read(async_store)
        with contextlib.ExitStack() as stores:
            sync_store, sync_sparse_store = (
                stores.enter_context(s) for s in _stores(work, FlushDiskType.SYNC_FLUSH)
            )
            raw_sync, sync_rate, sync_sparse = _side_by_side(
                work / "raw-sync",
                sync_store,
                sync_sparse_store,
                chunk,
                items,
                rounds,
                config.seconds,
            )
        return CaseResult(
            size,
            batch,
            raw,
            async_rate,
            async_sparse,
            raw_sync,
            sync_rate,
            sync_sparse,
            dispatch,
            replay,
            read,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_store_bench(
    config: StoreBenchConfig, progress: Callable[[str], None] | None = None
) -> list[CaseResult]:
    """Run every case; `progress` hears the name of each case as it starts."""
    config.directory.mkdir(parents=True, exist_ok=True)
    results: list[CaseResult] = []
    for size in config.sizes:
        for batch in config.batches:
            if progress:
                progress(f"{size} B x {batch}")
            results.append(run_case(config, size, batch))
    return results
