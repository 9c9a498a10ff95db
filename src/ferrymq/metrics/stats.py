"""Throughput accounting: counts per key and their windowed rates (RocketMQ `StatsItemSet`).

Owns what RocketMQ's `BrokerStatsManager` keeps as TOPIC_PUT_NUMS / TOPIC_PUT_SIZE (per topic)
and GROUP_GET_NUMS / GROUP_GET_SIZE (per topic and group): cumulative message and byte counts,
and the rates over the last minute that `consumerProgress`' consumeTps, `clusterList`'s
InTPS/OutTPS and `brokerStatus`' putTps/getTransferedTps show.

Rules:
1. Pure: no clock, no I/O, no locks. `add` is the hot path (one dict lookup and two additions per
   send or pull); times come in as `now` (seconds, any monotonic origin) to `sample` and `rate`.
2. A rate is (count now - count at the oldest snapshot inside the window) / the time between;
   snapshots are taken by `sample` at most every `sample_s`, and kept for `window_s`. A key
   missing from a snapshot had count 0 then (keys only appear, never go back, until `forget`
   drops a key of a deleted topic or group from the counts and every snapshot at once).
3. Latency histograms (`Latency`) count observations into fixed buckets: `bisect` and one list
   increment, so the send path never touches prometheus-client's locks.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Final, Generic, TypeVar

__all__ = ["DEFAULT_LATENCY_BUCKETS_S", "Latency", "Rates", "StatsTable"]

K = TypeVar("K", bound=Hashable)

DEFAULT_LATENCY_BUCKETS_S: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Upper bounds (seconds) of the latency buckets: 100 us to 5 s (+Inf is implied)."""


_Snapshot = tuple[float, dict[K, tuple[int, int]]]
"""(time, key -> (messages, bytes)) at that time."""


class Rates:
    """Messages and bytes per second of one key over the window."""

    __slots__ = ("bytes_per_s", "count_per_s")

    def __init__(self, count_per_s: float, bytes_per_s: float) -> None:
        self.count_per_s = count_per_s
        self.bytes_per_s = bytes_per_s

    def __repr__(self) -> str:
        return f"Rates({self.count_per_s:.3f}/s, {self.bytes_per_s:.1f} B/s)"


class StatsTable(Generic[K]):
    """Cumulative (count, bytes) per key, with rates over a sliding window."""

    __slots__ = ("_cells", "_snapshots", "sample_s", "window_s")

    def __init__(self, now: float, *, window_s: float = 60.0, sample_s: float = 10.0) -> None:
        self.window_s = window_s
        self.sample_s = sample_s
        self._cells: dict[K, list[int]] = {}
        self._snapshots: deque[_Snapshot[K]] = deque()
        self._snapshots.append((now, {}))

    def add(self, key: K, count: int, size: int) -> None:
        """Count `count` messages of `size` bytes in all under `key`."""
        cell = self._cells.get(key)
        if cell is None:
            self._cells[key] = [count, size]
        else:
            cell[0] += count
            cell[1] += size

    def total(self, key: K) -> tuple[int, int]:
        """(messages, bytes) counted under `key` since the start."""
        cell = self._cells.get(key)
        return (cell[0], cell[1]) if cell is not None else (0, 0)

    def items(self) -> Iterator[tuple[K, int, int]]:
        """Every key with its cumulative (messages, bytes)."""
        for key, cell in list(self._cells.items()):
            yield key, cell[0], cell[1]

    def forget(self, doomed: Callable[[K], bool]) -> None:
        """Drop every key `doomed` is true of, from the counts and the snapshots (rule 2)."""
        for key in [k for k in self._cells if doomed(k)]:
            del self._cells[key]
        for _, counts in self._snapshots:
            for key in [k for k in counts if doomed(k)]:
                del counts[key]

    def grand_total(self) -> tuple[int, int]:
        """(messages, bytes) over every key."""
        count = size = 0
        for cell in self._cells.values():
            count += cell[0]
            size += cell[1]
        return count, size

    def sample(self, now: float) -> None:
        """Take a snapshot if the last one is `sample_s` old; drop those out of the window."""
        snapshots = self._snapshots
        if now - snapshots[-1][0] >= self.sample_s:
            snapshots.append((now, {k: (c[0], c[1]) for k, c in self._cells.items()}))
        # keep the newest snapshot at or before the window's start: it is the rate's baseline
        while len(snapshots) > 1 and snapshots[1][0] <= now - self.window_s:
            snapshots.popleft()

    def _baseline(
        self, now: float, window_s: float | None
    ) -> tuple[float, dict[K, tuple[int, int]]]:
        """The newest snapshot at or before `now - window_s`, else the oldest one kept."""
        self.sample(now)
        start = now - (self.window_s if window_s is None else window_s)
        chosen = self._snapshots[0]
        for snapshot in self._snapshots:
            if snapshot[0] > start:
                break
            chosen = snapshot
        return chosen

    def rate(self, key: K, now: float, window_s: float | None = None) -> Rates:
        """`key`'s messages and bytes per second over the window (default: the whole one)."""
        since, counts = self._baseline(now, window_s)
        elapsed = now - since
        if elapsed <= 0:
            return Rates(0.0, 0.0)
        count, size = self.total(key)
        base_count, base_size = counts.get(key, (0, 0))
        return Rates((count - base_count) / elapsed, (size - base_size) / elapsed)

    def rate_all(self, now: float, window_s: float | None = None) -> Rates:
        """The rates summed over every key."""
        since, counts = self._baseline(now, window_s)
        elapsed = now - since
        if elapsed <= 0:
            return Rates(0.0, 0.0)
        count, size = self.grand_total()
        base_count = sum(c for c, _ in counts.values())
        base_size = sum(s for _, s in counts.values())
        return Rates((count - base_count) / elapsed, (size - base_size) / elapsed)


class Latency:
    """A latency histogram: counts per bucket, their sum and maximum, cheap to observe."""

    __slots__ = ("bounds", "counts", "max_s", "sum_s")

    def __init__(self, bounds: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum_s = 0.0
        self.max_s = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation of `seconds`."""
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (`le` text, observations at or below it), `+Inf` last."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(running + self.counts[-1])))
        return out
