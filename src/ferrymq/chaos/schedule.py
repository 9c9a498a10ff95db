"""Fault schedules: which nemesis hits which role when, for how long; fixed shape, seeded jitter.

`standard` is the ~5-minute CI run (every nemesis at least once, masters and slaves both hit);
`smoke` is the under-a-minute version the test suite runs; `power-loss` and `bitflip` hit one
fault three times (the bug-switch tests). The same seed always gives the same
schedule; the schedule is written into the history, so a failing run can be replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

__all__ = ["SCHEDULES", "Schedule", "Step", "build_schedule"]


@dataclass(frozen=True, slots=True)
class Step:
    """One fault: begin `nemesis` on `target` at `at_s`, end it `duration_s` later."""

    at_s: float
    nemesis: str
    target: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """A run's faults and timing."""

    name: str
    warmup_s: float
    steps: tuple[Step, ...]
    quiet_s: float
    """Fault-free load after the last step, before the clients stop."""

    @property
    def faults_end_s(self) -> float:
        """When the last fault has healed."""
        return max((s.at_s + s.duration_s for s in self.steps), default=self.warmup_s)


_STANDARD: Final = (
    ("kill", "slave", 8.0),
    ("kill", "master", 6.0),
    ("pause", "slave", 10.0),
    ("pause", "master", 5.0),
    ("partition-isolate", "slave", 12.0),
    ("partition-isolate", "master", 8.0),
    ("partition-split", "master", 10.0),
    ("partition-one-way", "slave", 8.0),
    ("torn-tail", "slave", 2.0),
    ("bitflip", "slave", 2.0),
    ("power-loss", "master", 3.0),
    ("power-loss", "slave", 2.0),
    ("disk-full", "master", 8.0),
    ("disk-full", "slave", 8.0),
    ("torn-tail", "master", 3.0),
    ("bitflip", "slave", 2.0),
)
_STANDARD_GAP_S: Final = 7.0

_SMOKE: Final = (
    ("kill", "slave", 2.0),
    ("power-loss", "master", 1.5),
    ("pause", "slave", 2.0),
    ("partition-isolate", "master", 2.0),
    ("bitflip", "slave", 1.0),
    ("torn-tail", "slave", 1.0),
    ("disk-full", "master", 2.0),
)
_SMOKE_GAP_S: Final = 2.0

_FOCUSED: Final = {
    "power-loss": (
        ("power-loss", "master", 1.5),
        ("power-loss", "master", 1.5),
        ("power-loss", "master", 1.5),
    ),
    "bitflip": (
        ("bitflip", "slave", 1.0),
        ("bitflip", "slave", 1.0),
        ("bitflip", "slave", 1.0),
    ),
}
"""Short runs aimed at one fault (the bug-switch tests: each must catch its bug)."""

SCHEDULES: Final = ("standard", "smoke", *_FOCUSED)


def _lay_out(
    name: str,
    faults: tuple[tuple[str, str, float], ...],
    warmup_s: float,
    gap_s: float,
    quiet_s: float,
    rng: random.Random,
) -> Schedule:
    steps: list[Step] = []
    at = warmup_s
    for nemesis, target, duration in faults:
        at += rng.uniform(0.0, gap_s / 2)
        steps.append(Step(round(at, 2), nemesis, target, duration))
        at += duration + gap_s
    return Schedule(name, warmup_s, tuple(steps), quiet_s)


def build_schedule(name: str, seed: int) -> Schedule:
    """The named schedule with the seed's jitter.

    Raises:
        ValueError: an unknown schedule name.
    """
    rng = random.Random(f"schedule-{name}-{seed}")
    if name == "standard":
        return _lay_out(name, _STANDARD, 10.0, _STANDARD_GAP_S, 8.0, rng)
    if name == "smoke":
        return _lay_out(name, _SMOKE, 3.0, _SMOKE_GAP_S, 2.0, rng)
    if name in _FOCUSED:
        return _lay_out(name, _FOCUSED[name], 3.0, _SMOKE_GAP_S, 1.0, rng)
    raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
