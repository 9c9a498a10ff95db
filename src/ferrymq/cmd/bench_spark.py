"""`ferry bench spark`: the `ferrymq` data source's rows/s beside Spark reading Parquet files.

One NameServer and one broker run as processes on this machine; one local[2] SparkSession
measures, in one run, on the same rows (`rows` bodies of `size` bytes in a 4-queue topic):

- batch read: `spark.read.format("ferrymq")` into the `noop` sink, beside `spark.read.parquet`
  of the same rows (written once beforehand) into `noop`;
- streaming read: `readStream.format("ferrymq")` into Parquet (Trigger.AvailableNow), beside
  `readStream.parquet` of the same files into Parquet, `repeat` times each, alternating which
  goes first, the median reported;
- streaming write: `readStream.parquet` into `writeStream.format("ferrymq")` (exactly once), beside
  the same stream into Parquet.

Each job runs once after warm-up jobs: the first Python data source job of a session pays for
starting Python workers, the first streaming query for the JVM's streaming and Parquet-sink
warm-up, so one unmeasured batch read and one streaming query of each source come first. Rows/s
are wall time from start to the end of the job. Nothing asserts a speed; the ratios (ferrymq /
Parquet) are what docs/benchmarks.md reports.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child, spawn

__all__ = ["SparkBenchConfig", "SparkRow", "ratios", "run_spark_bench"]

TOPIC = "BenchSpark"
OUT_TOPIC = "BenchSparkOut"
_QUEUES = 4


@dataclass(frozen=True, slots=True)
class SparkBenchConfig:
    """What to run."""

    rows: int = 500_000
    size: int = 100
    max_offsets_per_trigger: int = 250_000
    repeat: int = 3
    """Runs of the stream-read pair (ferrymq, Parquet, alternating who goes first); its rows
    report the median (a single run of either moves by 10 % on this machine)."""


@dataclass(frozen=True, slots=True)
class SparkRow:
    """One measured job."""

    job: str
    source: str
    sink: str
    rows: int
    seconds: float
    runs: tuple[float, ...] = ()
    """Each run's seconds, when the row is the median of several."""

    @property
    def rows_per_s(self) -> float:
        """Rows per second of wall time."""
        return self.rows / self.seconds if self.seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        return {
            **asdict(self),
            "seconds": round(self.seconds, 3),
            "runs": [round(r, 3) for r in self.runs],
            "rows_per_s": round(self.rows_per_s),
        }


def ratios(rows: list[SparkRow]) -> dict[str, float]:
    """Ferrymq rows/s over Parquet rows/s, per job."""
    by = {(r.job, r.source, r.sink): r.rows_per_s for r in rows}
    pairs = {
        "batch_read": (("batch read", "ferrymq", "noop"), ("batch read", "parquet", "noop")),
        "stream_read": (
            ("stream read", "ferrymq", "parquet"),
            ("stream read", "parquet", "parquet"),
        ),
        "stream_write": (
            ("stream write", "parquet", "ferrymq"),
            ("stream write", "parquet", "parquet"),
        ),
    }
    return {
        name: round(by[a] / by[b], 3)
        for name, (a, b) in pairs.items()
        if a in by and b in by and by[b] > 0
    }


