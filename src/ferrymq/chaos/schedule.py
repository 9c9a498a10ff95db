"""Fault schedules: which nemesis hits which role when, for how long; fixed shape, seeded jitter.

`standard` is the ~5-minute CI run (every nemesis at least once, masters and slaves both hit;
on the controller topology also failovers, the controllers' Raft leader and followers, a master
cut off from the cluster, and clock jumps on the master and the controllers' leader); `smoke`
is the under-a-minute version the test suite runs; `power-loss` and `bitflip` hit one fault
three times, `strand-slave` once (the bug-switch tests: a second strand could elect a replica
that still holds what the first one lost);
`soak` rotates seeded mixes of every fault the topology has for a given duration. Each
topology (`controller`, `controller-2groups`, `classic`) has its own `standard` and `smoke`; the
two-group ones hit both groups (`master@broker-b` names broker-b's master), one fault at a time,
so while one group fails over the other takes the load alone. With Connect workers in the run
(`connect=True`), `standard` and `smoke` also kill, pause and cut off the workers' leader and
pause a follower (a paused follower forwards the writes it holds when it resumes), spread among
the broker faults, and `soak` adds the workers to the kill, pause and isolate targets; the broker
faults on the first group hit the config log's broker group as well. The same seed always
gives the same schedule; the schedule is written into the output, so a failing run can be
replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

__all__ = ["SCHEDULES", "TOPOLOGIES", "Schedule", "Step", "build_schedule"]


@dataclass(frozen=True, slots=True)
class Step:
    """One fault: begin `nemesis` on `target` at `at_s`, end it `duration_s` later."""

    at_s: float
    nemesis: str
    target: str
    duration_s: float
    size_ms: int | None = None
    """Clock faults: the bump (strobe: the flip), signed; None: drawn from the run's seed."""


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


_CLASSIC_STANDARD: Final = (
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
    ("clock-bump", "master", 6.0, -240_000),
    ("bitflip", "slave", 2.0),
    ("clock-strobe", "slave", 6.0, 30_000),
)

_CLASSIC_SMOKE: Final = (
    ("kill", "slave", 2.0),
    ("power-loss", "master", 1.5),
    ("pause", "slave", 2.0),
    ("partition-isolate", "master", 2.0),
    ("bitflip", "slave", 1.0),
    ("torn-tail", "slave", 1.0),
    ("disk-full", "master", 2.0),
    ("clock-bump", "master", 2.0, -240_000),
)

_STANDARD: Final = (
    ("kill", "master", 8.0),
    ("kill", "slave", 6.0),
    ("kill", "controller-leader", 6.0),
    ("pause", "master", 6.0),
    ("partition-cluster", "master", 10.0),
    ("kill", "controller-follower", 5.0),
    ("pause", "slave", 6.0),
    ("partition-isolate", "slave", 8.0),
    ("power-loss", "master", 3.0),
    ("torn-tail", "slave", 2.0),
    ("pause", "controller-leader", 5.0),
    ("partition-split", "master", 8.0),
    ("bitflip", "slave", 2.0),
    ("disk-full", "master", 8.0),
    ("strand-slave", "slave", 6.0),
    ("clock-bump", "master", 8.0, -240_000),
    ("partition-one-way", "master", 6.0),
    ("clock-bump", "controller-leader", 8.0, 200_000),
    ("disk-full", "slave", 6.0),
    ("clock-strobe", "master", 6.0, 30_000),
    ("power-loss", "slave", 2.0),
)
"""The controller topology's CI run: every nemesis, failovers and controller faults, and clock
jumps: four minutes back on the master (its lease must not stretch over them), 200 s forward on
the controllers' leader (every broker looks silent to it), a 30 s strobe on the master."""
_STANDARD_GAP_S: Final = 7.0

_SMOKE: Final = (
    ("kill", "master", 3.0),
    ("pause", "slave", 2.0),
    ("partition-cluster", "master", 4.0),
    ("kill", "controller-leader", 2.0),
    ("bitflip", "slave", 1.0),
    ("disk-full", "master", 2.0),
    ("clock-bump", "master", 2.0, -240_000),
)
_SMOKE_GAP_S: Final = 2.0

