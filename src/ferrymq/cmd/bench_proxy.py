"""`ferry bench proxy`: the official 5.x client through the gRPC endpoint beside ferrymq's SDK.

One cluster as processes (a NameServer, one broker, the endpoint: `ProcessCluster` with
`proxy=True`). Per size and round, each side sends `messages` messages to its own topic, one at
a time (sync) and with up to 64 in flight (SDK: `asyncio.gather`; 5.x: `send_async`), then
receives and acks the sync round's (batches of up to 32, one ack at a time): the official Python
client `rocketmq-python-client` 5.1.2 over gRPC to the endpoint, which relays to the broker over
remoting, and ferrymq's SDK (`Producer`, `SimpleConsumer`) straight to the broker. Median over
rounds; ratio = msg/s through the endpoint over SDK msg/s. A third side, bare grpcio asyncio calls
of the same RPCs from this process, separates the endpoint's cost from the 5.x client's; a fourth,
bare Heartbeat calls (answered by the endpoint without the cluster), is the gRPC hop alone: the
ceiling of every relayed send. Odd rounds run the sides in the opposite order (the load drifts).

CPU per message is measured beside the rates, over the timed part only (after the warm-up): the
client's (this process's getrusage for the SDK and bare sides, `time.process_time` inside the
5.x client's process), the endpoint's and the broker's (/proc). On 2 busy cores the sum bounds
windowed throughput, and the 5.x client's own share bounds any endpoint, however cheap.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.client.simple import SimpleConsumer
from ferrymq.cmd.measure import process_cpu, self_cpu
from ferrymq.cmd.up import ProcessCluster, UpConfig

__all__ = [
    "CpuMeter",
    "ProxyBenchConfig",
    "ProxyRow",
    "bench_proxy_command",
    "metered_worker",
    "ratios",
    "run_proxy_bench",
]

_V5_WORKER = Path(__file__).with_name("bench_proxy_v5.py")
_FLOOR = "grpc-heartbeat-floor"
"""Bare gRPC Heartbeats (answered by the endpoint itself): no goal, the ceiling of the others."""


@dataclass(frozen=True, slots=True)
class ProxyBenchConfig:
    """What to run."""

    sizes: tuple[int, ...] = (100, 1024)
    messages: int = 2000
    rounds: int = 3
    windows: tuple[int, ...] = (1, 64)
    """Sends in flight: 1, one at a time; N, up to N (acks are always one at a time)."""


@dataclass(frozen=True, slots=True)
class ProxyRow:
    """One side, one mode, one size: the median round."""

    system: str
    mode: str
    size: int
    messages: int
    msgs_per_s: float
    rounds: list[float]
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    """Median over rounds of CPU microseconds per message: "client", "endpoint", "broker"."""

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        row = asdict(self)
        row["msgs_per_s"] = round(self.msgs_per_s, 1)
        row["rounds"] = [round(r, 1) for r in self.rounds]
        row["cpu_us_per_msg"] = {k: round(v, 1) for k, v in self.cpu_us_per_msg.items()}
        return row


class CpuMeter:
    """CPU seconds of the client, the endpoint and the broker over one timed part.

    `begin` after the warm-up, `end` after the last message; `client_seconds` replaces this
    process's CPU when the client ran elsewhere (the 5.x client's own process).
    """

    def __init__(self, servers: dict[str, int]) -> None:
        self._servers = servers
        self._mark: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {name: process_cpu(pid) for name, pid in self._servers.items()}
        now["client"] = self_cpu()
        return now

    def begin(self) -> None:
        """Start the timed part."""
        self._mark = self._now()

    def end(self, client_seconds: float | None = None) -> None:
        """End it: CPU seconds used per process since `begin`."""
        now = self._now()
        self.used = {name: now[name] - self._mark[name] for name in now}
        if client_seconds is not None:
            self.used["client"] = client_seconds

    def per_message_us(self, messages: int) -> dict[str, float]:
        """Microseconds of CPU per message, per process."""
        return {name: seconds * 1e6 / messages for name, seconds in self.used.items()}


async def metered_worker(
    argv: list[str], meter: CpuMeter, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a client worker process; `meter` runs from its {"phase": "start"} line to its result.

    The result line carries the worker's own CPU seconds (`cpu_seconds`); lines that are not
    JSON objects (a client's own log) are skipped.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read())
    result: dict[str, Any] = {}
    async with asyncio.timeout(600):
        async for line in proc.stdout:
            if not line.startswith(b"{"):
                continue
            said = json.loads(line)
            if said.get("phase") == "start":
                meter.begin()
            else:
                meter.end(said.get("cpu_seconds"))
                result = said
        await proc.wait()
    err = await errors
    if proc.returncode != 0 or not result:
        raise RuntimeError(f"{Path(argv[1]).name} failed: {err.decode()[-6000:]}")
    return result


async def _v5(python: Path, meter: CpuMeter, *args: str) -> dict[str, Any]:
    """Run the 5.x worker (the official Python client's venv)."""
    return await metered_worker([str(python), str(_V5_WORKER), *args], meter)


async def _sdk_send(
    namesrv: str, topic: str, count: int, size: int, window: int, meter: CpuMeter
) -> float:
    async with Producer(namesrv) as producer:
        body = b"x" * size
        for _ in range(20):
            await producer.send(topic, body)
        meter.begin()
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(producer.send(topic, body) for _ in range(batch)))
            left -= batch
        rate = count / (time.perf_counter() - start)
        meter.end()
        return rate


