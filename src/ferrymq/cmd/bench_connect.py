"""`ferry bench connect`: Connect leader failover, REST write latency, and a worker's start.

Issue 18's benchmark, on real processes: `ProcessCluster` (3 controllers, a NameServer, one group
of 3 replicas in controller mode, sync replication) and `ferry connect worker` processes. Each
phase runs its own Connect cluster (its own `connectClusterId` and topics) on that one ferrymq
cluster, and its workers are stopped before the next phase starts.

- **Leader failover**, per timing profile (`default`: heartbeatIntervalMs 1000,
  leaderFailoverGraceMs 1000, sessionTimeoutMs 6000; `fast`: the system tests' 200 / 500 /
  2000), 3 workers. A client writes to a follower without pause (PATCH of a STOPPED connector's
  config, one request in flight; after a 409 or 504, or a refused connection, it waits 50 ms,
  not the `Retry-After` second, and writes again). Per round the leader is killed (kill -9)
  0.5-1.5 s after the writes began (seeded: the kill falls anywhere in a heartbeat period);
  `write_s` is the kill to the first 2xx of a write sent after the kill, `claim_s` the kill to
  the moment the other follower's `GET /cluster` names a new leader with a higher epoch. The
  killed worker is restarted and the cluster has to agree on one leader before the next round.
- **REST write latency** (on the first profile's cluster, after its rounds): sequential PATCHes
  of a STOPPED connector's config through the leader and through a follower (which forwards to
  the leader), each side with its own keep-alive client, in alternating slices (the side going
  first alternates); p50/p99 per side and follower/leader ratios.
- **Start to serve**: a worker joins a Connect cluster whose leader is running, once with an
  empty config log and once with `connectors` STOPPED connectors in it (no Spark starts), in
  alternating samples. `ready_s` is the spawn to the ready file (REST bound, advertised URL
  checked); `serve_s` the spawn to the first `GET /health` 200 (log replayed, leader known).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from ferrymq.cmd.local import Child
from ferrymq.cmd.up import ProcessCluster, UpConfig

__all__ = [
    "TIMINGS",
    "ConnectBenchConfig",
    "ConnectBenchResult",
    "FailoverResult",
    "LatencyResult",
    "StartResult",
    "quantile",
    "run_connect_bench",
]

TIMINGS: Final[dict[str, tuple[str, ...]]] = {
    "default": (),
    "fast": (
        "--heartbeat-interval-ms",
        "200",
        "--session-timeout-ms",
        "2000",
        "--leader-failover-grace-ms",
        "500",
        "--task-reassign-grace-ms",
        "1000",
    ),
}
"""Worker flags per timing profile (`default`: the worker's own defaults)."""

_TIMING_MS: Final[dict[str, dict[str, int]]] = {
    "default": {"heartbeat_interval_ms": 1000, "leader_failover_grace_ms": 1000},
    "fast": {"heartbeat_interval_ms": 200, "leader_failover_grace_ms": 500},
}
_RETRY_S: Final = 0.05
_POLL_S: Final = 0.01
_LIMIT_S: Final = 60.0
_REQUEST_TIMEOUT_S: Final = 30.0
_CONNECTOR: Final = "bench"


def _replicator(**extra: str) -> dict[str, str]:
    return {
        "connector.class": "FerrymqReplicator",
        "topics": "bench-src",
        "target.topic.format": "${topic}-copy",
        **extra,
    }


def quantile(values: Sequence[float], q: float) -> float:
    """A quantile: 0.5 is the median, others the nearest rank; NaN when empty.

    With 10 values, 0.9 is the 9th smallest and 1.0 the largest.
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    if q == 0.5:
        return float(statistics.median(ordered))
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


@dataclass(frozen=True, slots=True)
class ConnectBenchConfig:
    """What to run."""

    rounds: int = 10
    """Leader kills per timing profile."""
    timings: tuple[str, ...] = ("default", "fast")
    writes: int = 400
    """Measured writes per side (leader, follower) in the latency phase."""
    slice_writes: int = 20
    """Writes per slice: the sides alternate every slice."""
    connectors: int = 200
    """Connectors in the log of the start phase's full cluster."""
    start_samples: int = 5
    """Starts per log (empty, full)."""
    workdir: Path | None = None


@dataclass(frozen=True, slots=True)
class FailoverRound:
    """One kill -9 of the leader, in seconds from the kill."""

    claim_s: float
    write_s: float
    answers: dict[str, int]
    """What the writes sent after the kill got before the first 2xx (status, or `error`)."""
    killed: str
    new_leader: str


@dataclass
class FailoverResult:
    """The rounds of one timing profile."""

    timing: str
    rounds: list[FailoverRound] = field(default_factory=list)

    def stat(self, figure: str, q: float) -> float:
        """A quantile of `claim_s` or `write_s` over the rounds."""
        return quantile([getattr(r, figure) for r in self.rounds], q)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        figures = {
            f"{figure.removesuffix('_s')}_{label}_s": round(self.stat(figure, q), 3)
            for figure in ("write_s", "claim_s")
            for label, q in (("median", 0.5), ("p90", 0.9), ("max", 1.0))
        }
        return {
            "timing": self.timing,
            **_TIMING_MS.get(self.timing, {}),
            **figures,
            "rounds": [
                {
                    "claim_s": round(r.claim_s, 3),
                    "write_s": round(r.write_s, 3),
                    "answers": r.answers,
                    "killed": r.killed,
                    "new_leader": r.new_leader,
                }
                for r in self.rounds
            ],
        }


@dataclass
class LatencyResult:
    """Write latencies in milliseconds, per side."""

    timing: str
    leader_ms: list[float] = field(default_factory=list)
    follower_ms: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, with the ratios the goal names."""
        figures: dict[str, Any] = {"timing": self.timing, "writes_per_side": len(self.leader_ms)}
        for side, values in (("leader", self.leader_ms), ("follower", self.follower_ms)):
            for label, q in (("p50", 0.5), ("p99", 0.99)):
                figures[f"{side}_{label}_ms"] = round(quantile(values, q), 2)
        for label in ("p50", "p99"):
            leader = figures[f"leader_{label}_ms"]
            follower = figures[f"follower_{label}_ms"]
            figures[f"follower_over_leader_{label}"] = (
                round(follower / leader, 2) if leader else None
            )
        return figures


@dataclass(frozen=True, slots=True)
class StartSample:
    """One worker start, in seconds from the spawn."""

    ready_s: float
    serve_s: float


@dataclass
class StartResult:
    """Starts with an empty log and with `connectors` connectors in it."""

    connectors: int
    log_records: int = 0
    """Records in the full log (its config offset when the starts ran)."""
    empty: list[StartSample] = field(default_factory=list)
    full: list[StartSample] = field(default_factory=list)

    def median(self, which: str, figure: str) -> float:
        """The median of `ready_s` or `serve_s` of the empty or full starts."""
        samples: list[StartSample] = getattr(self, which)
        return quantile([getattr(s, figure) for s in samples], 0.5)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        empty = self.median("empty", "serve_s")
        full = self.median("full", "serve_s")
        return {
            "connectors": self.connectors,
            "log_records": self.log_records,
            "empty_ready_median_s": round(self.median("empty", "ready_s"), 3),
            "empty_serve_median_s": round(empty, 3),
            "full_ready_median_s": round(self.median("full", "ready_s"), 3),
            "full_serve_median_s": round(full, 3),
            "full_over_empty": round(full / empty, 2) if empty else None,
            "samples": {
                which: [
                    {"ready_s": round(s.ready_s, 3), "serve_s": round(s.serve_s, 3)}
                    for s in getattr(self, which)
                ]
                for which in ("empty", "full")
            },
        }


@dataclass
class ConnectBenchResult:
    """Everything one run measured."""

    failovers: list[FailoverResult] = field(default_factory=list)
    latency: LatencyResult | None = None
    start: StartResult | None = None


# ---------------------------------------------------------------------- helpers


async def _until(
    condition: Callable[[], Awaitable[bool]], what: str, limit_s: float = _LIMIT_S
) -> None:
    deadline = time.monotonic() + limit_s
    while not await condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {limit_s:g} s")
        await asyncio.sleep(_POLL_S)


class _ConnectCluster:
    """One Connect cluster (its own id and topics) of workers on the ferrymq cluster."""

    def __init__(
        self, cluster: ProcessCluster, client: httpx.AsyncClient, name: str, timing: str
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.name = name
        self.flags = [
            "--connect-cluster-id",
            name,
            "--config-store-topic",
            f"{name}-config",
            "--connect-status-topic",
            f"{name}-status",
            "--position-store-topic",
            f"{name}-position",
            "--rest-request-timeout-ms",
            "15000",
            *TIMINGS[timing],
        ]
        self.ids: list[str] = []

    async def start(self, worker_id: str) -> Child:
        child = await self.cluster.restart_worker(worker_id, extra=self.flags)
        if worker_id not in self.ids:
            self.ids.append(worker_id)
        return child

    def child(self, worker_id: str) -> Child:
        return self.cluster.workers[worker_id]

    def url(self, worker_id: str) -> str:
        return str(self.child(worker_id).info["url"])

    def running(self) -> list[str]:
        return [w for w in self.ids if self.child(w).running]

    async def get(self, worker_id: str, path: str) -> Any:
        answer = await self.client.get(self.url(worker_id) + path)
        answer.raise_for_status()
        return answer.json()

    async def healthy(self, worker_id: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            answer = await self.client.get(self.url(worker_id) + "/health")
            return answer.status_code == 200
        return False

    async def agreed_leader(self) -> tuple[str, int]:
        """Wait until every running worker is healthy and names the same leader."""
        found: list[tuple[str, int]] = []

        async def agreed() -> bool:
            views = []
            for worker_id in self.running():
                if not await self.healthy(worker_id):
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    views.append(await self.get(worker_id, "/cluster"))
            named = {(v["leader"]["worker_id"], v["epoch"]) for v in views}
            if len(views) != len(self.running()) or len(named) != 1:
                return False
            leader, epoch = named.pop()
            if not leader or leader not in self.running():
                return False
            found[:] = [(leader, epoch)]
            return True

        await _until(agreed, f"{self.name}: one leader named by every worker")
        return found[0]

    async def create(self, worker_id: str, name: str, config: dict[str, str]) -> None:
        body = {"name": name, "config": config, "initial_state": "STOPPED"}
        answer: httpx.Response | None = None
        for _ in range(100):
            answer = await self.client.post(self.url(worker_id) + "/connectors", json=body)
            if answer.status_code in (201, 409):
                return
            await asyncio.sleep(_RETRY_S)
        said = f"{answer.status_code} {answer.text}" if answer is not None else "nothing"
        raise RuntimeError(f"{self.name}: cannot create {name}: {said}")

    async def stop(self) -> None:
        for worker_id in self.ids:
            await self.child(worker_id).stop()


class _Writer:
    """Writes to one worker back to back; records (started, ended, status) per request."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url + f"/connectors/{_CONNECTOR}/config"
        self.answers: list[tuple[float, float, str]] = []
        self.accepted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        for sequence in range(10**9):  # bounded: a run never gets near it
            started = time.monotonic()
            try:
                answer = await self.client.patch(self.url, json={"bench.seq": str(sequence)})
                status = str(answer.status_code)
            except httpx.HTTPError:
                status = "error"
            self.answers.append((started, time.monotonic(), status))
            if status.startswith("2"):
                self.accepted.set()
            else:
                await asyncio.sleep(_RETRY_S)

    async def first_accepted_after(self, moment: float) -> tuple[float, dict[str, int]]:
        """When the first 2xx of a write sent after `moment` came, and what came before it."""
        deadline = time.monotonic() + _LIMIT_S
        while time.monotonic() < deadline:
            later = [a for a in self.answers if a[0] >= moment]
            for index, (_started, ended, status) in enumerate(later):
                if status.startswith("2"):
                    return ended, dict(Counter(s for _, _, s in later[:index]))
            await asyncio.sleep(_POLL_S)
        raise RuntimeError(f"no write accepted {_LIMIT_S:g} s after the leader's kill")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# ---------------------------------------------------------------------- phases


async def _failover(
    connect: _ConnectCluster,
    rounds: int,
    progress: Callable[[str], None],
    latency: LatencyResult | None,
    config: ConnectBenchConfig,
) -> FailoverResult:
    result = FailoverResult(connect.name.removeprefix("bench-"))
    rng = random.Random(18)
    ids = [f"{result.timing}-{i}" for i in (1, 2, 3)]
    await asyncio.gather(*(connect.start(worker_id) for worker_id in ids))
    leader, _ = await connect.agreed_leader()
    await connect.create(leader, _CONNECTOR, _replicator())
    for number in range(1, rounds + 1):
        progress(f"{result.timing} timings: failover round {number}/{rounds}")
        leader, epoch = await connect.agreed_leader()
        follower, observer = (w for w in connect.running() if w != leader)
        async with httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S) as client:
            writer = _Writer(client, connect.url(follower))
            writer.start()
            try:
                await asyncio.wait_for(writer.accepted.wait(), _LIMIT_S)
                # a kill at a random moment of the survivors' heartbeat period (seeded)
                await asyncio.sleep(0.5 + rng.random())
                victim = connect.child(leader)
                killed_at = time.monotonic()
                victim.kill()
                claimed = asyncio.ensure_future(
                    _claimed(connect, observer, leader, epoch, killed_at)
                )
                try:
                    accepted_at, answers = await writer.first_accepted_after(killed_at)
                    claim_s, new_leader = await claimed
                finally:
                    claimed.cancel()
            finally:
                await writer.stop()
        result.rounds.append(
            FailoverRound(
                claim_s=claim_s,
                write_s=accepted_at - killed_at,
                answers=answers,
                killed=leader,
                new_leader=new_leader,
            )
        )
        await victim.process.wait()
        await connect.start(leader)
    if latency is not None:
        progress(f"{result.timing} timings: REST write latency")
        await _latency(connect, latency, config)
    return result


