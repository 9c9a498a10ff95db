"""`ferry bench replication`: three replicas with sync replication beside one, and beside NATS R3.

One run measures ferrymq with one replica, ferrymq with three, and a 3-node NATS JetStream
cluster with an R3 stream and an R1 stream (NATS's own R3/R1 on this machine, for scale). All
run for the whole run, and every row is measured in rotating slices
(`measure.interleaved_sends`): one system's slice, then the same slice of the next.

Every ferrymq broker runs as its own process (`ferry broker`): R1 is a SYNC_MASTER alone in its
SyncStateSet, R3 a SYNC_MASTER with two SLAVEs, so a send is acknowledged only once all three
hold it. NATS is three `nats-server` processes in one cluster, file storage, the client connected
to each stream's leader's node (the server CPU of NATS rows is the whole cluster's). Rows: sync
sends (one in flight) and windowed sends (`window` in flight), per payload size, with p50/p99
latency and the CPU of the client and of all servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child, spawn
from ferrymq.cmd.measure import Row, Side, free_port, interleaved_sends_by_size, quiet_nats_errors
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

__all__ = ["ReplicationBenchConfig", "ratios", "run_replication_bench"]


@dataclass(frozen=True, slots=True)
class ReplicationBenchConfig:
    """What to run."""

    sizes: tuple[int, ...] = (100, 1024)
    seconds: float = 5.0
    rounds: int = 5
    window: int = 256
    nats: bool = True
    workdir: Path | None = None


_SYSTEMS = ("ferrymq-r1", "ferrymq-r3", "nats-jetstream-r1", "nats-jetstream-r3")


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Per mode and size: R3/R1 for ferrymq and for NATS, and ferrymq R3 / NATS R3."""
    index = {(r.system, r.mode, r.size): r for r in rows}

    def ratio(top: Row | None, bottom: Row | None) -> float | None:
        if top is None or bottom is None or not bottom.msgs_per_s:
            return None
        return round(top.msgs_per_s / bottom.msgs_per_s, 2)

    out = []
    for (system, mode, size), row in index.items():
        if system != "ferrymq-r3":
            continue
        nats_r3 = index.get(("nats-jetstream-r3", mode, size))
        out.append(
            {
                "mode": mode,
                "size": size,
                "r3_over_r1": ratio(row, index.get(("ferrymq-r1", mode, size))),
                "r3_over_nats_r3": ratio(row, nats_r3),
                "nats_r3_over_r1": ratio(nats_r3, index.get(("nats-jetstream-r1", mode, size))),
            }
        )
    return out


@contextlib.asynccontextmanager
async def _ferrymq_group(workdir: Path, replicas: int) -> AsyncIterator[tuple[str, list[Child]]]:
    children: list[Child] = []
    try:
        namesrv = await spawn(
            f"r{replicas}-namesrv",
            ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"],
            workdir,
        )
        children.append(namesrv)
        for broker_id in range(replicas):
            name = f"r{replicas}-broker-{broker_id}"
            children.append(
                await spawn(
                    name,
                    [
                        "broker",
                        "--broker-name",
                        f"bench-r{replicas}",
                        "--listen",
                        "127.0.0.1:0",
                        "--namesrv",
                        namesrv.addr,
                        "--store-dir",
                        str(workdir / name),
                        "--role",
                        "SYNC_MASTER" if broker_id == 0 else "SLAVE",
                        "--broker-id",
                        str(broker_id),
                        "--log-level",
                        "WARNING",
                    ],
                    workdir,
                )
            )
        yield namesrv.addr, children[1:]
    finally:
        for child in reversed(children):
            await child.stop()


@contextlib.asynccontextmanager
async def _ferrymq_side(
    config: ReplicationBenchConfig, workdir: Path, replicas: int
) -> AsyncIterator[Side]:
    async with _ferrymq_group(workdir, replicas) as (namesrv, brokers):
        async with AdminClient(namesrv) as admin:
            for size in config.sizes:
                await admin.create_topic(f"Repl{size}", queues=4)
            deadline = time.monotonic() + 30
            while any([await admin.route(f"Repl{s}") is None for s in config.sizes]):
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark topics never reached the NameServer")
                await asyncio.sleep(0.05)
        await _wait_in_sync(brokers[0].addr, replicas)
        async with Producer(namesrv, "bench-replication", send_timeout=10) as producer:
            payloads = {size: os.urandom(size) for size in config.sizes}

            def sender(size: int) -> Callable[[], Awaitable[object]]:
                return functools.partial(producer.send, f"Repl{size}", payloads[size])

            yield Side(f"ferrymq-r{replicas}", [b.pid for b in brokers], sender)


