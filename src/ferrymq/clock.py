"""The process clock: what time a server thinks it is, as every time-based decision reads it.

Owns the process's monotonic seconds (`mono`) and wall-clock milliseconds (`wall_ms`): the real
clocks plus an offset that only a test moves (a clock fault: `bump`, `strobe`, `reset`; the
chaos harness's ClockNemesis, reference/reliability-harness.md sections 2.5 and 3).

Rules:
1. Decisions that compare times read this module, never `time`: master leases, broker liveness
   at the controller and the NameServer, SyncStateSet lag (`haMaxTimeSlaveNotCatchup`), client
   and lock expiry on the broker, stored timestamps, delayed messages, transaction checks.
   Pacing of one wait (asyncio sleeps and timeouts, RPC deadlines, the flusher's interval, the
   Raft driver's tick sleep, HA connection heartbeats) stays on the event loop's clock, which no
   fault moves.
2. An offset moves both clocks alike, as a step of the system clock under libfaketime does, so
   `mono()` can go backwards: code timing a lease treats a reading before the lease began as
   expired.
3. Only the test-clock request (`rpc.testclock`) moves the process clock, and it is refused unless
   the process started with `FERRYMQ_TEST_CLOCK=1`. The pure cores (Raft, controller decide,
   routes) take `now` as an argument and never import this module.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CLOCK",
    "MAX_OFFSET_S",
    "MAX_STROBE_S",
    "TEST_CLOCK_ENABLED",
    "TEST_CLOCK_ENV",
    "Clock",
    "mono",
    "wall_ms",
]

TEST_CLOCK_ENV: Final = "FERRYMQ_TEST_CLOCK"
TEST_CLOCK_ENABLED: Final = os.environ.get(TEST_CLOCK_ENV) == "1"
"""Whether this process accepts test-clock requests (read once, at start)."""

MAX_OFFSET_S: Final = 86_400.0
"""The largest offset a test may set, either way (a day; Jepsen's bump tops out near 288 s)."""
MAX_STROBE_S: Final = 3_600.0
"""The longest a strobe may last."""
MIN_STROBE_PERIOD_S: Final = 0.001


@dataclass(frozen=True, slots=True)
class _Strobe:
    delta_s: float
    period_s: float
    start: float
    """Real monotonic seconds."""
    until: float


class Clock:
    """Real clocks plus a test-set offset; `source`s are injectable for unit tests."""

    def __init__(
        self,
        mono_source: Callable[[], float] = time.monotonic,
        wall_ns_source: Callable[[], int] = time.time_ns,
    ) -> None:
        self._mono_source = mono_source
        self._wall_ns_source = wall_ns_source
        self._offset_s = 0.0
        self._strobe: _Strobe | None = None
        self._faulty = False
        """Fast path: False while no fault was ever set since the last reset."""

    def offset(self) -> float:
        """Seconds this clock is ahead of the real one now (negative: behind)."""
        if not self._faulty:
            return 0.0
        offset = self._offset_s
        strobe = self._strobe
        if strobe is not None:
            real = self._mono_source()
            if real >= strobe.until:
                self._strobe = None
                self._faulty = offset != 0.0
            elif int((real - strobe.start) / strobe.period_s) % 2 == 1:
                offset += strobe.delta_s
        return offset

    def mono(self) -> float:
        """Monotonic seconds as this process sees them (may step back under a clock fault)."""
        if not self._faulty:
            return self._mono_source()
        return self._mono_source() + self.offset()

    def wall_ms(self) -> int:
        """Milliseconds since the epoch as this process sees them."""
        if not self._faulty:
            return self._wall_ns_source() // 1_000_000
        return self._wall_ns_source() // 1_000_000 + round(self.offset() * 1000)

    def bump(self, delta_s: float) -> float:
        """Step the clock by `delta_s` (either sign); returns the new offset.

        Raises:
            ValueError: not a finite number, or the offset would pass `MAX_OFFSET_S`.
        """
        _check_finite("delta", delta_s)
        offset = self._offset_s + delta_s
        if abs(offset) > MAX_OFFSET_S:
            raise ValueError(f"an offset of {offset:g} s is beyond ±{MAX_OFFSET_S:g} s")
        self._offset_s = offset
        self._faulty = True
        return offset

    def strobe(self, delta_s: float, period_s: float, duration_s: float) -> None:
        """Flip the clock between its offset and offset + `delta_s` every `period_s`, for a while.

        Raises:
            ValueError: a value is not finite or out of its bounds.
        """
        for name, value in (("delta", delta_s), ("period", period_s), ("duration", duration_s)):
            _check_finite(name, value)
        if abs(self._offset_s + delta_s) > MAX_OFFSET_S:
            raise ValueError(f"a strobe delta of {delta_s:g} s is beyond ±{MAX_OFFSET_S:g} s")
        if period_s < MIN_STROBE_PERIOD_S:
            raise ValueError(f"a strobe period must be at least {MIN_STROBE_PERIOD_S:g} s")
        if not 0 < duration_s <= MAX_STROBE_S:
            raise ValueError(f"a strobe lasts more than 0 and at most {MAX_STROBE_S:g} s")
        real = self._mono_source()
        self._strobe = _Strobe(delta_s, period_s, real, real + duration_s)
        self._faulty = True

    def reset(self) -> None:
        """Back to the real clocks: no offset, no strobe."""
        self._offset_s = 0.0
        self._strobe = None
        self._faulty = False

    @property
    def is_strobing(self) -> bool:
        """Whether a strobe is still running."""
        self.offset()
        return self._strobe is not None


def _check_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, not {value!r}")


CLOCK: Final = Clock()
"""This process's clock."""


def mono() -> float:
    """Monotonic seconds of the process clock."""
    return CLOCK.mono()


def wall_ms() -> int:
    """Wall-clock milliseconds of the process clock."""
    return CLOCK.wall_ms()