async def _claimed(
    connect: _ConnectCluster, observer: str, old: str, epoch: int, killed_at: float
) -> tuple[float, str]:
    """When `observer` first names a leader other than `old` with a later epoch."""
    deadline = time.monotonic() + _LIMIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            view = await connect.get(observer, "/cluster")
            named = view["leader"]["worker_id"]
            if named and named != old and view["epoch"] > epoch:
                return time.monotonic() - killed_at, str(named)
        await asyncio.sleep(_POLL_S)
    raise RuntimeError(f"{connect.name}: no new claim {_LIMIT_S:g} s after the leader's kill")


async def _latency(
    connect: _ConnectCluster, result: LatencyResult, config: ConnectBenchConfig
) -> None:
    leader, _ = await connect.agreed_leader()
    follower = next(w for w in connect.running() if w != leader)
    sides = {"leader": connect.url(leader), "follower": connect.url(follower)}
    samples: dict[str, list[float]] = {"leader": result.leader_ms, "follower": result.follower_ms}
    clients = {side: httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S) for side in sides}
    sequence = 0

    async def one_slice(side: str, count: int, keep: bool) -> None:
        nonlocal sequence
        url = sides[side] + f"/connectors/{_CONNECTOR}/config"
        for _ in range(count):
            sequence += 1
            started = time.perf_counter()
            answer = await clients[side].patch(url, json={"bench.seq": str(sequence)})
            elapsed_ms = (time.perf_counter() - started) * 1000
            if answer.status_code != 200:
                raise RuntimeError(f"a {side} write answered {answer.status_code}: {answer.text}")
            if keep:
                samples[side].append(elapsed_ms)

    try:
        for side in sides:  # warm both paths (connections, the follower's forwarding client)
            await one_slice(side, min(20, config.slice_writes), keep=False)
        slices = max(1, math.ceil(config.writes / config.slice_writes))
        for index in range(slices):
            count = min(config.slice_writes, config.writes - index * config.slice_writes)
            order = ("leader", "follower") if index % 2 == 0 else ("follower", "leader")
            for side in order:
                await one_slice(side, count, keep=True)
    finally:
        for client in clients.values():
            await client.aclose()


