"""`ferry bench controller`: three controller nodes beside a three-node etcd 3.4 cluster.

Issue 6's benchmark. One run measures, on the same machine and loopback:

- commit latency (p50/p99) of sequential writes, and throughput with `window` writes in flight:
  ferrymq ApplyBrokerId (a new broker group each) and AlterSyncStateSet (one chain of epochs per
  group, `window` groups), against etcd puts of a small value (`/v3/kv/put` through etcd's HTTP
  JSON gateway, one keep-alive connection per write in flight);
- leader failover after kill -9: from the kill to the first write acknowledged by the new leader,
  per round, with the killed node restarted from its data directory between rounds.

Every server is its own process on free loopback ports, with its data in a fresh directory. The
ferrymq client is `ControllerAdmin` (one multiplexed connection); etcd's is a minimal HTTP/1.1
client written here (the gateway adds a proxy hop inside etcd, so etcd's latency here is somewhat
higher than a gRPC client would see).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.cmd.local import Child, spawn
from ferrymq.cmd.measure import Meter, Row, free_port, timed_window
from ferrymq.errors import FerryError
from ferrymq.wire.controller import BrokerHeartbeatRequestHeader, SyncStateSet

__all__ = ["ControllerBenchConfig", "ControllerBenchResult", "run_controller_bench"]

_CLUSTER: Final = "BenchCluster"
_ETCD_VALUE: Final = base64.b64encode(b"127.0.0.1:10911;1").decode()
_RETRY_DELAY: Final = 0.02


@dataclass(frozen=True, slots=True)
class ControllerBenchConfig:
    """What to run."""

    requests: int = 1000
    """Sequential writes measured per row."""
    seconds: float = 5.0
    """Length of each windowed row."""
    window: int = 32
    """Writes in flight in the windowed rows."""
    failovers: int = 5
    """Leader kills per system."""
    etcd: bool = True
    workdir: Path | None = None


@dataclass(slots=True)
class ControllerBenchResult:
    """Rows, and failover gaps in seconds per system."""

    rows: list[Row] = field(default_factory=list)
    failovers: dict[str, list[float]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Medians and the ratios the issue's goals name."""
        medians = {s: statistics.median(g) for s, g in self.failovers.items() if g}
        p50 = {(r.system, r.mode): r.p50_ms for r in self.rows}
        out: dict[str, Any] = {"failover_median_s": {s: round(m, 3) for s, m in medians.items()}}
        ferry = medians.get("ferrymq-controller")
        etcd = medians.get("etcd-3.4")
        out["failover_over_etcd"] = round(ferry / etcd, 2) if ferry and etcd else None
        ferry_p50 = p50.get(("ferrymq-controller", "sequential ApplyBrokerId"))
        etcd_p50 = p50.get(("etcd-3.4", "sequential put"))
        out["commit_p50_over_etcd"] = (
            round(ferry_p50 / etcd_p50, 2) if ferry_p50 and etcd_p50 else None
        )
        return out


# ---------------------------------------------------------------------- ferrymq


class _FerryGroup:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.addrs = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
        self.children: dict[str, Child] = {}

    async def start(self, node_id: str) -> None:
        peers = ",".join(f"{n}={a}" for n, a in self.addrs.items())
        self.children[node_id] = await spawn(
            f"controller-{node_id}",
            [
                "controller",
                "--id",
                node_id,
                "--peers",
                peers,
                "--data-dir",
                str(self.workdir / node_id),
                "--log-level",
                "WARNING",
            ],
            self.workdir,
        )

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children.values() if c.running]

    async def leader(self, admin: ControllerAdmin) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for node_id, addr in self.addrs.items():
                if not self.children[node_id].running:
                    continue
                with contextlib.suppress(FerryError):
                    if (await admin.metadata(addr)).is_leader:
                        return node_id
            await asyncio.sleep(_RETRY_DELAY)
        raise RuntimeError("no controller leader within 30 s")

    async def caught_up(self, admin: ControllerAdmin) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(FerryError):
                applied = {(await admin.metadata(a)).applied_index for a in self.addrs.values()}
                if len(applied) == 1:
                    return
            await asyncio.sleep(0.05)
        raise RuntimeError("a restarted controller did not catch up within 30 s")

    async def stop(self) -> None:
        for child in self.children.values():
            await child.stop()


async def _timed_sequential(
    write: Callable[[int], Awaitable[object]], count: int
) -> tuple[int, list[float]]:
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        await write(n)
        latencies.append(time.perf_counter() - started)
    return count, latencies


