"""`ferry bench connectors`: the issue-19 connectors beside their baselines, in one run.

One NameServer and one broker (`ferry` processes), one PostgreSQL server (Debian's package:
`initdb` into a temporary directory, run as the `postgres` user when this is root, on a free
loopback port, stopped by PID; `track_commit_timestamp=on` for the latency rows) and one
SparkSession on a Connect worker's default master (`local_session` on
`runtime.SPARK_MASTER`, `local[<2 x cores>,4]`; with `/usr/share/java/postgresql.jar` on its
class path when that file exists) measure, on the same rows:

- PostgreSQL sink: `PostgresSink` with the plugin's defaults (`ferrymq.read.mode`, `ranges`;
  `trigger.interval.ms`, 200) unless `_Bench.read_mode` names a mode; its plugin `build`, the
  query Connect runs: one micro-batch
  of `rows` JSON messages from a 4-queue topic, exactly once) from its start until the stored
  offsets reach the topic's end, beside a plain psycopg `COPY` of the same rows (Python tuples
  made beforehand) into the same table shape, and beside Spark's own JDBC writer
  (`df.write.jdbc`, a batch read of the same topic through `from_json`; not exactly once) when
  the driver jar is there (else the row is skipped with the reason);
- PostgreSQL sink, steady (group `postgres sink steady`): what a Connect task's user feels, a
  query already running. `PostgresSink` started on a topic of 1,000 rows and its first batch
  stored, then the `rows` messages produced into its topic (the bench holding an EXCLUSIVE lock
  on the offsets table meanwhile, so no batch writes before the clock starts), timed from the
  moment they are all in the topic until the stored offsets reach its end; beside the same COPY,
  and beside Spark's JDBC writer in a running stream (`foreachBatch` + `write.jdbc`, held by a
  lock on its table the same way, on the sink's default trigger interval);
- stream write into ferrymq: `FileSource` (JSON lines files of `size`-byte rows into a topic
  through the exactly-once ferrymq sink, one micro-batch) and `PostgresSource` (a table into a
  topic), each from its start until the topic holds every row, beside `ferry bench produce
  --window 256` (a subprocess) of the same count and body size to the same broker;
- end-to-end latency: `PostgresSource` -> topic -> `PostgresSink` (both queries in the one
  session, as one worker runs them) while rows are inserted at a steady rate; a row's latency is
  the commit time of its copy minus its own (`pg_xact_commit_timestamp` of both rows' xmin).

Each throughput pair runs `repeat` times, alternating which goes first, and reports the median.
Before anything is measured, small unmeasured runs of each job warm the JVM and Spark's Python
workers. Nothing asserts a speed; the ratios are what docs/benchmarks.md reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import FERRY, Child, spawn
from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.runtime import SPARK_MASTER, TRIGGER_INTERVAL_MS

__all__ = [
    "JDBC_JAR",
    "ConnectorsBenchConfig",
    "ConnectorsBenchResult",
    "Latency",
    "ThroughputRow",
    "run_connectors_bench",
]

JDBC_JAR: Final = Path("/usr/share/java/postgresql.jar")
_PG_USER: Final = "postgres"
_PG_PASSWORD: Final = "ferry-bench"
_QUEUES: Final = 4
_FIELDS: Final = (
    "id bigint not null, customer text, amount numeric(12,2), at timestamptz, note text"
)
_SPARK_SCHEMA: Final = "id bigint, customer string, amount decimal(12,2), at timestamp, note string"
_POLL_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class ConnectorsBenchConfig:
    """What to run."""

    rows: int = 200_000
    size: int = 100
    """Body bytes of the FileSource rows (and of `ferry bench produce` beside them)."""
    repeat: int = 3
    latency_seconds: float = 20.0
    """Measured seconds of the latency run (0: none)."""
    latency_rate: float = 200.0
    """Rows inserted per second during the latency run."""
    interval_ms: int = 200
    """PostgresSource's poll.interval.ms and PostgresSink's trigger.interval.ms in the latency
    run."""
    warmup: bool = True
    """Unmeasured small runs of each job first (off: the first measured job pays Spark's
    warm-up; for the CLI test)."""
    jdbc_jar: Path = JDBC_JAR


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    """One measured job (the median of its runs)."""

    group: str
    """`postgres sink` or `ferrymq write`."""
    system: str
    rows: int
    size: int
    """Mean body bytes."""
    seconds: float
    runs: tuple[float, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

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


@dataclass(frozen=True, slots=True)
class Latency:
    """Row committed in PostgreSQL -> its copy committed in the other table."""

    rows: int
    rate: float
    interval_ms: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float


@dataclass(slots=True)
class ConnectorsBenchResult:
    """Every row, the latency, and what was skipped (with the reason)."""

    rows: list[ThroughputRow] = field(default_factory=list)
    latency: Latency | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    master: str = SPARK_MASTER
    """The SparkSession's master (a Connect worker's default)."""

    def ratios(self) -> dict[str, float]:
        """The issue's ratios: each connector's rows/s over its baseline's."""
        by = {(r.group, r.system): r.rows_per_s for r in self.rows}
        pairs = {
            "pg_sink_vs_copy": (
                ("postgres sink", "PostgresSink"),
                ("postgres sink", "psycopg COPY"),
            ),
            "pg_sink_vs_jdbc": (("postgres sink", "PostgresSink"), ("postgres sink", "Spark JDBC")),
            "pg_sink_steady_vs_copy": (
                ("postgres sink steady", "PostgresSink"),
                ("postgres sink steady", "psycopg COPY"),
            ),
            "pg_sink_steady_vs_jdbc": (
                ("postgres sink steady", "PostgresSink"),
                ("postgres sink steady", "Spark JDBC"),
            ),
            "file_source_vs_produce": (
                ("ferrymq write", "FileSource"),
                ("ferrymq write", "produce --window 256"),
            ),
            "pg_source_vs_produce": (
                ("ferrymq write", "PostgresSource"),
                ("ferrymq write", "produce --window 256 (PostgresSource size)"),
            ),
        }
        return {
            name: round(by[a] / by[b], 3)
            for name, (a, b) in pairs.items()
            if a in by and b in by and by[b] > 0
        }

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "rows": [r.as_json() for r in self.rows],
            "ratios": self.ratios(),
            "latency": None if self.latency is None else asdict(self.latency),
            "skipped": dict(self.skipped),
            "master": self.master,
        }