async def _start_once(connect: _ConnectCluster, worker_id: str) -> StartSample:
    started = time.monotonic()
    child = await connect.start(worker_id)
    ready = time.monotonic()
    try:
        await _until(
            lambda: connect.healthy(worker_id), f"{connect.name}: {worker_id} healthy (GET /health)"
        )
        served = time.monotonic()
    finally:
        await child.stop()
    return StartSample(ready_s=ready - started, serve_s=served - started)


async def _starts(
    cluster: ProcessCluster,
    client: httpx.AsyncClient,
    config: ConnectBenchConfig,
    progress: Callable[[str], None],
) -> StartResult:
    result = StartResult(config.connectors)
    empty = _ConnectCluster(cluster, client, "bench-empty", "default")
    full = _ConnectCluster(cluster, client, "bench-full", "default")
    try:
        await asyncio.gather(empty.start("empty-1"), full.start("full-1"))
        await empty.agreed_leader()
        await full.agreed_leader()
        progress(f"start: creating {config.connectors} STOPPED connectors")
        names = [f"c{i:04d}" for i in range(config.connectors)]
        for start in range(0, len(names), 8):
            await asyncio.gather(
                *(full.create("full-1", n, _replicator(topics=n)) for n in names[start : start + 8])
            )
        result.log_records = int((await full.get("full-1", "/"))["config_offset"])
        for sample in range(config.start_samples):
            progress(f"start: sample {sample + 1}/{config.start_samples}")
            order = [(empty, "empty-2", result.empty), (full, "full-2", result.full)]
            if sample % 2:
                order.reverse()
            for connect, worker_id, samples in order:
                samples.append(await _start_once(connect, worker_id))
    finally:
        await empty.stop()
        await full.stop()
    return result


async def run_connect_bench(
    config: ConnectBenchConfig, progress: Callable[[str], None]
) -> ConnectBenchResult:
    """Every phase on one ferrymq cluster (3 controllers, 3 replicas), in a fresh directory."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="ferrymq-bench-connect-"))
    result = ConnectBenchResult()
    cluster = ProcessCluster(UpConfig(data_dir=workdir, replicas=3, controllers=3))
    try:
        progress("starting ferrymq (3 controllers, 3 replicas)")
        await cluster.start()
        async with httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S) as client:
            for index, timing in enumerate(config.timings):
                connect = _ConnectCluster(cluster, client, f"bench-{timing}", timing)
                latency = LatencyResult(timing) if index == 0 and config.writes else None
                try:
                    result.failovers.append(
                        await _failover(connect, config.rounds, progress, latency, config)
                    )
                finally:
                    await connect.stop()
                if latency is not None:
                    result.latency = latency
            if config.start_samples:
                result.start = await _starts(cluster, client, config, progress)
    finally:
        await cluster.stop()
        if config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return result
