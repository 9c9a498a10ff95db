"""`ferry bench broker`: one ferrymq broker beside NATS JetStream R1, measured in the same run.

Both servers run on this machine as separate processes, file storage, acknowledging after the
write (ferrymq ASYNC_FLUSH; JetStream's default file store, which fsyncs on its own timer). For
each payload size:

- sync: one producer awaits each acknowledgement (ferrymq SDK `Producer.send`; nats-py
  `js.publish`);
- window: `window` sends in flight (ferrymq SDK; nats-py `publish_async`);
- raw: ferrymq with pre-encoded SEND_MESSAGE_V2 frames pipelined on one connection, no SDK: what
  the broker sustains when the client costs nothing;
- cpp: the official RocketMQ 4.x client (C++ core) `send_sync` from threads, when installed;
- consume: batches of 256 from the start (ferrymq pull by offset; JetStream pull consumer
  fetch 256 with AckNone).

Each row carries the client's and the server's CPU (% of one core) over the row. Nothing here
asserts a speed; the numbers go to docs/benchmarks.md with the command that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import resource
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child, spawn
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import SendMessageRequestHeader, SendMessageRequestHeaderV2
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields

__all__ = ["BrokerBenchConfig", "Row", "ratios_to_nats", "run_broker_bench"]

log = logging.getLogger(__name__)

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class BrokerBenchConfig:
    """What to run."""

    sizes: tuple[int, ...] = (100, 1024)
    seconds: float = 5.0
    window: int = 256
    nats: bool = True
    cpp: bool = True
    workdir: Path | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement."""

    system: str
    mode: str
    size: int
    messages: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    client_cpu_pct: float
    server_cpu_pct: float
    failed: int = 0  # sends that raised (counted apart from msg/s)

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def ratios_to_nats(rows: list[Row]) -> list[dict[str, Any]]:
    """Ferrymq over NATS for every row both measured (same mode and size), throughput and p99."""
    nats = {(r.mode, r.size): r for r in rows if r.system != "ferrymq"}
    paired = []
    for row in rows:
        peer = nats.get((row.mode, row.size))
        if row.system != "ferrymq" or peer is None or not peer.msgs_per_s:
            continue
        p99_ratio = None
        if row.p99_ms and peer.p99_ms:
            p99_ratio = round(peer.p99_ms / row.p99_ms, 2)  # > 1: ferrymq's p99 is lower
        paired.append(
            {
                "mode": row.mode,
                "size": row.size,
                "throughput_ratio": round(row.msgs_per_s / peer.msgs_per_s, 2),
                "p99_ratio": p99_ratio,
            }
        )
    return paired


def _process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Meter:
    """CPU of this process and of the server processes over one measurement."""

    def __init__(self, server_pids: list[int]) -> None:
        self._pids = server_pids
        self._client = _self_cpu()
        self._servers = sum(_process_cpu(p) for p in server_pids)
        self._start = time.perf_counter()

    def row(self, system: str, mode: str, size: int, messages: int, latencies: list[float]) -> Row:
        elapsed = time.perf_counter() - self._start
        client = (_self_cpu() - self._client) / elapsed * 100
        servers = (sum(_process_cpu(p) for p in self._pids) - self._servers) / elapsed * 100
        ordered = sorted(latencies)
        return Row(
            system=system,
            mode=mode,
            size=size,
            messages=messages,
            seconds=elapsed,
            msgs_per_s=messages / elapsed,
            mb_per_s=messages * size / elapsed / 1e6,
            p50_ms=statistics.median(ordered) * 1000 if ordered else None,
            p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
            if ordered
            else None,
            client_cpu_pct=client,
            server_cpu_pct=servers,
        )