async def _sdk_receive(namesrv: str, topic: str, group: str, count: int, meter: CpuMeter) -> float:
    async with SimpleConsumer(namesrv, group) as consumer:
        acked = 0
        meter.begin()
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while acked < count and time.monotonic() < deadline:
            batch = await consumer.receive(topic, max_messages=32, wait=2.0)
            for received in batch:
                await consumer.ack(received)
            acked += len(batch)
        if acked < count:
            raise RuntimeError(f"SDK received {acked} of {count} within 300 s")
        rate = count / (time.perf_counter() - start)
        meter.end()
        return rate


async def _raw_send(
    endpoint: str, topic: str, count: int, size: int, window: int, meter: CpuMeter
) -> float:
    """Sends as bare MessagingService calls from grpcio's asyncio client (no 5.x SDK)."""
    import grpc  # only when this bench runs

    from ferrymq.proxy.stubs import SERVICE, load

    v2 = load()
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/SendMessage",
            request_serializer=v2.SendMessageRequest.SerializeToString,
            response_deserializer=v2.SendMessageResponse.FromString,
        )
        body = b"x" * size

        async def one(i: int) -> None:
            request = v2.SendMessageRequest()
            message = request.messages.add()
            message.topic.name = topic
            message.body = body
            message.system_properties.message_id = f"raw-{i}"
            message.system_properties.message_type = 1  # NORMAL
            answer = await call(request, timeout=10)
            if answer.status.code != v2.code("OK"):
                raise RuntimeError(f"raw gRPC send: {answer.status}")

        for i in range(20):
            await one(i)
        meter.begin()
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(one(left - k) for k in range(batch)))
            left -= batch
        rate = count / (time.perf_counter() - start)
        meter.end()
        return rate


async def _raw_heartbeat(endpoint: str, count: int, window: int, meter: CpuMeter) -> float:
    """Heartbeat calls, which the endpoint answers without the cluster: its gRPC hop alone.

    The ceiling of any relayed call through this endpoint (each relayed call adds a remoting
    round trip to a broker on top).
    """
    import grpc

    from ferrymq.proxy.stubs import SERVICE, load

    v2 = load()
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/Heartbeat",
            request_serializer=v2.HeartbeatRequest.SerializeToString,
            response_deserializer=v2.HeartbeatResponse.FromString,
        )

        async def one() -> None:
            answer = await call(v2.HeartbeatRequest(), timeout=10)
            if answer.status.code != v2.code("OK"):
                raise RuntimeError(f"raw gRPC heartbeat: {answer.status}")

        for _ in range(20):
            await one()
        meter.begin()
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(one() for _ in range(batch)))
            left -= batch
        rate = count / (time.perf_counter() - start)
        meter.end()
        return rate


