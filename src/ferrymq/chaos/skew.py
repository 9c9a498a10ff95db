"""ClockNemesis: clock faults through each server's clock seam (`ferrymq.clock`, TEST_CLOCK).

Jepsen's clock nemesis (reference/reliability-harness.md sections 1.3, 2.5, 6.2), on one node at
a time: `bump` steps its clock by ±1.5^k ms, k in 6..31 (about ±11 ms to ±288 s); `strobe` flips
it by 4 ms to 60 s every 1 ms to 1 s for up to 30 s; `reset` puts it back on the real clocks (the
end of either, and part of healing everything). Wall and monotonic time move together, so a bump
back makes "monotonic" time go back, and the reset after it is a jump forward. Every size comes
from the run's seeded random source unless the schedule's step fixes it (the CI run makes sure of
a long jump each way). Servers take these requests because the harness starts them
with `FERRYMQ_TEST_CLOCK=1`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from ferrymq.client.testclock import ClockFault, move_clock
from ferrymq.rpc.client import RpcClient

__all__ = ["ClockNemesis", "bump_ms", "strobe_ms"]

BUMP_EXPONENTS: Final = (6, 31)
"""A bump is 1.5**k ms for k in this range (Jepsen's `bump`)."""
STROBE_DELTA_MS: Final = (4, 60_000)
STROBE_PERIOD_MS: Final = (1, 1_000)
STROBE_MAX_MS: Final = 30_000


def bump_ms(rng: random.Random) -> int:
    """A seeded bump: ±1.5**k ms, k uniform in 6..31."""
    size = round(1.5 ** rng.randint(*BUMP_EXPONENTS))
    return size if rng.random() < 0.5 else -size


def strobe_ms(rng: random.Random) -> tuple[int, int]:
    """A seeded strobe: (delta, period) in ms; the delta log-uniform, either sign."""
    low, high = STROBE_DELTA_MS
    delta = round(low * (high / low) ** rng.random())
    period = rng.randint(*STROBE_PERIOD_MS)
    return (delta if rng.random() < 0.5 else -delta), period


@dataclass
class ClockNemesis:
    """Moves the clocks of cluster nodes; remembers which ones it moved, to reset them."""

    rpc: RpcClient
    rng: random.Random
    skewed: set[str] = field(default_factory=set)
    """Addresses whose clock this nemesis moved and has not reset."""

    async def bump(self, address: str, size_ms: int | None = None) -> str:
        """Step the clock at `address` by `size_ms` (None: a seeded size); returns a detail line."""
        delta = bump_ms(self.rng) if size_ms is None else size_ms
        self.skewed.add(address)
        clock = await move_clock(self.rpc, address, ClockFault.BUMP, delta_ms=delta)
        return f"bumped by {delta:+d} ms (offset {clock.offset_ms:+d} ms)"

    async def strobe(self, address: str, size_ms: int | None = None) -> str:
        """Flip the clock at `address` by `size_ms` (None: seeded) every seeded period.

        It flips for at most `STROBE_MAX_MS`; the step's end resets it sooner.
        """
        delta, period = strobe_ms(self.rng)
        delta = delta if size_ms is None else size_ms
        self.skewed.add(address)
        await move_clock(
            self.rpc,
            address,
            ClockFault.STROBE,
            delta_ms=delta,
            period_ms=period,
            duration_ms=STROBE_MAX_MS,
        )
        return f"strobing by {delta:+d} ms every {period} ms"

    async def reset(self, address: str) -> str:
        """Back to the real clocks; returns a detail line."""
        clock = await move_clock(self.rpc, address, ClockFault.RESET)
        self.skewed.discard(address)
        return f"clock reset (offset {clock.offset_ms:+d} ms)"

    def forget(self, address: str) -> None:
        """The process at `address` restarted: its clock is the real one again."""
        self.skewed.discard(address)
