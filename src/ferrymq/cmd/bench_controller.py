"""`ferry bench controller`: commit latency, throughput and leader failover, beside etcd 3.4.

One run starts three `ferry controller` processes (a Raft group) and a 3-node etcd cluster
(`peer_etcd`), on free loopback ports, and measures both the same way:

- `sync`: one write at a time for `seconds`: p50/p99 commit latency and writes/s. A ferrymq write
  is an ApplyBrokerId for a new broker group (one replicated event, fsynced on a majority before
  the answer); an etcd write is a put of a 64-byte value (the same: a majority's fsynced log).
- `window N`: N writes in flight for `seconds`: throughput with batching.
- `failover`: kill -9 the leader, then time until a write through the surviving nodes succeeds
  (a follower redirects ferrymq's client, etcd forwards itself); the killed node restarts from
  its data and rejoins before the next round. The median over `rounds` kills is reported.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ferrymq.broker.controller_link import ControllerLink
from ferrymq.cmd.local import Child, spawn
from ferrymq.cmd.measure import Meter, Row, free_port, timed_window
from ferrymq.cmd.peer_etcd import EtcdCluster, EtcdNode
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import ApplyBrokerIdRequestHeader, GetMetaDataResponseHeader
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields

__all__ = ["ControllerBenchConfig", "FailoverResult", "run_controller_bench"]

_VALUE = b"v" * 64


@dataclass(frozen=True, slots=True)
class ControllerBenchConfig:
    """What to run."""

    seconds: float = 5.0
    window: int = 32
    rounds: int = 5
    etcd: bool = True
    workdir: Path | None = None


@dataclass(frozen=True, slots=True)
class FailoverResult:
    """Seconds from kill -9 of the leader to the first successful write, per round."""

    system: str
    seconds: list[float]

    @property
    def median(self) -> float:
        """The median round."""
        return statistics.median(self.seconds)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "system": self.system,
            "median_s": round(self.median, 3),
            "rounds_s": [round(s, 3) for s in self.seconds],
        }


Measured = tuple[list[Row], FailoverResult]
"""A system's rows and its failover rounds."""


async def _rows(
    system: str,
    write: Callable[[], Awaitable[None]],
    config: ControllerBenchConfig,
    pids: list[int],
) -> list[Row]:
    rows = []
    meter = Meter(pids)
    latencies: list[float] = []
    end = time.perf_counter() + config.seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        await write()
        latencies.append(time.perf_counter() - started)
    rows.append(meter.row(system, "sync", len(_VALUE), len(latencies), latencies))
    meter = Meter(pids)
    count, latencies = await timed_window(write, config.seconds, config.window)
    rows.append(meter.row(system, f"window {config.window}", len(_VALUE), count, latencies))
    return rows


async def _until_write(write: Callable[[], Awaitable[None]], limit_s: float = 60.0) -> float:
    """Seconds until `write` succeeds (retried at once after each failure)."""
    started = time.perf_counter()
    while True:
        try:
            await write()
            return time.perf_counter() - started
        except (FerryError, httpx.HTTPError, OSError) as exc:
            if time.perf_counter() - started > limit_s:
                raise RuntimeError(f"no write succeeded {limit_s:g} s after the kill") from exc
            await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- ferrymq controllers


