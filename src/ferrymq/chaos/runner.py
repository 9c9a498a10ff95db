"""`ferry chaos`: run a cluster under a fault schedule, record the history, check it.

`run_isolated` re-runs `ferry chaos` inside `unshare --net --pid --mount-proc --fork --kill-child`
(root needed): the run gets its own loopback, firewall and mount table, and when it exits the
kernel ends every process it started, so nothing leaks to the host. Inside, `run_inside` brings up
`lo`, loop-mounts a small ext4 image per broker store, starts the cluster (and its Connect
workers), runs the workloads and the schedule, heals everything, waits for the replicas to
converge, reads every Connect worker's final state and the raw config log, drains, stops the
cluster cleanly, dumps every replica, and checks the history.

The output directory holds `history.jsonl`, `results.json`, `schedule.json`, `logs/` (one per node,
appended across restarts) and, when anomalies were found, `disks/` (each broker's store as an ext4
image: `mount -o loop`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import msgspec

from ferrymq.chaos.checker import Results, check
from ferrymq.chaos.cluster import Cluster, ClusterConfig
from ferrymq.chaos.connect_workload import CONNECT_OBSERVER, ConnectConfig, ConnectWorkload
from ferrymq.chaos.dump import dump_store
from ferrymq.chaos.history import NEMESIS, Event
from ferrymq.chaos.nemesis import NEMESES, Faults
from ferrymq.chaos.net import Net, nft_available
from ferrymq.chaos.recorder import Recorder
from ferrymq.chaos.schedule import Schedule, Step, build_schedule
from ferrymq.chaos.workload import CONTROLLER_VIEW, TOPIC, Workload, WorkloadConfig, queue_name
from ferrymq.errors import FerryError
from ferrymq.testbugs import BUGS

__all__ = [
    "RunConfig",
    "ack_gaps",
    "connect_failovers",
    "connect_gaps",
    "failovers",
    "run_inside",
    "run_isolated",
]

log = logging.getLogger(__name__)

INSIDE_ENV: Final = "FERRYMQ_CHAOS_NETNS"


@dataclass(frozen=True)
class RunConfig:
    """One chaos run."""

    out_dir: Path
    seed: int = 1
    schedule: str = "standard"
    bugs: tuple[str, ...] = ()
    sends_per_second: float = 100.0
    drain_timeout_s: float = 60.0
    converge_timeout_s: float = 60.0
    topology: str = "controller"
    """controller (3 controllers pick the master), controller-2groups (the same with two broker
    groups, broker-a and broker-b) or classic (static master/slave roles)."""
    duration_s: float = 900.0
    """The soak schedule's length."""
    connect_workers: int = 3
    """Connect workers running the Connect workload (config writes; 0: none). The standard,
    smoke and soak schedules then hit the workers too."""
    tls: bool = False
    """Every server and client with TLS only (`make chaos-tls`), the workers' REST API too."""
    acl: bool = False
    """ACL 1.0 on every server; every process signs with the run's admin account."""

    def argv(self) -> list[str]:
        """The `ferry chaos` arguments that repeat this run."""
        args = [
            "chaos",
            "--out",
            str(self.out_dir),
            "--seed",
            str(self.seed),
            "--schedule",
            self.schedule,
            "--rate",
            str(self.sends_per_second),
            "--drain-timeout",
            str(self.drain_timeout_s),
            "--converge-timeout",
            str(self.converge_timeout_s),
            "--topology",
            self.topology,
            "--duration",
            str(self.duration_s),
            "--connect-workers",
            str(self.connect_workers),
            *(["--tls"] if self.tls else []),
            *(["--acl"] if self.acl else []),
        ]
        for bug in self.bugs:
            args += ["--bug", bug]
        return args


