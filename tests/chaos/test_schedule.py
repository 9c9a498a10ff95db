"""Fault schedules: every nemesis they name exists, targets fit the topology, seeds replay."""

import random

import pytest

from ferrymq.chaos.nemesis import NEMESES
from ferrymq.chaos.schedule import SCHEDULES, TOPOLOGIES, build_schedule
from ferrymq.chaos.skew import bump_ms, strobe_ms

_CONTROLLER_TARGETS = {"controller-leader", "controller-follower"}
_CONTROLLER_NEMESES = {"partition-cluster", "strand-slave"}


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_names_known_nemeses_and_fitting_targets(name: str, topology: str) -> None:
    schedule = build_schedule(name, 1, topology, duration_s=600.0)
    assert schedule.steps
    for step in schedule.steps:
        assert step.nemesis in NEMESES
        assert step.duration_s > 0
        if topology == "classic" and name in ("standard", "smoke", "soak"):
            assert step.target not in _CONTROLLER_TARGETS
            assert step.nemesis not in _CONTROLLER_NEMESES
    starts = [s.at_s for s in schedule.steps]
    assert starts == sorted(starts)
    ends = [s.at_s + s.duration_s for s in schedule.steps]
    assert all(end <= start for end, start in zip(ends, starts[1:], strict=False)), "overlap"


def test_the_controller_standard_run_hits_failovers_and_both_controller_roles() -> None:
    steps = {(s.nemesis, s.target) for s in build_schedule("standard", 1).steps}
    assert {
        ("kill", "master"),
        ("kill", "slave"),
        ("kill", "controller-leader"),
        ("kill", "controller-follower"),
        ("pause", "master"),
        ("partition-cluster", "master"),
        ("strand-slave", "slave"),
        ("clock-bump", "master"),
        ("clock-bump", "controller-leader"),
        ("clock-strobe", "master"),
    } <= steps
    assert {n for n, _ in steps} == set(NEMESES)


@pytest.mark.parametrize("name", ["standard", "smoke", "soak"])
def test_the_two_group_runs_fail_over_both_groups(name: str) -> None:
    steps = build_schedule(name, 1, "controller-2groups", duration_s=900.0).steps
    targets = {(s.nemesis, s.target) for s in steps}
    hits = {t for n, t in targets if n == "kill" or name == "soak"}  # soak: seeded mixes
    assert {"master", "master@broker-b"} <= hits
    assert {t.partition("@")[2] for _, t in targets} <= {"", "broker-b"}
    if name != "smoke":
        assert {n for n, _ in targets} == set(NEMESES)
        assert {t.partition("@")[0] for n, t in targets if t.endswith("@broker-b")} == {
            "master",
            "slave",
        }


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_standard_and_smoke_run_moves_a_clock(topology: str) -> None:
    for name in ("standard", "smoke"):
        nemeses = {s.nemesis for s in build_schedule(name, 1, topology).steps}
        assert "clock-bump" in nemeses, (name, topology)
    assert {"clock-bump", "clock-strobe"} <= {
        s.nemesis for s in build_schedule("standard", 1, topology).steps
    }


def test_the_controller_standard_run_jumps_a_clock_minutes_each_way() -> None:
    sizes = {
        (s.target, s.size_ms)
        for s in build_schedule("standard", 1).steps
        if s.nemesis == "clock-bump" and s.size_ms is not None
    }
    assert any(t == "master" and size <= -60_000 for t, size in sizes)
    assert any(t == "controller-leader" and size >= 60_000 for t, size in sizes)
    assert all(abs(size) <= 287_627 for _, size in sizes)


def test_clock_bumps_span_jepsens_range_both_ways_and_replay_from_the_seed() -> None:
    bumps = [bump_ms(random.Random(seed)) for seed in range(400)]
    assert all(11 <= abs(b) <= 287_627 for b in bumps)
    assert min(bumps) < -100_000
    assert max(bumps) > 100_000
    assert min(abs(b) for b in bumps) < 50
    assert bumps == [bump_ms(random.Random(seed)) for seed in range(400)]
    strobes = [strobe_ms(random.Random(seed)) for seed in range(400)]
    assert all(4 <= abs(delta) <= 60_000 and 1 <= period <= 1_000 for delta, period in strobes)
    assert {delta > 0 for delta, _ in strobes} == {True, False}


def test_a_soak_fills_its_duration_with_every_fault_and_the_same_seed_replays() -> None:
    soak = build_schedule("soak", 5, duration_s=900.0)
    assert {s.nemesis for s in soak.steps} == set(NEMESES)
    assert 600.0 < soak.faults_end_s <= 900.0
    assert build_schedule("soak", 5, duration_s=900.0) == soak
    assert build_schedule("soak", 6, duration_s=900.0) != soak


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="topology"):
        build_schedule("standard", 1, "mesh")
    with pytest.raises(ValueError, match="schedule"):
        build_schedule("forever", 1)


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("name", ["standard", "smoke"])
def test_with_connect_workers_the_runs_also_hit_the_workers(name: str, topology: str) -> None:
    plain = build_schedule(name, 1, topology)
    steps = build_schedule(name, 1, topology, connect=True).steps
    worker_faults = [(s.nemesis, s.target) for s in steps if s.target.startswith("connect-")]
    assert ("kill", "connect-leader") in worker_faults
    assert ("pause", "connect-leader") in worker_faults
    if name == "standard":
        assert ("partition-isolate", "connect-leader") in worker_faults
        assert ("pause", "connect-follower") in worker_faults
    # the broker faults are the same, in the same order, spread among the worker faults
    others = [(s.nemesis, s.target) for s in steps if not s.target.startswith("connect-")]
    assert others == [(s.nemesis, s.target) for s in plain.steps]
    positions = [i for i, s in enumerate(steps) if s.target.startswith("connect-")]
    assert positions[0] > 0
    assert positions[-1] < len(steps) - 1
    ends = [s.at_s + s.duration_s for s in steps]
    assert all(end <= s.at_s for end, s in zip(ends, steps[1:], strict=False)), "overlap"


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_a_soak_with_connect_workers_hits_them_too(topology: str) -> None:
    steps = build_schedule("soak", 2, topology, duration_s=1800.0, connect=True).steps
    targets = {s.target for s in steps}
    assert {"connect-leader", "connect-follower"} <= targets
    assert not any(
        t.startswith("connect-") for t in (s.target for s in build_schedule("soak", 2).steps)
    )
