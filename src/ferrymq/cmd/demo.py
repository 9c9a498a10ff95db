"""`ferry demo`: the HA story on a local cluster, told in one report.

What a newcomer sees (issue 7): `ferry up`'s default cluster starts as real processes (3
controller nodes, a NameServer, one broker group of 3 replicas in controller mode); a producer
sends a stream with sync replication while a push consumer group consumes it; the master is
killed with SIGKILL mid-stream; the controllers elect a new master from the SyncStateSet; the
producer and the consumer carry on through the new master; the old master restarts, rejoins as a
slave and truncates what only it had; finally every acknowledged message is checked to have been
consumed, and the report shows the failover gap, rates, latencies and what was redelivered. It
ends with the data pipelines: Spark reads the topic (`format("ferrymq")`) and writes an aggregate
to Parquet, printed; and a connector created over REST on a Connect worker that is not the leader
(the write is forwarded to it) mirrors the topic into another one with a Spark streaming query,
exactly once (both skipped, saying so, when pyspark is not installed).

The Connect pipeline (issue 19) runs across the failover: the demo starts its own PostgreSQL
(`connectors.pgserver`: Debian's package, a temporary directory, a free port, as the `postgres`
user when root, stopped by PID at the end), creates a PostgresSource connector (table `orders`
into topic `pg-orders`) and a PostgresSink connector (`pg-orders` into table `orders_copy`) over
REST on a follower worker, waits until the first rows are copied, keeps inserting rows while the
master is killed and replaced, and finally prints both tables' counts, which must be equal (and
the copy's ids distinct) for the demo to pass. A PostgreSQL that cannot be found or started is
said in one line, and the demo fails.

Without `--data-dir` the demo works in a new temporary directory, removed when the demo passes
and kept (its path printed) when it fails, so the servers' logs can be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, PushConsumer
from ferrymq.cmd.up import ProcessCluster, UpConfig, disk_shortage
from ferrymq.connectors.pgserver import (
    Database,
    PostgresServer,
    PostgresUnavailableError,
    start_postgres,
)
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

__all__ = ["DemoReport", "run_demo"]

TOPIC = "DemoTopic"
GROUP = "demo-consumer"
MIRROR = "demo-mirror"
PG_TABLE = "orders"
PG_COPY = "orders_copy"
PG_TOPIC = f"pg-{PG_TABLE}"
PG_SOURCE = "orders-from-pg"
PG_SINK = "orders-to-pg"
PG_FIRST_ROWS = 200
"""Rows in `orders` before the failover; the pipeline must have copied them before the kill."""
PG_BATCH = 20
PG_MAX_ROWS = 20_000
"""A bound on the rows the demo inserts while the story runs (a batch every 0.1 s)."""
PIPELINE_START_S = 300.0
"""Until the first rows are copied: two Spark sessions start on a possibly busy machine."""
PIPELINE_DRAIN_S = 240.0
RESTART_S = 120.0
"""How long the killed master may take to recover and start again."""
DEMO_SEGMENT_BYTES = 16 * 1024 * 1024
"""Commit-log segments of 16 MiB, not 1 GiB: the demo's 3 brokers preallocate 48 MiB, not 3 GiB,
and the killed master's recovery reads 16 MiB past its log's end (`--mapped-file-size-commit-log`
changes it)."""


def demo_config(workdir: Path, segment_bytes: int = DEMO_SEGMENT_BYTES) -> UpConfig:
    """The demo's cluster: 3 controllers, one group of 3 replicas, 2 Connect workers."""
    return UpConfig(
        data_dir=workdir, replicas=3, controllers=3, connect=2, segment_bytes=segment_bytes
    )


