"""`PostgresSink`: ferrymq topics into PostgreSQL tables, exactly once (issue 19).

Implements connect-anchors.md section 4.3, mode offsets: a task is one streaming query,
`readStream.format("ferrymq")` (no shuffle: one Spark partition per queue range) into
`writeStream.format("ferrymq-postgres")`, this module's `DataSourceStreamArrowWriter`. Config
keys follow Kafka Connect and Confluent's JDBC sink (`PostgresSink.keys`; docs/connect.md).
`trigger.interval.ms` defaults to 200 ms (`runtime.TRIGGER_INTERVAL_MS` says why).

Exactly once, whatever Spark replays or whoever owns the task (rules):
1. Each writer task (one queue range of one micro-batch) is ONE PostgreSQL transaction: it
   inserts the missing rows of `ferry_connect_offsets` for its queues (ON CONFLICT DO NOTHING)
   and locks them (SELECT ... FOR UPDATE); it skips every message whose offset is below the
   stored `next_offset` (written by an earlier attempt, a replay or another owner); it COPYs the
   rest into the table (insert mode) or into a temporary table merged with INSERT ... ON
   CONFLICT (pk) DO UPDATE (upsert mode); it sets `next_offset` to the highest offset it handled
   + 1 and the row's owner (task, generation); then it commits. Rows and offsets land together
   or not at all, so Spark's driver-side commit has nothing left to do: a crash between the
   PostgreSQL commit and Spark's `commits/<batch>` replays the batch, and every row of it is
   skipped.
2. The stored offsets are the truth and the Spark checkpoint a cache: a task whose checkpoint is
   missing (a new owner elsewhere, an offsets change) starts each of its queues at the stored
   `next_offset` (startingOffsets JSON by (broker group, queue id)), the others at
   `startingOffsets` (earliest by default). A queue range never starts above the stored offset
   (a writer's checkpoint only moves past what it committed), so skipping below it loses nothing.
3. Fencing: `build` claims the task's queues (their rows take its task and generation) before
   the query starts, and a writer whose task's stored generation is higher than its own rolls
   back and fails with `FencedError`, so a zombie owner's in-flight and next transactions are
   refused once a newer owner has started. Generations of different tasks are not comparable; a
   queue that moved to another task (tasks.max changed) is taken over by it, and two writers of
   one queue stay exact by rule 1 (the lock serialises them, the skip drops what one already
   wrote).
4. Offsets are keyed by (connector, incarnation, topic, broker, queue): a deleted and re-created
   connector starts afresh; to carry offsets over, create it STOPPED and PATCH its offsets.
   `offsets` reads them (GET /connectors/{c}/offsets), `check_offsets` vets a PATCH, and
   `apply_offsets` applies an offsets change once (recorded by request id in
   `ferry_connect_offsets_changes`), called by `build` at the task's start.
5. Malformed messages (`postgres_columns.row_of`) fail the task (`errors.tolerance=none`) or go
   to `errors.deadletterqueue.topic.name` with the reason in the `__connect.errors.*`
   properties (`all`), sent before the transaction commits: at least once, like Kafka Connect's
   dead-letter queue (a crash between the send and the commit sends them again; the properties
   name the source topic, broker, queue and offset).
6. A wrong password, an unreachable server, a missing table (auto.create=false) or a fenced
   writer raise `PostgresConnectorError` naming the database without its password: from `build`
   (the task shows FAILED with the trace) or from the writer (the query ends with it).
7. Bulk mapping: a queue run of at least `BULK_ROWS` rows at or above its stored offset is
   first mapped as a whole (`postgres_columns.bulk_reader`: one msgspec decode of the run, Arrow
   checks) and COPYed as CSV written by Arrow, `batch.size` rows per COPY, instead of row by row
   through psycopg. A run it does not take as it is (one malformed body, a value it cannot
   vouch for) is mapped body by body as before, so reasons, dead letters, skips, upsert order,
   the fence and the offsets are the same either way (tests/connectors/test_sink_bulk.py
   stores the same messages both ways and compares the tables).

8. Ranges (`ferrymq.read.mode=ranges`, the default): the query's source is the same
   `readStream.format("ferrymq")` planning the same queue ranges from the same offsets (the
   checkpoint, initialOffsets, maxOffsetsPerTrigger, route changes, queue moves), with
   `rowsAs=ranges`: a Spark task gets one row naming its range, and the writer pulls the range's
   messages itself with the reader's code (`source.read_partition`: failover waits,
   failOnDataLoss) and hands them to rules 1-7 as message rows. A replayed batch or a retried
   task names the same ranges, so rule 1 skips what it wrote. `rows` reads the message rows
   through Spark instead (slower, docs/benchmarks.md). `ranges` was the default once and set
   back after one CI run of the kill -9 crash test failed in it with
   java.io.OptionalDataException in Spark's task deserialization, in both of the driver's
   queries at once after the restart. The one mechanism found that gives exactly that
   (spark/registration.py, fixed): the registered source's env HashMap, shared by every task
   binary of every query, corrupted by two queries' source runners putting their keys at once.
   It was never reproduced here; since the fix the sink's exactly-once tests (test_postgres_sink,
   the crash test, test_sink_retry) pass in `ranges`, and workers retry failed tasks
   (`runtime.SPARK_MASTER`; a corrupted map would fail every retry too, so retries do not hide
   that failure).

9. Computed columns (`fields.expressions`, `postgres_expressions`): Spark evaluates the
   expressions over each message row in the query (`_computed`) and the writer gets, for each
   message, its topic, partition, offset and key as they were and a body that is the JSON object
   of the computed columns (`to_json`; a NULL is a missing field), which rules 1-7 map by
   `fields` as any body: the offsets still commit with the rows. Spark rows are needed, so
   expressions read in `rows` mode (the default when they are set; `ranges` with them is a
   config error). A dead letter then carries the computed JSON. An expression Spark refuses
   fails the task's start with Spark's message (`/status` shows FAILED with it).

Task split: `tasks.max` tasks; with one, the query subscribes to the topics (queues that appear
later join). With more, a task reads the queues whose `(crc32(topic) + stable partition) %
tasks` is its index (docs/spark.md "The stable partition number"), listed when it starts and
named with `assign`: a route change moves no queue between tasks, and a queue added later is
read once the tasks restart.

Test-only failed attempts (with `FERRYMQ_TEST_HOOKS=1` in the driver at `build`):
`FERRYMQ_TEST_FAIL_FIRST_ATTEMPTS=<directory>` makes every writer task's first attempt fail right
after its PostgreSQL commit (a file in the directory names it), so Spark retries it on a master
that retries tasks (`runtime.SPARK_MASTER`) and the retry skips all it would write (rule 1).

Test-only crash point (honoured only with `FERRYMQ_TEST_HOOKS=1`):
`FERRYMQ_TEST_CRASH_AT=after_pg_commit_before_spark_commit` (optionally
`FERRYMQ_TEST_CRASH_BATCH=<batch id>`) kills the driver, JVM included, in the driver-side commit
of a micro-batch, after every writer task's PostgreSQL commit and before Spark records the batch.
The driver is `FERRYMQ_TEST_CRASH_PID`, else the parent of the JVM that started the commit's
Python process.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import os
import signal
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import psycopg
from psycopg import sql
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ferrymq.connect.plugin import (
    ConfigKey,
    ConfigType,
    ConnectorPlugin,
    OffsetsScope,
    TaskContext,
)
from ferrymq.connect.records import OffsetEntry, OffsetsPut
from ferrymq.connectors.postgres import (
    CONNECTION_KEYS,
    FencedError,
    PgTarget,
    PostgresConnectorError,
    parse_target,
    qualified,
    table_name,
)
from ferrymq.connectors.postgres_columns import Column, bulk_reader, parse_fields, row_reader
from ferrymq.connectors.postgres_expressions import EXPRESSIONS_KEY, parse_expressions
from ferrymq.connectors.runtime import TRIGGER_INTERVAL_MS
from ferrymq.connectors.selection import list_value, topic_selection_errors
from ferrymq.model import validate_topic
from ferrymq.spark.plan import (
    QueueKey,
    QueueRange,
    group_code,
    partition_queue,
    stable_partition,
)
from ferrymq.spark.registration import register_data_source
from ferrymq.spark.rows import range_of

__all__ = [
    "CHANGES_TABLE",
    "CRASH_POINT",
    "FAIL_FIRST_ATTEMPTS_ENV",
    "FORMAT",
    "OFFSETS_TABLE",
    "READ_MODES",
    "PostgresSink",
    "PostgresSinkDataSource",
    "PostgresStreamWriter",
    "SinkCommit",
    "SinkSpec",
    "create_offsets_tables",
    "sink_spec",
    "task_owner",
    "write_task",
]

log = logging.getLogger(__name__)

FORMAT: Final = "ferrymq-postgres"
OFFSETS_TABLE: Final = "ferry_connect_offsets"
CHANGES_TABLE: Final = "ferry_connect_offsets_changes"
CRASH_POINT: Final = "after_pg_commit_before_spark_commit"
FAIL_FIRST_ATTEMPTS_ENV: Final = "FERRYMQ_TEST_FAIL_FIRST_ATTEMPTS"
"""Test hook: with `FERRYMQ_TEST_HOOKS=1` in the driver, every writer task's first attempt fails
after its commit and leaves a file in this directory (`fail_first_attempt`)."""
BULK_ROWS: Final = 64
"""A queue run of at least this many rows is first tried on the bulk path (rule 7)."""

_OFFSETS_DDL: Final = f"""
CREATE TABLE IF NOT EXISTS {OFFSETS_TABLE} (
    connector text NOT NULL,
    incarnation text NOT NULL,
    topic text NOT NULL,
    broker text NOT NULL,
    queue integer NOT NULL,
    next_offset bigint NOT NULL,
    task integer NOT NULL,
    generation bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, incarnation, topic, broker, queue)
);
CREATE TABLE IF NOT EXISTS {CHANGES_TABLE} (
    connector text NOT NULL,
    incarnation text NOT NULL,
    request_id text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, incarnation, request_id)
)
"""
_DDL_LOCK: Final = 0x4645525259  # "FERRY": serialises CREATE TABLE IF NOT EXISTS across tasks
_PASSED_READ_OPTIONS: Final = ("failOnDataLoss",)
"""Sink config keys that are ferrymq read options (of the reader, or of a ranges writer)."""
READ_MODES: Final = ("ranges", "rows")
"""The first is the default (rule 8), `rows` with `fields.expressions` (rule 9)."""
_KEY: Final = "connector = %s AND incarnation = %s AND topic = %s AND broker = %s AND queue = %s"


class SinkSpec(msgspec.Struct, frozen=True):
    """Everything a writer task needs (a Spark option as JSON; no password in it)."""

    connector: str
    incarnation: str
    task: int
    generation: int
    target: PgTarget
    table_format: str
    upsert: bool
    pk_fields: tuple[str, ...]
    columns: tuple[Column, ...]
    auto_create: bool
    dead_letter_topic: str | None
    tolerate_errors: bool
    batch_size: int
    servers: str
    read_options: dict[str, str] = msgspec.field(default_factory=dict)
    """The ferrymq read options a writer pulls its ranges with (`ferrymq.read.mode=ranges`)."""
    groups: dict[str, dict[int, str]] = msgspec.field(default_factory=dict)
    """Per topic, the broker group of each group code (the stable partition numbers' upper
    bits) routed when the task started; a writer looks a code missing here up in the route."""
    test_fail_first_attempts: str | None = None
    """Test hook (`FAIL_FIRST_ATTEMPTS_ENV`): a directory; each writer task's first attempt
    records itself there and fails right after its PostgreSQL commit."""

    def table(self, topic: str) -> tuple[str | None, str]:
        """(schema, table) the messages of `topic` go to."""
        return table_name(self.table_format.replace("${topic}", topic))


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one writer task did: rows written, skipped (below the stored offsets), dead-lettered."""

    written: int = 0
    skipped: int = 0
    dead: int = 0
    next_offsets: dict[str, int] = field(default_factory=dict)
    """topic/broker/queue -> the stored next offset after the commit."""


