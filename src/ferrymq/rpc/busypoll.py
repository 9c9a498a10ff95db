"""Adaptive busy polling of a server's event loop after each read (broker key `busyPollMicros`).

A server that sleeps in epoll between requests pays for every wake-up. On this project's virtual
machines the write that wakes a process sleeping on an idle vCPU costs its writer 25-35 us (an
inter-processor interrupt, which exits to the hypervisor), and the woken process waits for its
vCPU to resume; a broker answering sync sends one at a time sleeps between every two. So after a
read the loop keeps polling, with a zero timeout, for a window sized as KVM sizes its halt
polling: when the next read comes within `max_window` of the end of the last one but after the
window, the window grows to twice that gap (at most `max_window`); when it comes later than
`max_window`, the window halves, and below a microsecond it is 0. Sparse traffic never polls; a
stream of requests a round trip apart meets a loop that is awake. Every polling round yields the
CPU (`sched_yield`) to anything else runnable there: a master's slaves, on a machine with fewer
cores than processes, need the CPU more than its polling does.

Go's runtime, which NATS runs on, spins the same way before it parks a thread. The cost is CPU:
while requests come less than `max_window` apart, a polling server shows up to a whole core
busy (`ferry bench` reports it). Not thread-safe: one loop, the one that calls it.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Final

__all__ = ["BusyPoll"]

_MIN_WINDOW: Final = 1e-6
_yield: Final[Callable[[], None]] = getattr(os, "sched_yield", lambda: None)


class BusyPoll:
    """The polling window of one event loop; its owner calls `read_started` and `read_done`."""

    def __init__(
        self, max_window: float, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if max_window < 0:
            raise ValueError(f"max_window must be >= 0, not {max_window}")
        self.max_window = max_window
        """Seconds: the longest the loop polls after a read."""
        self.window = 0.0
        """Seconds the loop polls after the next read."""
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_since = -math.inf
        self._until = 0.0
        self._polling = False

    @property
    def polling(self) -> bool:
        """Whether the loop is being kept from sleeping now."""
        return self._polling

    def read_started(self) -> None:
        """Bytes arrived: adapt the window to how long after the last read they came."""
        gap = self._clock() - self._idle_since
        if gap > self.window:  # not met by polling: a longer window would have, or none would
            if gap <= self.max_window:
                self.window = min(self.max_window, 2 * gap)
            else:
                self.window = self.window / 2 if self.window >= 2 * _MIN_WINDOW else 0.0
        self._until = 0.0  # this read is handled now; `read_done` polls again after it

    def read_done(self) -> None:
        """The read is handled: poll for the window from now on."""
        now = self._clock()
        self._idle_since = now
        if not self.window:
            return
        self._until = now + self.window
        if not self._polling:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._polling = True
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        """One round: yield the CPU, then stay scheduled (so the loop polls, not sleeps)."""
        _yield()
        if self._clock() < self._until:
            assert self._loop is not None
            self._loop.call_soon(self._poll)
        else:
            self._polling = False