@dataclass
class DemoReport:
    """What the demo measured."""

    sent: int = 0
    """Sends acknowledged as committed (every in-sync replica has them)."""
    unknown: int = 0
    """Sends whose outcome the client could not know (the master died with them in flight)."""
    failed: int = 0
    """Sends refused (surely not stored), each sent again."""
    retries: int = 0
    consumed: int = 0
    missing: int = 0
    duplicates: int = 0
    """Deliveries beyond the first (at-least-once: the consumer resumes from its last commit)."""
    failover_gap_s: float = 0.0
    """From the last acknowledged send on the old master to the first on the new one."""
    old_master: str = ""
    new_master: str = ""
    truncated_bytes: int = 0
    rejoined: bool = False
    send_seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    clean_exits: dict[str, int | None] = field(default_factory=dict)
    stored: int = 0
    """Messages in the topic when the story ends (acknowledged ones, and unknown sends stored)."""
    spark_rows: list[dict[str, Any]] | None = None
    """The Spark pipeline's aggregate (None: skipped)."""
    spark_skipped: str = ""
    mirrored: int | None = None
    """Messages the Connect mirror copied (None: skipped)."""
    connect_note: str = ""
    pg_rows: int | None = None
    """Rows in PostgreSQL's `orders` when the pipeline was checked (None: it did not run)."""
    pg_copied: int | None = None
    """Rows in `orders_copy` then."""
    pg_distinct: int | None = None
    """Distinct ids in `orders_copy` (equal to pg_copied: nothing copied twice)."""
    pg_copied_before_kill: int = 0
    pg_error: str = ""
    """Why the pipeline did not run or did not finish (the demo then fails)."""
    pipeline_skipped: str = ""
    """Set when pyspark is not installed: the Connect pipelines cannot run (not a failure)."""

    @property
    def pipeline_ok(self) -> bool:
        """Both tables hold the same rows, each copied once (or pyspark is missing)."""
        if self.pipeline_skipped:
            return True
        return (
            not self.pg_error
            and bool(self.pg_rows)
            and self.pg_copied == self.pg_rows
            and self.pg_distinct == self.pg_rows
        )

    @property
    def ok(self) -> bool:
        """Nothing acknowledged lost, a new master elected, the old one back, clean shutdowns."""
        return (
            self.sent > 0
            and self.missing == 0
            and bool(self.new_master)
            and self.new_master != self.old_master
            and self.rejoined
            and all(code == 0 for code in self.clean_exits.values())
            and (
                self.spark_rows is None
                or sum(row["orders"] for row in self.spark_rows) == self.stored
            )
            and (self.mirrored is None or self.mirrored == self.stored)
            and self.pipeline_ok
        )


async def _runtime(rpc: RpcClient, address: str) -> dict[str, str]:
    response = await rpc.call(address, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 3)
    return decode_body(response.body, KVTable).table


async def _master(admin: AdminClient, *, not_addr: str = "", timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(TOPIC)
        for broker in route.broker_datas if route else []:
            address = broker.broker_addrs.get(0)
            if address and address != not_addr:
                return address
        if time.monotonic() > deadline:
            raise RuntimeError("no master appeared in the route")
        await asyncio.sleep(0.05)


async def _until_in_sync(rpc: RpcClient, master: str, replicas: int) -> None:
    deadline = time.monotonic() + 30
    while len((await _runtime(rpc, master)).get("syncStateSet", "").split(",")) < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError("the slaves never joined the SyncStateSet")
        await asyncio.sleep(0.05)


async def run_demo(
    messages: int,
    data_dir: Path | None,
    console: Console,
    segment_bytes: int = DEMO_SEGMENT_BYTES,
) -> DemoReport:
    """Run the whole demo; returns its report.

    Raises:
        FerryError: the disk is too full for the brokers (`ferry up`'s check, one line);
            nothing was started.
    """
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="ferrymq-demo-"))
    config = demo_config(workdir, segment_bytes)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    shortage = disk_shortage((await asyncio.to_thread(shutil.disk_usage, workdir)).free, config)
    if shortage is not None:
        if data_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise FerryError(shortage)
    report = DemoReport()
    cluster = ProcessCluster(config)
    console.print(f"[bold]ferrymq demo[/bold] in {workdir}")
    # PostgreSQL's initdb and start (a few seconds) beside the cluster's
    postgres = asyncio.create_task(asyncio.to_thread(_start_postgres))
    pipeline: _Pipeline | None = None
    passed = False
    try:
        await cluster.start()
        for node, child in cluster.controllers.items():
            console.print(f"  controller {node}  {child.addr}  (pid {child.pid})")
        console.print(f"  NameServer     {cluster.namesrv_addr}")
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as rpc:
            await admin.create_topic(TOPIC, queues=4)
            report.old_master = await _master(admin)
            for name, child in cluster.brokers.items():
                role = "master" if child.addr == report.old_master else "slave"
                console.print(f"  {name}     {child.addr}  (pid {child.pid}, {role})")
            await _until_in_sync(rpc, report.old_master, 3)
            console.print(f"  topic          {TOPIC}: 4 queues, sync replication to 3 replicas\n")
            pipeline = await _start_pipeline(cluster, admin, await postgres, report, console)
            feeding = asyncio.Event()
            feeder = asyncio.create_task(pipeline.feed(feeding)) if pipeline else None
            try:
                await _story(cluster, admin, rpc, messages, report, console)
            finally:
                feeding.set()
                if feeder is not None:
                    await feeder
            if pipeline is not None:
                await pipeline.drain(report, console)
            report.stored = await _stored(cluster.namesrv_addr)
            await _spark_pipeline(cluster.namesrv_addr, workdir, report, console)
            await _connect_pipeline(cluster, report, console)
        passed = True
    finally:
        for child in reversed(cluster.children):
            report.clean_exits[child.name] = await child.stop()
        with contextlib.suppress(BaseException):
            server = await postgres
            if isinstance(server, PostgresServer):
                await asyncio.to_thread(server.stop)
        if not passed:  # an error ends the demo: its logs are what to read
            console.print(f"the demo's data and logs are kept in {workdir}")
    _print(report, console)
    tidy(workdir, own=data_dir is None, ok=report.ok, console=console)
    return report