def task_owner(topic: str, queue: QueueKey, tasks: int) -> int:
    """Which of `tasks` tasks reads a queue (a function of names alone: routes do not move it)."""
    number = stable_partition(queue.broker_name, queue.queue_id)
    return (zlib.crc32(topic.encode()) + number) % tasks


# ------------------------------------------------------------------------ config


def _bool(config: Mapping[str, str], key: str, default: bool) -> bool:
    return (config.get(key) or str(default)).strip().lower() == "true"


def read_mode(config: Mapping[str, str]) -> str:
    """`ferrymq.read.mode`, else `rows` with `fields.expressions` and `ranges` without."""
    given = (config.get("ferrymq.read.mode") or "").strip()
    if given:
        return given
    return "rows" if (config.get(EXPRESSIONS_KEY) or "").strip() else READ_MODES[0]


def _config_errors(config: Mapping[str, str]) -> dict[str, list[str]]:
    errors = topic_selection_errors(config)

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    try:
        parse_target(config)
    except ValueError as exc:
        add("connection.url", str(exc))
    form = config.get("table.name.format") or "${topic}"
    for topic in list_value(config, "topics") or ["topic"]:
        try:
            table_name(form.replace("${topic}", topic))
        except ValueError as exc:
            add("table.name.format", str(exc))
    upsert = (config.get("insert.mode") or "insert") == "upsert"
    by_value = (config.get("pk.mode") or "none") == "record_value"
    keys = list_value(config, "pk.fields")
    if upsert and not by_value:
        add("pk.mode", "insert.mode=upsert needs pk.mode=record_value and pk.fields")
    if by_value and not keys:
        add("pk.fields", "pk.mode=record_value needs the key columns in pk.fields")
    if keys and not by_value:
        add("pk.fields", "pk.fields is set but pk.mode is none")
    try:
        columns = parse_fields(config.get("fields") or "", keys)
    except ValueError as exc:
        add("fields", str(exc))
        columns = ()
    expressions = (config.get(EXPRESSIONS_KEY) or "").strip()
    if expressions:
        if columns:
            try:
                parse_expressions(expressions, columns)
            except ValueError as exc:
                add(EXPRESSIONS_KEY, str(exc))
        if read_mode(config) == "ranges":
            add(
                "ferrymq.read.mode",
                f"{EXPRESSIONS_KEY} are evaluated by Spark over the message rows: they need "
                f"ferrymq.read.mode=rows (the default when {EXPRESSIONS_KEY} is set)",
            )
    dead = (config.get("errors.deadletterqueue.topic.name") or "").strip()
    if dead:
        try:
            validate_topic(dead)
        except ValueError as exc:
            add("errors.deadletterqueue.topic.name", str(exc))
    return errors