async def _wait_in_sync(master: str, replicas: int) -> None:
    expected = ",".join(str(i) for i in range(replicas))
    deadline = time.monotonic() + 30
    async with RpcClient() as client:
        while True:
            response = await client.call(
                master, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 5
            )
            table = decode_body(response.body, KVTable).table
            if table.get("syncStateSet") == expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the SyncStateSet never reached {expected}: {table}")
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _nats_sides(config: ReplicationBenchConfig, workdir: Path) -> AsyncIterator[list[Side]]:
    """One 3-node cluster: an R3 stream, and an R1 stream, each driven on its leader's node."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed (apt-get install nats-server)")
    import nats

    names = ["n1", "n2", "n3"]
    client_ports = {n: free_port() for n in names}
    route_ports = {n: free_port() for n in names}
    processes: list[asyncio.subprocess.Process] = []
    connections: list[Any] = []
    try:
        for name in names:
            routes = ", ".join(
                f"nats-route://127.0.0.1:{route_ports[o]}" for o in names if o != name
            )
            conf = workdir / f"nats-{name}.conf"
            conf.write_text(
                f"server_name: {name}\nlisten: 127.0.0.1:{client_ports[name]}\n"
                f'jetstream {{\n  store_dir: "{workdir / ("nats-" + name)}"\n}}\n'
                f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{route_ports[name]}\n"
                f"  routes: [ {routes} ]\n}}\n"
            )
            with (workdir / f"nats-{name}.log").open("ab") as log:
                processes.append(
                    await asyncio.create_subprocess_exec(
                        binary, "-c", str(conf), stdout=asyncio.subprocess.DEVNULL, stderr=log
                    )
                )
        pids = [p.pid for p in processes]
        payloads = {size: os.urandom(size) for size in config.sizes}
        sides: list[Side] = []
        for stream, replicas in (("REPL", 3), ("REPL1", 1)):
            leader = await _nats_stream_leader(
                f"nats://127.0.0.1:{client_ports['n1']}", stream, replicas
            )
            connection = await nats.connect(
                f"nats://127.0.0.1:{client_ports[leader]}", error_cb=quiet_nats_errors
            )
            connections.append(connection)
            js = connection.jetstream()

            def sender(
                size: int, js: Any = js, subject: str = stream.lower()
            ) -> Callable[[], Awaitable[object]]:
                return functools.partial(
                    js.publish, f"{subject}.{size}", payloads[size], timeout=10
                )

            sides.append(Side(f"nats-jetstream-r{replicas}", pids, sender))
        yield sides
    finally:
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.close()
        for process in processes:
            if process.returncode is None:
                process.terminate()
                await process.wait()


async def _nats_stream_leader(url: str, stream: str, replicas: int) -> str:
    """Create a file stream (subjects `<stream lower>.>`) once JetStream answers.

    Returns the server name of its leader.
    """
    import nats
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + 60
    while True:
        try:
            probe = await nats.connect(
                url, connect_timeout=1, allow_reconnect=False, error_cb=quiet_nats_errors
            )
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        try:
            js = probe.jetstream(timeout=2)
            with contextlib.suppress(Exception):
                await js.add_stream(
                    StreamConfig(
                        name=stream,
                        subjects=[f"{stream.lower()}.>"],
                        storage=StorageType.FILE,
                        num_replicas=replicas,
                    )
                )
            info = await js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return str(info.cluster.leader)
        except Exception:
            if time.monotonic() > deadline:
                raise
        finally:
            await probe.close()
        await asyncio.sleep(0.5)


async def run_replication_bench(
    config: ReplicationBenchConfig, progress: Callable[[str], None]
) -> list[Row]:
    """Start ferrymq R1 and R3 and NATS R1 and R3 side by side, then measure their rows in turns."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="ferrymq-bench-replication-"))
    try:
        async with contextlib.AsyncExitStack() as stack:
            progress("starting the servers")
            sides = [
                await stack.enter_async_context(_ferrymq_side(config, workdir, 1)),
                await stack.enter_async_context(_ferrymq_side(config, workdir, 3)),
            ]
            if config.nats:
                sides += await stack.enter_async_context(_nats_sides(config, workdir))
            rows = await interleaved_sends_by_size(
                sides,
                config.sizes,
                seconds=config.seconds,
                rounds=config.rounds,
                window=config.window,
                progress=progress,
            )
    finally:
        if config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return sorted(rows, key=lambda r: _SYSTEMS.index(r.system))  # stable: sizes stay in order