async def _produce(servers: str, config: SparkBenchConfig) -> None:
    async with AdminClient(servers) as admin:
        for topic in (TOPIC, OUT_TOPIC):
            await admin.create_topic(topic, queues=_QUEUES)
        deadline = time.monotonic() + 20
        while await admin.route(OUT_TOPIC) is None or await admin.route(TOPIC) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the bench topics never reached the NameServer")
            await asyncio.sleep(0.05)
    body = b"x" * config.size
    async with Producer(servers, "bench-spark") as producer:
        queues = (await producer.routes.get(TOPIC)).write_queues
        per_batch = max(1, min(500, (900 * 1024) // (config.size + 64)))
        sends = [
            (queues[i % len(queues)], min(per_batch, config.rows - first))
            for i, first in enumerate(range(0, config.rows, per_batch))
        ]
        window = asyncio.Semaphore(8)

        async def one(queue: Any, count: int) -> None:
            async with window:
                await producer.send_batch(TOPIC, [body] * count, queue=queue)

        await asyncio.gather(*(one(q, n) for q, n in sends))


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _measure(
    spark: Any, servers: str, work: Path, config: SparkBenchConfig, progress: Callable[[str], None]
) -> list[SparkRow]:
    n = config.rows

    def ferry_read() -> Any:
        return spark.read.format("ferrymq").option("servers", servers).option("subscribe", TOPIC)

    def ferry_stream() -> Any:
        return (
            spark.readStream.format("ferrymq")
            .option("servers", servers)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
            .load()
        )

    files = work / "source.parquet"
    schema = ferry_read().load().schema

    def parquet_stream() -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", "2").parquet(str(files))

    def run_stream(frame: Any, sink: str, name: str, **options: str) -> None:
        writer = frame.writeStream.format(sink).option(
            "checkpointLocation", str(work / f"{name}.checkpoint")
        )
        for key, value in options.items():
            writer = writer.option(key, value)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"{name}: {error}")

    progress("warming up (Spark, Python workers)")
    spark.read.format("ferrymq").option("servers", servers).option(
        "assign", f'{{"{TOPIC}": [0]}}'
    ).option("endingOffsets", f'{{"{TOPIC}": {{"0": 1000}}}}').load().write.format("noop").mode(
        "overwrite"
    ).save()
    progress("writing the Parquet copy")
    ferry_read().load().write.mode("overwrite").parquet(str(files))
    spark.read.parquet(str(files)).write.format("noop").mode("overwrite").save()

    # the first streaming query of a session also pays the JVM's warm-up of streaming and of the
    # Parquet sink: one small unmeasured query of each kind first, so neither measured job does
    progress("warming up (streaming)")
    run_stream(
        spark.readStream.format("ferrymq")
        .option("servers", servers)
        .option("assign", f'{{"{TOPIC}": [0]}}')
        .option("startingOffsets", "earliest")
        .load(),
        "parquet",
        "warm-ferry",
        path=str(work / "warm1"),
    )
    run_stream(parquet_stream(), "parquet", "warm-parquet", path=str(work / "warm2"))

    rows: list[SparkRow] = []
    progress("batch read: ferrymq")
    seconds = _timed(lambda: ferry_read().load().write.format("noop").mode("overwrite").save())
    rows.append(SparkRow("batch read", "ferrymq", "noop", n, seconds))
    progress("batch read: parquet")
    seconds = _timed(
        lambda: spark.read.parquet(str(files)).write.format("noop").mode("overwrite").save()
    )
    rows.append(SparkRow("batch read", "parquet", "noop", n, seconds))
    ferry_runs: list[float] = []
    parquet_runs: list[float] = []
    for run in range(config.repeat):

        def ferry_job(run: int = run) -> None:
            run_stream(ferry_stream(), "parquet", f"read-ferry{run}", path=str(work / f"o1-{run}"))

        def parquet_job(run: int = run) -> None:
            run_stream(
                parquet_stream(), "parquet", f"read-parquet{run}", path=str(work / f"o2-{run}")
            )

        jobs = [(ferry_job, ferry_runs, "ferrymq"), (parquet_job, parquet_runs, "parquet")]
        for job, runs, source in jobs if run % 2 == 0 else jobs[::-1]:
            progress(f"stream read {run + 1}/{config.repeat}: {source} -> parquet")
            runs.append(_timed(job))
    for source, runs in (("ferrymq", ferry_runs), ("parquet", parquet_runs)):
        rows.append(
            SparkRow("stream read", source, "parquet", n, statistics.median(runs), tuple(runs))
        )
    progress("stream write: parquet -> ferrymq")
    seconds = _timed(
        lambda: run_stream(
            parquet_stream().select("key", "value"),
            "ferrymq",
            "write-ferry",
            servers=servers,
            topic=OUT_TOPIC,
        )
    )
    rows.append(SparkRow("stream write", "parquet", "ferrymq", n, seconds))
    progress("stream write: parquet -> parquet")
    seconds = _timed(
        lambda: run_stream(
            parquet_stream().select("key", "value"),
            "parquet",
            "write-parquet",
            path=str(work / "o3"),
        )
    )
    rows.append(SparkRow("stream write", "parquet", "parquet", n, seconds))
    return rows


def _in_spark(
    servers: str, work: Path, config: SparkBenchConfig, progress: Callable[[str], None]
) -> list[SparkRow]:
    """Start Spark, measure, stop it: all in one thread.

    The session is active only in the thread that made it, and Spark looks a streaming sink's
    Python data source up in the active session: a `writeStream.format("ferrymq")` from
    another thread fails with `ClassNotFoundException: ferrymq.DefaultSource` (seen when
    `asyncio.to_thread` ran the measuring on another worker thread than the session's start).
    """
    from ferrymq.spark.session import local_session

    progress("starting Spark")
    spark = local_session("ferrymq-bench")
    try:
        return _measure(spark, servers, work, config, progress)
    finally:
        spark.stop()


async def run_spark_bench(
    config: SparkBenchConfig, progress: Callable[[str], None]
) -> list[SparkRow]:
    """Start the servers, load the topic, measure every job, stop everything."""
    work = Path(tempfile.mkdtemp(prefix="ferrymq-bench-spark-"))
    children: list[Child] = []
    try:
        progress("starting a NameServer and a broker")
        namesrv = await spawn("namesrv", ["namesrv", "--listen", "127.0.0.1:0"], work)
        children.append(namesrv)
        broker = await spawn(
            "broker",
            [
                "broker",
                "--listen",
                "127.0.0.1:0",
                "--namesrv",
                namesrv.addr,
                "--store-dir",
                str(work / "store"),
            ],
            work,
        )
        children.append(broker)
        progress(f"producing {config.rows:,} rows of {config.size} B")
        await _produce(namesrv.addr, config)
        return await asyncio.to_thread(_in_spark, namesrv.addr, work, config, progress)
    finally:
        for child in reversed(children):
            await child.stop()
        shutil.rmtree(work, ignore_errors=True)