def sink_spec(config: Mapping[str, str], context: TaskContext) -> SinkSpec:
    """A task's spec from its config.

    Raises:
        PostgresConnectorError: the config is invalid (what `validate` reports).
    """
    errors = _config_errors(config)
    if errors:
        details = "; ".join(f"{key}: {' '.join(found)}" for key, found in sorted(errors.items()))
        raise PostgresConnectorError(f"invalid PostgresSink config: {details}")
    keys = tuple(list_value(config, "pk.fields"))
    dead = (config.get("errors.deadletterqueue.topic.name") or "").strip() or None
    return SinkSpec(
        connector=context.connector,
        incarnation=context.incarnation,
        task=context.task,
        generation=context.generation,
        target=parse_target(config).without_password(),
        table_format=config.get("table.name.format") or "${topic}",
        upsert=(config.get("insert.mode") or "insert") == "upsert",
        pk_fields=keys,
        columns=parse_fields(config.get("fields") or "", keys),
        auto_create=_bool(config, "auto.create", False),
        dead_letter_topic=dead,
        tolerate_errors=(config.get("errors.tolerance") or "none") == "all",
        batch_size=int(config.get("batch.size") or "3000"),
        servers=context.namesrv_addr,
        read_options={k: config[k] for k in _PASSED_READ_OPTIONS if config.get(k)},
        test_fail_first_attempts=(
            os.environ.get(FAIL_FIRST_ATTEMPTS_ENV) or None
            if os.environ.get("FERRYMQ_TEST_HOOKS") == "1"
            else None
        ),
    )


# ------------------------------------------------------------------------ tables