class _AlterChain:
    """One group's SyncStateSet flipping between {1} and {1, 2, 3}, each alter fenced by epochs."""

    def __init__(self, admin: ControllerAdmin, name: str, master_epoch: int, set_epoch: int):
        self._admin = admin
        self._name = name
        self._master_epoch = master_epoch
        self._set_epoch = set_epoch
        self._wide = False

    async def step(self) -> None:
        members = [1] if self._wide else [1, 2, 3]
        accepted = await self._admin.alter_sync_state_set(
            self._name,
            1,
            self._master_epoch,
            SyncStateSet(sync_state_set=members, sync_state_set_epoch=self._set_epoch),
        )
        self._set_epoch = accepted.sync_state_set_epoch
        self._wide = not self._wide


async def _alter_chains(
    admin: ControllerAdmin, groups: int, prefix: str
) -> list[Callable[[], Awaitable[None]]]:
    """Groups of three live brokers with broker 1 master; each returns its next alter step."""
    steps: list[Callable[[], Awaitable[None]]] = []
    for g in range(groups):
        name = f"{prefix}-{g}"
        for broker_id in (1, 2, 3):
            await admin.apply_broker_id(_CLUSTER, name, broker_id, f"127.0.0.1:{broker_id};{g}")
            await admin.heartbeat(
                BrokerHeartbeatRequestHeader(
                    cluster_name=_CLUSTER,
                    broker_addr=f"127.0.0.1:{broker_id}",
                    broker_name=name,
                    broker_id=broker_id,
                    heartbeat_timeout_mills=3_600_000,
                )
            )
        elected = await admin.elect_master(_CLUSTER, name, 1, designate=True)
        chain = _AlterChain(
            admin,
            name,
            elected.header.master_epoch or 1,
            elected.header.sync_state_set_epoch or 1,
        )
        steps.append(chain.step)
    return steps


async def _chains_window(
    steps: list[Callable[[], Awaitable[None]]], seconds: float
) -> tuple[int, list[float]]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def run(step: Callable[[], Awaitable[None]]) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await step()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(run(step) for step in steps))
    return len(latencies), latencies


async def _ferry_rows(
    config: ControllerBenchConfig,
    workdir: Path,
    result: ControllerBenchResult,
    progress: Callable[[str], None],
) -> None:
    system = "ferrymq-controller"
    group = _FerryGroup(workdir)
    try:
        for node_id in group.addrs:
            await group.start(node_id)
        async with ControllerAdmin(";".join(group.addrs.values()), timeout=15.0) as admin:
            await group.leader(admin)
            names = itertools.count()

            async def apply(_: int = 0) -> None:
                n = next(names)
                await admin.apply_broker_id(_CLUSTER, f"b-{n}", 1, f"127.0.0.1:{n};1")

            progress("ferrymq sequential ApplyBrokerId")
            meter = Meter(group.pids)
            count, lat = await _timed_sequential(apply, config.requests)
            result.rows.append(meter.row(system, "sequential ApplyBrokerId", 0, count, lat))
            progress("ferrymq windowed ApplyBrokerId")
            meter = Meter(group.pids)
            count, lat = await timed_window(apply, config.seconds, config.window)
            result.rows.append(
                meter.row(system, f"window {config.window} ApplyBrokerId", 0, count, lat)
            )
            progress("ferrymq AlterSyncStateSet")
            steps = await _alter_chains(admin, config.window, "alter")
            meter = Meter(group.pids)
            count, lat = await _timed_sequential(lambda _: steps[0](), config.requests)
            result.rows.append(meter.row(system, "sequential AlterSyncStateSet", 0, count, lat))
            meter = Meter(group.pids)
            count, lat = await _chains_window(steps, config.seconds)
            result.rows.append(
                meter.row(system, f"window {config.window} AlterSyncStateSet", 0, count, lat)
            )
            gaps = result.failovers.setdefault(system, [])
            for round_number in range(config.failovers):
                progress(f"ferrymq failover {round_number + 1}/{config.failovers}")
                victim = await group.leader(admin)
                group.children[victim].kill()
                killed = time.perf_counter()
                while True:
                    try:
                        await apply()
                        break
                    except FerryError:
                        await asyncio.sleep(_RETRY_DELAY)
                gaps.append(time.perf_counter() - killed)
                await group.children[victim].process.wait()
                await group.start(victim)
                await group.caught_up(admin)
    finally:
        await group.stop()


# ---------------------------------------------------------------------- etcd


