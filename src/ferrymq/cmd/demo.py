"""`ferry demo`: a NameServer and a broker on free ports, a stream produced and consumed, a report.

What a newcomer sees: two real server processes start; a producer sends a stream of messages
with keys and tags (synchronous flush, so every acknowledged message is on disk); a consumer
reads every queue from offset 0 and commits its offsets; the report checks that every
acknowledged message was consumed exactly once and in queue order, and shows the rates and
latencies measured; a Spark pipeline reads the topic (`format("ferrymq")`) and writes an
aggregate to Parquet, printed (skipped, saying so, when pyspark is not installed); the servers
stop cleanly.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child, spawn
from ferrymq.model import MessageQueue

__all__ = ["DemoReport", "run_demo"]

TOPIC = "DemoTopic"


@dataclass
class DemoReport:
    """What the demo measured."""

    sent: int = 0
    consumed: int = 0
    duplicates: int = 0
    missing: int = 0
    out_of_order: int = 0
    send_seconds: float = 0.0
    consume_seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    clean_exits: dict[str, int | None] = field(default_factory=dict)
    spark_rows: list[dict[str, Any]] | None = None
    """The Spark pipeline's aggregate (None: skipped)."""
    spark_skipped: str = ""

    @property
    def ok(self) -> bool:
        """Every acknowledged message consumed once, in order, and clean shutdowns."""
        return (
            self.sent > 0
            and self.consumed == self.sent
            and self.duplicates == self.missing == self.out_of_order == 0
            and all(code == 0 for code in self.clean_exits.values())
            and (
                self.spark_rows is None
                or sum(row["orders"] for row in self.spark_rows) == self.consumed
            )
        )


async def _wait_for_route(admin: AdminClient, topic: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while await admin.route(topic) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} never reached the NameServer")
        await asyncio.sleep(0.05)


async def run_demo(messages: int, data_dir: Path | None, console: Console) -> DemoReport:
    """Run the whole demo; returns its report."""
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="ferrymq-demo-"))
    report = DemoReport()
    children: list[Child] = []
    console.print(f"[bold]ferrymq demo[/bold] in {workdir}")
    try:
        namesrv = await spawn("namesrv", ["namesrv", "--listen", "127.0.0.1:0"], workdir)
        children.append(namesrv)
        console.print(f"  NameServer   {namesrv.addr}  (pid {namesrv.pid})")
        broker = await spawn(
            "broker",
            [
                "broker",
                "--listen",
                "127.0.0.1:0",
                "--namesrv",
                namesrv.addr,
                "--store-dir",
                str(workdir / "store"),
                "--flush-disk-type",
                "SYNC_FLUSH",
            ],
            workdir,
        )
        children.append(broker)
        console.print(f"  broker-a     {broker.addr}  (pid {broker.pid}, SYNC_FLUSH)")
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic(TOPIC, queues=4)
            await _wait_for_route(admin, TOPIC)
        console.print(f"  topic        {TOPIC}: 4 queues\n")
        acked: dict[MessageQueue, list[tuple[int, bytes]]] = {}
        async with Producer(namesrv.addr, "demo-producer") as producer:
            with Progress(
                TextColumn("producing"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                task = progress.add_task("send", total=messages)
                start = time.perf_counter()
                for i in range(messages):
                    body = f"order-{i:06d} amount={i % 97}".encode()
                    sent_at = time.perf_counter()
                    sent = await producer.send(TOPIC, body, tags="Order", keys=[f"order-{i}"])
                    report.latencies_ms.append((time.perf_counter() - sent_at) * 1000)
                    acked.setdefault(sent.queue, []).append((sent.queue_offset, body))
                    progress.advance(task)
                report.send_seconds = time.perf_counter() - start
        report.sent = sum(len(v) for v in acked.values())
        start = time.perf_counter()
        async with PullConsumer(namesrv.addr, "demo-consumer") as consumer:
            for queue in await consumer.queues(TOPIC):
                offset = await consumer.committed(queue) or 0
                seen: list[tuple[int, bytes]] = []
                while True:
                    result = await consumer.pull(queue, offset, max_messages=256)
                    if result.status is not PullStatus.FOUND:
                        break
                    seen += [(m.queue_offset, m.body) for m in result.messages]
                    offset = result.next_offset
                await consumer.commit(queue, offset)
                expected = acked.get(queue, [])
                report.consumed += len(seen)
                report.out_of_order += sum(1 for a, b in itertools.pairwise(seen) if b[0] <= a[0])
                bodies = [body for _, body in seen]
                report.duplicates += len(bodies) - len(set(bodies))
                report.missing += len({b for _, b in expected} - set(bodies))
        report.consume_seconds = time.perf_counter() - start
        await _spark_pipeline(namesrv.addr, workdir, report, console)
    finally:
        for child in reversed(children):
            report.clean_exits[child.name] = await child.stop()
    _print(report, console)
    return report


async def _spark_pipeline(
    servers: str, workdir: Path, report: DemoReport, console: Console
) -> None:
    try:
        from ferrymq.spark.session import demo_aggregate
    except ImportError as exc:
        report.spark_skipped = f"pyspark is not installed ({exc}); pip install 'ferrymq[spark]'"
        return
    out = workdir / "spark-aggregate.parquet"
    console.print(f"\n[bold]Spark[/bold]: {TOPIC} -> aggregate per tag and partition -> {out}")
    with console.status("starting Spark (local[2]) and running the pipeline"):
        report.spark_rows = await asyncio.to_thread(demo_aggregate, servers, TOPIC, out)


def _print_spark(report: DemoReport, console: Console) -> None:
    if report.spark_rows is None:
        console.print(f"Spark pipeline skipped: {report.spark_skipped}")
        return
    table = Table(title="Spark: orders per tag and partition (read back from Parquet)")
    for name in ("tags", "partition", "orders", "amount"):
        table.add_column(name, justify="left" if name == "tags" else "right")
    for row in report.spark_rows:
        table.add_row(
            str(row["tags"]), str(row["partition"]), f"{row['orders']:,}", f"{row['amount']:,}"
        )
    console.print(table)
    orders = sum(row["orders"] for row in report.spark_rows)
    console.print(f"Spark read {orders:,} messages of {report.consumed:,} consumed.")


def _print(report: DemoReport, console: Console) -> None:
    latencies = sorted(report.latencies_ms) or [0.0]
    table = Table(title="what happened", show_header=False)
    table.add_row("messages acknowledged (fsynced)", f"{report.sent:,}")
    table.add_row("messages consumed", f"{report.consumed:,}")
    table.add_row(
        "missing / duplicated / out of order",
        f"{report.missing} / {report.duplicates} / {report.out_of_order}",
    )
    if report.send_seconds:
        table.add_row(
            "produce rate (one producer, one at a time)",
            f"{report.sent / report.send_seconds:,.0f} msg/s",
        )
    if report.consume_seconds:
        table.add_row(
            "consume rate (batches of 256)",
            f"{report.consumed / report.consume_seconds:,.0f} msg/s",
        )
    table.add_row(
        "send latency p50 / p99",
        f"{statistics.median(latencies):.2f} / {latencies[int(len(latencies) * 0.99) - 1]:.2f} ms",
    )
    table.add_row(
        "servers stopped cleanly",
        ", ".join(f"{n}: exit {c}" for n, c in report.clean_exits.items()),
    )
    console.print(table)
    _print_spark(report, console)
    console.print(
        "[bold green]OK[/bold green]: every acknowledged message was consumed once, in order."
        if report.ok
        else "[bold red]FAILED[/bold red]: see the table above."
    )
