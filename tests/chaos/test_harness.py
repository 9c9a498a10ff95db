"""The chaos harness end to end: a short faulty run is clean, and each test-only bug is caught.

The controller smoke run also runs the Connect workload (3 workers, config writes checked like
sends) and kills and pauses the workers' leader; the other runs have no Connect workers.

Each run is `ferry chaos` in private network, PID and mount namespaces (root, `unshare`, `nft`,
loop devices); without them the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ferrymq.chaos.checker import ANOMALIES
from ferrymq.chaos.history import read_history
from ferrymq.chaos.runner import RunConfig, run_isolated
from ferrymq.chaos.schedule import build_schedule

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="ferry chaos needs root (namespaces, mounts)"),
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in ("unshare", "nft", "mkfs.ext4")),
        reason="ferry chaos needs unshare, nft (apt-get install nftables) and mkfs.ext4",
    ),
]


def test_a_smoke_run_on_controllers_hits_every_fault_and_finds_no_anomaly(tmp_path: Path) -> None:
    results = run_isolated(RunConfig(out_dir=tmp_path, seed=7, schedule="smoke"))
    assert results.valid, results.examples
    assert set(results.anomalies) == set(ANOMALIES)
    schedule = build_schedule("smoke", 7, connect=True)
    assert set(results.faults) == {step.nemesis for step in schedule.steps}
    assert results.stats["acked"] > 100
    assert results.stats["drain_complete"] == 1
    # the Connect workload: writes acknowledged, the workers converged, the leader moved
    assert results.stats["connect_acked"] > 10
    assert results.stats["connect_converged"] == 1
    assert results.stats["connect_claims"] >= 2
    history = read_history(tmp_path / "history.jsonl")
    hit = {e.targets[0] for e in history if e.proc == "nemesis" and e.type == "info" and e.targets}
    assert {"n15-worker1", "n16-worker2", "n17-worker3"} & hit
    assert sum(1 for e in history if e.f == "cview" and e.type == "ok") == 3
    assert sum(1 for e in history if e.f == "dump" and e.type == "ok") == 3
    logs = sorted(p.name for p in (tmp_path / "logs").glob("*.log"))
    assert logs == [
        "n1-namesrv.log",
        "n15-worker1.log",
        "n16-worker2.log",
        "n17-worker3.log",
        "n2-broker1.log",
        "n3-broker2.log",
        "n4-broker3.log",
        "n5-controller1.log",
        "n6-controller2.log",
        "n7-controller3.log",
    ]
    # the master was killed and cut off: the controllers moved it at least twice
    epochs = {e.epoch for e in history if e.proc == "controller-view" and e.f == "role"}
    assert len(epochs) >= 3, epochs
    assert not (tmp_path / "disks" / "n2-broker1.img").exists(), "a clean run keeps no images"


def test_a_smoke_run_on_two_groups_fails_over_both_and_finds_no_anomaly(tmp_path: Path) -> None:
    results = run_isolated(
        RunConfig(
            out_dir=tmp_path,
            seed=7,
            schedule="smoke",
            topology="controller-2groups",
            connect_workers=0,
        )
    )
    assert results.valid, results.examples
    assert results.stats["drain_complete"] == 1
    assert results.stats["acked@broker-a"] > 50
    assert results.stats["acked@broker-b"] > 50
    history = read_history(tmp_path / "history.jsonl")
    dumps = {(e.group, e.node) for e in history if e.f == "dump" and e.type == "ok"}
    assert {g for g, _ in dumps} == {"broker-a", "broker-b"}
    assert len(dumps) == 6
    # each group's master was killed: the controllers moved both
    for group in ("broker-a", "broker-b"):
        epochs = {
            e.epoch
            for e in history
            if e.proc == "controller-view" and e.f == "role" and e.group == group
        }
        assert len(epochs) >= 2, (group, epochs)


@pytest.mark.parametrize(
    ("bug", "schedule", "topology"),
    [
        ("ack-before-replication", "power-loss", "classic"),  # a failover would hide it
        ("skip-truncation", "power-loss", "classic"),
        ("skip-crc-on-recovery", "bitflip", "controller"),
        ("elect-outside-sync-state-set", "strand-slave", "controller"),
    ],
)
def test_each_test_only_bug_is_caught(
    tmp_path: Path, bug: str, schedule: str, topology: str
) -> None:
    config = RunConfig(
        out_dir=tmp_path,
        seed=3,
        schedule=schedule,
        bugs=(bug,),
        converge_timeout_s=15.0,
        drain_timeout_s=20.0,
        topology=topology,
        connect_workers=0,
    )
    results = run_isolated(config)
    assert not results.valid, f"{bug} went unnoticed: {results.stats}"
    first = "n2-broker1" if topology == "controller" else "n2-master"
    assert (tmp_path / "disks" / f"{first}.img").exists(), "a failed run keeps its stores"