async def _raw_receive(endpoint: str, topic: str, group: str, count: int, meter: CpuMeter) -> float:
    """ReceiveMessage (batches of 32) and one AckMessage per message, bare gRPC calls."""
    import grpc

    from ferrymq.proxy.stubs import SERVICE, load

    v2 = load()
    async with grpc.aio.insecure_channel(endpoint) as channel:
        receive = channel.unary_stream(
            f"/{SERVICE}/ReceiveMessage",
            request_serializer=v2.ReceiveMessageRequest.SerializeToString,
            response_deserializer=v2.ReceiveMessageResponse.FromString,
        )
        ack = channel.unary_unary(
            f"/{SERVICE}/AckMessage",
            request_serializer=v2.AckMessageRequest.SerializeToString,
            response_deserializer=v2.AckMessageResponse.FromString,
        )
        request = v2.ReceiveMessageRequest(batch_size=32)
        request.group.name = group
        request.message_queue.topic.name = topic
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(2)
        acked = 0
        meter.begin()
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while acked < count and time.monotonic() < deadline:
            async for part in receive(request, timeout=30):
                if not part.HasField("message"):
                    continue
                entry = v2.AckMessageRequest()
                entry.group.name = group
                entry.topic.name = topic
                item = entry.entries.add()
                item.message_id = part.message.system_properties.message_id
                item.receipt_handle = part.message.system_properties.receipt_handle
                answer = await ack(entry, timeout=10)
                if answer.status.code != v2.code("OK"):
                    raise RuntimeError(f"raw gRPC ack: {answer.status}")
                acked += 1
        if acked < count:
            raise RuntimeError(f"raw gRPC received {acked} of {count} within 300 s")
        rate = count / (time.perf_counter() - start)
        meter.end()
        return rate


_Results = dict[tuple[str, str, int], list[tuple[float, dict[str, float]]]]
"""Per (side, mode, size): each round's msg/s and CPU microseconds per message per process."""


async def _round(
    results: _Results,
    python: Path,
    namesrv: str,
    endpoint: str,
    servers: dict[str, int],
    admin: AdminClient,
    size: int,
    count: int,
    window: int,
    tag: str,
    reverse: bool,
) -> None:
    """One round of every side; `reverse` runs them in the opposite order (load drifts)."""
    sdk_topic, v5_topic, raw_topic = f"BenchSdk{tag}", f"BenchV5{tag}", f"BenchRaw{tag}"
    for topic in (sdk_topic, v5_topic, raw_topic):
        await admin.create_topic(topic, queues=4)
    await asyncio.sleep(1.0)  # the routes reach the NameServer
    send_mode = "send" if window <= 1 else f"send w{window}"
    total = count + 20

    def keep(system: str, mode: str, rate: float, meter: CpuMeter, messages: int) -> None:
        results.setdefault((system, mode, size), []).append((rate, meter.per_message_us(messages)))

    async def sdk_send() -> None:
        meter = CpuMeter(servers)
        rate = await _sdk_send(namesrv, sdk_topic, count, size, window, meter)
        keep("ferrymq-sdk", send_mode, rate, meter, count)

    async def v5_send() -> None:
        meter = CpuMeter(servers)
        args = ("send", endpoint, v5_topic, str(count), str(size), str(window))
        sent = await _v5(python, meter, *args)
        if sent["failed"]:
            raise RuntimeError(f"5.x client: {sent['failed']} sends failed")
        keep("rocketmq-5.x-grpc", send_mode, count / sent["seconds"], meter, count)

    async def raw_send() -> None:
        meter = CpuMeter(servers)
        rate = await _raw_send(endpoint, raw_topic, count, size, window, meter)
        keep("bare-grpc-aio", send_mode, rate, meter, count)

    async def floor() -> None:
        meter = CpuMeter(servers)
        rate = await _raw_heartbeat(endpoint, count, window, meter)
        keep(_FLOOR, send_mode, rate, meter, count)

    async def sdk_receive() -> None:
        meter = CpuMeter(servers)
        rate = await _sdk_receive(namesrv, sdk_topic, f"g{sdk_topic}", total, meter)
        keep("ferrymq-sdk", "receive+ack", rate, meter, total)

    async def v5_receive() -> None:
        meter = CpuMeter(servers)
        args = ("receive", endpoint, v5_topic, f"g{v5_topic}", str(total), "1")
        got = await _v5(python, meter, *args)
        if got["received"] < total:
            raise RuntimeError(f"5.x client received {got['received']} of {total}")
        keep("rocketmq-5.x-grpc", "receive+ack", total / got["seconds"], meter, total)

    async def raw_receive() -> None:
        meter = CpuMeter(servers)
        rate = await _raw_receive(endpoint, raw_topic, f"g{raw_topic}", total, meter)
        keep("bare-grpc-aio", "receive+ack", rate, meter, total)

    sends = [sdk_send, v5_send, raw_send, floor]
    # acks stay one at a time: the 5.1.2 client's ack_async lost acks (cancelled)
    receives = [sdk_receive, v5_receive, raw_receive] if window <= 1 else []
    for group in (sends, receives):
        for side in reversed(group) if reverse else group:
            await side()