def run_isolated(config: RunConfig, *, timeout: float | None = None) -> Results:
    """Run `ferry chaos` in a private network, PID and mount namespace; return its results.

    Raises:
        FerryError: not root, a tool is missing, or the run failed before checking.
    """
    if os.geteuid() != 0:
        raise FerryError("ferry chaos needs root (it creates network and mount namespaces)")
    for tool in ("unshare", "ip", "mount", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise FerryError(f"ferry chaos needs the {tool} command")
    if not nft_available():
        raise FerryError("ferry chaos needs nftables (apt-get install nftables)")
    unknown = set(config.bugs) - set(BUGS)
    if unknown:
        raise FerryError(f"unknown bug switches {sorted(unknown)}; known: {', '.join(BUGS)}")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    results_path = config.out_dir / "results.json"
    results_path.unlink(missing_ok=True)
    command = [
        "unshare",
        "--net",
        "--pid",
        "--mount-proc",
        "--fork",
        "--kill-child",
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        *config.argv(),
    ]
    completed = subprocess.run(
        command, env={**os.environ, INSIDE_ENV: "1"}, timeout=timeout, check=False
    )
    if not results_path.exists():
        raise FerryError(
            f"the chaos run exited with {completed.returncode} before writing {results_path}"
        )
    data = msgspec.json.decode(results_path.read_bytes())
    return msgspec.convert(
        {k: data[k] for k in ("valid", "anomalies", "examples", "operations", "faults", "stats")},
        Results,
    )


def is_inside() -> bool:
    """Whether this process is the namespace's harness."""
    return os.environ.get(INSIDE_ENV) == "1"


async def _group_converged(cluster: Cluster, group: str) -> bool:
    """Every broker of `group` runs, its master's SyncStateSet is full and their logs match."""
    brokers = cluster.group_brokers(group)
    infos = [await cluster.runtime(b) for b in brokers]
    masters = [i for i in infos if i is not None and i.role == "master"]
    return (
        all(i is not None for i in infos)
        and len(masters) == 1
        and len((masters[0].sync_state_set or "").split(",")) == len(brokers)
        and len({i.max_log_offset for i in infos if i is not None}) == 1
        and masters[0].confirm_log_offset == masters[0].max_log_offset
    )


async def _converge(cluster: Cluster, recorder: Recorder, timeout: float) -> bool:
    """Wait until every group has converged (`_group_converged`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [await _group_converged(cluster, g) for g in cluster.config.group_names]
        if all(done):
            recorder.record("observer", "ok", "converged")
            return True
        await asyncio.sleep(0.25)
    recorder.record("observer", "fail", "converged", error=f"not converged in {timeout:g} s")
    return False


async def _run_schedule(schedule: Schedule, faults: Faults, start: float) -> None:
    loop = asyncio.get_running_loop()
    for step in schedule.steps:
        await asyncio.sleep(max(0.0, start + step.at_s - loop.time()))
        await _run_step(step, faults)


async def _run_step(step: Step, faults: Faults) -> None:
    nemesis = NEMESES[step.nemesis]
    faults.size_ms = step.size_ms
    node = await faults.resolve(step.target)
    if node is None:
        faults.recorder.fault(step.nemesis, [], f"no {step.target} to hit")
        return
    try:
        detail = await nemesis.begin(faults, node)
    except (OSError, subprocess.CalledProcessError, FerryError) as exc:
        detail = f"begin failed: {exc}"
    faults.recorder.fault(step.nemesis, [node.name], f"{step.target}: {detail}")
    log.info("%s on %s: %s", step.nemesis, node.name, detail)
    await asyncio.sleep(step.duration_s)
    try:
        detail = await nemesis.end(faults, node)
    except (OSError, subprocess.CalledProcessError, FerryError) as exc:
        detail = f"end failed: {exc}"
    faults.recorder.fault(step.nemesis, [node.name], detail, end=True)


def ack_gaps(events: list[Event], *, min_gap_s: float = 1.0) -> list[dict[str, object]]:
    """Every stretch longer than `min_gap_s` without an acknowledged send, longest first.

    Each names the faults that began during or just before it: a failover's write gap, as the
    clients saw it (from the last ack before the gap to the first ack after it). With several
    broker groups each group's acks count on their own (a group's failover is a gap in its
    acks while the others go on), and each gap names its group.
    """
    acks: dict[str, list[int]] = {}
    for e in events:
        if e.f == "send" and e.type == "ok":
            acks.setdefault((e.q or "").split("/", 1)[0], []).append(e.t_ns)
    starts = [
        (e.t_ns, e.f, e.targets or []) for e in events if e.proc == NEMESIS and e.type == "info"
    ]
    gaps: list[dict[str, object]] = []
    for group, times in sorted(acks.items()):
        for before, after in itertools.pairwise(sorted(times)):
            gap_s = (after - before) / 1e9
            if gap_s < min_gap_s:
                continue
            faults = [
                f"{f} {','.join(targets)}"
                for t, f, targets in starts
                if before - int(min_gap_s * 1e9) <= t <= after
            ]
            gap: dict[str, object] = {
                "at_s": round(before / 1e9, 2),
                "gap_s": round(gap_s, 2),
                "faults": faults,
            }
            if len(acks) > 1:
                gap["group"] = group
            gaps.append(gap)
    gaps.sort(key=lambda g: -float(str(g["gap_s"])))
    return gaps


def connect_gaps(events: list[Event], *, min_gap_s: float = 2.0) -> list[dict[str, object]]:
    """Every stretch longer than `min_gap_s` without an acknowledged Connect write.

    Longest first, each with the faults that began during or just before it.
    """
    acks = sorted(e.t_ns for e in events if e.f == "cwrite" and e.type == "ok")
    starts = [
        (e.t_ns, e.f, e.targets or []) for e in events if e.proc == NEMESIS and e.type == "info"
    ]
    gaps: list[dict[str, object]] = []
    for before, after in itertools.pairwise(acks):
        gap_s = (after - before) / 1e9
        if gap_s < min_gap_s:
            continue
        faults = [
            f"{f} {','.join(targets)}"
            for t, f, targets in starts
            if before - int(min_gap_s * 1e9) <= t <= after
        ]
        gaps.append({"at_s": round(before / 1e9, 2), "gap_s": round(gap_s, 2), "faults": faults})
    gaps.sort(key=lambda g: -float(str(g["gap_s"])))
    return gaps


def connect_failovers(events: list[Event]) -> list[dict[str, object]]:
    """Each fault aimed at the Connect leader that moved the leadership, and how long it took.

    `claimed_after_s`: until the observer (polling every 0.5 s) saw a newer claim by another
    worker; `acked_after_s`: until the next acknowledged Connect write.
    """
    out: list[dict[str, object]] = []
    claims = [e for e in events if e.proc == CONNECT_OBSERVER and e.f == "cleader"]
    acks = [e for e in events if e.f == "cwrite" and e.type == "ok"]
    hits = [
        e
        for e in events
        if e.proc == NEMESIS
        and e.type == "info"
        and (e.error or "").split(":", 1)[0] == "connect-leader"
    ]
    for hit in hits:
        old = hit.targets[0] if hit.targets else None
        claim = next((c for c in claims if c.t_ns > hit.t_ns and c.node != old), None)
        if claim is None:
            continue
        acked = next((a for a in acks if a.t_ns > claim.t_ns), None)
        out.append(
            {
                "fault": hit.f,
                "at_s": round(hit.t_ns / 1e9, 2),
                "old_leader": old,
                "new_leader": claim.node,
                "epoch": claim.epoch,
                "claimed_after_s": round((claim.t_ns - hit.t_ns) / 1e9, 2),
                "acked_after_s": (
                    round((acked.t_ns - hit.t_ns) / 1e9, 2) if acked is not None else None
                ),
            }
        )
    return out


def failovers(events: list[Event]) -> list[dict[str, object]]:
    """Each fault aimed at the master that moved it, and how long the move took.

    `elected_after_s`: until the observer saw the controllers name a new master (it polls every
    second); `acked_after_s`: until the new master acknowledged a send.
    """
    out: list[dict[str, object]] = []
    views = [e for e in events if e.proc == CONTROLLER_VIEW and e.f == "role"]
    acks = [e for e in events if e.f == "send" and e.type == "ok"]
    group_of = {e.node: e.group for e in events if e.f == "role" and e.node and e.group}
    hits = [
        e
        for e in events
        if e.proc == NEMESIS
        and e.type == "info"
        and (e.error or "").split(":", 1)[0].split("@", 1)[0] == "master"
    ]
    for hit in hits:
        old = hit.targets[0] if hit.targets else None
        group = group_of.get(old or "")
        elected = next(
            (v for v in views if v.t_ns > hit.t_ns and (group is None or v.group == group)), None
        )
        if elected is None or elected.node == old:
            continue  # the fault ended before the controllers moved the master
        acked = next((a for a in acks if a.t_ns > elected.t_ns and a.node == elected.node), None)
        out.append(
            {
                "group": group,
                "fault": hit.f,
                "at_s": round(hit.t_ns / 1e9, 2),
                "old_master": old,
                "new_master": elected.node,
                "epoch": elected.epoch,
                "elected_after_s": round((elected.t_ns - hit.t_ns) / 1e9, 2),
                "acked_after_s": (
                    round((acked.t_ns - hit.t_ns) / 1e9, 2) if acked is not None else None
                ),
            }
        )
    return out


def _write_results(
    config: RunConfig, schedule: Schedule, results: Results, extra: dict[str, object]
) -> None:
    document = {
        "seed": config.seed,
        "schedule": schedule.name,
        "topology": config.topology,
        "bugs": list(config.bugs),
        **msgspec.to_builtins(results),
        **extra,
    }
    path = config.out_dir / "results.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _unmount(cluster: Cluster) -> None:
    for broker in cluster.brokers:
        assert broker.store_dir is not None
        subprocess.run(["umount", str(broker.store_dir)], check=False, capture_output=True)


async def run_inside(config: RunConfig) -> Results:
    """The run itself (call only inside the namespaces: see `run_isolated`)."""
    if not is_inside():
        raise FerryError("run_inside must run inside the chaos namespaces (use run_isolated)")
    started = time.monotonic()
    await asyncio.to_thread(subprocess.run, ["ip", "link", "set", "lo", "up"], check=True)
    schedule = build_schedule(
        config.schedule,
        config.seed,
        config.topology,
        config.duration_s,
        connect=config.connect_workers > 0,
    )
    (config.out_dir / "schedule.json").write_text(
        json.dumps(
            {
                "name": schedule.name,
                "seed": config.seed,
                "topology": config.topology,
                "connect_workers": config.connect_workers,
                "steps": [asdict(s) for s in schedule.steps],
            },
            indent=2,
        )
        + "\n"
    )
    history_path = config.out_dir / "history.jsonl"
    history_path.unlink(missing_ok=True)
    recorder = Recorder(history_path)
    cluster = Cluster(
        ClusterConfig(
            out_dir=config.out_dir,
            bugs=config.bugs,
            controllers=0 if config.topology == "classic" else 3,
            groups=2 if config.topology == "controller-2groups" else 1,
            connect_workers=config.connect_workers,
            tls=config.tls,
            acl=config.acl,
        )
    )
    cluster.mount_stores()
    rng = random.Random(config.seed)
    faults = Faults(cluster, Net(), recorder, rng)
    workload = Workload(
        cluster, recorder, WorkloadConfig(sends_per_second=config.sends_per_second), rng
    )
    connect = ConnectWorkload(cluster, recorder, ConnectConfig(), random.Random(config.seed + 1))
    converged = drained = False
    connect_converged: bool | None = None
    try:
        await cluster.start()
        await workload.create_topic()
        await cluster.start_workers()
        await _converge(cluster, recorder, 30.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        workload.start()
        connect.start()
        await _run_schedule(schedule, faults, start)
        await asyncio.sleep(
            max(0.0, start + schedule.faults_end_s + schedule.quiet_s - loop.time())
        )
        await asyncio.gather(workload.finish(), connect.finish())
        await faults.heal_all()
        converged = await _converge(cluster, recorder, config.converge_timeout_s)
        if cluster.workers:
            connect_converged = await connect.final(config.converge_timeout_s)
        drained = await workload.drain(config.drain_timeout_s)
    finally:
        await asyncio.gather(workload.finish(), connect.finish())
        await faults.heal_all()
        await cluster.rpc.close()
        cluster.stop()
    for broker in cluster.brokers:
        assert broker.store_dir is not None
        group = broker.group or cluster.config.group
        names = {q.queue_id: queue_name(q) for q in workload.queues() if q.broker_name == group}
        await asyncio.to_thread(
            dump_store,
            recorder,
            broker.name,
            group,
            broker.store_dir,
            cluster.config.segment_bytes,
            TOPIC,
            names,
        )
    recorder.close()
    results = check(recorder.events)
    await asyncio.to_thread(_unmount, cluster)
    if results.valid:
        cluster.remove_disk_images()
    _write_results(
        config,
        schedule,
        results,
        {
            "converged": converged,
            "drained": drained,
            "connect_workers": config.connect_workers,
            "connect_converged": connect_converged,
            "duration_s": round(time.monotonic() - started, 1),
            "ack_gaps": ack_gaps(recorder.events),
            "failovers": failovers(recorder.events),
            "connect_failovers": connect_failovers(recorder.events),
            "connect_gaps": connect_gaps(recorder.events),
            "nemeses_available": sorted(NEMESES),
        },
    )
    return results