# ------------------------------------------------------------------------ PostgreSQL


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", _PG_USER, "--", *command] if os.geteuid() == 0 else command


@dataclass
class _Postgres:
    """A PostgreSQL server this bench started (stopped by the postmaster's PID)."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        login = f"{_PG_USER}:{_PG_PASSWORD}" if password else _PG_USER
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "bench") -> Any:
        import psycopg

        return psycopg.connect(self.url(database), autocommit=True, connect_timeout=5)

    def stop(self) -> None:
        try:
            pid = int((self.root / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            pid = None
        if pid is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # fast shutdown
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def _start_postgres() -> _Postgres:
    """Run initdb in a new temporary directory, start on a free port, create database `bench`.

    Raises:
        RuntimeError: no PostgreSQL server is installed, or it did not start.
    """
    import psycopg

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise RuntimeError("no PostgreSQL server: apt-get install -y postgresql")
    bin_dir = Path(found[-1]).parent
    # not under a private temporary directory: the server runs as `postgres`
    root = Path(tempfile.mkdtemp(prefix="ferry-bench-pg-"))
    try:
        secret = root / "pwfile"
        secret.write_text(_PG_PASSWORD + "\n")
        sockets = root / "sockets"
        sockets.mkdir()
        if os.geteuid() == 0:
            for path in (root, secret, sockets):
                shutil.chown(path, _PG_USER, _PG_USER)
        subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(root / "data"),
                    "-U",
                    _PG_USER,
                    f"--pwfile={secret}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        secret.unlink()
        log = root / "postgres.log"
        for _ in range(3):
            port = _free_port()
            with log.open("ab") as out:
                process = subprocess.Popen(
                    _as_postgres(
                        [
                            str(bin_dir / "postgres"),
                            "-D",
                            str(root / "data"),
                            "-p",
                            str(port),
                            "-k",
                            str(sockets),
                            "-c",
                            "listen_addresses=127.0.0.1",
                            "-c",
                            "track_commit_timestamp=on",
                            "-c",
                            "max_connections=100",
                        ]
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            server = _Postgres(root, port, process)
            deadline = time.monotonic() + 60
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    psycopg.connect(server.url(), connect_timeout=2).close()
                    break
                except psycopg.OperationalError:
                    time.sleep(0.1)
            if process.poll() is not None:  # the port was taken meanwhile: another one
                continue
            if time.monotonic() >= deadline:
                server.stop()
                raise RuntimeError(f"PostgreSQL did not start: {log.read_text()[-2000:]}")
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE bench")
            return server
        raise RuntimeError(f"PostgreSQL did not start: {log.read_text()[-2000:]}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


# ------------------------------------------------------------------------ rows and topics


def _document(i: int, note: int = 0) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"c{i % 1000:04d}",
        "amount": round((i % 100_000) / 100 + 0.01, 2),
        "at": f"2026-11-25T10:{(i // 60) % 60:02d}:{i % 60:02d}.123+00:00",
        "note": "n" * note,
    }


def _copy_row(document: dict[str, Any]) -> tuple[Any, ...]:
    return (
        document["id"],
        document["customer"],
        decimal.Decimal(str(document["amount"])),
        datetime.datetime.fromisoformat(document["at"]),
        document["note"],
    )


def _sized_line(i: int, size: int) -> str:
    """Row i as a JSON line of exactly `size` bytes (more when the fields alone are longer)."""
    base = json.dumps(_document(i), separators=(",", ":"))
    return json.dumps(_document(i, max(0, size - len(base))), separators=(",", ":"))


async def _create_topics(servers: str, *topics: str) -> None:
    async with AdminClient(servers) as admin:
        for topic in topics:
            await admin.create_topic(topic, queues=_QUEUES)
        deadline = time.monotonic() + 20
        for topic in topics:
            while await admin.route(topic) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {topic} never reached the NameServer")
                await asyncio.sleep(0.05)


async def _produce(servers: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(servers, "bench-connectors", send_timeout=30.0) as producer:
        queues = (await producer.routes.get(topic)).write_queues
        per_batch = max(1, min(500, (900 * 1024) // (max(len(b) for b in bodies) + 64)))
        window = asyncio.Semaphore(8)

        async def one(queue: Any, part: list[bytes]) -> None:
            async with window:
                await producer.send_batch(topic, part, queue=queue)

        await asyncio.gather(
            *(
                one(queues[n % len(queues)], bodies[first : first + per_batch])
                for n, first in enumerate(range(0, len(bodies), per_batch))
            )
        )


class _Topics:
    """A consumer kept open to read topics' end offsets cheaply while a job runs."""

    def __init__(self, servers: str) -> None:
        self._runner = asyncio.Runner()

        async def make() -> PullConsumer:
            # generous: the broker answers slowly while Spark, PostgreSQL and others share 2 cores
            return PullConsumer(servers, "bench-connectors-watch", request_timeout=30.0)

        self._consumer = self._runner.run(make())

    def size(self, topic: str) -> int:
        async def total() -> int:
            queues = await self._consumer.queues(topic)
            return sum([await self._consumer.max_offset(q) for q in queues])

        return self._runner.run(total())

    def bodies(self, topic: str, limit: int) -> list[bytes]:
        async def read() -> list[bytes]:
            found: list[bytes] = []
            for queue in await self._consumer.queues(topic):
                result = await self._consumer.pull(queue, 0, max_messages=min(256, limit))
                found += [m.body for m in result.messages]
            return found[:limit]

        return self._runner.run(read())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._runner.run(self._consumer.close())
        self._runner.close()