def create_offsets_tables(conn: psycopg.Connection[Any]) -> None:
    """Create `ferry_connect_offsets` and `ferry_connect_offsets_changes` if missing (`build`)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_DDL_LOCK])
        for statement in _OFFSETS_DDL.split(";"):
            conn.execute(statement.encode())


def _ensure_table(conn: psycopg.Connection[Any], spec: SinkSpec, topic: str) -> None:
    """The topic's table exists (created from the fields with auto.create), inside a transaction.

    Raises:
        PostgresConnectorError: it does not exist and auto.create is false, or it lacks a column.
    """
    schema, table = spec.table(topic)
    name = qualified(schema, table)
    found = conn.execute("SELECT to_regclass(%s)", [name.as_string(conn)]).fetchone()
    if found is None or found[0] is None:
        # only a creation takes the lock (held to the end of the caller's transaction)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_DDL_LOCK])
        found = conn.execute("SELECT to_regclass(%s)", [name.as_string(conn)]).fetchone()
    if found is None or found[0] is None:
        if not spec.auto_create:
            raise PostgresConnectorError(
                f"table {name.as_string(conn)} does not exist in {spec.target.display} and "
                "auto.create is false: create it, or set auto.create=true"
            )
        parts = [
            sql.SQL("{} {}{}").format(
                sql.Identifier(c.name),
                sql.SQL(c.sql_type),
                sql.SQL(" NOT NULL" if c.not_null else ""),
            )
            for c in spec.columns
        ]
        if spec.pk_fields:
            keys = sql.SQL(", ").join(sql.Identifier(k) for k in spec.pk_fields)
            parts.append(sql.SQL("PRIMARY KEY ({})").format(keys))
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(name, sql.SQL(", ").join(parts))
        )
        log.info("PostgresSink %s: created table %s", spec.connector, name.as_string(conn))
        return
    have = {
        row[0]
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped",
            [name.as_string(conn)],
        )
    }
    missing = [c.name for c in spec.columns if c.name not in have]
    if missing:
        raise PostgresConnectorError(
            f"table {name.as_string(conn)} in {spec.target.display} has no column "
            f"{', '.join(missing)} (named in fields)"
        )


def _queue_name(topic: str, key: QueueKey) -> str:
    return f"{topic}/{key.broker_name}/{key.queue_id}"


# ------------------------------------------------------------------------ offsets


def _partition(entry: OffsetEntry) -> tuple[str, QueueKey]:
    partition = entry.partition
    topic, broker, queue = partition.get("topic"), partition.get("broker"), partition.get("queue")
    if not isinstance(topic, str) or not isinstance(broker, str) or not topic or not broker:
        raise ValueError(
            f"partition {partition}: name a queue as "
            '{"topic": "orders", "broker": "broker-a", "queue": 0}'
        )
    if isinstance(queue, str) and queue.isdecimal():
        queue = int(queue)
    if not isinstance(queue, int) or not 0 <= queue < 1024:
        raise ValueError(f"partition {partition}: queue is a queue id, 0..1023")
    return topic, QueueKey(broker, queue)


def _offset(entry: OffsetEntry) -> int | None:
    if entry.offset is None:
        return None
    value = entry.offset.get("offset")
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    if not isinstance(value, int) or value < 0 or set(entry.offset) != {"offset"}:
        raise ValueError(
            f"offset {entry.offset} of partition {entry.partition}: give "
            '{"offset": <next offset to write, >= 0>} or null to reset it'
        )
    return value


def _apply_change(conn: psycopg.Connection[Any], connector: str, change: OffsetsPut) -> bool:
    with conn.transaction():
        applied = conn.execute(
            f"INSERT INTO {CHANGES_TABLE} (connector, incarnation, request_id) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING 1",
            [connector, change.incarnation, change.request_id],
        ).fetchone()
        if applied is None:
            return False
        if change.offsets is None:
            conn.execute(
                f"DELETE FROM {OFFSETS_TABLE} WHERE connector = %s AND incarnation = %s",
                [connector, change.incarnation],
            )
            return True
        for entry in change.offsets:
            topic, key = _partition(entry)
            where = [connector, change.incarnation, topic, key.broker_name, key.queue_id]
            offset = _offset(entry)
            if offset is None:
                conn.execute(f"DELETE FROM {OFFSETS_TABLE} WHERE {_KEY}", where)
                continue
            conn.execute(
                f"INSERT INTO {OFFSETS_TABLE} (connector, incarnation, topic, broker, queue, "
                "next_offset, task, generation) VALUES (%s, %s, %s, %s, %s, %s, -1, 0) "
                "ON CONFLICT (connector, incarnation, topic, broker, queue) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
                [*where, offset],
            )
    return True


def _claim(
    conn: psycopg.Connection[Any], spec: SinkSpec, queues: Sequence[tuple[str, QueueKey]]
) -> dict[tuple[str, QueueKey], int]:
    """The stored next offsets of the task's queues, which now name the task and its generation.

    Raises:
        FencedError: a newer generation of this task has claimed one of them.
    """
    wanted = set(queues)
    stored: dict[tuple[str, QueueKey], int] = {}
    with conn.transaction():
        rows = conn.execute(
            f"SELECT topic, broker, queue, next_offset, task, generation FROM {OFFSETS_TABLE} "
            "WHERE connector = %s AND incarnation = %s FOR UPDATE",
            [spec.connector, spec.incarnation],
        ).fetchall()
        for topic, broker, queue, next_offset, task, generation in rows:
            key = (topic, QueueKey(broker, queue))
            if key not in wanted:
                continue
            if task == spec.task and generation > spec.generation:
                raise FencedError(
                    f"PostgresSink {spec.connector} task {spec.task}: generation {generation} "
                    f"owns {_queue_name(*key)} in {spec.target.display}; this owner "
                    f"(generation {spec.generation}) is a zombie and must not start"
                )
            stored[key] = next_offset
        conn.cursor().executemany(
            f"UPDATE {OFFSETS_TABLE} SET task = %s, generation = %s WHERE {_KEY}",
            [
                (
                    spec.task,
                    spec.generation,
                    spec.connector,
                    spec.incarnation,
                    t,
                    k.broker_name,
                    k.queue_id,
                )
                for t, k in stored
            ],
        )
    return stored


# ------------------------------------------------------------------------ the writer


class _TaskWrite:
    """One writer task: one transaction over its queue ranges (rule 1)."""

    def __init__(
        self, spec: SinkSpec, conn: psycopg.Connection[Any], bulk_rows: int = BULK_ROWS
    ) -> None:
        self.spec = spec
        self.conn = conn
        self.next: dict[tuple[str, QueueKey], int] = {}
        """The stored next offset of each locked queue."""
        self.queues: dict[tuple[str, Any], tuple[str, QueueKey]] = {}
        self.floor: dict[tuple[str, Any], int] = {}
        self.top: dict[tuple[str, Any], int] = {}
        """By (topic, partition number or (broker, queue id)): the queue, its stored next offset,
        the highest offset handled."""
        self.tables: dict[str, sql.Identifier] = {}
        self.stages: dict[str, sql.Identifier] = {}
        self.pending: dict[str, list[tuple[Any, ...]]] = {}
        self.dead: list[tuple[bytes | None, bytes | None, dict[str, str]]] = []
        self.result = SinkCommit()
        self.seq = 0
        self.groups = {topic: dict(codes) for topic, codes in spec.groups.items()}
        self.read = row_reader(spec.columns, copy_text=True)  # flush COPYs text
        self.bulk = bulk_reader(spec.columns) if bulk_rows else None
        self.bulk_rows = bulk_rows

    def lock(self, key: tuple[str, QueueKey]) -> None:
        topic, queue = key
        spec = self.spec
        where = [spec.connector, spec.incarnation, topic, queue.broker_name, queue.queue_id]
        self.conn.execute(
            f"INSERT INTO {OFFSETS_TABLE} (connector, incarnation, topic, broker, queue, "
            "next_offset, task, generation) VALUES (%s, %s, %s, %s, %s, 0, %s, %s) "
            "ON CONFLICT DO NOTHING",
            [*where, self.spec.task, self.spec.generation],
        )
        row = self.conn.execute(
            f"SELECT next_offset, task, generation FROM {OFFSETS_TABLE} WHERE {_KEY} FOR UPDATE",
            where,
        ).fetchone()
        assert row is not None
        next_offset, task, generation = row
        if task == self.spec.task and generation > self.spec.generation:
            raise FencedError(
                f"PostgresSink {self.spec.connector} task {self.spec.task}: generation "
                f"{generation} owns {_queue_name(*key)} in {self.spec.target.display}; the write "
                f"of generation {self.spec.generation} (a zombie) is rolled back"
            )
        self.next[key] = next_offset

    def table(self, topic: str) -> sql.Identifier:
        found = self.tables.get(topic)
        if found is None:
            _ensure_table(self.conn, self.spec, topic)
            found = self.tables[topic] = qualified(*self.spec.table(topic))
            self.pending[topic] = []
        return found

    def add(self, batch: Any) -> None:
        """Stage a batch's rows, a run of one queue's rows at a time (a range's come together)."""
        count = batch.num_rows
        if not count:
            return
        topics = batch.column("topic").to_pylist()
        offsets = batch.column("offset").to_pylist()
        values = batch.column("value").to_pylist()
        if "brokerName" in batch.schema.names:  # queues named by the ferrymq columns
            places: list[Any] = list(
                zip(
                    batch.column("brokerName").to_pylist(),
                    batch.column("queueId").to_pylist(),
                    strict=True,
                )
            )
        else:  # by stable partition number (what the task's query reads)
            places = batch.column("partition").to_pylist()
        if topics.count(topics[0]) == count and places.count(places[0]) == count:
            self.add_run(batch, (topics[0], places[0]), 0, offsets, values)
            return
        start = 0
        while start < count:
            end = start + 1
            while end < count and topics[end] == topics[start] and places[end] == places[start]:
                end += 1
            run = (topics[start], places[start])
            self.add_run(batch, run, start, offsets[start:end], values[start:end])
            start = end

    def add_run(
        self,
        batch: Any,
        coordinates: tuple[str, Any],
        first: int,
        offsets: list[int],
        values: list[bytes | None],
    ) -> None:
        """Stage the rows of one queue: rows `first`.. of `batch`, their offsets and bodies."""
        key = self.queues.get(coordinates)
        if key is None:
            topic, place = coordinates
            key = self.queues[coordinates] = (topic, self.queue_of(topic, place))
            self.lock(key)
            self.floor[coordinates] = self.next[key]
            self.table(topic)
        floor = self.floor[coordinates]
        indexes: Sequence[int] = range(first, first + len(offsets))
        if min(offsets) < floor:  # written by an earlier attempt, a replay or another owner
            kept = [i for i, offset in enumerate(offsets) if offset >= floor]
            self.result.skipped += len(offsets) - len(kept)
            if not kept:
                return
            indexes = [first + i for i in kept]
            offsets = [offsets[i] for i in kept]
            values = [values[i] for i in kept]
        self.add_rows(batch, key, coordinates, indexes, offsets, values)

    def add_rows(
        self,
        batch: Any,
        key: tuple[str, QueueKey],
        coordinates: tuple[str, Any],
        indexes: Sequence[int],
        offsets: list[int],
        values: list[bytes | None],
    ) -> None:
        """Map and stage rows of one queue at or above its stored offset (`indexes` in `batch`)."""
        highest = max(offsets)
        if highest > self.top.get(coordinates, -1):
            self.top[coordinates] = highest
        if self.bulk is not None and len(values) >= self.bulk_rows:
            table = self.bulk(values)
            if table is not None:  # every body fits as it is: rule 7
                self.copy_table(key[0], table)
                return
        rows: list[Any] = list(map(self.read, values))
        if any(type(row) is str for row in rows):
            good: list[Any] = []
            for i, row in enumerate(rows):
                if isinstance(row, str):
                    raw_key = batch.column("key")[indexes[i]].as_py()
                    self.malformed(key, offsets[i], raw_key, values[i], row)
                else:
                    good.append(row)
            rows = good
        topic = key[0]
        if self.spec.upsert:
            seq = self.seq
            rows = [(seq + i, *row) for i, row in enumerate(rows, 1)]
            self.seq += len(rows)
        self.result.written += len(rows)
        pending, limit, done = self.pending[topic], self.spec.batch_size, 0
        while done < len(rows):  # COPYs of `batch.size` rows
            room = limit - len(pending)
            pending.extend(rows[done : done + room])
            done += room
            if len(pending) >= limit:
                self.flush(topic)

    def queue_of(self, topic: str, place: Any) -> QueueKey:
        """The queue a row's (broker, queue id) or stable partition number names.

        Raises:
            PostgresConnectorError: no broker group of the topic's route has the number's code.
        """
        if isinstance(place, tuple):
            return QueueKey(*place)
        code, queue_id = partition_queue(place)
        groups = self.groups.setdefault(topic, {})
        broker = groups.get(code)
        if broker is None:  # a group that joined the route after the task started
            groups.update(asyncio.run(_route_groups(self.spec.servers, topic)))
            broker = groups.get(code)
        if broker is None:
            raise PostgresConnectorError(
                f"PostgresSink {self.spec.connector}: partition {place} of {topic} is queue "
                f"{queue_id} of the broker group with code {code}, which the topic's route "
                "does not have now; the task fails and a restart retries"
            )
        return QueueKey(broker, queue_id)

    def malformed(
        self,
        key: tuple[str, QueueKey],
        offset: int,
        msg_key: bytes | None,
        body: bytes | None,
        reason: str,
    ) -> None:
        where = f"{_queue_name(*key)} offset {offset}"
        if not self.spec.tolerate_errors:
            raise PostgresConnectorError(
                f"PostgresSink {self.spec.connector}: malformed message at {where}: {reason} "
                "(errors.tolerance=none fails the task; errors.tolerance=all sends such messages "
                "to errors.deadletterqueue.topic.name)"
            )
        self.result.dead += 1
        if self.spec.dead_letter_topic is None:
            log.warning(
                "PostgresSink %s: skipped malformed message at %s: %s",
                self.spec.connector,
                where,
                reason,
            )
            return
        self.dead.append(
            (
                msg_key,
                body,
                {
                    "__connect.errors.topic": key[0],
                    "__connect.errors.broker": key[1].broker_name,
                    "__connect.errors.queue": str(key[1].queue_id),
                    "__connect.errors.offset": str(offset),
                    "__connect.errors.connector.name": self.spec.connector,
                    "__connect.errors.task.id": str(self.spec.task),
                    "__connect.errors.stage": "VALUE_CONVERTER",
                    "__connect.errors.exception.message": reason,
                },
            )
        )

    def copy_table(self, topic: str, table: Any) -> None:
        """COPY a run's rows mapped in bulk (`bulk_reader`) as CSV, `batch.size` rows at a time.

        Rows staged before it are flushed first, so an upsert still merges in offset order.
        """
        import pyarrow as pa
        import pyarrow.csv as pa_csv

        self.flush(topic)
        count = table.num_rows
        self.result.written += count
        if self.spec.upsert:
            first = self.seq + 1
            self.seq += count
            table = table.add_column(0, "ferry_seq", pa.array(range(first, first + count)))
        options = pa_csv.WriteOptions(include_header=False)
        for start in range(0, count, self.spec.batch_size):
            data = pa.BufferOutputStream()
            pa_csv.write_csv(table.slice(start, self.spec.batch_size), data, options)
            self.flush(topic, memoryview(data.getvalue()))

    def flush(self, topic: str, csv: memoryview | None = None) -> None:
        """COPY the staged rows of `topic` (or `csv`: CSV rows); in upsert mode, merge them."""
        rows = self.pending[topic]
        if not rows and csv is None:
            return
        table = self.tables[topic]
        names = [sql.Identifier(c.name) for c in self.spec.columns]
        listed = sql.SQL(", ").join(names)
        form = sql.SQL(" (FORMAT csv)" if csv is not None else "")
        if not self.spec.upsert:
            with self.conn.cursor().copy(
                sql.SQL("COPY {} ({}) FROM STDIN{}").format(table, listed, form)
            ) as copy:
                if csv is not None:  # copy_table flushed the staged rows first
                    copy.write(csv)
                else:
                    for row in rows:
                        copy.write_row(row)
                    rows.clear()
            return
        stage = self.stages.get(topic)
        if stage is None:
            stage = self.stages[topic] = sql.Identifier(f"ferry_stage_{len(self.stages)}")
            declared = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type))
                for c in self.spec.columns
            )
            self.conn.execute(
                sql.SQL("CREATE TEMPORARY TABLE {} (ferry_seq bigint, {}) ON COMMIT DROP").format(
                    stage, declared
                )
            )
        with self.conn.cursor().copy(
            sql.SQL("COPY {} (ferry_seq, {}) FROM STDIN{}").format(stage, listed, form)
        ) as copy:
            if csv is not None:
                copy.write(csv)
            else:
                for row in rows:
                    copy.write_row(row)
                rows.clear()
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.spec.pk_fields)
        others = [c.name for c in self.spec.columns if c.name not in self.spec.pk_fields]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in others
                )
            )
            if others
            else sql.SQL("DO NOTHING")
        )
        # the last message of a key in this flush wins (ON CONFLICT cannot touch a row twice)
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {table} ({listed}) SELECT DISTINCT ON ({keys}) {listed} FROM {stage} "
                "ORDER BY {keys}, ferry_seq DESC ON CONFLICT ({keys}) {action}"
            ).format(table=table, listed=listed, keys=keys, stage=stage, action=action)
        )
        self.conn.execute(sql.SQL("TRUNCATE {}").format(stage))

    def finish(self) -> None:
        handled = {self.queues[c]: offset for c, offset in self.top.items()}
        for topic in self.pending:
            self.flush(topic)
        if self.dead and self.spec.dead_letter_topic is not None:
            asyncio.run(_send_dead(self.spec, self.spec.dead_letter_topic, self.dead))
        self.conn.cursor().executemany(
            f"UPDATE {OFFSETS_TABLE} SET next_offset = GREATEST(next_offset, %s), task = %s, "
            f"generation = %s, updated_at = now() WHERE {_KEY}",
            [
                (
                    handled.get(key, -1) + 1,
                    self.spec.task,
                    self.spec.generation,
                    self.spec.connector,
                    self.spec.incarnation,
                    key[0],
                    key[1].broker_name,
                    key[1].queue_id,
                )
                for key in self.next
            ],
        )
        for key, stored in self.next.items():
            self.result.next_offsets[_queue_name(*key)] = max(stored, handled.get(key, -1) + 1)