class _Http:
    """One keep-alive HTTP/1.1 connection to an etcd member's JSON gateway."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            try:
                return await self._post(path, payload)
            except BaseException:
                self.close()
                raise

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None:
            host, _, port = self.address.rpartition(":")
            self._reader, self._writer = await asyncio.open_connection(host, int(port))
        assert self._reader is not None
        body = json.dumps(payload).encode()
        self._writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.address}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in header_lines if line)
        }
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self._reader.readexactly(size + 2)
                if size == 0:
                    break
                data += chunk[:-2]
        else:
            data = await self._reader.readexactly(int(headers.get("content-length", "0")))
        status = int(status_line.split()[1])
        if status != 200:
            raise RuntimeError(f"etcd {self.address}: HTTP {status}: {data[:200]!r}")
        decoded: dict[str, Any] = json.loads(data or b"{}")
        return decoded

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class _EtcdGroup:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.members = {
            f"e{i}": (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}") for i in (1, 2, 3)
        }
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, name: str) -> None:
        client, peer = self.members[name]
        cluster = ",".join(f"{n}=http://{p}" for n, (_, p) in self.members.items())
        log = (self.workdir / f"{name}.log").open("ab")
        with log:
            self.processes[name] = await asyncio.create_subprocess_exec(
                "etcd",
                "--name", name,
                "--data-dir", str(self.workdir / name),
                "--listen-client-urls", f"http://{client}",
                "--advertise-client-urls", f"http://{client}",
                "--listen-peer-urls", f"http://{peer}",
                "--initial-advertise-peer-urls", f"http://{peer}",
                "--initial-cluster", cluster,
                "--initial-cluster-token", "ferrymq-bench",
                "--initial-cluster-state", "new",
                "--log-level", "warn",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values() if p.returncode is None]

    def running(self, name: str) -> bool:
        return self.processes[name].returncode is None

    async def leader(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for name, (client, _) in self.members.items():
                if not self.running(name):
                    continue
                http = _Http(client)
                try:
                    status = await http.post("/v3/maintenance/status", {}, 1.0)
                except (OSError, RuntimeError, TimeoutError, asyncio.IncompleteReadError):
                    continue
                finally:
                    http.close()
                if status.get("leader") and status.get("leader") == status["header"]["member_id"]:
                    return name
            await asyncio.sleep(_RETRY_DELAY)
        raise RuntimeError(f"no etcd leader within 30 s (logs in {self.workdir})")

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def _etcd_rows(
    config: ControllerBenchConfig,
    workdir: Path,
    result: ControllerBenchResult,
    progress: Callable[[str], None],
) -> None:
    system = "etcd-3.4"
    group = _EtcdGroup(workdir)
    connections: list[_Http] = []
    try:
        for name in group.members:
            await group.start(name)
        leader = await group.leader()
        names = itertools.count()
        pool: asyncio.Queue[_Http] = asyncio.Queue()
        for _ in range(config.window):
            http = _Http(group.members[leader][0])
            connections.append(http)
            pool.put_nowait(http)

        async def put(_: int = 0) -> None:
            http = await pool.get()
            try:
                key = base64.b64encode(f"b-{next(names)}".encode()).decode()
                await http.post("/v3/kv/put", {"key": key, "value": _ETCD_VALUE}, 5.0)
            finally:
                pool.put_nowait(http)

        progress("etcd sequential put")
        meter = Meter(group.pids)
        count, lat = await _timed_sequential(put, config.requests)
        result.rows.append(meter.row(system, "sequential put", 0, count, lat))
        progress("etcd windowed put")
        meter = Meter(group.pids)
        count, lat = await timed_window(put, config.seconds, config.window)
        result.rows.append(meter.row(system, f"window {config.window} put", 0, count, lat))
        gaps = result.failovers.setdefault(system, [])
        for round_number in range(config.failovers):
            progress(f"etcd failover {round_number + 1}/{config.failovers}")
            victim = await group.leader()
            group.processes[victim].kill()
            killed = time.perf_counter()
            survivors = [_Http(c) for n, (c, _) in group.members.items() if n != victim]
            connections.extend(survivors)
            for attempt in itertools.count():
                http = survivors[attempt % len(survivors)]
                key = base64.b64encode(f"fo-{round_number}-{attempt}".encode()).decode()
                try:
                    await http.post("/v3/kv/put", {"key": key, "value": _ETCD_VALUE}, 1.0)
                    break
                except (OSError, RuntimeError, TimeoutError, asyncio.IncompleteReadError):
                    await asyncio.sleep(_RETRY_DELAY)
            gaps.append(time.perf_counter() - killed)
            await group.processes[victim].wait()
            await group.start(victim)
            await group.leader()
    finally:
        for http in connections:
            http.close()
        await group.stop()


async def run_controller_bench(
    config: ControllerBenchConfig, progress: Callable[[str], None] = lambda _: None
) -> ControllerBenchResult:
    """Measure ferrymq's controller, then (unless disabled) etcd, in fresh directories.

    Raises:
        RuntimeError: a server did not start (the message has its log tail), or etcd is missing.
    """
    if config.etcd and shutil.which("etcd") is None:
        raise RuntimeError("etcd is not installed (Debian package etcd-server); or use --no-etcd")
    result = ControllerBenchResult()
    with contextlib.ExitStack() as stack:
        root = config.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        await _ferry_rows(config, root / "ferrymq", result, progress)
        if config.etcd:
            (root / "etcd").mkdir(parents=True, exist_ok=True)
            await _etcd_rows(config, root / "etcd", result, progress)
    return result
