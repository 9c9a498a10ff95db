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

With `tls` (issue 23), a second ferrymq broker and NameServer run with TLS only (`--tls`, a local
CA's certificate) as the system `ferrymq-tls`: its sync and windowed sends are interleaved with
the plain broker's in the same rounds, and its raw rows follow (`ratios_tls`: TLS over plain).
With `acl` (issue 23), the same with a broker that checks ACL 1.0 on every request
(`aclEnable=true`, a `plain_acl.yml` of an admin and a producer account) as `ferrymq-acl`: the SDK
signs every send (HmacSHA1 per request on both sides); its raw rows send one signed frame again
and again, so they show the broker's verification alone (`ratios_acl`: ACL over plain).
With both, the sides are plain, ACL and ACL + TLS (`ferrymq-acl-tls`: a broker with both, the
SDK signing over TLS; `ratios_acl_tls`), all three in the same rounds (no TLS-only side).

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
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child, spawn
from ferrymq.cmd.measure import (
    Meter,
    Row,
    Side,
    free_port,
    interleaved_sends_by_size,
    quiet_nats_errors,
    timed_window,
)
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials, sign
from ferrymq.security.tls import ClientTls, settings_for, tls_config_from
from ferrymq.security.tlscerts import issue_certificate, make_ca
from ferrymq.wire.broker import SendMessageRequestHeader, SendMessageRequestHeaderV2
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import ROCKETMQ_VERSION, RemotingCommand
from ferrymq.wire.headers import to_ext_fields

__all__ = [
    "BrokerBenchConfig",
    "Row",
    "ratios_acl",
    "ratios_acl_tls",
    "ratios_tls",
    "ratios_to_nats",
    "run_broker_bench",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerBenchConfig:
    """What to run."""

    sizes: tuple[int, ...] = (100, 1024)
    seconds: float = 5.0
    window: int = 256
    rounds: int = 5
    nats: bool = True
    cpp: bool = True
    workdir: Path | None = None
    tls: bool = False
    """Also a TLS-only broker (`ferrymq-tls`), measured in the same rounds as the plain one."""
    acl: bool = False
    """Also an ACL 1.0 broker (`ferrymq-acl`), measured in the same rounds as the plain one.

    With `tls` too: an ACL 1.0 broker and an ACL + TLS one (`ferrymq-acl-tls`), no TLS-only one.
    """


def ratios_to_nats(rows: list[Row]) -> list[dict[str, Any]]:
    """Ferrymq over NATS for every row both measured (same mode and size), throughput and p99."""
    nats = {(r.mode, r.size): r for r in rows if r.system.startswith("nats")}
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


def _over_plain(rows: list[Row], system: str) -> list[dict[str, Any]]:
    """`system` over plain ferrymq for every row both measured (same mode and size)."""
    plain = {(r.mode, r.size): r for r in rows if r.system == "ferrymq"}
    paired = []
    for row in rows:
        peer = plain.get((row.mode, row.size))
        if row.system != system or peer is None or not peer.msgs_per_s:
            continue
        ratio = round(row.msgs_per_s / peer.msgs_per_s, 2)
        paired.append({"mode": row.mode, "size": row.size, "throughput_ratio": ratio})
    return paired


def ratios_tls(rows: list[Row]) -> list[dict[str, Any]]:
    """TLS over plain ferrymq for every row both measured (same mode and size): throughput."""
    return _over_plain(rows, "ferrymq-tls")


def ratios_acl(rows: list[Row]) -> list[dict[str, Any]]:
    """ACL over plain ferrymq for every row both measured (same mode and size): throughput."""
    return _over_plain(rows, "ferrymq-acl")


def ratios_acl_tls(rows: list[Row]) -> list[dict[str, Any]]:
    """ACL + TLS over plain ferrymq for every row both measured (same mode and size)."""
    return _over_plain(rows, "ferrymq-acl-tls")


# ---------------------------------------------------------------------- ferrymq

_BENCH_ACL: Final = """accounts:
- {accessKey: bench-admin, secretKey: bench-admin-secret, admin: true}
- {accessKey: bench-producer, secretKey: bench-producer-secret, defaultTopicPerm: PUB}
"""
_BENCH_ADMIN: Final = Credentials("bench-admin", "bench-admin-secret")
_BENCH_PRODUCER: Final = Credentials("bench-producer", "bench-producer-secret")


def _make_acl(workdir: Path) -> list[str]:
    """The ACL broker's flags, with its `plain_acl.yml` written in `workdir`."""
    path = workdir / "bench_plain_acl.yml"
    path.write_text(_BENCH_ACL)
    return ["--acl-enable", "true", "--acl-file", str(path)]


def _make_tls(workdir: Path) -> tuple[list[str], ClientTls]:
    """A local CA and the TLS broker's certificate (in `workdir`): its flags, the clients' TLS."""
    ca = make_ca(workdir)
    cert, key = issue_certificate(ca, workdir, "server")
    flags = ["--tls", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca.cert_path)]
    values = {"tls.enable": "true", "tls.client.trustCertPath": str(ca.cert_path)}
    return flags, settings_for(tls_config_from(values), server_side=False).client


@contextlib.asynccontextmanager
async def _ferrymq(
    workdir: Path,
    name: str = "ferrymq",
    flags: tuple[str, ...] = (),
    broker_flags: tuple[str, ...] = (),
) -> AsyncIterator[tuple[str, list[Child]]]:
    namesrv = await spawn(
        f"bench-{name}-namesrv",
        ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING", *flags],
        workdir,
    )
    broker = await spawn(
        f"bench-{name}-broker",
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(workdir / f"{name}-store"),
            "--log-level",
            "WARNING",
            *flags,
            *broker_flags,
        ],
        workdir,
    )
    try:
        yield namesrv.addr, [namesrv, broker]
    finally:
        await broker.stop()
        await namesrv.stop()