_TWO_GROUPS_STANDARD: Final = (
    ("kill", "master", 8.0),
    ("kill", "master@broker-b", 8.0),
    ("kill", "slave@broker-b", 6.0),
    ("kill", "controller-leader", 6.0),
    ("pause", "master@broker-b", 6.0),
    ("partition-cluster", "master", 10.0),
    ("partition-cluster", "master@broker-b", 10.0),
    ("kill", "controller-follower", 5.0),
    ("pause", "slave", 6.0),
    ("partition-isolate", "slave@broker-b", 8.0),
    ("power-loss", "master@broker-b", 3.0),
    ("torn-tail", "slave", 2.0),
    ("pause", "controller-leader", 5.0),
    ("partition-split", "master@broker-b", 8.0),
    ("bitflip", "slave@broker-b", 2.0),
    ("disk-full", "master", 8.0),
    ("strand-slave", "slave@broker-b", 6.0),
    ("clock-bump", "master@broker-b", 8.0, -240_000),
    ("partition-one-way", "master", 6.0),
    ("clock-bump", "controller-leader", 8.0, 200_000),
    ("disk-full", "slave@broker-b", 6.0),
    ("clock-strobe", "master", 6.0, 30_000),
    ("power-loss", "slave", 2.0),
)
"""The controller standard run over two groups: every nemesis, failovers of both masters."""

_TWO_GROUPS_SMOKE: Final = (
    ("kill", "master", 3.0),
    ("kill", "master@broker-b", 3.0),
    ("pause", "slave@broker-b", 2.0),
    ("partition-cluster", "master@broker-b", 4.0),
    ("kill", "controller-leader", 2.0),
    ("bitflip", "slave@broker-b", 1.0),
    ("disk-full", "master", 2.0),
    ("clock-bump", "master@broker-b", 2.0, -240_000),
)

_CONNECT_STANDARD: Final = (
    ("kill", "connect-leader", 6.0),
    ("pause", "connect-leader", 6.0),
    ("partition-isolate", "connect-leader", 8.0),
    ("pause", "connect-follower", 6.0),
)
"""Connect worker faults of the standard run: a kill -9 of the leader (a new claim 0.5 s after
the broker drops it), a SIGSTOP of the leader past the session timeout (another claims; the old
one must be refused when it resumes), the leader cut off from everyone (it cannot heartbeat:
another claims, and it must stop acting as leader), and a paused follower holding writes."""

_CONNECT_SMOKE: Final = (
    ("kill", "connect-leader", 2.0),
    ("pause", "connect-leader", 4.0),
)

_CONNECT_TARGETS: Final = {
    "kill": ("connect-leader", "connect-follower"),
    "pause": ("connect-leader", "connect-follower"),
    "partition-isolate": ("connect-leader",),
}
"""What a soak with Connect workers adds to the targets of its mix."""

_SOAK_MIX: Final = (
    ("kill", ("master", "slave", "controller-leader", "controller-follower"), (2.0, 8.0)),
    ("pause", ("master", "slave", "controller-leader"), (1.0, 6.0)),
    ("partition-cluster", ("master",), (2.0, 10.0)),
    ("partition-isolate", ("master", "slave", "controller-leader"), (2.0, 10.0)),
    ("partition-split", ("master", "slave"), (2.0, 8.0)),
    ("partition-one-way", ("master", "slave"), (2.0, 8.0)),
    ("power-loss", ("master", "slave"), (1.0, 3.0)),
    ("torn-tail", ("master", "slave"), (1.0, 3.0)),
    ("bitflip", ("slave",), (1.0, 2.0)),
    ("disk-full", ("master", "slave"), (2.0, 8.0)),
    ("strand-slave", ("slave",), (5.0, 7.0)),
    (
        "clock-bump",
        ("master", "slave", "controller-leader", "controller-follower", "namesrv"),
        (2.0, 10.0),
    ),
    ("clock-strobe", ("master", "slave", "controller-leader"), (2.0, 10.0)),
)
"""What a soak draws from: nemesis, its targets, duration range (s)."""
_CLASSIC_ONLY_TARGETS: Final = frozenset({"master", "slave"})
_CONNECT_ONLY_TARGETS: Final = frozenset(t for ts in _CONNECT_TARGETS.values() for t in ts)
_SOAK_GAP_S: Final = 6.0

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
    "strand-slave": (("strand-slave", "slave", 6.0),),
}
"""Short runs aimed at one fault (the bug-switch tests: each must catch its bug)."""

SCHEDULES: Final = ("standard", "smoke", "soak", *_FOCUSED)
TOPOLOGIES: Final = ("controller", "controller-2groups", "classic")
_SECOND_GROUP: Final = "broker-b"


