"""`ferry bench failover`: unavailability after a master dies, beside NATS JetStream R3.

One run measures, per system and failure mode, `rounds` failures of the node that takes writes:

- ferrymq: the default HA cluster (`ProcessCluster`: 3 controllers, a NameServer, a group of 3
  replicas in controller mode, sync replication); the failure is the group's master;
- NATS JetStream: 3 `nats-server` nodes with an R3 file stream; the failure is the stream leader.

A failure is `kill -9` (a crash: the kernel closes its sockets) or SIGSTOP (a silent failure:
sockets stay open, nothing answers). Meanwhile a producer sends at a fixed rate, open loop, each
message retried until acknowledged (same id: NATS deduplicates it, ferrymq may store an unknown
send twice). Per round:

- gap: failure -> first acknowledgement after it (what clients see);
- elect: failure -> the cluster names a new master / stream leader;
- follow: elect -> first acknowledgement (how fast clients find the new master);

then the failed node is restarted (kill) or continued (SIGSTOP) and rejoins before the next round.
At the end everything is read back: acknowledged-but-lost and duplicated counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.producer import Producer
from ferrymq.cmd.measure import free_port, quiet_nats_errors
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

__all__ = ["FailoverBenchConfig", "FailoverRound", "FailoverSummary", "run_failover_bench"]

TOPIC = "FailoverBench"
Recover = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class FailoverBenchConfig:
    """What to run."""

    rounds: int = 5
    rate: int = 200
    """Messages per second, open loop."""
    modes: tuple[str, ...] = ("kill", "stop")
    nats: bool = True
    workdir: Path | None = None


@dataclass(frozen=True, slots=True)
class FailoverRound:
    """One failure, in seconds."""

    gap_s: float
    elect_s: float
    follow_s: float


_FIGURES = ("gap_s", "elect_s", "follow_s")


@dataclass
class FailoverSummary:
    """One system and mode: its rounds and what reading everything back found."""

    system: str
    mode: str
    rounds: list[FailoverRound] = field(default_factory=list)
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0

    def stat(self, figure: str, quantile: float) -> float:
        """A quantile (0.5: the median) of one per-round figure."""
        values = sorted(getattr(r, figure) for r in self.rounds)
        if not values:
            return float("nan")
        if quantile == 0.5:
            return float(statistics.median(values))
        return float(values[min(len(values) - 1, round(quantile * (len(values) - 1)))])

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        figures = {
            f"{figure.removesuffix('_s')}_{label}_s": round(self.stat(figure, q), 3)
            for figure in _FIGURES
            for label, q in (("median", 0.5), ("p99", 0.99))
        }
        return {
            "system": self.system,
            "mode": self.mode,
            "acknowledged": self.acknowledged,
            "lost": self.lost,
            "duplicated": self.duplicated,
            **figures,
            "rounds": [
                {figure: round(getattr(r, figure), 3) for figure in _FIGURES} for r in self.rounds
            ],
        }


class _System(Protocol):
    name: str

    async def send(self, body: bytes, msg_id: str) -> None:
        """One attempt; raises when it was not acknowledged."""
        ...

    async def fail(self, mode: str) -> Recover:
        """Fail the node taking writes; returns how to bring it back."""
        ...

    async def elected(self) -> float:
        """Wait until a new master/leader is named; returns when (monotonic seconds)."""
        ...

    async def read_back(self) -> Counter[bytes]:
        """Every stored body, with how often it is stored or delivered."""
        ...


class _Load:
    """An open-loop producer: message i starts at i/rate seconds and is retried until acked."""

    def __init__(self, system: _System, rate: int) -> None:
        self.system = system
        self.rate = rate
        self.acks: list[tuple[float, float]] = []
        """(attempt started, acknowledged) per acknowledged message, monotonic seconds."""
        self.acked: set[bytes] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._acked_one = asyncio.Event()

    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        start = time.monotonic()
        for i in itertools_count():
            await asyncio.sleep(max(0.0, start + i / self.rate - time.monotonic()))
            task = asyncio.get_running_loop().create_task(self._one(i))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, i: int) -> None:
        body = b"%012d" % i
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            attempt = time.monotonic()
            try:
                await self.system.send(body, str(i))
            except Exception:  # noqa: BLE001 - any failed attempt: send it again
                await asyncio.sleep(0.02)
                continue
            self.acks.append((attempt, time.monotonic()))
            self.acked.add(body)
            self._acked_one.set()
            return

    async def first_ack_after(self, moment: float, limit_s: float = 60.0) -> float:
        """When the first acknowledgement of an attempt started after `moment` came.

        (An answer already on its way when the node failed does not count as service.)
        """
        deadline = time.monotonic() + limit_s
        while True:
            later = [acked for started, acked in self.acks[-2000:] if started > moment]
            if later:
                return min(later)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.system.name}: nothing acknowledged {limit_s:g} s after")
            self._acked_one.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._acked_one.wait()

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def itertools_count() -> range:
    """Message numbers (bounded: a run never gets near it)."""
    return range(10**9)


async def _measure(system: _System, config: FailoverBenchConfig, mode: str) -> FailoverSummary:
    summary = FailoverSummary(system.name, mode)
    load = _Load(system, config.rate)
    load.start()
    try:
        await load.first_ack_after(0.0)
        for _ in range(config.rounds):
            await asyncio.sleep(1.0)
            failed_at = time.monotonic()
            recover = await system.fail(mode)
            elected = asyncio.ensure_future(system.elected())
            first_ack = await load.first_ack_after(failed_at)
            elected_at = await elected
            summary.rounds.append(
                FailoverRound(
                    gap_s=first_ack - failed_at,
                    elect_s=elected_at - failed_at,
                    follow_s=max(0.0, first_ack - elected_at),
                )
            )
            await recover()
        await asyncio.sleep(1.0)
    finally:
        await load.stop()
    consumed = await system.read_back()
    summary.acknowledged = len(load.acked)
    summary.lost = len(load.acked - consumed.keys())
    summary.duplicated = sum(n - 1 for n in consumed.values() if n > 1)
    return summary


async def _until(condition: Callable[[], Awaitable[bool]], what: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not await condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {limit_s:g} s")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- ferrymq


class _Ferrymq:
    name = "ferrymq"

    def __init__(self, workdir: Path) -> None:
        self.cluster = ProcessCluster(UpConfig(data_dir=workdir, replicas=3, controllers=3))
        self.rpc = RpcClient()
        self.producer: Producer | None = None
        self.controllers: ControllerAdmin | None = None
        self._epoch = 0

    async def start(self) -> None:
        await self.cluster.start()
        async with AdminClient(self.cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, queues=4)
        self.controllers = ControllerAdmin(
            ";".join(self.cluster.controller_addrs.values()), timeout=1.0
        )
        self.producer = Producer(self.cluster.namesrv_addr, "bench-failover", send_timeout=1.0)
        await self._until_in_sync()

    async def _master(self) -> tuple[str, int]:
        assert self.controllers is not None
        info = await self.controllers.replica_info("broker-a")
        return info.master_address or "", info.master_epoch or 0

    async def _until_in_sync(self) -> None:
        async def in_sync() -> bool:
            with contextlib.suppress(FerryError):
                master, self._epoch = await self._master()
                if master:
                    response = await self.rpc.call(
                        master, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 2
                    )
                    members = decode_body(response.body, KVTable).table.get("syncStateSet", "")
                    return len(members.split(",")) == 3
            return False

        await _until(in_sync, "three replicas in sync")

    async def send(self, body: bytes, msg_id: str) -> None:
        assert self.producer is not None
        await self.producer.send(TOPIC, body)

    async def fail(self, mode: str) -> Recover:
        master, self._epoch = await self._master()
        name = next(n for n, c in self.cluster.brokers.items() if c.addr == master)
        child = self.cluster.brokers[name]
        if mode == "kill":
            child.kill()
        else:
            child.suspend()

        async def recover() -> None:
            if mode == "kill":
                await child.process.wait()
                await self.cluster.restart(name)
            else:
                child.resume()
            await self._until_in_sync()

        return recover

    async def elected(self) -> float:
        async def new_master() -> bool:
            with contextlib.suppress(FerryError):
                master, epoch = await self._master()
                return bool(master) and epoch > self._epoch
            return False

        await _until(new_master, "a new ferrymq master")
        return time.monotonic()

    async def read_back(self) -> Counter[bytes]:
        found: Counter[bytes] = Counter()
        async with PullConsumer(self.cluster.namesrv_addr, "bench-failover-check") as consumer:
            for queue in await consumer.queues(TOPIC):
                offset = 0
                while True:
                    pulled = await consumer.pull(queue, offset, max_messages=256)
                    if pulled.status is not PullStatus.FOUND:
                        break
                    found.update(m.body for m in pulled.messages)
                    offset = pulled.next_offset
        return found

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.close()
        if self.controllers is not None:
            await self.controllers.close()
        await self.rpc.close()
        await self.cluster.stop()


# ---------------------------------------------------------------------- NATS JetStream R3


class _Nats:
    name = "nats-jetstream-r3"

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            raise RuntimeError("nats-server is not installed (apt-get install nats-server)")
        self.binary = binary
        self.workdir = workdir
        self.names = ["n1", "n2", "n3"]
        self.client_ports = {n: free_port() for n in self.names}
        self.route_ports = {n: free_port() for n in self.names}
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.connection: Any = None
        self.js: Any = None
        self._leader = ""

    async def _spawn(self, name: str) -> None:
        routes = ", ".join(
            f"nats-route://127.0.0.1:{self.route_ports[o]}" for o in self.names if o != name
        )
        conf = self.workdir / f"nats-{name}.conf"
        conf.write_text(
            f"server_name: {name}\nlisten: 127.0.0.1:{self.client_ports[name]}\n"
            f'jetstream {{\n  store_dir: "{self.workdir / ("nats-" + name)}"\n}}\n'
            f"cluster {{\n  name: failover\n  listen: 127.0.0.1:{self.route_ports[name]}\n"
            f"  routes: [ {routes} ]\n}}\n"
        )
        with (self.workdir / f"nats-{name}.log").open("ab") as log:
            self.processes[name] = await asyncio.create_subprocess_exec(
                self.binary, "-c", str(conf), stdout=asyncio.subprocess.DEVNULL, stderr=log
            )

    async def start(self) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        for name in self.names:
            await self._spawn(name)
        servers = [f"nats://127.0.0.1:{self.client_ports[n]}" for n in self.names]
        # what NATS users configure for fast failover: a server that stops answering pings is
        # left within ~2 s, reconnects are immediate
        self.connection = await nats.connect(
            servers=servers,
            error_cb=quiet_nats_errors,
            reconnect_time_wait=0.05,
            max_reconnect_attempts=-1,
            connect_timeout=1,
            ping_interval=1,
            max_outstanding_pings=2,
        )
        self.js = self.connection.jetstream(timeout=1.0)

        async def stream_ready() -> bool:
            with contextlib.suppress(Exception):
                await self.js.add_stream(
                    StreamConfig(
                        name="FAILOVER",
                        subjects=["failover.>"],
                        storage=StorageType.FILE,
                        num_replicas=3,
                    )
                )
            with contextlib.suppress(Exception):
                return bool(await self._leader_name())
            return False

        await _until(stream_ready, "the NATS R3 stream")

    async def _leader_name(self) -> str:
        # bounded here too: a client still attached to a stopped server can wait on its buffer
        info = await asyncio.wait_for(self.js.stream_info("FAILOVER"), 1.5)
        return str(info.cluster.leader or "") if info.cluster else ""

    async def send(self, body: bytes, msg_id: str) -> None:
        await asyncio.wait_for(
            self.js.publish("failover.x", body, timeout=1.0, headers={"Nats-Msg-Id": msg_id}),
            1.5,
        )

    async def fail(self, mode: str) -> Recover:
        self._leader = await self._leader_name()
        process = self.processes[self._leader]
        name = self._leader
        os.kill(process.pid, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)

        async def recover() -> None:
            if mode == "kill":
                await process.wait()
                await self._spawn(name)
            else:
                os.kill(process.pid, signal.SIGCONT)

            async def current() -> bool:
                with contextlib.suppress(Exception):
                    info = await asyncio.wait_for(self.js.stream_info("FAILOVER"), 1.5)
                    replicas = info.cluster.replicas or [] if info.cluster else []
                    return len(replicas) == 2 and all(r.current for r in replicas)
                return False

            await _until(current, "the NATS replica to catch up")

        return recover

    async def elected(self) -> float:
        async def new_leader() -> bool:
            with contextlib.suppress(Exception):
                leader = await self._leader_name()
                return bool(leader) and leader != self._leader
            return False

        await _until(new_leader, "a new NATS stream leader")
        return time.monotonic()

    async def read_back(self) -> Counter[bytes]:
        """Every stored message, fetched by stream sequence.

        No consumer: a pull consumer's delivery state could hide a message a fetch dropped (an
        earlier read-back through one reported acknowledged messages missing).
        """
        from nats.js.errors import NotFoundError

        bounds: list[int] = []

        async def stream_state() -> bool:
            # JetStream answers 503 for a moment after a node rejoins: ask again
            with contextlib.suppress(Exception):
                state = (await asyncio.wait_for(self.js.stream_info("FAILOVER"), 1.5)).state
                bounds[:] = [state.first_seq, state.last_seq]
                return True
            return False

        await _until(stream_state, "the NATS stream's sequence range")
        first, last = bounds
        found: Counter[bytes] = Counter()

        async def one(seq: int) -> None:
            for _ in range(50):
                try:
                    message = await asyncio.wait_for(self.js.get_msg("FAILOVER", seq), 2.0)
                except NotFoundError:
                    return  # deleted: nothing stored at this sequence
                except Exception:  # noqa: BLE001 - a transient 503 or timeout: ask again
                    await asyncio.sleep(0.1)
                    continue
                found[message.data or b""] += 1
                return
            raise RuntimeError(f"NATS stream sequence {seq} could not be read")

        for start in range(first, last + 1, 64):
            await asyncio.gather(*(one(seq) for seq in range(start, min(start + 64, last + 1))))
        return found

    async def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.terminate()
                await process.wait()


async def run_failover_bench(
    config: FailoverBenchConfig, progress: Callable[[str], None]
) -> list[FailoverSummary]:
    """Every system and mode, each on a fresh cluster."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="ferrymq-bench-failover-"))
    summaries = []
    try:
        for mode in config.modes:
            factories: list[Callable[[Path], _Ferrymq | _Nats]] = [_Ferrymq]
            if config.nats:
                factories.append(_Nats)
            for factory in factories:
                directory = workdir / f"{factory.__name__.strip('_').lower()}-{mode}"
                directory.mkdir(parents=True)
                system = factory(directory)
                progress(f"{system.name}, {mode}")
                try:
                    await system.start()
                    summaries.append(await _measure(system, config, mode))
                finally:
                    await system.close()
    finally:
        if config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return summaries
