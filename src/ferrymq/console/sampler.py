"""The console's periodic readings: what the live charts and the elections list show.

Rules: the sampler reads the cluster every `interval` seconds through the same `ConsoleReader`
the API uses (topics' end offsets, groups' lag and consumed offsets, each group's master and
epoch) and feeds `views`; a failed reading is logged once per kind of failure and skipped, never
fatal. At most `MAX_SAMPLED` topics and groups are sampled. While no one reads the API (nothing
for `IDLE_AFTER_S`), it samples `IDLE_FACTOR` times less often, so a console nobody looks at
(the one `ferry up` runs, say) costs the cluster little.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Generator
from typing import Final

from ferrymq import clock
from ferrymq.console.reader import ConsoleError, ConsoleReader
from ferrymq.console.views import CounterSeries, ElectionLog, GaugeSeries

__all__ = ["Sampler"]

log = logging.getLogger("ferrymq.console")

MAX_SAMPLED: Final = 50
IDLE_AFTER_S: Final = 60.0
IDLE_FACTOR: Final = 10


def pause_after_sample(interval: float, now: float, viewed_at: float | None) -> float:
    """Seconds until the next sample: `interval` while the API is read, longer when idle.

    >>> pause_after_sample(1.0, 100.0, 90.0), pause_after_sample(1.0, 100.0, None)
    (1.0, 10.0)
    """
    if viewed_at is not None and now - viewed_at < IDLE_AFTER_S:
        return interval
    return interval * IDLE_FACTOR


class Sampler:
    """Periodic readings for the charts and the elections list."""

    def __init__(self, reader: ConsoleReader, interval: float) -> None:
        self.reader = reader
        self.interval = interval
        self.topic_rates = CounterSeries()
        """Messages stored per second, per topic."""
        self.group_rates = CounterSeries()
        """Messages consumed (committed) per second, per group."""
        self.group_lag = GaugeSeries()
        self.elections = ElectionLog()
        self.viewed_at: float | None = None
        """When the API was last read (monotonic seconds; None: never)."""
        self._woken = asyncio.Event()
        self._failing: set[str] = set()

    async def sample(self) -> None:
        """Take one reading of everything sampled."""
        at, wall_ms = clock.mono(), time.time_ns() // 1_000_000
        with self._noted("masters"):
            for name, (broker_id, address, epoch) in (await self.reader.masters()).items():
                if self.elections.observe(wall_ms, name, broker_id, address, epoch):
                    log.info("console: %s has a new master %s (epoch %d)", name, address, epoch)
        with self._noted("topics"):
            stored: dict[str, int] = {}
            for topic in (await self.reader.topic_names())[:MAX_SAMPLED]:
                with contextlib.suppress(ConsoleError):
                    stored[topic] = (await self.reader.topic(topic))["max_offset_total"]
            self.topic_rates.add(at, wall_ms, stored)
        with self._noted("groups"):
            lag: dict[str, float] = {}
            consumed: dict[str, int] = {}
            for group in (await self.reader.group_names())[:MAX_SAMPLED]:
                with contextlib.suppress(ConsoleError):
                    progress = await self.reader.group(group)
                    lag[group] = progress["lag"]
                    consumed[group] = progress["consumed_total"]
            self.group_lag.add(at, wall_ms, lag)
            self.group_rates.add(at, wall_ms, consumed)

    @contextlib.contextmanager
    def _noted(self, what: str) -> Generator[None]:
        try:
            yield
        except ConsoleError as exc:
            if what not in self._failing:
                log.warning("console: reading %s failed: %s", what, exc.message)
            self._failing.add(what)
        else:
            self._failing.discard(what)

    def viewed(self) -> None:
        """Note that the API was read now (the pages poll it while open); an idle pause ends."""
        now = clock.mono()
        if pause_after_sample(self.interval, now, self.viewed_at) > self.interval:
            self._woken.set()
        self.viewed_at = now

    async def run(self) -> None:
        """Sample until cancelled: every `interval` seconds while viewed (`pause_after_sample`)."""
        while True:
            await self.sample()
            self._woken.clear()
            pause = pause_after_sample(self.interval, clock.mono(), self.viewed_at)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), pause)
