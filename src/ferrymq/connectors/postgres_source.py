"""`PostgresSource`: PostgreSQL tables (or a query) polled into ferrymq topics, exactly once.

Implements issue 19's PostgreSQL source and connect-anchors.md section 4.4: a task is one
streaming query, `readStream.format("ferrymq-postgres-source")` (this module's
`DataSourceStreamReader`) into `writeStream.format("ferrymq")`, whose prepared rows and
first-winner decision per (sink id, batch id) commit each micro-batch once; the sink id is
`<connector>:<incarnation>:<task>`. Config keys follow Confluent's JDBC source (`mode`,
`incrementing.column.name`, `timestamp.column.name`, `table.whitelist` or `query`,
`topic.prefix`, `poll.interval.ms`, `timestamp.delay.interval.ms`, `batch.max.rows`).

Why not "id > last id": ids (and timestamps) are handed out when a transaction writes, not when
it commits, so a row with a lower id can commit after one with a higher id has been read; a
poller keyed by the last id skips it forever (connect-anchors 4.3, "two PostgreSQL pitfalls").
The technique here (rules):
1. A micro-batch covers the rows whose version became visible between two snapshots: visible in
   `hi` and not in `lo` (PostgreSQL's `pg_visible_in_snapshot` on the row's `xmin`, widened to
   an xid8). Every committed row version becomes visible between exactly one pair of consecutive
   snapshots, in whatever order transactions commit, so none is skipped and none is read twice.
   A batch's rows are a pure function of its offsets: a replay reads the same rows (unless they
   were deleted or updated since; an updated row is read again as its new version).
2. The ordering column (`incrementing.column.name`, `timestamp.column.name`, or both) only
   bounds the scan so an index serves it: a diff's rows are read above `w`, a lower bound below
   which no row can still appear, and in order, at most `batch.max.rows` per micro-batch (`c`
   is how far the current diff has been read). `w` moves up to the highest value visible in an
   earlier snapshot S_j once every transaction that could still write a lower value has ended
   before the new diff's `lo`: the xmax of a snapshot taken at least
   `timestamp.delay.interval.ms` (and one poll) after S_j is at most `lo`'s xmin. Ids come from
   a sequence (or identity) in the inserting statement, so a transaction holding a lower id had
   its xid by then; a transaction that takes an id (or a `now()` timestamp) and writes it more
   than `timestamp.delay.interval.ms` later can be missed: set the delay above that.
3. Offsets (Spark's checkpoint) are `{table: {"lo", "hi", "w", "c"}}`: snapshots as text
   (`xmin:xmax:xip,...`), `w` and `c` as lists of the ordering columns' values; keys sorted,
   values ints and strings only (Spark compares the JSON text). No new visible rows: the same
   offsets, so no empty micro-batches. Rows with NULL ordering columns are never read. The REST
   API shows every field as text (`shown_offset`: "" for none, `w` and `c` as JSON lists).
4. Rows become JSON objects (column -> value; timestamps and dates ISO 8601, numeric as strings,
   bytea as base64), the key optionally from `message.key.column`; the topic is `topic.prefix`
   + the table name (`query` mode: `topic.prefix` itself). A `query` must return the source
   table's `xmin` as a column named `xmin` (`SELECT o.xmin, o.* FROM orders o JOIN ...`).
5. Work runs where the PySpark 4.3 data source API puts it: offsets in the driver's long-lived
   stream runner (a connection per call; the candidates for `w` live in that process), reads in
   executors (one connection per table range, a server-side cursor). Nothing open is pickled.
6. An offsets change (PATCH/DELETE /connectors/{c}/offsets) gives the task's first micro-batch
   its start: reset re-reads everything; alter sets tables' states
   (`{"partition": {"table": t}, "offset": {"lo", "hi", "w", "c"}}`, as `shown_offset` shows).
   The runtime starts such a task on a fresh checkpoint, whose batch ids start again at 0; the
   ferrymq sink numbers a stream's batches under `<sinkId>/<query id>`, and the query id is new
   with the checkpoint, so the first-winner decisions of the old batch ids never swallow the new
   ones. The sink id stays `<connector>:<incarnation>:<task>` for every checkpoint: it is what
   the task's generation fences (a zombie of an older owner, whatever checkpoint it runs on, is
   refused once a newer generation decided a batch). It is written into the checkpoint
   (`ferrymq-sink-id`) and read back by every later start on it (a checkpoint of an earlier
   version keeps its `:o<request id>` id).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import psycopg
from psycopg import sql
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
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
    PgTarget,
    PostgresConnectorError,
    parse_target,
    qualified,
    table_name,
)
from ferrymq.model import validate_topic
from ferrymq.spark.registration import register_data_source

__all__ = [
    "FORMAT",
    "INITIAL",
    "Candidate",
    "PostgresSource",
    "PostgresSourceDataSource",
    "PostgresStreamReader",
    "SourceSpec",
    "offset_state",
    "promote",
    "shown_offset",
]

log = logging.getLogger(__name__)

FORMAT: Final = "ferrymq-postgres-source"
INITIAL: Final[dict[str, Any]] = {"c": None, "hi": None, "lo": None, "w": None}
"""A table's offset before anything was read."""