def _row(system: str, mode: str, size: int, messages: int, rounds: list[Any]) -> ProxyRow:
    """The median round's rate, and the median CPU per message of each process over rounds."""
    rates = [rate for rate, _ in rounds]
    names = sorted({name for _, cpu in rounds for name in cpu})
    cpu = {name: statistics.median(c[name] for _, c in rounds if name in c) for name in names}
    return ProxyRow(system, mode, size, messages, statistics.median(rates), rates, cpu)


async def run_proxy_bench(config: ProxyBenchConfig) -> list[ProxyRow]:
    """Start the cluster, measure both sides, stop it; rows per (system, mode, size)."""
    from ferrymq.proxy.stubs import client_python  # grpcio/protobuf: only when this bench runs

    python = await asyncio.to_thread(client_python)
    data_dir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-proxy-"))
    cluster = ProcessCluster(
        UpConfig(data_dir=data_dir, replicas=1, controllers=0, proxy=True, segment_bytes=256 << 20)
    )
    results: _Results = {}
    try:
        await cluster.start()
        assert cluster.proxy is not None
        endpoint = str(cluster.proxy.info["grpc"])
        namesrv = cluster.namesrv_addr
        (broker,) = cluster.brokers.values()
        servers = {"endpoint": cluster.proxy.pid, "broker": broker.pid}
        async with AdminClient(namesrv) as admin:
            for size in config.sizes:
                for round_ in range(config.rounds):
                    count = config.messages
                    for window in config.windows:
                        await _round(
                            results,
                            python,
                            namesrv,
                            endpoint,
                            servers,
                            admin,
                            size,
                            count,
                            window,
                            f"{size}r{round_}w{window}",
                            round_ % 2 == 1,
                        )
    finally:
        await cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return [
        _row(system, mode, size, config.messages, rounds)
        for (system, mode, size), rounds in results.items()
    ]


def ratios(rows: list[ProxyRow]) -> list[dict[str, Any]]:
    """Each gRPC side over the SDK, per mode and size (goals: send 0.7, receive+ack 0.5)."""
    by_key = {(r.system, r.mode, r.size): r.msgs_per_s for r in rows}
    found = []
    for (system, mode, size), rate in sorted(by_key.items()):
        sdk = by_key.get(("ferrymq-sdk", mode, size))
        if system != "ferrymq-sdk" and sdk:
            goal = None if system == _FLOOR else 0.7 if mode.startswith("send") else 0.5
            found.append(
                {
                    "system": system,
                    "mode": mode,
                    "size": size,
                    "ratio": round(rate / sdk, 3),
                    "goal": goal,
                }
            )
    return found


@click.command("proxy")
@click.option("--size", "sizes", type=int, multiple=True, default=(100, 1024), show_default=True)
@click.option("--messages", type=click.IntRange(min=10), default=2000, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1, max=20), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_proxy_command(sizes: tuple[int, ...], messages: int, rounds: int, as_json: bool) -> None:
    """The official 5.x client through the gRPC endpoint beside ferrymq's SDK over remoting."""
    config = ProxyBenchConfig(sizes=tuple(sizes), messages=messages, rounds=rounds)
    console = Console(stderr=True)
    with console.status("measuring"):
        try:
            rows = asyncio.run(run_proxy_bench(config))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "proxy",
                    "rows": [r.as_json() for r in rows],
                    "ratios": ratios(rows),
                }
            )
        )
        return
    table = Table(title=f"ferry bench proxy ({messages} messages, median of {rounds})")
    for column in ("system", "mode", "size B", "msg/s", "rounds msg/s", "CPU us/msg"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row.system,
            row.mode,
            str(row.size),
            f"{row.msgs_per_s:,.0f}",
            " ".join(f"{r:,.0f}" for r in row.rounds),
            " ".join(f"{name} {us:,.0f}" for name, us in row.cpu_us_per_msg.items()),
        )
    console.print(table)
    for ratio in ratios(rows):
        goal = "no goal" if ratio["goal"] is None else f"goal {ratio['goal']}x"
        click.echo(
            f"{ratio['system']} {ratio['mode']} {ratio['size']} B: / SDK {ratio['ratio']}x ({goal})"
        )