def tidy(workdir: Path, *, own: bool, ok: bool, console: Console) -> None:
    """Remove the demo's own temporary directory once it passed; otherwise say where it is."""
    if not ok:
        console.print(f"the demo's data and logs are kept in {workdir}")
    elif own:
        shutil.rmtree(workdir, ignore_errors=True)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _start_postgres() -> PostgresServer | str:
    """A PostgreSQL server of the demo's own, or why there is none."""
    try:
        return start_postgres()
    except (PostgresUnavailableError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)


async def _leader(http: httpx.AsyncClient, urls: dict[str, str]) -> dict[str, Any]:
    """The Connect cluster's leader, once the workers elected one."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.HTTPError):
            leader: dict[str, Any] = (
                await http.get(next(iter(urls.values())) + "/cluster")
            ).json()["leader"]
            if leader["worker_id"]:
                return leader
        if time.monotonic() > deadline:
            raise RuntimeError("the Connect workers elected no leader")
        await asyncio.sleep(0.2)


async def _start_pipeline(
    cluster: ProcessCluster,
    admin: AdminClient,
    postgres: PostgresServer | str,
    report: DemoReport,
    console: Console,
) -> _Pipeline | None:
    """PostgreSQL -> PostgresSource -> topic -> PostgresSink -> PostgreSQL, running before the kill.

    Returns None (the reason in the report) when it cannot run.
    """
    console.print("[bold]Connect pipeline[/bold]: PostgreSQL -> ferrymq -> PostgreSQL")
    try:
        import pyspark  # noqa: F401 - the workers run their tasks on Spark
    except ImportError as exc:
        report.pipeline_skipped = f"pyspark is not installed ({exc})"
        console.print(f"  skipped: {report.pipeline_skipped}")
        return None
    if isinstance(postgres, str):
        report.pg_error = f"PostgreSQL cannot run here: {postgres}"
        console.print(f"  [red]{report.pg_error}[/red]")
        return None
    try:
        database = await asyncio.to_thread(postgres.create_database, "shop")
        await asyncio.to_thread(
            database.query,
            f"CREATE TABLE {PG_TABLE} (id bigint PRIMARY KEY, item text NOT NULL, amount integer)",
        )
    except psycopg.Error as exc:
        report.pg_error = f"PostgreSQL refused the demo's database: {_one_line(exc)}"
        console.print(f"  [red]{report.pg_error}[/red]")
        return None
    console.print(
        f"  PostgreSQL {postgres.url('shop', password=None)} (pid {postgres.process.pid}), "
        f"table {PG_TABLE}"
    )
    await admin.create_topic(PG_TOPIC, queues=2)
    urls = {name: str(child.info["url"]) for name, child in cluster.workers.items()}
    pipeline = _Pipeline(database, urls)
    try:
        await pipeline.create(console)
    except (RuntimeError, httpx.HTTPError) as exc:
        report.pg_error = str(exc)
        console.print(f"  [red]{report.pg_error}[/red]")
        return None
    copied = await pipeline.first_rows(report, console)
    if copied is None:
        return None
    report.pg_copied_before_kill = copied
    if copied < pipeline.inserted:
        report.pg_error = (
            f"the pipeline copied {copied} of {pipeline.inserted} rows in {PIPELINE_START_S:.0f} s"
            f" (status: {await pipeline.states()})"
        )
        console.print(f"  [red]{report.pg_error}[/red]")
        return None
    console.print(
        f"  {PG_TABLE} -> {PG_TOPIC} -> {PG_COPY}: {copied} rows copied; rows keep coming in "
        f"(a batch of {PG_BATCH} every 0.1 s) through the failover\n"
    )
    return pipeline


class _Pipeline:
    """The demo's PostgreSQL pipeline: its two connectors, its rows and its checks."""

    def __init__(self, database: Database, urls: dict[str, str]) -> None:
        self.database = database
        self.urls = urls
        self.follower = ""
        self.inserted = 0
        self.error = ""

    async def create(self, console: Console) -> None:
        """Both connectors over REST on a follower worker (it forwards the writes)."""
        connection = self.database.config
        source = {
            "connector.class": "PostgresSource",
            **connection,
            "mode": "incrementing",
            "incrementing.column.name": "id",
            "table.whitelist": PG_TABLE,
            "topic.prefix": "pg-",
            "poll.interval.ms": "500",
        }
        sink = {
            "connector.class": "PostgresSink",
            **connection,
            "topics": PG_TOPIC,
            "table.name.format": PG_COPY,
            "fields": "id bigint not null, item text, amount integer",
            "auto.create": "true",
            "trigger.interval.ms": "500",
        }
        async with httpx.AsyncClient(timeout=60) as http:
            leader = await _leader(http, self.urls)
            self.follower = next(name for name in self.urls if name != leader["worker_id"])
            url = self.urls[self.follower]
            for name, config in ((PG_SOURCE, source), (PG_SINK, sink)):
                shown = {"name": name, "config": {**config, "connection.password": "..."}}
                console.print(
                    f"  curl -X POST {url}/connectors -H 'Content-Type: application/json' "
                    f"-d '{json.dumps(shown)}'"
                )
                created = await http.post(
                    url + "/connectors", json={"name": name, "config": config}
                )
                if created.status_code != 201:
                    raise RuntimeError(
                        f"creating {name} failed: {created.status_code} {created.text}"
                    )
            console.print(
                f"  201, 201 from {self.follower}, a follower (forwarded to the leader "
                f"{leader['worker_id']})"
            )

    async def first_rows(self, report: DemoReport, console: Console) -> int | None:
        """Insert the first rows and wait for their copy.

        Returns the rows copied, or None (the PostgreSQL error in the report, in one line).
        """
        starting = "the pipeline's tasks (two Spark streaming queries) start and copy"
        try:
            await self.insert(PG_FIRST_ROWS)
            with console.status(starting):
                return await self.until_copied(PIPELINE_START_S)
        except psycopg.Error as exc:
            report.pg_error = f"PostgreSQL failed the pipeline: {_one_line(exc)}"
            console.print(f"  [red]{report.pg_error}[/red]")
            return None

    async def insert(self, count: int) -> None:
        """`count` more rows into `orders`, in one transaction."""
        first = self.inserted
        rows = [(i, f"item-{i % 13}", i % 97) for i in range(first, first + count)]
        async with (
            await psycopg.AsyncConnection.connect(self.database.url) as conn,
            conn.cursor() as cursor,
        ):
            await cursor.executemany(
                f"INSERT INTO {PG_TABLE} (id, item, amount) VALUES (%s, %s, %s)".encode(),
                rows,
            )
        self.inserted += count

    async def feed(self, stop: asyncio.Event) -> None:
        """A batch of rows every 0.1 s until `stop` (at most PG_MAX_ROWS in all)."""
        while not stop.is_set() and self.inserted + PG_BATCH <= PG_MAX_ROWS:
            try:
                await self.insert(PG_BATCH)
            except psycopg.Error as exc:
                self.error = f"inserting into {PG_TABLE} failed: {_one_line(exc)}"
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def counts(self) -> tuple[int, int, int]:
        """Rows in `orders`, rows and distinct ids in `orders_copy` (0 before the sink made it)."""

        def read() -> tuple[int, int, int]:
            [(source,)] = self.database.query(f"SELECT count(*) FROM {PG_TABLE}")
            if self.database.query(f"SELECT to_regclass('{PG_COPY}')") == [(None,)]:
                return int(str(source)), 0, 0
            [(copied, distinct)] = self.database.query(
                f"SELECT count(*), count(DISTINCT id) FROM {PG_COPY}"
            )
            return int(str(source)), int(str(copied)), int(str(distinct))

        return await asyncio.to_thread(read)

    async def states(self) -> dict[str, str]:
        """Each connector's task states, as `/status` shows them."""
        found: dict[str, str] = {}
        async with httpx.AsyncClient(timeout=20) as http:
            for name in (PG_SOURCE, PG_SINK):
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    status = await http.get(f"{self.urls[self.follower]}/connectors/{name}/status")
                    found[name] = ", ".join(
                        f"task {t['id']} {t['state']} on {t['worker_id']}"
                        for t in status.json()["tasks"]
                    )
        return found

    async def until_copied(self, timeout: float) -> int:
        """Rows copied once the copy holds every inserted row, or when `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            _, copied, _ = await self.counts()
            if copied >= self.inserted or time.monotonic() > deadline:
                return copied
            await asyncio.sleep(0.5)

    async def drain(self, report: DemoReport, console: Console) -> None:
        """After the failover: wait until the copy holds every row, then count both tables."""
        try:
            with console.status("the pipeline copies the rows inserted across the failover"):
                await self.until_copied(PIPELINE_DRAIN_S)
            report.pg_rows, report.pg_copied, report.pg_distinct = await self.counts()
        except psycopg.Error as exc:
            report.pg_error = f"PostgreSQL failed the pipeline: {_one_line(exc)}"
            console.print(f"  [red]{report.pg_error}[/red]")
            return
        states = await self.states()
        console.print(
            f"\n[bold]Connect pipeline[/bold] after the failover: {PG_TABLE} {report.pg_rows:,} "
            f"rows, {PG_COPY} {report.pg_copied:,} rows ({report.pg_distinct:,} distinct ids)"
        )
        for name, state in states.items():
            console.print(f"  {name}: {state}")
        if self.error:
            report.pg_error = self.error
        elif report.pg_copied != report.pg_rows:
            report.pg_error = (
                f"{PG_COPY} holds {report.pg_copied} of {report.pg_rows} rows after "
                f"{PIPELINE_DRAIN_S:.0f} s"
            )


async def _story(
    cluster: ProcessCluster,
    admin: AdminClient,
    rpc: RpcClient,
    messages: int,
    report: DemoReport,
    console: Console,
) -> None:
    acked: set[bytes] = set()
    unknown: set[bytes] = set()
    consumed: dict[bytes, int] = {}
    last_old_ack = first_new_ack = 0.0
    killed = asyncio.Event()

    all_consumed = asyncio.Event()

    async def listener(message: Message) -> None:
        consumed[message.body] = consumed.get(message.body, 0) + 1
        all_consumed.set()

    consumer = PushConsumer(
        cluster.namesrv_addr,
        GROUP,
        listener,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        commit_interval=0.5,
        pull_wait=1.0,
        rebalance_interval=1.0,
    )
    consumer.subscribe(TOPIC)
    await consumer.start()
    victim = next(n for n, c in cluster.brokers.items() if c.addr == report.old_master)
    try:
        async with Producer(cluster.namesrv_addr, "demo-producer", send_timeout=2.0) as producer:
            start = time.perf_counter()
            for i in range(messages):
                if i == messages // 3:
                    console.print(
                        f"  [red]kill -9[/red] master {victim} (pid {cluster.brokers[victim].pid}) "
                        f"after {i} sends"
                    )
                    cluster.brokers[victim].kill()
                    killed.set()
                body = f"order-{i:06d} amount={i % 97}".encode()
                sent_at = time.perf_counter()
                if not await _send_until_acked(producer, body, i, unknown, report):
                    continue
                now = time.perf_counter()
                report.latencies_ms.append((now - sent_at) * 1000)
                acked.add(body)
                if not killed.is_set():
                    last_old_ack = now
                elif not first_new_ack:
                    first_new_ack = now
            report.send_seconds = time.perf_counter() - start
        report.failover_gap_s = max(0.0, first_new_ack - last_old_ack) if first_new_ack else 0.0
        report.new_master = await _master(admin, not_addr=report.old_master)
        console.print(f"  new master     {report.new_master} (elected from the SyncStateSet)")

        await cluster.brokers[victim].process.wait()
        # recovery after kill -9 checks the segment past the log's end: slow on a busy box
        restarted = await cluster.restart(victim, timeout=RESTART_S)
        deadline = time.monotonic() + 60
        while True:
            mine, theirs = (
                await _runtime(rpc, restarted.addr),
                await _runtime(rpc, report.new_master),
            )
            if mine.get("brokerRole") == "SLAVE" and mine.get("commitLogMaxOffset") == theirs.get(
                "commitLogMaxOffset"
            ):
                report.rejoined = True
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        found = re.search(r"truncating the log from (\d+) to (\d+)", restarted.log_path.read_text())
        report.truncated_bytes = int(found[1]) - int(found[2]) if found else 0
        console.print(
            f"  old master     {restarted.addr} is back as a slave"
            + (f", cut {report.truncated_bytes} bytes only it had" if found else "")
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(60):
                while not acked <= consumed.keys():
                    await all_consumed.wait()
                    all_consumed.clear()
    finally:
        await consumer.close()
    report.sent = len(acked)
    report.unknown = len(unknown)
    report.consumed = sum(consumed.values())
    report.missing = len(acked - consumed.keys())
    report.duplicates = sum(n - 1 for n in consumed.values() if n > 1)


async def _send_until_acked(
    producer: Producer, body: bytes, index: int, unknown: set[bytes], report: DemoReport
) -> bool:
    """What an application does: send again (after a pause) until the send is acknowledged.

    A failed send surely stored nothing; an unknown one may have been stored, so sending it
    again may store it twice (at least once). Gives up after 30 s.
    """
    deadline = time.monotonic() + 30
    while True:
        try:
            await producer.send(TOPIC, body, tags="Order", keys=[f"order-{index}"])
            return True
        except SendOutcomeUnknownError:
            unknown.add(body)
        except FerryError:
            report.failed += 1
        if time.monotonic() > deadline:
            return False
        report.retries += 1
        await asyncio.sleep(0.05)


async def _stored(namesrv: str, topic: str = TOPIC) -> int:
    """How many messages a topic holds (every queue's max offset; nothing expired here)."""
    async with PullConsumer(namesrv, "demo-count") as consumer:
        return sum([await consumer.max_offset(q) for q in await consumer.queues(topic)])


async def _connect_pipeline(cluster: ProcessCluster, report: DemoReport, console: Console) -> None:
    """A connector created over REST on a follower worker mirrors the topic, exactly once."""
    try:
        import pyspark  # noqa: F401 - the workers run their tasks on Spark
    except ImportError as exc:
        report.connect_note = f"pyspark is not installed ({exc})"
        return
    urls = {name: str(child.info["url"]) for name, child in cluster.workers.items()}
    async with httpx.AsyncClient(timeout=60) as http:
        leader = await _leader(http, urls)
        follower = next(name for name in urls if name != leader["worker_id"])
        body = {
            "name": MIRROR,
            "config": {
                "connector.class": "FerrymqReplicator",
                "topics": TOPIC,
                "target.topic.format": "${topic}-mirror",
            },
        }
        console.print(
            f"\n[bold]Connect[/bold]: curl -X POST {urls[follower]}/connectors "
            f"-H 'Content-Type: application/json' -d '{json.dumps(body)}'"
        )
        created = await http.post(urls[follower] + "/connectors", json=body)
        if created.status_code != 201:
            raise RuntimeError(
                f"creating the connector failed: {created.status_code} {created.text}"
            )
        console.print(
            f"  201 from {follower}, a follower: it forwarded the write to the leader "
            f"{leader['worker_id']} (epoch {created.headers.get('X-Ferry-Epoch')}, config "
            f"offset {created.headers.get('X-Ferry-Config-Offset')})"
        )
        target = f"{TOPIC}-mirror"
        with console.status("the connector's task (a Spark streaming query) copies the topic"):
            deadline = time.monotonic() + 240
            report.mirrored = 0
            while time.monotonic() < deadline:
                with contextlib.suppress(FerryError):
                    report.mirrored = await _stored(cluster.namesrv_addr, target)
                if report.mirrored >= report.stored:
                    break
                await asyncio.sleep(1.0)
        status = (await http.get(urls[follower] + f"/connectors/{MIRROR}/status")).json()
        task = status["tasks"][0]
        console.print(
            f"  {MIRROR}: task 0 {task['state']} on {task['worker_id']}; {target} holds "
            f"{report.mirrored:,} of the {report.stored:,} messages"
        )


async def _spark_pipeline(
    servers: str, workdir: Path, report: DemoReport, console: Console
) -> None:
    """The data pipeline: Spark reads the topic and writes an aggregate to Parquet."""
    try:
        from ferrymq.spark.session import demo_aggregate
    except ImportError as exc:
        report.spark_skipped = f"pyspark is not installed ({exc}); pip install 'ferrymq[spark]'"
        return
    out = workdir / "spark-aggregate.parquet"
    console.print(f"\n[bold]Spark[/bold]: {TOPIC} -> aggregate per tag and queue -> {out}")
    with console.status("starting Spark (local[2]) and running the pipeline"):
        report.spark_rows = await asyncio.to_thread(demo_aggregate, servers, TOPIC, out)


def _print_spark(report: DemoReport, console: Console) -> None:
    if report.spark_rows is None:
        console.print(f"Spark pipeline skipped: {report.spark_skipped}")
        return
    table = Table(title="Spark: orders per tag and queue (read back from Parquet)")
    for name in ("tags", "queue", "orders", "amount"):
        table.add_column(name, justify="left" if name in ("tags", "queue") else "right")
    for row in report.spark_rows:
        table.add_row(
            str(row["tags"]),
            f"{row['brokerName']}/{row['queueId']}",
            f"{row['orders']:,}",
            f"{row['amount']:,}",
        )
    console.print(table)
    orders = sum(row["orders"] for row in report.spark_rows)
    console.print(f"Spark read {orders:,} messages of the {report.stored:,} the topic holds.")


def _print(report: DemoReport, console: Console) -> None:
    latencies = sorted(report.latencies_ms) or [0.0]
    table = Table(title="what happened", show_header=False)
    table.add_row("sends acknowledged (on all 3 replicas)", f"{report.sent:,}")
    table.add_row(
        "sends unknown / refused during the failover (each sent again)",
        f"{report.unknown} / {report.failed}",
    )
    table.add_row("messages consumed (push consumer group)", f"{report.consumed:,}")
    table.add_row("acknowledged but never consumed", f"{report.missing}")
    table.add_row("redelivered (at least once, around the failover)", f"{report.duplicates}")
    table.add_row("master", f"{report.old_master} -> {report.new_master or '-'}")
    table.add_row("failover gap (last ack on old, first on new)", f"{report.failover_gap_s:.2f} s")
    table.add_row("old master rejoined as slave", "yes" if report.rejoined else "no")
    if report.send_seconds:
        table.add_row(
            "produce rate (one producer, one at a time)",
            f"{report.sent / report.send_seconds:,.0f} msg/s",
        )
    table.add_row(
        "send latency p50 / p99",
        f"{statistics.median(latencies):.2f} / {latencies[int(len(latencies) * 0.99) - 1]:.2f} ms",
    )
    table.add_row(
        "servers stopped cleanly",
        ", ".join(f"{n}: exit {c}" for n, c in report.clean_exits.items()),
    )
    if report.pipeline_skipped:
        table.add_row(
            "Connect pipeline PostgreSQL -> PostgreSQL", f"skipped: {report.pipeline_skipped}"
        )
    elif report.pg_rows is not None:
        table.add_row(
            f"Connect pipeline: {PG_TABLE} / {PG_COPY} rows (across the failover)",
            f"{report.pg_rows:,} / {report.pg_copied:,}",
        )
    if report.pg_error:
        table.add_row("Connect pipeline FAILED", report.pg_error)
    if report.mirrored is not None:
        table.add_row("Connect mirror (a Spark query on a worker)", f"{report.mirrored:,} messages")
    elif report.connect_note:
        table.add_row("Connect mirror", f"skipped: {report.connect_note}")
    console.print(table)
    _print_spark(report, console)
    console.print(
        "[bold green]OK[/bold green]: every acknowledged message was consumed; the master "
        "failed over and the old one came back as a slave"
        + ("." if report.pipeline_skipped else "; the pipeline copied every row once.")
        if report.ok
        else "[bold red]FAILED[/bold red]: see the table above."
    )