_Fault = tuple[str, str, float] | tuple[str, str, float, int]
"""nemesis, target, duration (s) and, for a clock fault, its size (ms)."""


def _lay_out(
    name: str,
    faults: tuple[_Fault, ...],
    warmup_s: float,
    gap_s: float,
    quiet_s: float,
    rng: random.Random,
) -> Schedule:
    steps: list[Step] = []
    at = warmup_s
    for fault in faults:
        nemesis, target, duration = fault[:3]
        size_ms = fault[3] if len(fault) == 4 else None
        at += rng.uniform(0.0, gap_s / 2)
        steps.append(Step(round(at, 2), nemesis, target, duration, size_ms))
        at += duration + gap_s
    return Schedule(name, warmup_s, tuple(steps), quiet_s)


def _with_connect(faults: tuple[_Fault, ...], extra: tuple[_Fault, ...]) -> tuple[_Fault, ...]:
    """`faults` with `extra` spread evenly among them (fixed places: the seed only jitters)."""
    out = list(faults)
    for k, fault in enumerate(extra):
        out.insert(round((k + 1) * len(faults) / (len(extra) + 1)) + k, fault)
    return tuple(out)


def _soak(topology: str, duration_s: float, rng: random.Random, connect: bool) -> Schedule:
    """Seeded rotation through the fault mix until `duration_s`.

    Shuffled rounds: each round uses every fault once, so every kind recurs evenly.
    """
    controllers = topology != "classic"
    allowed = _CLASSIC_ONLY_TARGETS | _CONNECT_ONLY_TARGETS
    mix = [
        (
            nemesis,
            [
                t
                for t in (*targets, *(_CONNECT_TARGETS.get(nemesis, ()) if connect else ()))
                if controllers or t in allowed
            ],
        )
        for nemesis, targets, _ in _SOAK_MIX
        if controllers or nemesis not in ("partition-cluster", "strand-slave")
    ]
    if topology == "controller-2groups":  # every broker fault hits either group
        mix = [
            (
                nemesis,
                targets + [f"{t}@{_SECOND_GROUP}" for t in targets if t in _CLASSIC_ONLY_TARGETS],
            )
            for nemesis, targets in mix
        ]
    durations = {nemesis: span for nemesis, _, span in _SOAK_MIX}
    steps: list[Step] = []
    warmup_s, at = 10.0, 10.0
    while True:
        round_ = list(mix)
        rng.shuffle(round_)
        for nemesis, targets in round_:
            low, high = durations[nemesis]
            duration = round(rng.uniform(low, high), 1)
            at += rng.uniform(0.0, _SOAK_GAP_S / 2)
            if at + duration > duration_s:
                return Schedule("soak", warmup_s, tuple(steps), 8.0)
            steps.append(Step(round(at, 2), nemesis, rng.choice(targets), duration))
            at += duration + _SOAK_GAP_S


def build_schedule(
    name: str,
    seed: int,
    topology: str = "controller",
    duration_s: float = 900.0,
    *,
    connect: bool = False,
) -> Schedule:
    """The named schedule with the seed's jitter.

    `duration_s`: the soak's length; `connect`: the run has Connect workers, which `standard`,
    `smoke` and `soak` then hit too.

    Raises:
        ValueError: an unknown schedule or topology name.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    rng = random.Random(f"schedule-{name}-{seed}")
    if name == "standard":
        standard: tuple[_Fault, ...] = {
            "classic": _CLASSIC_STANDARD,
            "controller-2groups": _TWO_GROUPS_STANDARD,
        }.get(topology, _STANDARD)
        if connect:
            standard = _with_connect(standard, _CONNECT_STANDARD)
        return _lay_out(name, standard, 10.0, _STANDARD_GAP_S, 8.0, rng)
    if name == "smoke":
        smoke: tuple[_Fault, ...] = {
            "classic": _CLASSIC_SMOKE,
            "controller-2groups": _TWO_GROUPS_SMOKE,
        }.get(topology, _SMOKE)
        if connect:
            smoke = _with_connect(smoke, _CONNECT_SMOKE)
        return _lay_out(name, smoke, 3.0, _SMOKE_GAP_S, 2.0, rng)
    if name == "soak":
        return _soak(topology, duration_s, rng, connect)
    if name in _FOCUSED:
        return _lay_out(name, _FOCUSED[name], 3.0, _SMOKE_GAP_S, 1.0, rng)
    raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