async def _timed_window(
    send: Callable[[], Awaitable[object]], seconds: float, window: int
) -> tuple[int, list[float]]:
    """Keep `window` sends in flight for `seconds`; return count and per-send latencies."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        started = time.perf_counter()
        try:
            await send()
            latencies.append(time.perf_counter() - started)
        finally:
            slots.release()

    while time.perf_counter() < deadline:
        await slots.acquire()
        task = asyncio.get_running_loop().create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return len(latencies), latencies


# ---------------------------------------------------------------------- ferrymq


@contextlib.asynccontextmanager
async def _ferrymq(workdir: Path) -> AsyncIterator[tuple[str, list[Child]]]:
    namesrv = await spawn(
        "bench-namesrv", ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"], workdir
    )
    broker = await spawn(
        "bench-broker",
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(workdir / "ferrymq-store"),
            "--log-level",
            "WARNING",
        ],
        workdir,
    )
    try:
        yield namesrv.addr, [namesrv, broker]
    finally:
        await broker.stop()
        await namesrv.stop()


async def _ferrymq_rows(config: BrokerBenchConfig, workdir: Path) -> list[Row]:
    rows: list[Row] = []
    async with _ferrymq(workdir) as (namesrv, children):
        pids = [children[1].pid]
        async with AdminClient(namesrv) as admin:
            for size in config.sizes:
                await admin.create_topic(f"Bench{size}", queues=4)
            deadline = time.monotonic() + 10
            while any([await admin.route(f"Bench{s}") is None for s in config.sizes]):
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark topics never reached the NameServer")
                await asyncio.sleep(0.05)
        async with Producer(namesrv, "bench-producer", send_timeout=10) as producer:
            for size in config.sizes:
                topic, payload = f"Bench{size}", os.urandom(size)
                meter = _Meter(pids)
                latencies: list[float] = []
                end = time.perf_counter() + config.seconds
                while time.perf_counter() < end:
                    started = time.perf_counter()
                    await producer.send(topic, payload)
                    latencies.append(time.perf_counter() - started)
                rows.append(meter.row("ferrymq", "sync", size, len(latencies), latencies))
                meter = _Meter(pids)
                count, window_latencies = await _timed_window(
                    functools.partial(producer.send, topic, payload), config.seconds, config.window
                )
                rows.append(
                    meter.row("ferrymq", f"window {config.window}", size, count, window_latencies)
                )
                route = await producer.routes.get(topic)
                address = route.master(route.write_queues[0].broker_name) or ""
                rows.append(await _raw_rows(address, topic, payload, size, config, pids))
        if config.cpp:
            for size in config.sizes:
                row = await asyncio.to_thread(
                    _cpp_row, namesrv, f"Bench{size}", size, config.seconds, pids
                )
                if row is not None:
                    rows.append(row)
        async with PullConsumer(namesrv, "bench-consumer") as consumer:
            for size in config.sizes:
                meter = _Meter(pids)
                total = 0
                for queue in await consumer.queues(f"Bench{size}"):
                    offset = 0
                    while True:
                        result = await consumer.pull(queue, offset, max_messages=256)
                        if result.status is not PullStatus.FOUND:
                            break
                        total += len(result.messages)
                        offset = result.next_offset
                rows.append(meter.row("ferrymq", "consume 256", size, total, []))
    return rows


async def _raw_rows(
    address: str, topic: str, payload: bytes, size: int, config: BrokerBenchConfig, pids: list[int]
) -> Row:
    header = SendMessageRequestHeader(
        producer_group="bench-raw",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=time.time_ns() // 1_000_000,
        flag=0,
        properties="WAIT\x01true\x02",
    )
    fields = to_ext_fields(SendMessageRequestHeaderV2.from_v1(header))
    async with RpcClient(max_in_flight=config.window * 2) as rpc:
        conn = await rpc.connection(address)
        meter = _Meter(pids)

        async def send() -> RemotingCommand:
            request = RemotingCommand(
                code=RequestCode.SEND_MESSAGE_V2, ext_fields=fields, body=payload
            )
            return await conn.call(request, 10)

        count, latencies = await _timed_window(send, config.seconds, config.window)
        return meter.row("ferrymq", f"raw window {config.window}", size, count, latencies)


def _cpp_row(namesrv: str, topic: str, size: int, seconds: float, pids: list[int]) -> Row | None:
    try:
        from rocketmq.client import Message
        from rocketmq.client import Producer as CppProducer
    except (ImportError, OSError):
        return None
    # One producer per thread: the C++ core's transport table mutex times out under four
    # threads sharing one producer, failing sends with "No route info" (client-side, logged).
    producers = []
    for i in range(4):
        producer = CppProducer(f"bench-cpp-{i}")
        producer.set_namesrv_addr(namesrv)
        producer.start()
        producers.append(producer)
    payload = os.urandom(size)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def one(producer: Any) -> None:
        message = Message(topic)
        message.set_body(payload)
        producer.send_sync(message)

    def worker(producer: Any) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                one(producer)
            except Exception as exc:  # noqa: BLE001 - the C++ core raises its own exception types
                with lock:
                    failures.append(str(exc))
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    try:
        for producer in producers:
            one(producer)  # route lookup and connection before the clock starts
        meter = _Meter(pids)
        deadline = time.perf_counter() + seconds
        threads = [threading.Thread(target=worker, args=(p,)) for p in producers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            log.warning("the C++ client failed %d sends: %s", len(failures), failures[0])
        row = meter.row("ferrymq", "cpp client sync x4", size, len(latencies), latencies)
        return dataclasses.replace(row, failed=len(failures))
    finally:
        for producer in producers:
            producer.shutdown()


# ---------------------------------------------------------------------- NATS


async def _quiet(exc: Exception) -> None:
    """The NATS client's error hook: refused connections while nats-server starts are expected."""
    log.debug("nats client: %s", exc)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _nats_rows(config: BrokerBenchConfig, workdir: Path) -> list[Row]:
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed (apt-get install nats-server)")
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

    port = _free_port()
    store = workdir / "nats-store"
    store.mkdir(parents=True, exist_ok=True)
    log = (workdir / "nats.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        binary,
        "-js",
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        "-sd",
        str(store),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
    )
    log.close()
    rows: list[Row] = []
    try:
        deadline = time.monotonic() + 10
        connection = None
        while connection is None:
            try:
                connection = await nats.connect(
                    f"nats://127.0.0.1:{port}",
                    connect_timeout=1,
                    allow_reconnect=False,
                    error_cb=_quiet,
                )
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        js = connection.jetstream()
        pids = [process.pid]
        for size in config.sizes:
            subject = f"bench.{size}"
            await js.add_stream(
                StreamConfig(
                    name=f"BENCH{size}",
                    subjects=[subject],
                    storage=StorageType.FILE,
                    num_replicas=1,
                )
            )
            payload = os.urandom(size)
            meter = _Meter(pids)
            latencies: list[float] = []
            end = time.perf_counter() + config.seconds
            while time.perf_counter() < end:
                started = time.perf_counter()
                await js.publish(subject, payload, timeout=10)
                latencies.append(time.perf_counter() - started)
            rows.append(meter.row("nats-jetstream-r1", "sync", size, len(latencies), latencies))
            meter = _Meter(pids)
            count, window_latencies = await _timed_window(
                functools.partial(js.publish, subject, payload, timeout=10),
                config.seconds,
                config.window,
            )
            rows.append(
                meter.row(
                    "nats-jetstream-r1", f"window {config.window}", size, count, window_latencies
                )
            )
            meter = _Meter(pids)
            subscription = await js.pull_subscribe(
                subject, durable=f"bench{size}", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
            )
            total = 0
            while True:
                try:
                    batch = await subscription.fetch(256, timeout=1)
                except nats.errors.TimeoutError:
                    break
                total += len(batch)
            rows.append(meter.row("nats-jetstream-r1", "consume 256", size, total, []))
        await connection.close()
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
    return rows


async def run_broker_bench(config: BrokerBenchConfig, progress: Callable[[str], None]) -> list[Row]:
    """Run every row; ferrymq first, then NATS."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="ferrymq-bench-broker-"))
    progress("ferrymq")
    rows = await _ferrymq_rows(config, workdir)
    if config.nats:
        progress("NATS JetStream R1")
        rows += await _nats_rows(config, workdir)
    shutil.rmtree(workdir / "ferrymq-store", ignore_errors=True)
    shutil.rmtree(workdir / "nats-store", ignore_errors=True)
    return rows