async def _route_groups(servers: str, topic: str) -> dict[int, str]:
    """The broker group of each group code in the topic's route now."""
    from ferrymq.client.consumer import PullConsumer

    async with PullConsumer(servers, "ferrymq-connect-sink") as consumer:
        return {group_code(q.broker_name): q.broker_name for q in await consumer.queues(topic)}


async def _ensure_topic(servers: str, topic: str, wait_s: float = 30.0) -> None:
    """Create the dead-letter topic (one queue, as Kafka's one partition) unless it is routed.

    Raises:
        PostgresConnectorError: it is not routed within `wait_s`.
    """
    import time

    from ferrymq.client.admin import AdminClient

    async with AdminClient(servers) as admin:
        if await admin.route(topic) is None:
            log.info("creating the dead-letter topic %s", topic)
            await admin.create_topic(topic, queues=1)
        deadline = time.monotonic() + wait_s
        while (route := await admin.route(topic)) is None or not route.queue_datas:
            if time.monotonic() > deadline:
                raise PostgresConnectorError(
                    f"the dead-letter topic {topic} has no route {wait_s:g} s after its creation"
                )
            await asyncio.sleep(0.2)


async def _send_dead(
    spec: SinkSpec, topic: str, dead: list[tuple[bytes | None, bytes | None, dict[str, str]]]
) -> None:
    from ferrymq.client.producer import Producer

    async with Producer(spec.servers, "ferrymq-connect-dlq") as producer:
        for key, body, properties in dead:
            await producer.send(
                topic,
                body or b"",
                keys=key.decode(errors="replace") if key else None,
                properties=properties,
            )