class _Controllers:
    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        self.ids = [f"n{i}" for i in range(1, size + 1)]
        self.addrs = {node: f"127.0.0.1:{free_port()}" for node in self.ids}
        self.children: dict[str, Child] = {}
        self.rpc = RpcClient()
        self.link = ControllerLink(self.rpc, list(self.addrs.values()), timeout=1.0)
        self._ids = itertools.count(1)

    async def start(self, node: str | None = None) -> None:
        peers = ",".join(f"{n}={a}" for n, a in self.addrs.items())
        for name in [node] if node else self.ids:
            self.children[name] = await spawn(
                f"controller-{name}",
                [
                    "controller",
                    "--id",
                    name,
                    "--peers",
                    peers,
                    "--listen",
                    self.addrs[name],
                    "--data-dir",
                    str(self.workdir / f"controller-{name}"),
                ],
                self.workdir,
            )
        await _until_write(self.write, 30.0)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children.values() if c.running]

    async def write(self) -> None:
        group = next(self._ids)
        response = await self.link.call(
            RequestCode.CONTROLLER_APPLY_BROKER_ID,
            ApplyBrokerIdRequestHeader("bench", f"bench-{group}", 1, f"127.0.0.1:1;{group}"),
        )
        if response.code != ResponseCode.SUCCESS:
            raise FerryError(f"ApplyBrokerId: {response.code} {response.remark}")

    async def leader(self) -> str:
        for name, addr in self.addrs.items():
            if not self.children[name].running:
                continue
            request = RemotingCommand(code=RequestCode.CONTROLLER_GET_METADATA_INFO)
            try:
                response = await self.rpc.call(addr, request, 1.0)
            except FerryError:
                continue
            meta = from_ext_fields(GetMetaDataResponseHeader, response.ext_fields)
            if meta.is_leader:
                return name
        raise RuntimeError("no controller leads")

    async def close(self) -> None:
        for child in self.children.values():
            await child.stop()
        await self.rpc.close()


async def _ferrymq(config: ControllerBenchConfig, workdir: Path) -> Measured:
    controllers = _Controllers(workdir / "ferrymq")
    try:
        await controllers.start()
        rows = await _rows("ferrymq-controller", controllers.write, config, controllers.pids)
        rounds = []
        for _ in range(config.rounds):
            leader = await controllers.leader()
            controllers.children[leader].kill()
            rounds.append(await _until_write(controllers.write))
            await controllers.children[leader].process.wait()
            await controllers.start(leader)
        return rows, FailoverResult("ferrymq-controller", rounds)
    finally:
        await controllers.close()


async def _etcd(config: ControllerBenchConfig, workdir: Path) -> Measured:
    cluster = EtcdCluster(workdir / "etcd")
    keys = itertools.count()
    cached: list[EtcdNode] = []  # the leader, found once (a put through it is not forwarded)
    try:
        await cluster.start()

        async def write() -> None:
            if not cached:
                cached.append(await cluster.leader())
            try:
                await cluster.put(cached[0], b"bench/%d" % next(keys), _VALUE, timeout=1.0)
            except httpx.HTTPError:
                cached.clear()
                raise

        rows = await _rows("etcd-3.4", write, config, cluster.pids)
        rounds = []
        for _ in range(config.rounds):
            leader = await cluster.leader()
            cluster.kill(leader)
            cached.clear()
            survivors = itertools.cycle([n for n in cluster.nodes if n is not leader])
            rounds.append(await _until_write(functools.partial(_put_one, cluster, survivors, keys)))
            assert leader.process is not None
            await leader.process.wait()
            await cluster.start(leader)
        return rows, FailoverResult("etcd-3.4", rounds)
    finally:
        await cluster.close()


async def _put_one(cluster: EtcdCluster, nodes: Iterator[EtcdNode], keys: Iterator[int]) -> None:
    await cluster.put(next(nodes), b"failover/%d" % next(keys), _VALUE, timeout=0.5)


async def run_controller_bench(
    config: ControllerBenchConfig,
) -> tuple[list[Row], list[FailoverResult]]:
    """Measure ferrymq's controller and, unless disabled, etcd; rows and failover results."""
    owned = config.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="ferry-bench-ctl-")) if owned else config.workdir
    assert workdir is not None
    try:
        rows, failovers = [], []
        ours, failover = await _ferrymq(config, workdir)
        rows += ours
        failovers.append(failover)
        if config.etcd:
            theirs, failover = await _etcd(config, workdir)
            rows += theirs
            failovers.append(failover)
        return rows, failovers
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
