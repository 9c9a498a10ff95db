"""Measurement helpers shared by the `ferry bench` commands: rows, CPU meters, send windows.

CPU is read from /proc for server processes and from getrusage for this process, over the wall
time of one row (100 % = one core).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Meter",
    "Row",
    "Side",
    "Tally",
    "free_port",
    "interleaved_sends",
    "interleaved_sends_by_size",
    "process_cpu",
    "quiet_nats_errors",
    "self_cpu",
    "timed_sync",
    "timed_window",
]

log = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement."""

    system: str
    mode: str
    size: int
    messages: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    client_cpu_pct: float
    server_cpu_pct: float
    failed: int = 0  # sends that raised (counted apart from msg/s)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def self_cpu() -> float:
    """CPU seconds (user + system, every thread) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """CPU of this process and of the server processes over one measurement (one slice)."""

    def __init__(self, server_pids: list[int]) -> None:
        self._tally = Tally(server_pids)
        self._tally.begin()

    def row(self, system: str, mode: str, size: int, messages: int, latencies: list[float]) -> Row:
        """The row for what was measured since this meter was made."""
        self._tally.end(messages, latencies)
        return self._tally.row(system, mode, size)


class Tally:
    """One row measured in slices, interleaved with another system's.

    Time, CPU, messages and latencies are summed over the slices between `begin` and `end`.
    """

    def __init__(self, server_pids: list[int]) -> None:
        self._pids = server_pids
        self._mark: tuple[float, float, float] | None = None
        self._elapsed = 0.0
        self._client = 0.0
        self._servers = 0.0
        self._messages = 0
        self._latencies: list[float] = []

    def begin(self) -> None:
        """Start a slice."""
        self._mark = (time.perf_counter(), self_cpu(), sum(process_cpu(p) for p in self._pids))

    def end(self, messages: int, latencies: list[float]) -> None:
        """End the slice `begin` started, adding what it measured."""
        if self._mark is None:
            raise RuntimeError("Tally.end without begin")
        started, client, servers = self._mark
        self._elapsed += time.perf_counter() - started
        self._client += self_cpu() - client
        self._servers += sum(process_cpu(p) for p in self._pids) - servers
        self._messages += messages
        self._latencies += latencies
        self._mark = None

    def row(self, system: str, mode: str, size: int) -> Row:
        """The row over every slice."""
        return _row(
            system,
            mode,
            size,
            self._messages,
            self._elapsed,
            self._client,
            self._servers,
            self._latencies,
        )


def _row(
    system: str,
    mode: str,
    size: int,
    messages: int,
    elapsed: float,
    client_cpu_s: float,
    servers_cpu_s: float,
    latencies: list[float],
) -> Row:
    ordered = sorted(latencies)
    return Row(
        system=system,
        mode=mode,
        size=size,
        messages=messages,
        seconds=elapsed,
        msgs_per_s=messages / elapsed,
        mb_per_s=messages * size / elapsed / 1e6,
        p50_ms=statistics.median(ordered) * 1000 if ordered else None,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000 if ordered else None,
        client_cpu_pct=client_cpu_s / elapsed * 100,
        server_cpu_pct=servers_cpu_s / elapsed * 100,
    )


async def timed_sync(
    send: Callable[[], Awaitable[object]], seconds: float
) -> tuple[int, list[float]]:
    """One send at a time for `seconds`; return count and per-send latencies."""
    latencies: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        await send()
        latencies.append(time.perf_counter() - started)
    return len(latencies), latencies


async def timed_window(
    send: Callable[[], Awaitable[object]], seconds: float, window: int
) -> tuple[int, list[float]]:
    """Keep `window` sends in flight for `seconds`; return count and per-send latencies."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        started = time.perf_counter()
        try:
            await send()
            latencies.append(time.perf_counter() - started)
        finally:
            slots.release()

    while time.perf_counter() < deadline:
        await slots.acquire()
        task = asyncio.get_running_loop().create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return len(latencies), latencies


async def quiet_nats_errors(exc: Exception) -> None:
    """The NATS client's error hook: refused connections while nats-server starts are expected."""
    log.debug("nats client: %s", exc)


def free_port() -> int:
    """A loopback port free right now (for servers that cannot report the one they took)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _no_rows() -> list[Row]:
    return []


@dataclass
class Side:
    """One system under test, running.

    `sender(size)` sends one message of that size; `rows_after` measures what comes after the
    interleaved send rows (nothing by default).
    """

    system: str
    pids: list[int]
    sender: Callable[[int], Callable[[], Awaitable[object]]]
    rows_after: Callable[[], Awaitable[list[Row]]] = field(default=_no_rows)


async def interleaved_sends(
    sides: list[Side], size: int, *, seconds: float, rounds: int, window: int
) -> list[Row]:
    """Sync and windowed send rows of every side, measured in `rounds` rotating slices.

    Each row's `seconds` is cut into `rounds` slices; in every round each mode runs one slice
    per side, and the side that goes first rotates by round. A machine that speeds up or slows
    down during the run moves every side alike: run one after the other, the same row's ratio
    moved by up to 2x between reruns.
    """
    slice_s = seconds / rounds
    modes: list[tuple[str, int | None]] = [("sync", None), (f"window {window}", window)]
    tallies = {(side.system, mode): Tally(side.pids) for side in sides for mode, _ in modes}
    for round_number in range(rounds):
        shift = round_number % len(sides)
        order = sides[shift:] + sides[:shift]
        for mode, in_flight in modes:
            for side in order:
                tally = tallies[(side.system, mode)]
                send = side.sender(size)
                tally.begin()
                if in_flight is None:
                    count, latencies = await timed_sync(send, slice_s)
                else:
                    count, latencies = await timed_window(send, slice_s, in_flight)
                tally.end(count, latencies)
    return [
        tallies[(side.system, mode)].row(side.system, mode, size)
        for side in sides
        for mode, _ in modes
    ]


async def interleaved_sends_by_size(
    sides: list[Side],
    sizes: tuple[int, ...],
    *,
    seconds: float,
    rounds: int,
    window: int,
    progress: Callable[[str], None],
) -> list[Row]:
    """`interleaved_sends` for each payload size in turn, saying which through `progress`."""
    rows: list[Row] = []
    for size in sizes:
        progress(f"sends of {size} B")
        rows += await interleaved_sends(sides, size, seconds=seconds, rounds=rounds, window=window)
    return rows