@contextlib.asynccontextmanager
async def _ferrymq_side(
    config: BrokerBenchConfig, workdir: Path, tls: bool = False, acl: bool = False
) -> AsyncIterator[Side]:
    system = "ferrymq" + ("-acl" if acl else "") + ("-tls" if tls else "")
    flags, client_tls = _make_tls(workdir / f"{system}-certs") if tls else ([], ClientTls(None))
    broker_flags = _make_acl(workdir) if acl else []
    admin_credentials = _BENCH_ADMIN if acl else None
    credentials = _BENCH_PRODUCER if acl else None
    async with (
        _ferrymq(workdir, system, tuple(flags), tuple(broker_flags)) as (namesrv, children),
        RpcClient(tls=client_tls, credentials=admin_credentials) as admin_rpc,
    ):
        pids = [children[1].pid]
        async with AdminClient(namesrv, rpc=admin_rpc) as admin:
            for size in config.sizes:
                await admin.create_topic(f"Bench{size}", queues=4)
            deadline = time.monotonic() + 10
            while any([await admin.route(f"Bench{s}") is None for s in config.sizes]):
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark topics never reached the NameServer")
                await asyncio.sleep(0.05)
        async with (
            RpcClient(tls=client_tls, credentials=credentials) as rpc,
            Producer(namesrv, "bench-producer", send_timeout=10, rpc=rpc) as producer,
        ):
            payloads = {size: os.urandom(size) for size in config.sizes}

            def sender(size: int) -> Callable[[], Awaitable[object]]:
                return functools.partial(producer.send, f"Bench{size}", payloads[size])

            async def rows_after() -> list[Row]:
                rows: list[Row] = []
                for size in config.sizes:
                    topic = f"Bench{size}"
                    route = await producer.routes.get(topic)
                    address = route.master(route.write_queues[0].broker_name) or ""
                    rows.append(
                        await _raw_rows(
                            address,
                            topic,
                            payloads[size],
                            size,
                            config,
                            pids,
                            system,
                            client_tls,
                            credentials,
                        )
                    )
                if tls or acl:
                    return rows
                if config.cpp:
                    for size in config.sizes:
                        row = await asyncio.to_thread(
                            _cpp_row, namesrv, f"Bench{size}", size, config.seconds, pids
                        )
                        if row is not None:
                            rows.append(row)
                async with PullConsumer(namesrv, "bench-consumer") as consumer:
                    for size in config.sizes:
                        meter = Meter(pids)
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

            yield Side(system, pids, sender, rows_after)