@functools.cache
def _freeze_heap() -> None:
    """Once per process: what is alive now (modules, classes, the plugin) leaves the collector.

    Spark's reused Python workers run a full `gc.collect()` after every task
    (`pyspark/daemon.py`), which walks every object PySpark, PyArrow, psycopg and ferrymq
    loaded: py-spy put ~23% of the writer processes' samples there. Frozen objects are skipped
    by every later collection; what a task allocates is still collected.
    """
    gc.collect()
    gc.freeze()


_MESSAGE_COLUMNS: Final = ("topic", "partition", "offset", "key", "value")


def _read_range(spec: SinkSpec, queue_range: QueueRange) -> Iterator[Any]:
    """A range's messages as Arrow batches of `_MESSAGE_COLUMNS`, pulled by this process.

    The reader's own code (`source.read_partition`): the same retries, failover waits and
    failOnDataLoss rules as a message-rows read of the range.
    """
    from pyspark.sql.types import StructType

    from ferrymq.spark.options import parse_read_options
    from ferrymq.spark.rows import read_schema
    from ferrymq.spark.source import read_partition

    options = parse_read_options(
        {"servers": spec.servers, "subscribe": queue_range.topic, **spec.read_options},
        streaming=True,
    )
    every = read_schema(include_headers=False, include_ferry_columns=False)
    schema = StructType([every[name] for name in _MESSAGE_COLUMNS])
    return read_partition(options, queue_range, schema)


def write_task(
    spec: SinkSpec, password: str, batches: Iterator[Any], *, bulk_rows: int = BULK_ROWS
) -> SinkCommit:
    """One writer task's transaction (rule 1): the Arrow batches of its queue ranges.

    A batch is messages (`_MESSAGE_COLUMNS`), or ranges (`rows.RANGE_SCHEMA`, rule 8) whose
    messages this task pulls from the brokers.

    `bulk_rows`: the shortest queue run tried on the bulk path (rule 7); 0 maps every body alone.

    Raises:
        FencedError: a newer generation of the task owns one of the queues (rolled back).
        PostgresConnectorError: the database refused (rolled back), or a malformed message with
            errors.tolerance=none.
    """
    target = spec.target.with_password(password)
    conn = target.connect("writing a micro-batch", autocommit=True)
    try:
        with conn.transaction():
            work = _TaskWrite(spec, conn, bulk_rows)
            for batch in batches:
                if "endOffset" in batch.schema.names:  # rowsAs=ranges: read each range here
                    for queue_range in map(range_of, batch.to_pylist()):
                        for messages in _read_range(spec, queue_range):
                            work.add(messages)
                else:
                    work.add(batch)
            work.finish()
        return work.result
    except psycopg.Error as exc:
        diag = getattr(exc, "sqlstate", None) or type(exc).__name__
        raise PostgresConnectorError(
            f"PostgresSink {spec.connector}: PostgreSQL at {target.display} refused a micro-batch "
            f"({diag}): {' '.join(str(exc).split())}"
        ) from None
    finally:
        conn.close()


# ------------------------------------------------------------------------ Spark


class PostgresStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream.format("ferrymq-postgres")`: each task one transaction; commit is a no-op."""

    def __init__(self, spec: SinkSpec, password: str) -> None:
        self.spec = spec
        self.password = password

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        """Write one task's rows and their offsets in one transaction (in an executor)."""
        _freeze_heap()
        done = write_task(self.spec, self.password, iterator)
        if self.spec.test_fail_first_attempts is not None:
            fail_first_attempt(self.spec.test_fail_first_attempts)
        return done

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to commit: every task committed its own transaction (driver side)."""
        crash_point(CRASH_POINT, batchId)
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info(
            "PostgresSink %s task %d batch %d: %d rows written, %d skipped, %d dead-lettered",
            self.spec.connector,
            self.spec.task,
            batchId,
            sum(m.written for m in done),
            sum(m.skipped for m in done),
            sum(m.dead for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing: a failed task's transaction rolled back (or never began)."""


class PostgresSinkDataSource(DataSource):
    """`format("ferrymq-postgres")`: the sink's writer (options `spec` and `password`)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        """The writer of one micro-batch."""
        options = dict(self.options)
        spec = msgspec.json.decode(options["spec"], type=SinkSpec)
        return PostgresStreamWriter(spec, options.get("password", ""))


# ------------------------------------------------------------------------ test hook


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _driver_pid() -> int | None:
    named = os.environ.get("FERRYMQ_TEST_CRASH_PID", "")
    if named.isdecimal():
        return int(named)
    pid: int | None = os.getppid()
    while pid is not None and pid > 1:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == "java":
                    return _parent(pid)
        except OSError:
            return None
        pid = _parent(pid)
    return None


def fail_first_attempt(directory: str) -> None:
    """Fail this writer task if it is its first attempt, leaving a file saying so (test hook).

    A real task failure after the task's PostgreSQL commit: Spark retries the task on a master
    that allows it (`local[N,F]`, a cluster), and the retry must skip every row (rule 1).
    """
    from pyspark import TaskContext as SparkTaskContext

    task = SparkTaskContext.get()
    if task is None or task.attemptNumber() != 0:
        return
    name = f"stage{task.stageId()}-partition{task.partitionId()}-attempt0"
    Path(directory, name).touch()
    raise RuntimeError(f"test hook: writer task {name} fails after its PostgreSQL commit")


def crash_point(name: str, batch_id: int) -> None:
    """Kill the driver tree here (as kill -9) when the test hooks ask for this point."""
    if os.environ.get("FERRYMQ_TEST_HOOKS") != "1":
        return
    if os.environ.get("FERRYMQ_TEST_CRASH_AT") != name:
        return
    wanted = os.environ.get("FERRYMQ_TEST_CRASH_BATCH")
    if wanted is not None and wanted != str(batch_id):
        return
    log.warning("test crash point %s reached at batch %d: killing the driver", name, batch_id)
    driver = _driver_pid()
    if driver is not None:
        parents = {p: _parent(p) for p in map(int, filter(str.isdecimal, os.listdir("/proc")))}
        tree, frontier = [driver], [driver]
        while frontier:
            parent = frontier.pop()
            children = [p for p, pp in parents.items() if pp == parent]
            tree += children
            frontier += children
        for pid in tree:
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
    os._exit(137)


# ------------------------------------------------------------------------ the plugin


class PostgresSink(ConnectorPlugin):
    """ferrymq topics into PostgreSQL tables, exactly once (module docstring)."""

    type = "sink"
    trigger_interval_ms = TRIGGER_INTERVAL_MS
    version = "1.0"
    keys = (
        ConfigKey("topics", ConfigType.LIST, "Topics to read, comma-separated (or topics.regex)."),
        ConfigKey("topics.regex", ConfigType.STRING, "A Python regular expression over topics."),
        *CONNECTION_KEYS,
        ConfigKey(
            "table.name.format",
            ConfigType.STRING,
            "The table of a topic's messages; ${topic} is the topic (table or schema.table).",
            default="${topic}",
            group="Writes",
        ),
        ConfigKey(
            "fields",
            ConfigType.STRING,
            "The columns, each taking the JSON body's field of its name: 'name type [not null]', "
            "comma-separated, e.g. 'id bigint not null, name text, amount numeric(12,2)'.",
            required=True,
            importance="HIGH",
            group="Writes",
        ),
        ConfigKey(
            EXPRESSIONS_KEY,
            ConfigType.STRING,
            "Spark SQL expressions computing the columns from each message row (value and key "
            "as text, topic, offset, tags, ...), comma-separated, each 'expr AS column', e.g. "
            "\"CAST(get_json_object(value, '$.id') AS BIGINT) AS id\"; the columns' types stay "
            "fields'; read in ferrymq.read.mode=rows.",
            group="Writes",
        ),
        ConfigKey(
            "insert.mode",
            ConfigType.STRING,
            "insert: every message is a new row; upsert: INSERT ... ON CONFLICT (pk.fields) DO "
            "UPDATE (the last message of a key wins).",
            default="insert",
            choices=("insert", "upsert"),
            group="Writes",
        ),
        ConfigKey(
            "pk.mode",
            ConfigType.STRING,
            "none, or record_value: the key columns are fields of the body (pk.fields).",
            default="none",
            choices=("none", "record_value"),
            group="Writes",
        ),
        ConfigKey(
            "pk.fields", ConfigType.LIST, "The key columns (pk.mode=record_value).", group="Writes"
        ),
        ConfigKey(
            "auto.create",
            ConfigType.BOOLEAN,
            "Create a missing table from fields (with pk.fields as its primary key).",
            default="false",
            group="Writes",
        ),
        ConfigKey(
            "batch.size",
            ConfigType.INT,
            "Rows per COPY (and per upsert merge) within a task's transaction.",
            default="3000",
            minimum=1,
            group="Writes",
        ),
        ConfigKey(
            "errors.tolerance",
            ConfigType.STRING,
            "none: a malformed message fails the task; all: it goes to the dead-letter topic "
            "(or is skipped and logged without one).",
            default="none",
            choices=("none", "all"),
            group="Error Handling",
        ),
        ConfigKey(
            "errors.deadletterqueue.topic.name",
            ConfigType.STRING,
            "The dead-letter topic (errors.tolerance=all); the reason is in the message's "
            "__connect.errors.exception.message property.",
            group="Error Handling",
        ),
        ConfigKey(
            "startingOffsets",
            ConfigType.STRING,
            "Where a queue with no stored offset starts.",
            default="earliest",
            choices=("earliest", "latest"),
            group="Spark",
        ),
        ConfigKey(
            "maxOffsetsPerTrigger",
            ConfigType.LONG,
            "Messages per micro-batch at most (all queues of the task together).",
            minimum=1,
            group="Spark",
        ),
        ConfigKey(
            "failOnDataLoss",
            ConfigType.BOOLEAN,
            "true: offsets retention deleted before they were written fail the task; false: "
            "they are skipped (logged).",
            default="true",
            group="Spark",
        ),
        ConfigKey(
            "ferrymq.read.mode",
            ConfigType.STRING,
            "rows: the ferrymq source's message rows; ranges: each Spark task pulls its queue "
            "range's messages in the writer itself (no message crosses Spark's JVM); rows when "
            "fields.expressions is set.",
            default=READ_MODES[0],
            choices=READ_MODES,
            group="Spark",
        ),
        ConfigKey(
            "trigger.interval.ms",
            ConfigType.LONG,
            "Micro-batch interval (a batch that ends early waits for the next multiple).",
            default=str(TRIGGER_INTERVAL_MS),
            minimum=10,
            group="Spark",
        ),
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Cross-key rules: one of topics/topics.regex, the URL, fields, keys, table names."""
        return _config_errors(config)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """`tasks.max` tasks, each naming its index and the count (queues are split at start)."""
        count = max(1, max_tasks)
        return [{**config, "task.index": str(i), "task.count": str(count)} for i in range(count)]

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """Claim the task's queues, apply a pending offsets change, start the query."""
        spec = sink_spec(config, context)
        password = parse_target(config).password
        index = int(config.get("task.index") or context.task)
        count = int(config.get("task.count") or "1")
        listed = _queues(context.namesrv_addr, config)
        if spec.dead_letter_topic is not None:  # as Kafka Connect's DLQ reporter does at start
            asyncio.run(_ensure_topic(context.namesrv_addr, spec.dead_letter_topic))
        mine = {
            topic: sorted(k for k in queues if task_owner(topic, k, count) == index)
            for topic, queues in listed.items()
        }
        if count > 1 and not mine:
            raise PostgresConnectorError(
                f"PostgresSink {spec.connector}: topics.regex matches no topic yet; with "
                "tasks.max > 1 the topics must exist when the tasks start"
            )
        target = spec.target.with_password(password)
        with target.connect("starting a PostgresSink task", autocommit=True) as conn:
            try:
                create_offsets_tables(conn)
                for topic in [t for t, keys in mine.items() if keys]:  # the tables it writes
                    with conn.transaction():
                        _ensure_table(conn, spec, topic)
                change = context.extra.get("offsets")
                if (
                    isinstance(change, OffsetsPut)
                    and change.incarnation == spec.incarnation
                    and _apply_change(conn, spec.connector, change)
                ):
                    log.info(
                        "PostgresSink %s: offsets change %s applied",
                        spec.connector,
                        change.request_id,
                    )
                stored = _claim(conn, spec, [(t, k) for t, keys in mine.items() for k in keys])
            except psycopg.Error as exc:
                raise PostgresConnectorError(
                    f"PostgresSink {spec.connector}: PostgreSQL at {target.display} refused the "
                    f"task's start: {' '.join(str(exc).split())}"
                ) from None
        default = -2 if (config.get("startingOffsets") or "earliest") == "earliest" else -1
        starting: dict[str, dict[str, dict[str, int]]] = {}
        for topic, keys in mine.items():
            per_topic = starting.setdefault(topic, {})
            for key in keys:
                offset = stored.get((topic, key), default)
                per_topic.setdefault(key.broker_name, {})[str(key.queue_id)] = offset
        register_data_source(spark, PostgresSinkDataSource)  # spark/registration.py
        # queues by stable partition number: the ferrymq columns (brokerName, queueId) would make
        # the reader split every message's properties for tags, keys and msgId too
        spec = msgspec.structs.replace(
            spec,
            groups={
                topic: {group_code(k.broker_name): k.broker_name for k in queues}
                for topic, queues in listed.items()
            },
        )
        reader = (
            spark.readStream.format("ferrymq")
            .option("servers", context.namesrv_addr)
            .option("startingOffsets", json.dumps(starting, sort_keys=True))
        )
        if count > 1:
            assign = {
                topic: [stable_partition(k.broker_name, k.queue_id) for k in keys]
                for topic, keys in mine.items()
            }
            reader = reader.option("assign", json.dumps(assign, sort_keys=True))
        elif config.get("topics.regex"):
            reader = reader.option("subscribePattern", config["topics.regex"])
        else:
            reader = reader.option("subscribe", ",".join(list_value(config, "topics")))
        if config.get("maxOffsetsPerTrigger"):
            reader = reader.option("maxOffsetsPerTrigger", config["maxOffsetsPerTrigger"])
        expressions = (config.get(EXPRESSIONS_KEY) or "").strip()
        if read_mode(config) == "ranges":
            rows = reader.option("rowsAs", "ranges").load()  # rule 8
        else:
            for name, value in spec.read_options.items():
                reader = reader.option(name, value)
            if expressions:  # rule 9
                computed = parse_expressions(expressions, spec.columns)
                frame = reader.option("includeFerryColumns", "true").load()
                rows = _computed(spec.connector, frame, computed)
            else:
                rows = reader.load().select(*_MESSAGE_COLUMNS)
        log.info(
            "PostgresSink %s task %d (generation %d): %d queues into %s",
            spec.connector,
            spec.task,
            spec.generation,
            sum(len(k) for k in mine.values()),
            spec.target.display,
        )
        writer = (
            rows.writeStream.format(FORMAT)
            .option("spec", msgspec.json.encode(spec).decode())
            .option("password", password)
            .option("checkpointLocation", context.checkpoint_dir)
        )
        return self.start_query(writer, config, context)

    def offsets(self, config: Mapping[str, str], incarnation: str) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: the stored next offset of every queue (KIP-875 shape).

        Raises:
            PostgresConnectorError: the database cannot be reached.
        """
        target = parse_target(config)
        with target.connect("reading the sink's offsets", autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", [OFFSETS_TABLE]).fetchone()
            if exists is None or exists[0] is None:
                return []
            rows = conn.execute(
                f"SELECT topic, broker, queue, next_offset FROM {OFFSETS_TABLE} "
                "WHERE connector = %s AND incarnation = %s ORDER BY topic, broker, queue",
                [config.get("name", ""), incarnation],
            ).fetchall()
        return [
            {
                "partition": {"topic": topic, "broker": broker, "queue": queue},
                "offset": {"offset": next_offset},
            }
            for topic, broker, queue, next_offset in rows
        ]

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: the stored offsets (`offsets`), the sink's truth."""
        return self.offsets(config, scope.incarnation)

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """What is wrong with a PATCH /offsets body's entries (none: it may be written)."""
        problems: list[str] = []
        for entry in entries:
            try:
                _partition(entry)
                _offset(entry)
            except ValueError as exc:
                problems.append(str(exc))
        return problems

    def apply_offsets(self, config: Mapping[str, str], change: OffsetsPut) -> bool:
        """Apply an offsets change once (alter: set next offsets; reset: delete them).

        `build` calls it at a task's start; a worker may call it too. Returns whether this call
        applied it (False: its request id was applied before).

        Raises:
            PostgresConnectorError: the database cannot be reached.
            ValueError: an entry is malformed (`check_offsets`).
        """
        target = parse_target(config)
        with target.connect("applying an offsets change", autocommit=True) as conn:
            create_offsets_tables(conn)
            return _apply_change(conn, config.get("name", ""), change)


def _computed(connector: str, frame: Any, expressions: Sequence[tuple[str, str]]) -> Any:
    """The message rows with the computed columns as the JSON body (rule 9).

    Raises:
        PostgresConnectorError: Spark refuses an expression (its AnalysisException's message).
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions

    seen = frame.withColumn("_ferry_key", functions.col("key"))
    seen = seen.withColumn("value", functions.col("value").cast("string"))
    seen = seen.withColumn("key", functions.col("key").cast("string"))
    try:
        body = functions.to_json(functions.struct(*(functions.expr(e) for _, e in expressions)))
        return seen.select(
            "topic",
            "partition",
            "offset",
            functions.col("_ferry_key").alias("key"),
            body.cast("binary").alias("value"),
        )
    except AnalysisException as exc:
        raise PostgresConnectorError(
            f"PostgresSink {connector}: Spark refused {EXPRESSIONS_KEY} "
            f"({'; '.join(e for _, e in expressions)}): {exc}"
        ) from None


def _queues(servers: str, config: Mapping[str, str]) -> dict[str, list[QueueKey]]:
    """The routed queues of the connector's topics now."""
    from ferrymq.spark.options import parse_read_options
    from ferrymq.spark.source import FerryQueues

    options: dict[str, str] = {"servers": servers}
    if config.get("topics.regex"):
        options["subscribePattern"] = config["topics.regex"]
    else:
        options["subscribe"] = ",".join(list_value(config, "topics"))
    bounds = FerryQueues().bounds(parse_read_options(options, streaming=True), None)
    return {topic: sorted(queues) for topic, queues in bounds.items()}
