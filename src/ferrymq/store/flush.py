"""The flusher: fsync off the owner's thread, with group commit.

RocketMQ's `FlushRealTimeService`, `GroupCommitService` and consume-queue flush, as one class.

One background thread runs cycles. A cycle syncs the commit log up to its current end and resolves
every waiter at or below that log offset: waiters that arrive during an fsync are served together
by the next one (group commit). Every `metadata_interval` a cycle also syncs consume queues and the
index and saves the checkpoint (the callbacks decide what that means).

Rules:
1. The thread touches no store state but through the callbacks it is given, which only sync
   duplicated descriptors and read ints the owner writes.
2. `paused()` lets the owner change the log under the flusher (truncation) without a cycle running.
3. An fsync error fails the waiters of that cycle with `StoreError`; the thread keeps running.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

from ferrymq.errors import StoreError

__all__ = ["Flusher"]

log = logging.getLogger(__name__)


class Flusher:
    """A thread that syncs the commit log and, less often, everything derived from it."""

    def __init__(
        self,
        *,
        sync_log: Callable[[], int],
        sync_metadata: Callable[[int], None],
        flush_interval: float,
        metadata_interval: float,
        flushed_log_offset: int,
        name: str = "ferrymq-flusher",
    ) -> None:
        self._sync_log = sync_log
        self._sync_metadata = sync_metadata
        self._flush_interval = flush_interval
        self._metadata_interval = metadata_interval
        self._flushed = flushed_log_offset
        self._cond = threading.Condition()
        self._cycle = threading.Lock()
        self._waiters: list[tuple[int, int, Future[int]]] = []
        self._sequence = itertools.count()
        self._closing = False
        self._wake = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.on_flush: Callable[[float], None] | None = None
        """Hears the seconds of each fsync that moved the flushed offset (metrics)."""

    @property
    def flushed_log_offset(self) -> int:
        """Every commit-log byte below this offset is on disk."""
        return self._flushed

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def wait_flushed(self, log_offset: int) -> Future[int]:
        """A future resolved with the flushed offset once it reaches `log_offset`."""
        future: Future[int] = Future()
        with self._cond:
            if self._flushed >= log_offset:
                future.set_result(self._flushed)
                return future
            if self._closing:
                future.set_exception(StoreError("the store is closing"))
                return future
            heapq.heappush(self._waiters, (log_offset, next(self._sequence), future))
            self._cond.notify()
        return future

    def wake(self) -> None:
        """Run a cycle now rather than at the next interval."""
        with self._cond:
            self._wake = True
            self._cond.notify()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold off cycles while the owner rewrites the log; lowers the flushed offset after."""
        with self._cycle:
            yield

    def reset(self, flushed_log_offset: int) -> None:
        """Set the flushed offset after a truncation (call inside `paused`)."""
        with self._cond:
            self._flushed = flushed_log_offset

    def _resolve(self, flushed: int, error: BaseException | None) -> None:
        with self._cond:
            if error is None:
                self._flushed = max(self._flushed, flushed)
            ready: list[Future[int]] = []
            while self._waiters and (error is not None or self._waiters[0][0] <= self._flushed):
                ready.append(heapq.heappop(self._waiters)[2])
            result = self._flushed
        for future in ready:
            if not future.set_running_or_notify_cancel():
                continue  # its waiter gave up and cancelled it
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(StoreError(f"flush failed: {error}"))

    def _cycle_once(self, with_metadata: bool) -> None:
        with self._cycle:
            started = time.perf_counter()
            try:
                flushed = self._sync_log()
            except OSError as exc:
                log.error("commit log fsync failed: %s", exc)
                self._resolve(0, exc)
                return
            on_flush = self.on_flush
            if on_flush is not None and flushed > self._flushed:
                on_flush(time.perf_counter() - started)
            self._resolve(flushed, None)
            if with_metadata:
                try:
                    self._sync_metadata(flushed)
                except OSError as exc:
                    log.error("metadata flush failed: %s", exc)

    def _run(self) -> None:
        next_metadata = time.monotonic() + self._metadata_interval
        while True:
            with self._cond:
                deadline = time.monotonic() + self._flush_interval
                while not (self._closing or self._waiters or self._wake):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closing:
                    return
                self._wake = False
            now = time.monotonic()
            with_metadata = now >= next_metadata
            if with_metadata:
                next_metadata = now + self._metadata_interval
            try:
                self._cycle_once(with_metadata)
            except Exception:
                log.exception("flush cycle failed")

    def flush_all(self) -> None:
        """Run a full cycle (commit log, then metadata and checkpoint) in the caller's thread."""
        self._cycle_once(with_metadata=True)

    def _stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def abandon(self) -> None:
        """Stop the thread with no final cycle: what a crash leaves (fault-injection tests)."""
        self._stop()

    def close(self) -> None:
        """Stop the thread, then run a final full cycle in the caller's thread."""
        self._stop()
        self._cycle_once(with_metadata=True)
        with self._cond:
            leftover = [entry[2] for entry in self._waiters]
            self._waiters.clear()
        for future in leftover:
            future.set_exception(StoreError("the store closed before this offset was flushed"))
