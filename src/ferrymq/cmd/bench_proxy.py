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
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.client.simple import SimpleConsumer
from ferrymq.cmd.up import ProcessCluster, UpConfig

__all__ = ["ProxyBenchConfig", "ProxyRow", "bench_proxy_command", "ratios", "run_proxy_bench"]

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

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        row = asdict(self)
        row["msgs_per_s"] = round(self.msgs_per_s, 1)
        row["rounds"] = [round(r, 1) for r in self.rounds]
        return row


async def _v5(python: Path, *args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(python),
        str(_V5_WORKER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"5.x client failed: {err.decode()[-6000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _sdk_send(namesrv: str, topic: str, count: int, size: int, window: int) -> float:
    async with Producer(namesrv) as producer:
        body = b"x" * size
        for _ in range(20):
            await producer.send(topic, body)
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(producer.send(topic, body) for _ in range(batch)))
            left -= batch
        return count / (time.perf_counter() - start)


async def _sdk_receive(namesrv: str, topic: str, group: str, count: int) -> float:
    async with SimpleConsumer(namesrv, group) as consumer:
        acked = 0
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while acked < count and time.monotonic() < deadline:
            batch = await consumer.receive(topic, max_messages=32, wait=2.0)
            for received in batch:
                await consumer.ack(received)
            acked += len(batch)
        if acked < count:
            raise RuntimeError(f"SDK received {acked} of {count} within 300 s")
        return count / (time.perf_counter() - start)


async def _raw_send(endpoint: str, topic: str, count: int, size: int, window: int) -> float:
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
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(one(left - k) for k in range(batch)))
            left -= batch
        return count / (time.perf_counter() - start)


async def _raw_heartbeat(endpoint: str, count: int, window: int) -> float:
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
        start = time.perf_counter()
        left = count
        while left:
            batch = min(window, left)
            await asyncio.gather(*(one() for _ in range(batch)))
            left -= batch
        return count / (time.perf_counter() - start)


async def _raw_receive(endpoint: str, topic: str, group: str, count: int) -> float:
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
        return count / (time.perf_counter() - start)


async def _round(
    results: dict[tuple[str, str, int], list[float]],
    python: Path,
    namesrv: str,
    endpoint: str,
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

    async def sdk_send() -> None:
        rate = await _sdk_send(namesrv, sdk_topic, count, size, window)
        results.setdefault(("ferrymq-sdk", send_mode, size), []).append(rate)

    async def v5_send() -> None:
        sent = await _v5(python, "send", endpoint, v5_topic, str(count), str(size), str(window))
        if sent["failed"]:
            raise RuntimeError(f"5.x client: {sent['failed']} sends failed")
        rate = count / sent["seconds"]
        results.setdefault(("rocketmq-5.x-grpc", send_mode, size), []).append(rate)

    async def raw_send() -> None:
        rate = await _raw_send(endpoint, raw_topic, count, size, window)
        results.setdefault(("bare-grpc-aio", send_mode, size), []).append(rate)

    async def floor() -> None:
        rate = await _raw_heartbeat(endpoint, count, window)
        results.setdefault((_FLOOR, send_mode, size), []).append(rate)

    total = count + 20

    async def sdk_receive() -> None:
        rate = await _sdk_receive(namesrv, sdk_topic, f"g{sdk_topic}", total)
        results.setdefault(("ferrymq-sdk", "receive+ack", size), []).append(rate)

    async def v5_receive() -> None:
        got = await _v5(python, "receive", endpoint, v5_topic, f"g{v5_topic}", str(total), "1")
        if got["received"] < total:
            raise RuntimeError(f"5.x client received {got['received']} of {total}")
        rate = total / got["seconds"]
        results.setdefault(("rocketmq-5.x-grpc", "receive+ack", size), []).append(rate)

    async def raw_receive() -> None:
        rate = await _raw_receive(endpoint, raw_topic, f"g{raw_topic}", total)
        results.setdefault(("bare-grpc-aio", "receive+ack", size), []).append(rate)

    sends = [sdk_send, v5_send, raw_send, floor]
    # acks stay one at a time: the 5.1.2 client's ack_async lost acks (cancelled)
    receives = [sdk_receive, v5_receive, raw_receive] if window <= 1 else []
    for group in (sends, receives):
        for side in reversed(group) if reverse else group:
            await side()


async def run_proxy_bench(config: ProxyBenchConfig) -> list[ProxyRow]:
    """Start the cluster, measure both sides, stop it; rows per (system, mode, size)."""
    from ferrymq.proxy.stubs import client_python  # grpcio/protobuf: only when this bench runs

    python = await asyncio.to_thread(client_python)
    data_dir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-proxy-"))
    cluster = ProcessCluster(
        UpConfig(data_dir=data_dir, replicas=1, controllers=0, proxy=True, segment_bytes=256 << 20)
    )
    results: dict[tuple[str, str, int], list[float]] = {}
    try:
        await cluster.start()
        assert cluster.proxy is not None
        endpoint = str(cluster.proxy.info["grpc"])
        namesrv = cluster.namesrv_addr
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
        ProxyRow(system, mode, size, config.messages, statistics.median(rates), rates)
        for (system, mode, size), rates in results.items()
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
    for column in ("system", "mode", "size B", "msg/s", "rounds msg/s"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row.system,
            row.mode,
            str(row.size),
            f"{row.msgs_per_s:,.0f}",
            " ".join(f"{r:,.0f}" for r in row.rounds),
        )
    console.print(table)
    for ratio in ratios(rows):
        goal = "no goal" if ratio["goal"] is None else f"goal {ratio['goal']}x"
        click.echo(
            f"{ratio['system']} {ratio['mode']} {ratio['size']} B: / SDK {ratio['ratio']}x ({goal})"
        )