async def _raw_rows(
    address: str,
    topic: str,
    payload: bytes,
    size: int,
    config: BrokerBenchConfig,
    pids: list[int],
    system: str,
    tls: ClientTls,
    credentials: Credentials | None = None,
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
    if credentials is not None:  # signed once: every frame is the same request again
        sign(fields, payload, credentials, ROCKETMQ_VERSION)
    async with RpcClient(max_in_flight=config.window * 2, tls=tls) as rpc:
        conn = await rpc.connection(address)
        meter = Meter(pids)

        async def send() -> RemotingCommand:
            request = RemotingCommand(
                code=RequestCode.SEND_MESSAGE_V2, ext_fields=fields, body=payload
            )
            return await conn.call(request, 10)

        count, latencies = await timed_window(send, config.seconds, config.window)
        return meter.row(system, f"raw window {config.window}", size, count, latencies)


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
        meter = Meter(pids)
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


@contextlib.asynccontextmanager
async def _nats_side(config: BrokerBenchConfig, workdir: Path) -> AsyncIterator[Side]:
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed (apt-get install nats-server)")
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

    port = free_port()
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
    try:
        deadline = time.monotonic() + 10
        connection = None
        while connection is None:
            try:
                connection = await nats.connect(
                    f"nats://127.0.0.1:{port}",
                    connect_timeout=1,
                    allow_reconnect=False,
                    error_cb=quiet_nats_errors,
                )
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        js = connection.jetstream()
        pids = [process.pid]
        payloads = {size: os.urandom(size) for size in config.sizes}
        for size in config.sizes:
            await js.add_stream(
                StreamConfig(
                    name=f"BENCH{size}",
                    subjects=[f"bench.{size}"],
                    storage=StorageType.FILE,
                    num_replicas=1,
                )
            )

        def sender(size: int) -> Callable[[], Awaitable[object]]:
            return functools.partial(js.publish, f"bench.{size}", payloads[size], timeout=10)

        async def rows_after() -> list[Row]:
            rows: list[Row] = []
            for size in config.sizes:
                meter = Meter(pids)
                subscription = await js.pull_subscribe(
                    f"bench.{size}",
                    durable=f"bench{size}",
                    config=ConsumerConfig(ack_policy=AckPolicy.NONE),
                )
                total = 0
                while True:
                    try:
                        batch = await subscription.fetch(256, timeout=1)
                    except nats.errors.TimeoutError:
                        break
                    total += len(batch)
                rows.append(meter.row("nats-jetstream-r1", "consume 256", size, total, []))
            return rows

        yield Side("nats-jetstream-r1", pids, sender, rows_after)
        await connection.close()
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


async def run_broker_bench(config: BrokerBenchConfig, progress: Callable[[str], None]) -> list[Row]:
    """Run every row.

    The send rows of both systems interleaved, then ferrymq's raw, C++ client and consume rows,
    then NATS's consume rows.
    """
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="ferrymq-bench-broker-"))
    try:
        async with contextlib.AsyncExitStack() as stack:
            progress("starting the servers")
            sides = [await stack.enter_async_context(_ferrymq_side(config, workdir))]
            # (tls, acl) of each further ferrymq side; both: ACL and ACL + TLS, no TLS alone
            extra = [(False, True), (True, True)] if config.tls and config.acl else []
            if config.tls != config.acl:
                extra = [(config.tls, config.acl)]
            for tls, acl in extra:
                started = _ferrymq_side(config, workdir, tls=tls, acl=acl)
                sides.append(await stack.enter_async_context(started))
            if config.nats:
                sides.append(await stack.enter_async_context(_nats_side(config, workdir)))
            rows = await interleaved_sends_by_size(
                sides,
                config.sizes,
                seconds=config.seconds,
                rounds=config.rounds,
                window=config.window,
                progress=progress,
            )
            for side in sides:
                progress(f"{side.system}: the remaining rows")
                rows += await side.rows_after()
    finally:
        shutil.rmtree(workdir / "ferrymq-store", ignore_errors=True)
        shutil.rmtree(workdir / "ferrymq-tls-store", ignore_errors=True)
        shutil.rmtree(workdir / "ferrymq-acl-store", ignore_errors=True)
        shutil.rmtree(workdir / "ferrymq-acl-tls-store", ignore_errors=True)
        shutil.rmtree(workdir / "nats-store", ignore_errors=True)
    return sorted(rows, key=lambda r: (not r.system.startswith("ferrymq"), r.system))