def _wait(what: str, done: Callable[[], bool], query: Any | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if query is not None and not query.isActive:
            raise RuntimeError(f"{what}: the query ended: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done in {timeout:.0f} s")
        time.sleep(_POLL_S)


def _progress(query: Any) -> dict[str, Any]:
    """What the query's progress says about its micro-batches (Spark's own timings, ms).

    Waits (outside the timed part, 10 s at most) for the progress of the batch that did the
    work: Spark posts it after the batch's commit, which the bench saw happen.
    """
    deadline = time.monotonic() + 10
    batches: list[Any] = []
    while time.monotonic() < deadline:
        batches = [p for p in query.recentProgress if p.get("numInputRows")]
        if batches:
            break
        time.sleep(_POLL_S)
    durations: dict[str, int] = {}
    for progress in batches:
        for name, millis in (progress.get("durationMs") or {}).items():
            durations[name] = durations.get(name, 0) + int(millis)
    return {"batches": len(batches), "duration_ms": durations}


# ------------------------------------------------------------------------ the jobs


@dataclass
class _Bench:
    spark: Any
    servers: str
    pg: _Postgres
    work: Path
    config: ConnectorsBenchConfig
    progress: Callable[[str], None]
    topics: _Topics
    jdbc: bool
    runs: int = 0
    read_mode: str | None = None
    """PostgresSink's `ferrymq.read.mode` (None: the plugin's default)."""

    def context(self, name: str) -> TaskContext:
        self.runs += 1
        return TaskContext(
            name,
            f"inc-{self.runs}",
            0,
            1,
            "bench",
            self.servers,
            str(self.work / "checkpoints" / f"{name}-{self.runs}"),
        )

    def table(self, name: str) -> None:
        with self.pg.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(
                f"CREATE TABLE {name} (id bigint NOT NULL, customer text, amount numeric(12,2), "
                "at timestamptz, note text)"
            )

    def count(self, table: str) -> int:
        with self.pg.connect() as conn:
            found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(found[0]) if found else 0

    # -- PostgreSQL sink -----------------------------------------------------------------

    def pg_sink(self, topic: str, rows: int, table: str) -> tuple[float, dict[str, Any]]:
        from ferrymq.connectors.postgres_sink import PostgresSink

        self.table(table)
        context = self.context(f"sink-{table}")
        config = {
            "name": context.connector,
            "connector.class": "PostgresSink",
            "topics": topic,
            "connection.url": self.pg.url("bench", password=False),
            "connection.password": _PG_PASSWORD,
            "table.name.format": table,
            "fields": _FIELDS,
            **({"ferrymq.read.mode": self.read_mode} if self.read_mode else {}),
        }

        def stored() -> int:
            with self.pg.connect() as conn:
                found = conn.execute(
                    "SELECT coalesce(sum(next_offset), 0) FROM ferry_connect_offsets "
                    "WHERE connector = %s AND incarnation = %s",
                    [context.connector, context.incarnation],
                ).fetchone()
            return int(found[0]) if found else 0

        started = time.perf_counter()
        query = PostgresSink().build(self.spark, config, context)
        try:
            _wait("PostgresSink", lambda: stored() >= rows, query, 600)
            seconds = time.perf_counter() - started
            detail = _progress(query)
        finally:
            query.stop()
        if self.count(table) != rows:
            raise RuntimeError(f"PostgresSink wrote {self.count(table)} rows, not {rows}")
        return seconds, detail

    def pg_sink_steady(
        self, warm: list[bytes], bodies: list[bytes], topic: str, table: str
    ) -> tuple[float, dict[str, Any]]:
        """A running PostgresSink (its first batch, `warm`, stored), then `bodies` produced.

        Timed from the moment every body is in the topic until the stored offsets reach the
        topic's end. While the bodies are produced the bench holds an EXCLUSIVE lock on the
        offsets table, so a micro-batch the query starts meanwhile waits at its first statement
        (planned over the rows there then) and nothing is written before the clock starts.
        """
        from ferrymq.connectors.postgres_sink import OFFSETS_TABLE, PostgresSink

        self.table(table)
        asyncio.run(_create_topics(self.servers, topic))
        asyncio.run(_produce(self.servers, topic, warm))
        context = self.context(f"steady-{table}")
        config = {
            "name": context.connector,
            "connector.class": "PostgresSink",
            "topics": topic,
            "connection.url": self.pg.url("bench", password=False),
            "connection.password": _PG_PASSWORD,
            "table.name.format": table,
            "fields": _FIELDS,
            **({"ferrymq.read.mode": self.read_mode} if self.read_mode else {}),
        }
        total = len(warm) + len(bodies)

        def stored() -> int:
            with self.pg.connect() as conn:
                found = conn.execute(
                    "SELECT coalesce(sum(next_offset), 0) FROM ferry_connect_offsets "
                    "WHERE connector = %s AND incarnation = %s",
                    [context.connector, context.incarnation],
                ).fetchone()
            return int(found[0]) if found else 0

        query = PostgresSink().build(self.spark, config, context)
        try:
            _wait("PostgresSink's first batch", lambda: stored() >= len(warm), query, 600)
            batches = len(query.recentProgress)
            with self.pg.connect() as blocker, blocker.transaction():
                blocker.execute(f"LOCK TABLE {OFFSETS_TABLE} IN EXCLUSIVE MODE")
                produce_started = time.perf_counter()
                asyncio.run(_produce(self.servers, topic, bodies))
                started = time.perf_counter()
                if self.topics.size(topic) != total:
                    raise RuntimeError(f"{topic} holds {self.topics.size(topic)} of {total}")
            _wait("PostgresSink (steady)", lambda: stored() >= total, query, 600)
            seconds = time.perf_counter() - started
            deadline = time.monotonic() + 10  # the progress of the batches that did the work
            while time.monotonic() < deadline and not any(
                p.get("numInputRows") for p in query.recentProgress[batches:]
            ):
                time.sleep(_POLL_S)
            durations: dict[str, int] = {}
            measured = [p for p in query.recentProgress[batches:] if p.get("numInputRows")]
            for progress in measured:
                for name, millis in (progress.get("durationMs") or {}).items():
                    durations[name] = durations.get(name, 0) + int(millis)
            detail = {
                "produce_s": round(started - produce_started, 3),
                "batches": len(measured),
                "duration_ms": durations,
            }
        finally:
            query.stop()
        if self.count(table) != total:
            raise RuntimeError(f"PostgresSink wrote {self.count(table)} rows, not {total}")
        return seconds, detail

    def pg_jdbc_steady(
        self, warm: list[bytes], bodies: list[bytes], topic: str, table: str
    ) -> float:
        """Spark's JDBC writer in a running stream (`foreachBatch`), timed as `pg_sink_steady`.

        The query reads the topic and appends each micro-batch with `df.write.jdbc` (not exactly
        once); the bench's EXCLUSIVE lock on the table holds a batch started while the bodies are
        produced.
        """
        from pyspark.sql import functions

        self.table(table)
        asyncio.run(_create_topics(self.servers, topic))
        asyncio.run(_produce(self.servers, topic, warm))
        url = f"jdbc:postgresql://127.0.0.1:{self.pg.port}/bench"
        properties = {"user": _PG_USER, "password": _PG_PASSWORD, "driver": "org.postgresql.Driver"}

        def append(frame: Any, _batch: int) -> None:
            frame.write.mode("append").jdbc(url, table, properties=properties)

        total = len(warm) + len(bodies)
        query = (
            self.spark.readStream.format("ferrymq")
            .option("servers", self.servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .select(
                functions.from_json(functions.col("value").cast("string"), _SPARK_SCHEMA).alias("r")
            )
            .select("r.*")
            .writeStream.foreachBatch(append)
            .option("checkpointLocation", str(self.work / "checkpoints" / f"jdbc-{table}"))
            .trigger(processingTime=f"{TRIGGER_INTERVAL_MS} milliseconds")  # the sink's
            .start()
        )
        try:
            _wait("JDBC's first batch", lambda: self.count(table) >= len(warm), query, 600)
            with self.pg.connect() as blocker, blocker.transaction():
                blocker.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
                asyncio.run(_produce(self.servers, topic, bodies))
                started = time.perf_counter()
            _wait("Spark JDBC (steady)", lambda: self.count(table) >= total, query, 600)
            seconds = time.perf_counter() - started
        finally:
            query.stop()
        if self.count(table) != total:
            raise RuntimeError(f"the JDBC writer wrote {self.count(table)} rows, not {total}")
        return seconds

    def pg_copy(self, copy_rows: list[tuple[Any, ...]], table: str) -> float:
        self.table(table)
        started = time.perf_counter()
        with (
            self.pg.connect() as conn,
            conn.transaction(),
            conn.cursor().copy(f"COPY {table} (id, customer, amount, at, note) FROM STDIN") as copy,
        ):
            for row in copy_rows:
                copy.write_row(row)
        seconds = time.perf_counter() - started
        if self.count(table) != len(copy_rows):
            raise RuntimeError("the COPY lost rows")
        return seconds

    def pg_jdbc(self, topic: str, rows: int, table: str) -> float:
        from pyspark.sql import functions

        self.table(table)
        started = time.perf_counter()
        (
            self.spark.read.format("ferrymq")
            .option("servers", self.servers)
            .option("subscribe", topic)
            .load()
            .select(
                functions.from_json(functions.col("value").cast("string"), _SPARK_SCHEMA).alias("r")
            )
            .select("r.*")
            .write.mode("append")
            .jdbc(
                f"jdbc:postgresql://127.0.0.1:{self.pg.port}/bench",
                table,
                properties={
                    "user": _PG_USER,
                    "password": _PG_PASSWORD,
                    "driver": "org.postgresql.Driver",
                },
            )
        )
        seconds = time.perf_counter() - started
        if self.count(table) != rows:
            raise RuntimeError(f"the JDBC writer wrote {self.count(table)} rows, not {rows}")
        return seconds

    # -- into ferrymq ----------------------------------------------------------------------

    def file_source(self, directory: Path, topic: str, rows: int) -> tuple[float, dict[str, Any]]:
        from ferrymq.connectors.files import FileSource

        context = self.context(f"files-{topic}")
        config = {
            "name": context.connector,
            "connector.class": "FileSource",
            "file.path": str(directory),
            "file.format": "json",
            "schema": _SPARK_SCHEMA,
            "topic": topic,
        }
        started = time.perf_counter()
        query = FileSource().build(self.spark, config, context)
        try:
            _wait("FileSource", lambda: self.topics.size(topic) >= rows, query, 600)
            seconds = time.perf_counter() - started
            detail = _progress(query)
        finally:
            query.stop()
        if self.topics.size(topic) != rows:
            raise RuntimeError(f"FileSource sent {self.topics.size(topic)} rows, not {rows}")
        return seconds, detail

    def pg_source(self, table: str, topic: str, rows: int) -> tuple[float, dict[str, Any]]:
        from ferrymq.connectors.postgres_source import PostgresSource

        context = self.context(f"source-{topic}")
        config = {
            "name": context.connector,
            "connector.class": "PostgresSource",
            "connection.url": self.pg.url("bench", password=False),
            "connection.password": _PG_PASSWORD,
            "mode": "incrementing",
            "incrementing.column.name": "id",
            "table.whitelist": table,
            "topic.prefix": topic.removesuffix(table),
            "batch.max.rows": str(rows),
            "poll.interval.ms": "1000",
        }
        started = time.perf_counter()
        query = PostgresSource().build(self.spark, config, context)
        try:
            _wait("PostgresSource", lambda: self.topics.size(topic) >= rows, query, 600)
            seconds = time.perf_counter() - started
            detail = _progress(query)
        finally:
            query.stop()
        if self.topics.size(topic) != rows:
            raise RuntimeError(f"PostgresSource sent {self.topics.size(topic)} rows, not {rows}")
        return seconds, detail

    def produce(self, topic: str, rows: int, size: int) -> tuple[float, dict[str, Any]]:
        completed = subprocess.run(
            [
                *FERRY,
                "bench",
                "produce",
                "--namesrv",
                self.servers,
                "--topic",
                topic,
                "--size",
                str(max(8, size)),
                "--count",
                str(rows),
                "--window",
                "256",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"ferry bench produce failed: {completed.stderr[-2000:]}")
        report = json.loads(completed.stdout.strip().splitlines()[-1])
        if report["errors"] or report["messages"] != rows:
            raise RuntimeError(f"ferry bench produce: {report}")
        return float(report["seconds"]), {"p99_ms": report["p99_ms"]}


def _alternate(
    bench: _Bench, jobs: list[tuple[str, Callable[[int], float]]]
) -> dict[str, list[float]]:
    """Each job `repeat` times; the order rotates every round (who goes first alternates)."""
    runs: dict[str, list[float]] = {name: [] for name, _ in jobs}
    for round_ in range(bench.config.repeat):
        shift = round_ % len(jobs)
        for name, job in jobs[shift:] + jobs[:shift]:
            bench.progress(f"{name} {round_ + 1}/{bench.config.repeat}")
            runs[name].append(job(round_))
    return runs


def _median_row(
    group: str, system: str, rows: int, size: int, runs: list[float], detail: dict[str, Any]
) -> ThroughputRow:
    return ThroughputRow(group, system, rows, size, statistics.median(runs), tuple(runs), detail)


def _measure_sink(bench: _Bench, result: ConnectorsBenchResult) -> None:
    config = bench.config
    n = config.rows
    documents = [_document(i) for i in range(n)]
    bodies = [json.dumps(d, separators=(",", ":")).encode() for d in documents]
    size = round(sum(map(len, bodies)) / n)
    copy_rows = [_copy_row(d) for d in documents]
    del documents
    bench.progress(f"producing {n:,} JSON messages for the PostgreSQL sink")
    asyncio.run(_create_topics(bench.servers, "BenchPgSink", "BenchPgWarm"))
    asyncio.run(_produce(bench.servers, "BenchPgSink", bodies))
    asyncio.run(_produce(bench.servers, "BenchPgWarm", bodies[:2000]))
    if config.warmup:
        bench.progress("warming up (PostgresSink, JDBC)")
        bench.pg_sink("BenchPgWarm", min(n, 2000), "warm_sink")
        if bench.jdbc:
            bench.pg_jdbc("BenchPgWarm", min(n, 2000), "warm_jdbc")
    details: dict[str, dict[str, Any]] = {}

    def sink(round_: int) -> float:
        seconds, details["sink"] = bench.pg_sink("BenchPgSink", n, f"sink_{round_}")
        return seconds

    jobs: list[tuple[str, Callable[[int], float]]] = [
        ("PostgresSink", sink),
        ("psycopg COPY", lambda r: bench.pg_copy(copy_rows, f"copy_{r}")),
    ]
    if bench.jdbc:
        jobs.append(("Spark JDBC", lambda r: bench.pg_jdbc("BenchPgSink", n, f"jdbc_{r}")))
    else:
        result.skipped["Spark JDBC"] = (
            f"{config.jdbc_jar} is missing (apt-get install libpostgresql-jdbc-java)"
        )
    runs = _alternate(bench, jobs)
    for name, _ in jobs:
        detail = details.get("sink", {}) if name == "PostgresSink" else {}
        result.rows.append(_median_row("postgres sink", name, n, size, runs[name], detail))
    # steady: the query already running; the same rows produced into its topic
    warm = bodies[: min(n, 1000)]

    def steady(round_: int) -> float:
        seconds, details["steady"] = bench.pg_sink_steady(
            warm, bodies, f"BenchPgSteady{round_}", f"steady_{round_}"
        )
        return seconds

    steady_jobs: list[tuple[str, Callable[[int], float]]] = [
        ("PostgresSink", steady),
        ("psycopg COPY", lambda r: bench.pg_copy(copy_rows, f"steady_copy_{r}")),
    ]
    if bench.jdbc:
        steady_jobs.append(
            (
                "Spark JDBC",
                lambda r: bench.pg_jdbc_steady(
                    warm, bodies, f"BenchJdbcSteady{r}", f"steady_jdbc_{r}"
                ),
            )
        )
    runs = _alternate(bench, steady_jobs)
    for name, _ in steady_jobs:
        detail = details.get("steady", {}) if name == "PostgresSink" else {}
        result.rows.append(_median_row("postgres sink steady", name, n, size, runs[name], detail))


def _measure_write(bench: _Bench, result: ConnectorsBenchResult) -> None:
    config = bench.config
    n = config.rows
    # FileSource: JSON lines of exactly `size` bytes in 4 files, moved into the directory
    directory = bench.work / "files-in"
    staging = bench.work / "files-staging"
    for path in (directory, staging):
        path.mkdir(parents=True, exist_ok=True)
    parts = 4
    for part in range(parts):
        target = staging / f"part-{part}.json"
        with target.open("w") as out:
            for i in range(part, n, parts):
                out.write(_sized_line(i, config.size) + "\n")
        target.rename(directory / target.name)
    line_size = round(sum(p.stat().st_size for p in directory.iterdir()) / n) - 1
    warm = bench.work / "files-warm"
    warm.mkdir()
    (warm / "w.json").write_text("".join(_sized_line(i, config.size) + "\n" for i in range(2000)))
    # PostgresSource: a table of the same rows
    with bench.pg.connect() as conn:
        conn.execute(
            "CREATE TABLE src_rows (id bigint PRIMARY KEY, customer text, amount numeric(12,2), "
            "at timestamptz, note text)"
        )
        with (
            conn.transaction(),
            conn.cursor().copy("COPY src_rows (id, customer, amount, at, note) FROM STDIN") as copy,
        ):
            for i in range(n):
                copy.write_row(_copy_row(_document(i)))
        conn.execute("CREATE TABLE src_warm AS SELECT * FROM src_rows WHERE id < 2000")
        conn.execute("ALTER TABLE src_warm ADD PRIMARY KEY (id)")
    topics = [f"BenchFile{r}" for r in range(config.repeat)]
    topics += [f"BenchProduce{r}" for r in range(config.repeat)]
    topics += [f"BenchPgSrc{r}src_rows" for r in range(config.repeat)]
    topics += [f"BenchProduceP{r}" for r in range(config.repeat)]
    topics += ["BenchFileWarm", "BenchPgSrcWarmsrc_warm"]
    asyncio.run(_create_topics(bench.servers, *topics))
    if config.warmup:
        bench.progress("warming up (FileSource, PostgresSource)")
        bench.file_source(warm, "BenchFileWarm", 2000)
        bench.pg_source("src_warm", "BenchPgSrcWarmsrc_warm", 2000)
    details: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}

    def source_size() -> int:
        """The mean body PostgresSource made (round 0's source job runs before its produce)."""
        if "source" not in sizes:
            sample = bench.topics.bodies("BenchPgSrc0src_rows", 500)
            sizes["source"] = round(statistics.mean(map(len, sample)))
        return sizes["source"]

    def files(round_: int) -> float:
        seconds, details["FileSource"] = bench.file_source(directory, f"BenchFile{round_}", n)
        return seconds

    def produce(round_: int) -> float:
        seconds, details["produce"] = bench.produce(f"BenchProduce{round_}", n, line_size)
        return seconds

    def source(round_: int) -> float:
        topic = f"BenchPgSrc{round_}src_rows"
        seconds, details["PostgresSource"] = bench.pg_source("src_rows", topic, n)
        return seconds

    def produce_p(round_: int) -> float:
        seconds, details["produceP"] = bench.produce(f"BenchProduceP{round_}", n, source_size())
        return seconds

    runs = _alternate(
        bench,
        [
            ("FileSource", files),
            ("produce --window 256", produce),
            ("PostgresSource", source),
            ("produce --window 256 (PostgresSource size)", produce_p),
        ],
    )
    for name, size, key in (
        ("FileSource", line_size, "FileSource"),
        ("produce --window 256", line_size, "produce"),
        ("PostgresSource", source_size(), "PostgresSource"),
        ("produce --window 256 (PostgresSource size)", source_size(), "produceP"),
    ):
        result.rows.append(
            _median_row("ferrymq write", name, n, size, runs[name], details.get(key, {}))
        )


def _measure_latency(bench: _Bench, result: ConnectorsBenchResult) -> None:
    from ferrymq.connectors.postgres_sink import PostgresSink
    from ferrymq.connectors.postgres_source import PostgresSource

    config = bench.config
    with bench.pg.connect() as conn:
        conn.execute("CREATE TABLE lat_src (id bigserial PRIMARY KEY, payload text NOT NULL)")
        conn.execute("CREATE TABLE lat_dst (id bigint NOT NULL, payload text)")
    topic = "BenchLat_lat_src"
    asyncio.run(_create_topics(bench.servers, topic))
    interval = str(config.interval_ms)
    source_context, sink_context = bench.context("lat-source"), bench.context("lat-sink")
    source = PostgresSource().build(
        bench.spark,
        {
            "name": source_context.connector,
            "connector.class": "PostgresSource",
            "connection.url": bench.pg.url("bench", password=False),
            "connection.password": _PG_PASSWORD,
            "mode": "incrementing",
            "incrementing.column.name": "id",
            "table.whitelist": "lat_src",
            "topic.prefix": "BenchLat_",
            "poll.interval.ms": interval,
        },
        source_context,
    )
    sink = PostgresSink().build(
        bench.spark,
        {
            "name": sink_context.connector,
            "connector.class": "PostgresSink",
            "topics": topic,
            "connection.url": bench.pg.url("bench", password=False),
            "connection.password": _PG_PASSWORD,
            "table.name.format": "lat_dst",
            "fields": "id bigint not null, payload text",
            "trigger.interval.ms": interval,
        },
        sink_context,
    )
    stop = threading.Event()
    inserted: list[int] = []

    def insert() -> None:
        with bench.pg.connect() as conn:
            period = 1 / config.latency_rate
            next_at = time.perf_counter()
            while not stop.is_set():
                found = conn.execute(
                    "INSERT INTO lat_src (payload) VALUES (%s) RETURNING id", ["x" * 64]
                ).fetchone()
                if found is not None:
                    inserted.append(int(found[0]))
                next_at += period
                time.sleep(max(0.0, next_at - time.perf_counter()))

    inserter = threading.Thread(target=insert, name="bench-latency-insert", daemon=True)
    try:
        inserter.start()
        bench.progress("latency: waiting for the first copied row")
        _wait("the first copied row", lambda: bench.count("lat_dst") > 0, source, 120)
        time.sleep(2)  # both queries in their steady rhythm
        first = inserted[-1] + 1
        bench.progress(f"latency: {config.latency_seconds:.0f} s at {config.latency_rate:.0f}/s")
        time.sleep(config.latency_seconds)
        last = inserted[-1]
        stop.set()
        inserter.join(10)

        def copied() -> bool:
            with bench.pg.connect() as conn:
                found = conn.execute(
                    "SELECT count(*) FROM lat_dst WHERE id BETWEEN %s AND %s", [first, last]
                ).fetchone()
            return found is not None and int(found[0]) >= last - first + 1

        _wait("every measured row copied", copied, sink, 120)
    finally:
        stop.set()
        source.stop()
        sink.stop()
    with bench.pg.connect() as conn:
        latencies = [
            float(row[0])
            for row in conn.execute(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(d.xmin) - "
                "pg_xact_commit_timestamp(s.xmin)) * 1000 FROM lat_src s JOIN lat_dst d "
                "USING (id) WHERE s.id BETWEEN %s AND %s",
                [first, last],
            )
        ]
    if len(latencies) != last - first + 1:
        raise RuntimeError(f"latency: {len(latencies)} copies of {last - first + 1} rows")
    ordered = sorted(latencies)
    result.latency = Latency(
        rows=len(ordered),
        rate=config.latency_rate,
        interval_ms=config.interval_ms,
        p50_ms=round(ordered[len(ordered) // 2], 1),
        p99_ms=round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        max_ms=round(ordered[-1], 1),
        mean_ms=round(statistics.mean(ordered), 1),
    )


@contextlib.contextmanager
def _spark_session(jar: Path | None) -> Iterator[Any]:
    """The ferrymq local session, with the JDBC driver on its class path when `jar` is given."""
    from ferrymq.spark.session import local_session

    saved = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if jar is not None:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {jar} pyspark-shell"
    try:
        spark = local_session("ferrymq-bench-connectors", SPARK_MASTER)
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = saved
    try:
        yield spark
    finally:
        spark.stop()


def _in_spark(
    servers: str,
    pg: _Postgres,
    work: Path,
    config: ConnectorsBenchConfig,
    progress: Callable[[str], None],
) -> ConnectorsBenchResult:
    """Start Spark and measure, in one thread.

    Spark finds a Python sink in the calling thread's session (`bench_spark._in_spark`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result = ConnectorsBenchResult()
    jdbc = config.jdbc_jar.is_file()
    progress("starting Spark")
    with _spark_session(config.jdbc_jar if jdbc else None) as spark:
        topics = _Topics(servers)
        try:
            bench = _Bench(spark, servers, pg, work, config, progress, topics, jdbc)
            _measure_sink(bench, result)
            _measure_write(bench, result)
            if config.latency_seconds > 0:
                _measure_latency(bench, result)
        finally:
            topics.close()
    return result


async def run_connectors_bench(
    config: ConnectorsBenchConfig, progress: Callable[[str], None]
) -> ConnectorsBenchResult:
    """Start the servers, measure every job, stop everything.

    Raises:
        RuntimeError: a server did not start, or a job failed or lost rows.
    """
    work = Path(tempfile.mkdtemp(prefix="ferrymq-bench-connectors-"))
    children: list[Child] = []
    pg: _Postgres | None = None
    try:
        progress("starting a NameServer, a broker and PostgreSQL")
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
        pg = await asyncio.to_thread(_start_postgres)
        return await asyncio.to_thread(_in_spark, namesrv.addr, pg, work, config, progress)
    finally:
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        for child in reversed(children):
            await child.stop()
        shutil.rmtree(work, ignore_errors=True)