_MAX_CANDIDATES: Final = 256
_COLUMN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_XID_MASK: Final = 0xFFFFFFFF


class SourceSpec(msgspec.Struct, frozen=True):
    """Everything the reader needs (a Spark option as JSON; no password in it)."""

    connector: str
    task: int
    target: PgTarget
    order: tuple[str, ...]
    """The ordering columns: (id,), (ts,) or (ts, id)."""
    tables: tuple[str, ...]
    query: str | None
    topic_prefix: str
    key_column: str | None
    delay_ms: int
    max_rows: int
    initial: dict[str, dict[str, Any]] | None = None
    """Offsets a change asked for (None: every table from the start)."""

    def sources(self) -> tuple[str, ...]:
        """The offset keys: the tables, or "query"."""
        return ("query",) if self.query is not None else self.tables

    def topic(self, source: str) -> str:
        """The topic a table's rows go to."""
        return (
            self.topic_prefix
            if self.query is not None
            else self.topic_prefix + table_name(source)[1]
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """A past snapshot: when it was taken, its xmax, and the highest ordering value it showed."""

    at_ms: int
    xmax: int
    top: list[Any] | None


def promote(candidates: Sequence[Candidate], lo_xmin: int, delay_ms: int) -> int | None:
    """The newest candidate j whose value can be a diff's lower bound (rule 2), or None.

    j qualifies when the first later snapshot taken at least `delay_ms` after it has an xmax of
    at most `lo_xmin`: every transaction that had an xid by then ended before the diff's `lo`.
    """
    found: int | None = None
    for j, candidate in enumerate(candidates):
        later = next(
            (c for c in candidates[j + 1 :] if c.at_ms - candidate.at_ms >= delay_ms), None
        )
        if later is None or later.xmax > lo_xmin:
            break
        found = j
    return found


def _snapshot_xmin(snapshot: str) -> int:
    return int(snapshot.split(":", 1)[0])


def _scalar(value: Any) -> Any:
    """An ordering value as offsets JSON holds it (ints stay ints; the rest is text)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


def _body_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return value


# ------------------------------------------------------------------------ SQL


def _relation(spec: SourceSpec, source: str) -> sql.Composable:
    if spec.query is not None:
        return sql.SQL("({})").format(sql.SQL(spec.query))  # the user's query, by design
    return qualified(*table_name(source))


def _diff_query(
    spec: SourceSpec,
    source: str,
    *,
    lo: str | None,
    hi: str,
    lower: list[Any] | None,
    upper: list[Any] | None,
    columns: sql.Composable,
    limit: int | None = None,
) -> tuple[sql.Composed, list[Any]]:
    """Rows visible in `hi`, not in `lo`, with ordering value in (lower, upper], in order."""
    order = sql.SQL(", ").join(sql.SQL("q.{}").format(sql.Identifier(c)) for c in spec.order)
    row = sql.SQL("({})").format(order)
    marks = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() for _ in spec.order))
    xid8 = sql.SQL("((r.ref - ((r.ref - q.ferry_xmin) & {})))::text::xid8").format(
        sql.Literal(_XID_MASK)
    )
    where: list[sql.Composable] = [
        sql.SQL("{} IS NOT NULL").format(sql.SQL("q.{}").format(sql.Identifier(c)))
        for c in spec.order
    ]
    params: list[Any] = []
    where.append(sql.SQL("pg_visible_in_snapshot({}, %s::pg_snapshot)").format(xid8))
    params.append(hi)
    if lo is not None:
        where.append(sql.SQL("NOT pg_visible_in_snapshot({}, %s::pg_snapshot)").format(xid8))
        params.append(lo)
    if lower is not None:
        where.append(sql.SQL("{} > {}").format(row, marks))
        params += lower
    if upper is not None:
        where.append(sql.SQL("{} <= {}").format(row, marks))
        params += upper
    query = sql.SQL(
        "SELECT {columns} FROM (SELECT t.xmin::text::bigint AS ferry_xmin, t.* FROM {relation} "
        "AS t) AS q, (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS ref) AS r "
        "WHERE {where} ORDER BY {order}"
    ).format(
        columns=columns,
        relation=_relation(spec, source),
        where=sql.SQL(" AND ").join(where),
        order=order,
    )
    if limit is not None:
        query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(limit))
    return query, params


def _order_columns(spec: SourceSpec) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL("q.{}").format(sql.Identifier(c)) for c in spec.order)


def _cut(
    conn: psycopg.Connection[Any],
    spec: SourceSpec,
    source: str,
    lo: str | None,
    hi: str,
    lower: list[Any] | None,
) -> list[Any] | None:
    """Where the next micro-batch of a diff ends (at most `max_rows` rows), None: nothing left."""
    query, params = _diff_query(
        spec,
        source,
        lo=lo,
        hi=hi,
        lower=lower,
        upper=None,
        columns=_order_columns(spec),
        limit=spec.max_rows,
    )
    found = conn.execute(
        sql.SQL("SELECT * FROM ({}) AS page ORDER BY {} LIMIT 1").format(
            query,
            sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in spec.order),
        ),
        params,
    ).fetchone()
    return None if found is None else [_scalar(v) for v in found]


def _top(conn: psycopg.Connection[Any], spec: SourceSpec, source: str) -> list[Any] | None:
    """The highest ordering value visible now."""
    order = sql.SQL(", ").join(sql.SQL("t.{} DESC").format(sql.Identifier(c)) for c in spec.order)
    found = conn.execute(
        sql.SQL("SELECT {} FROM {} AS t WHERE {} ORDER BY {} LIMIT 1").format(
            sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in spec.order),
            _relation(spec, source),
            sql.SQL(" AND ").join(
                sql.SQL("t.{} IS NOT NULL").format(sql.Identifier(c)) for c in spec.order
            ),
            order,
        )
    ).fetchone()
    return None if found is None else [_scalar(v) for v in found]


# ------------------------------------------------------------------------ Spark


class TableRange(InputPartition):
    """One table's rows of one micro-batch: visible in hi, not in lo, ordering in (lower, upper]."""

    def __init__(
        self, source: str, lo: str | None, hi: str, lower: list[Any] | None, upper: list[Any]
    ) -> None:
        super().__init__(source)
        self.source = source
        self.lo = lo
        self.hi = hi
        self.lower = lower
        self.upper = upper


class PostgresStreamReader(DataSourceStreamReader):
    """Micro-batches of newly visible rows (module rules 1-3)."""

    def __init__(self, spec: SourceSpec, password: str) -> None:
        self.spec = spec
        self.password = password
        self.candidates: dict[str, list[Candidate]] = {}
        """Per table, the snapshots this runner took (in memory: rule 5)."""

    def _connect(self, purpose: str) -> psycopg.Connection[Any]:
        conn = self.spec.target.with_password(self.password).connect(purpose, autocommit=True)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return conn

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        """Nothing read yet (or what an offsets change asked for)."""
        initial = self.spec.initial or {}
        return {s: dict(initial.get(s, INITIAL)) for s in sorted(self.spec.sources())}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        """Where the next micro-batch ends: per table, the rest of its diff or a new one."""
        end: dict[str, Any] = {}
        try:
            with self._connect("polling for new rows") as conn:
                for source in sorted(self.spec.sources()):
                    end[source] = self._advance(conn, source, start.get(source, dict(INITIAL)))
        except psycopg.Error as exc:
            raise PostgresConnectorError(
                f"PostgresSource {self.spec.connector}: PostgreSQL at "
                f"{self.spec.target.display} refused a poll: {' '.join(str(exc).split())}"
            ) from None
        return end

    def _advance(
        self, conn: psycopg.Connection[Any], source: str, state: dict[str, Any]
    ) -> dict[str, Any]:
        with conn.transaction():  # REPEATABLE READ (`_connect`): one snapshot throughout
            # the first statement: the transaction's snapshot is the one it shows
            snapshot, xmax = conn.execute(
                "SELECT pg_current_snapshot()::text, "
                "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            ).fetchone() or ("", 0)
            hi = state.get("hi")
            if hi is not None:
                cut = _cut(conn, self.spec, source, state.get("lo"), hi, state.get("c"))
                if cut is not None:
                    return {**state, "c": cut}
            candidates = self.candidates.setdefault(source, [])
            lower = state.get("w")
            if hi is not None:
                chosen = promote(candidates, _snapshot_xmin(hi), self.spec.delay_ms)
                if chosen is not None:
                    lower = candidates[chosen].top or lower
                    del candidates[:chosen]
            candidates.append(
                Candidate(time.time_ns() // 1_000_000, xmax, _top(conn, self.spec, source))
            )
            del candidates[:-_MAX_CANDIDATES]
            cut = _cut(conn, self.spec, source, hi, snapshot, lower)
            if cut is None:
                return state
            return {"c": cut, "hi": snapshot, "lo": hi, "w": lower}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One range per table whose offset moved (from the two offsets alone)."""
        ranges: list[InputPartition] = []
        for source in sorted(end):
            after, before = end[source], start.get(source, INITIAL)
            if after == before or after.get("hi") is None:
                continue
            same_diff = (after["lo"], after["hi"]) == (before.get("lo"), before.get("hi"))
            lower = before.get("c") if same_diff else after.get("w")
            ranges.append(TableRange(source, after["lo"], after["hi"], lower, after["c"]))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str | None, str]]:
        """The range's rows as (topic, key, JSON body), in ordering-column order (executor)."""
        assert isinstance(partition, TableRange)
        spec = self.spec
        query, params = _diff_query(
            spec,
            partition.source,
            lo=partition.lo,
            hi=partition.hi,
            lower=partition.lower,
            upper=partition.upper,
            columns=sql.SQL("q.*"),
        )
        topic = spec.topic(partition.source)
        hidden = {"ferry_xmin", "xmin"}
        try:
            with self._connect("reading new rows") as conn, conn.transaction():
                cursor = conn.cursor(name="ferry_source")
                cursor.itersize = 2000
                cursor.execute(query, params)
                names = [d.name for d in cursor.description or ()]
                for values in cursor:
                    row = {
                        n: _body_value(v)
                        for n, v in zip(names, values, strict=True)
                        if n not in hidden
                    }
                    key = row.get(spec.key_column) if spec.key_column else None
                    yield (
                        topic,
                        None if key is None else str(key),
                        json.dumps(row, separators=(",", ":"), default=str),
                    )
        except psycopg.Error as exc:
            raise PostgresConnectorError(
                f"PostgresSource {spec.connector}: PostgreSQL at {spec.target.display} refused a "
                f"read of {partition.source}: {' '.join(str(exc).split())}"
            ) from None

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing: the checkpoint holds the offsets."""


class PostgresSourceDataSource(DataSource):
    """`format("ferrymq-postgres-source")`: rows as (topic, key, value); options spec, password."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> str:
        """The ferrymq sink's columns."""
        return "topic string, key string, value string"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader."""
        options = dict(self.options)
        spec = msgspec.json.decode(options["spec"], type=SourceSpec)
        return PostgresStreamReader(spec, options.get("password", ""))


# ------------------------------------------------------------------------ config


def _list(config: Mapping[str, str], key: str) -> list[str]:
    return [part.strip() for part in (config.get(key) or "").split(",") if part.strip()]


def _order(config: Mapping[str, str]) -> tuple[str, ...]:
    mode = config.get("mode") or ""
    increment = (config.get("incrementing.column.name") or "").strip()
    stamp = (config.get("timestamp.column.name") or "").strip()
    if mode == "incrementing":
        return (increment,)
    if mode == "timestamp":
        return (stamp,)
    return (stamp, increment)


def _config_errors(config: Mapping[str, str]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    try:
        parse_target(config)
    except ValueError as exc:
        add("connection.url", str(exc))
    mode = config.get("mode") or ""
    needs = {
        "incrementing": ("incrementing.column.name",),
        "timestamp": ("timestamp.column.name",),
        "timestamp+incrementing": ("timestamp.column.name", "incrementing.column.name"),
    }.get(mode, ())
    for key in needs:
        column = (config.get(key) or "").strip()
        if not column:
            add(key, f"mode={mode} needs {key}")
        elif not _COLUMN.fullmatch(column):
            add(key, f"{column!r} is not a column name")
    key_column = (config.get("message.key.column") or "").strip()
    if key_column and not _COLUMN.fullmatch(key_column):
        add("message.key.column", f"{key_column!r} is not a column name")
    tables = _list(config, "table.whitelist")
    query = (config.get("query") or "").strip()
    if bool(tables) == bool(query):
        add("table.whitelist", "give exactly one of table.whitelist and query")
    prefix = config.get("topic.prefix") or ""
    for table in tables:
        try:
            _, name = table_name(table)
            validate_topic(prefix + name)
        except ValueError as exc:
            add("table.whitelist", str(exc))
    if query:
        try:
            validate_topic(prefix)
        except ValueError as exc:
            add("topic.prefix", f"in query mode topic.prefix is the topic: {exc}")
    return errors


def source_spec(
    config: Mapping[str, str], context: TaskContext, initial: dict[str, dict[str, Any]] | None
) -> SourceSpec:
    """A task's spec from its config.

    Raises:
        PostgresConnectorError: the config is invalid (what `validate` reports).
    """
    errors = _config_errors(config)
    if errors:
        details = "; ".join(f"{key}: {' '.join(found)}" for key, found in sorted(errors.items()))
        raise PostgresConnectorError(f"invalid PostgresSource config: {details}")
    query = (config.get("query") or "").strip() or None
    return SourceSpec(
        connector=context.connector,
        task=context.task,
        target=parse_target(config).without_password(),
        order=_order(config),
        tables=tuple(_list(config, "table.whitelist")),
        query=query,
        topic_prefix=config.get("topic.prefix") or "",
        key_column=(config.get("message.key.column") or "").strip() or None,
        delay_ms=int(config.get("timestamp.delay.interval.ms") or "0"),
        max_rows=int(config.get("batch.max.rows") or "10000"),
        initial=initial,
    )


def shown_offset(state: Mapping[str, Any]) -> dict[str, str | int]:
    """A table's offset as the REST API shows it: every field as text ("" for none).

    Snapshots are their text; `w` and `c` are JSON lists of the ordering values.
    """
    return {
        "lo": state.get("lo") or "",
        "hi": state.get("hi") or "",
        "w": "" if state.get("w") is None else json.dumps(state["w"]),
        "c": "" if state.get("c") is None else json.dumps(state["c"]),
    }


def offset_state(shown: Mapping[str, str | int]) -> dict[str, Any]:
    """The inverse of `shown_offset`.

    Raises:
        ValueError: not the four fields, a snapshot not `xmin:xmax:xip,...`, or a bound not a
            JSON list.
    """
    if set(shown) != set(INITIAL) or not all(isinstance(v, str) for v in shown.values()):
        raise ValueError('give "lo", "hi", "w" and "c" as text, as GET .../offsets shows them')
    state: dict[str, Any] = {}
    for name in ("lo", "hi"):
        text = str(shown[name])
        if text and not re.fullmatch(r"\d+:\d+:[\d,]*", text):
            raise ValueError(f"{name}: {text!r} is not a snapshot (xmin:xmax:xip,...)")
        state[name] = text or None
    for name in ("w", "c"):
        text = str(shown[name])
        try:
            value = json.loads(text) if text else None
        except ValueError:
            value = "bad"
        if value is not None and not isinstance(value, list):
            raise ValueError(f"{name}: {text!r} is not a JSON list of ordering values")
        state[name] = value
    if (state["hi"] is None) != (state["c"] is None):
        raise ValueError("hi and c are given together (a diff read up to c) or not at all")
    return {k: state[k] for k in sorted(state)}


def _initial(change: OffsetsPut | None, spec_sources: Sequence[str]) -> dict[str, Any] | None:
    if change is None or change.offsets is None:
        return None
    initial: dict[str, Any] = {}
    for entry in change.offsets:
        source = entry.partition.get("table")
        if not isinstance(source, str) or source not in spec_sources:
            raise ValueError(f"partition {entry.partition}: name a table of the connector")
        if entry.offset is None:
            continue
        try:
            initial[source] = offset_state(entry.offset)
        except ValueError as exc:
            raise ValueError(f"offset of {source}: {exc}") from None
    return initial


_SINK_ID_FILE: Final = "ferrymq-sink-id"
"""A file in the task's checkpoint: the sink id its batches are committed under."""


def _sink_id(context: TaskContext) -> str:
    """The ferrymq sink id of the task's checkpoint (rule 6), kept in the checkpoint itself.

    `<connector>:<incarnation>:<task>`, the same for every checkpoint (the sink numbers batches
    per checkpoint itself); characters a sink id cannot hold become `_`. A restart on the same
    checkpoint reads it back, so a checkpoint started by an earlier version for an offsets change
    keeps its `:o<request id>` id.
    """
    marker = Path(context.checkpoint_dir) / _SINK_ID_FILE
    if marker.is_file():
        return marker.read_text().strip()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", context.connector)
    sink_id = f"{name}:{context.incarnation}:{context.task}"[:128]
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(sink_id)
    return sink_id


# ------------------------------------------------------------------------ the plugin


class PostgresSource(ConnectorPlugin):
    """PostgreSQL rows into ferrymq topics, exactly once (module docstring)."""

    type = "source"
    trigger_interval_ms = 5000
    """`poll.interval.ms`'s default: the micro-batch interval is the poll interval."""
    version = "1.0"
    keys = (
        *CONNECTION_KEYS,
        ConfigKey(
            "mode",
            ConfigType.STRING,
            "How new rows are found: incrementing (an id column), timestamp (a modification "
            "time column), timestamp+incrementing (both).",
            required=True,
            choices=("incrementing", "timestamp", "timestamp+incrementing"),
            importance="HIGH",
            group="Mode",
        ),
        ConfigKey(
            "incrementing.column.name",
            ConfigType.STRING,
            "The id column (from a sequence or identity), NOT NULL.",
            group="Mode",
        ),
        ConfigKey(
            "timestamp.column.name",
            ConfigType.STRING,
            "The modification time column, NOT NULL.",
            group="Mode",
        ),
        ConfigKey(
            "table.whitelist",
            ConfigType.LIST,
            "Tables to read (table or schema.table), comma-separated; tasks split them.",
            group="Database",
        ),
        ConfigKey(
            "query",
            ConfigType.STRING,
            "Instead of tables: a SELECT returning the source table's xmin as a column named "
            "xmin (SELECT o.xmin, o.* FROM orders o ...).",
            group="Database",
        ),
        ConfigKey(
            "topic.prefix",
            ConfigType.STRING,
            "Prepended to the table name to make the topic (query mode: the topic itself).",
            required=True,
            group="Connector",
        ),
        ConfigKey(
            "message.key.column",
            ConfigType.STRING,
            "A column whose value (as text) becomes the message key.",
            group="Connector",
        ),
        ConfigKey(
            "poll.interval.ms",
            ConfigType.INT,
            "How often tables are polled (the micro-batch interval).",
            default="5000",
            minimum=10,
            group="Connector",
        ),
        ConfigKey(
            "timestamp.delay.interval.ms",
            ConfigType.LONG,
            "How long a transaction may hold an id or timestamp before it writes it: the scan "
            "bound lags that far behind (no row is read twice either way).",
            default="0",
            minimum=0,
            group="Mode",
        ),
        ConfigKey(
            "batch.max.rows",
            ConfigType.INT,
            "Rows per table per micro-batch at most.",
            default="10000",
            minimum=1,
            group="Connector",
        ),
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Cross-key rules: the URL, the mode's columns, tables or query, topic names."""
        return _config_errors(config)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """Tables dealt round-robin over at most `max_tasks` tasks; a query is one task."""
        tables = _list(config, "table.whitelist")
        if not tables:
            return [dict(config)]
        count = max(1, min(max_tasks, len(tables)))
        return [{**config, "table.whitelist": ",".join(tables[i::count])} for i in range(count)]

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """Start the task's query: the reader into `writeStream.format("ferrymq")`."""
        change = context.extra.get("offsets")
        change = change if isinstance(change, OffsetsPut) else None
        probe = source_spec(config, context, None)
        try:
            initial = _initial(change, probe.sources())
        except ValueError as exc:
            raise PostgresConnectorError(f"PostgresSource {context.connector}: {exc}") from None
        spec = source_spec(config, context, initial)
        password = parse_target(config).password
        with spec.target.with_password(password).connect(
            "starting a PostgresSource task", autocommit=True
        ) as conn:
            for source in spec.sources():
                try:
                    conn.execute(
                        sql.SQL("SELECT xmin FROM {} AS t LIMIT 0").format(_relation(spec, source))
                    )
                except psycopg.Error as exc:
                    raise PostgresConnectorError(
                        f"PostgresSource {spec.connector}: cannot read "
                        f"{'the query' if spec.query else source} in {spec.target.display}: "
                        f"{' '.join(str(exc).split())}"
                    ) from None
        sink_id = _sink_id(context)
        register_data_source(spark, PostgresSourceDataSource)  # a stream reader: issue 19
        rows = (
            spark.readStream.format(FORMAT)
            .option("spec", msgspec.json.encode(spec).decode())
            .option("password", password)
            .load()
        )
        log.info(
            "PostgresSource %s task %d: %s from %s into ferrymq (sink id %s)",
            spec.connector,
            spec.task,
            "the query" if spec.query else ", ".join(spec.tables),
            spec.target.display,
            sink_id,
        )
        writer = (
            rows.writeStream.format("ferrymq")
            .option("servers", context.namesrv_addr)
            .option("sinkId", sink_id)
            .option("generation", str(context.generation))
            .option("checkpointLocation", context.checkpoint_dir)
        )
        return self.start_query(writer, config, context)

    def trigger_interval(self, config: Mapping[str, str]) -> int:
        """`poll.interval.ms` (default 5000): one poll per micro-batch."""
        return int(config.get("poll.interval.ms") or self.trigger_interval_ms)

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """What is wrong with a PATCH /offsets body's entries (none: it may be written)."""
        tables = _list(config, "table.whitelist")
        sources = ("query",) if not tables else tuple(tables)
        try:
            _initial(OffsetsPut("", "", "", list(entries)), sources)
        except ValueError as exc:
            return [str(exc)]
        return []

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: every task's last committed offsets, from its checkpoint.

        The checkpoints are read where this worker sees them (`storePathRootDir`, shared by the
        cluster's workers); a task whose checkpoint is elsewhere shows nothing.
        """
        return [entry for d in scope.checkpoint_dirs for entry in self.offsets_in_checkpoint(d)]

    def offsets_in_checkpoint(self, checkpoint_dir: str) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets for one task: its last committed offsets (KIP-875 shape).

        `checkpoint_dir` is the task's (`SparkTaskRunner.checkpoint_dir`); nothing committed
        yet: no entries.
        """
        root = Path(checkpoint_dir)
        commits = root / "commits"
        done = (
            sorted(int(p.name) for p in commits.iterdir() if p.name.isdecimal())
            if commits.is_dir()
            else []
        )
        if not done:
            return []
        lines = (root / "offsets" / str(done[-1])).read_text().splitlines()
        offsets = json.loads(lines[2])
        return [
            {"partition": {"table": source}, "offset": shown_offset(state)}
            for source, state in sorted(offsets.items())
        ]
