"""`FileSource` and `FileSink`: a directory of files into a topic, and topics into a directory.

Both are thin over Spark's own file source and file sink, so their exactly-once guarantees are
Spark's file metadata plus ferrymq's sink (issue 19, "Files"). Config keys follow Kafka
Connect's FileStream connectors (`topic`, `topics`) and Spark's file options where they apply
(docs/connect.md has both tables and example configs).

FileSource (rules):
1. A task is one query: `readStream.format(file.format)` on `file.path` (a directory; `text`,
   `json`, `csv` or `parquet`) into `writeStream.format("ferrymq")` under the sink id
   `<connector>:<incarnation>:<task>` with the task's fencing generation. The body is the line
   (`text`) or the row as a JSON object (`to_json(struct(*))`); `message.key.field` names a
   column whose value (as text) becomes the key, so rows of one key share a queue.
2. Exactly once: Spark's file source records which files every micro-batch reads in the
   checkpoint (`sources/0`, next to `offsets/N`), so a batch replayed after a crash reads the
   same files; the ferrymq sink commits each batch of the checkpoint once and finishes a
   replayed batch's first decided commit instead of writing a second copy. Files must be
   complete when they appear in the directory (write elsewhere, then rename into it), as Spark's
   file source requires. Which files were read lives in the checkpoint only: a task that lost
   its checkpoint reads every file again.
3. Fencing: `build` fences the sink id with the task's generation before the query starts
   (`spark.sink.start_sink`, which also finishes the last decided batch of earlier runs), so an
   older owner still running elsewhere has its next batch refused (`WriterFencedError`).
4. `json` and `csv` need `schema` (Spark DDL); `parquet` infers it from the files already there
   when it is absent. `errors.tolerance=none` (default) reads with Spark's FAILFAST mode, so a
   malformed line fails the task with Spark's reason; `all` drops such lines (DROPMALFORMED).
5. One task: a directory is one stream (Spark reads its files in parallel inside the query).

FileSink (rules):
1. A task is one query: `readStream.format("ferrymq")` of `topics` or `topics.regex` into
   `writeStream.format(file.format)` at `file.path`. Columns: `key`, `value`, `topic`,
   `partition`, `offset`, `timestamp` (key and value as text; binary in `parquet`; `text`
   writes the value alone, one line per message); with `value.schema` (DDL) the JSON value's
   fields instead (a value that does not parse fails the task: Spark's FAILFAST).
2. Exactly once through Spark's `_spark_metadata` log in the directory: a micro-batch's files
   count only once its entry is written, and a batch replayed after a crash is skipped when the
   log has it. Read the output with Spark (`spark.read.format(...).load(file.path)`), which
   lists only committed files; a file of a batch cut short by a crash stays on disk, unlisted.
3. One `_spark_metadata` per directory, one writer per `_spark_metadata`: a FileSink connector
   has one task, and the directory is bound to it. The log skips every batch id it already
   holds, so a query with another checkpoint (a new incarnation, another connector, a task that
   lost its checkpoint) would silently skip its first batches. `build` therefore refuses a
   directory whose log holds batches unless `_ferrymq_sink.json` names this connector,
   incarnation and task and the task's checkpoint has planned the log's last batch.

Offsets (GET /connectors/{c}/offsets, from the task's checkpoint where this worker sees it,
while the task runs and after a stop; nothing before its first committed micro-batch):
- FileSource: every file the committed batches read, from Spark's file source log
  (`sources/0`, up to the `logOffset` of the last committed batch): `{"filename": uri}`,
  `{"logOffset": n}` (the log batch that read it);
- FileSink: the ferrymq queues' next offsets of the last committed batch (`offsets/<n>` of the
  last `commits/<n>`): `{"topic", "broker", "queue"}`, `{"offset": next}`.
Neither takes a PATCH (`check_offsets` refuses it): which files were read, and which batches
the directory holds, live in Spark's own logs, not in offsets ferrymq could set.

Errors (a missing directory, a schema Spark cannot parse, a directory bound to another writer)
raise `FileConnectorError` from `build`, naming the key and the path: the runtime shows the
task FAILED with that trace.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ferrymq.connect.plugin import (
    ConfigKey,
    ConfigType,
    ConnectorPlugin,
    OffsetsScope,
    TaskContext,
)
from ferrymq.connect.records import OffsetEntry
from ferrymq.connectors.selection import list_value, topic_selection_errors
from ferrymq.errors import FerryError
from ferrymq.model import validate_topic

__all__ = [
    "OWNER_FILE",
    "FileConnectorError",
    "FileSink",
    "FileSource",
    "committed_batch",
    "ddl_errors",
    "read_files",
    "sink_offsets",
]

SOURCE_FORMATS: Final = ("text", "json", "csv", "parquet")
SINK_FORMATS: Final = ("json", "csv", "parquet", "text")
OWNER_FILE: Final = "_ferrymq_sink.json"
"""The file in a FileSink directory naming the connector, incarnation and task it is bound to
(a leading `_` keeps Spark's readers from taking it for data)."""
_METADATA: Final = "_spark_metadata"
_SPARK_TYPES: Final = frozenset(
    {
        "string",
        "varchar",
        "char",
        "boolean",
        "bool",
        "tinyint",
        "byte",
        "smallint",
        "short",
        "int",
        "integer",
        "bigint",
        "long",
        "float",
        "real",
        "double",
        "decimal",
        "dec",
        "numeric",
        "date",
        "timestamp",
        "timestamp_ntz",
        "timestamp_ltz",
        "binary",
        "array",
        "map",
        "struct",
        "interval",
        "variant",
        "void",
    }
)
_FIELD: Final = re.compile(
    r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)"  # the name, plain or `quoted`
    r"(?:\s*:\s*|\s+)([A-Za-z_][A-Za-z0-9_]*)(.*)",  # the type's first word, the rest
    re.DOTALL,
)
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class FileConnectorError(FerryError):
    """A file connector cannot run as configured: no directory, a bad schema, a bound output."""


# ------------------------------------------------------------------------ config checks


def _split_top(text: str) -> list[str]:
    """`text` cut at commas outside <>, () and backquotes."""
    parts: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, char in enumerate(text):
        if char == "`":
            quoted = not quoted
        elif quoted:
            continue
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def ddl_errors(ddl: str) -> list[str]:
    """What is wrong with a Spark DDL schema (`name type, ...`), checked without a JVM.

    A first check for `validate`: each field is a name and a Spark type, brackets balance. Spark
    parses the schema itself when the task starts (`build`), and its error is the task's.
    """
    text = ddl.strip()
    if not text:
        return ["the schema is empty: give Spark DDL such as 'id bigint, name string'"]
    depth = 0
    for char in text:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0 or text.count("`") % 2:
        return [f"{ddl!r}: unbalanced <>, () or backquotes"]
    problems: list[str] = []
    names: set[str] = set()
    for part in _split_top(text):
        found = _FIELD.fullmatch(part)
        if found is None:
            problems.append(f"{part.strip()!r} is not 'name type' (Spark DDL)")
            continue
        name, kind = found.group(1).strip("`").lower(), found.group(2).lower()
        if kind not in _SPARK_TYPES:
            problems.append(f"{part.strip()!r}: {found.group(2)!r} is not a Spark SQL type")
        if name in names:
            problems.append(f"field {found.group(1)} appears twice")
        names.add(name)
    return problems


def ddl_fields(ddl: str) -> list[str]:
    """The top-level field names of a DDL schema (lowercase, as Spark compares them)."""
    fields: list[str] = []
    for part in _split_top(ddl.strip()):
        found = _FIELD.fullmatch(part)
        if found is not None:
            fields.append(found.group(1).strip("`").lower())
    return fields


def _path_errors(config: Mapping[str, str]) -> list[str]:
    path = (config.get("file.path") or "").strip()
    if not path:
        return []  # the key's own check reports it missing
    if not (path.startswith("/") or _SCHEME.match(path)):
        return [
            f"{path!r} is relative: give an absolute directory (or a URI such as "
            "file:///data/in); a worker's working directory is not the user's"
        ]
    return []


def _local(path: str) -> Path | None:
    """The local directory a `file.path` names (None: a URI of another filesystem)."""
    if path.startswith("file://"):
        return Path(path.removeprefix("file://"))
    return None if _SCHEME.match(path) else Path(path)


def _source_errors(config: Mapping[str, str]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    for problem in _path_errors(config):
        add("file.path", problem)
    form = config.get("file.format") or "text"
    topic = (config.get("topic") or "").strip()
    if topic:
        try:
            validate_topic(topic)
        except ValueError as exc:
            add("topic", str(exc))
    schema = (config.get("schema") or "").strip()
    if schema:
        for problem in ddl_errors(schema):
            add("schema", problem)
    elif form in ("json", "csv"):
        add("schema", f"file.format={form} needs schema (Spark DDL, e.g. 'id bigint, name string')")
    if schema and form == "text":
        add("schema", "file.format=text has one column, value (the line): leave schema out")
    key_field = (config.get("message.key.field") or "").strip()
    if key_field and form == "text":
        add("message.key.field", "file.format=text has no fields: leave message.key.field out")
    elif key_field and schema and key_field.lower() not in ddl_fields(schema):
        add("message.key.field", f"{key_field!r} is not a field of schema")
    if config.get("csv.header") and form != "csv":
        add("csv.header", f"only file.format=csv takes it (not {form})")
    return errors


def _sink_errors(config: Mapping[str, str]) -> dict[str, list[str]]:
    errors = topic_selection_errors(config)

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    for problem in _path_errors(config):
        add("file.path", problem)
    form = config.get("file.format") or "json"
    schema = (config.get("value.schema") or "").strip()
    if schema:
        for problem in ddl_errors(schema):
            add("value.schema", problem)
        if form == "text":
            add("value.schema", "file.format=text writes the value as one line: leave it out")
    if config.get("csv.header") and form != "csv":
        add("csv.header", f"only file.format=csv takes it (not {form})")
    return errors


def _raise_invalid(kind: str, errors: dict[str, list[str]]) -> None:
    if errors:
        details = "; ".join(f"{key}: {' '.join(found)}" for key, found in sorted(errors.items()))
        raise FileConnectorError(f"invalid {kind} config: {details}")


def _bool(config: Mapping[str, str], key: str, default: bool) -> bool:
    return (config.get(key) or str(default)).strip().lower() == "true"


def sink_id(context: TaskContext) -> str:
    """`<connector>:<incarnation>:<task>`, with characters a sink id cannot hold as `_`."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", context.connector)
    incarnation = re.sub(r"[^A-Za-z0-9_.-]", "_", context.incarnation)
    return f"{name}:{incarnation}:{context.task}"[:128]


def _parse_schema(spark: Any, ddl: str, key: str, connector: str) -> Any:
    """Spark's StructType of a DDL schema.

    Raises:
        FileConnectorError: Spark cannot parse it, naming the key and Spark's reason.
    """
    from pyspark.sql.types import StructType, _parse_datatype_string

    del spark  # the parser runs in the session's JVM (the active SparkContext)
    try:
        parsed = _parse_datatype_string(ddl)
    except Exception as exc:  # noqa: BLE001 - Spark's ParseException and its kin
        reason = " ".join(str(exc).split())[:600]
        raise FileConnectorError(
            f"{connector}: {key} {ddl!r} is not a Spark DDL schema: {reason}"
        ) from None
    if not isinstance(parsed, StructType):
        raise FileConnectorError(
            f"{connector}: {key} {ddl!r} is a {parsed.simpleString()}, not a list of fields "
            "('id bigint, name string')"
        )
    return parsed


# ------------------------------------------------------------------------ FileSource


_TOLERANCE: Final = ConfigKey(
    "errors.tolerance",
    ConfigType.STRING,
    "none: a malformed json or csv line fails the task (Spark's FAILFAST); all: it is dropped "
    "(DROPMALFORMED).",
    default="none",
    choices=("none", "all"),
    group="Files",
)
_INTERVAL: Final = ConfigKey(
    "trigger.interval.ms",
    ConfigType.LONG,
    "Micro-batch interval.",
    default="1000",
    minimum=10,
    group="Spark",
)


class FileSource(ConnectorPlugin):
    """A directory of text, JSON lines, CSV or Parquet files into a topic (module docstring)."""

    type = "source"
    version = "1.0"
    keys = (
        ConfigKey(
            "file.path",
            ConfigType.STRING,
            "The directory to read (absolute, or a URI such as file:///data/in); every file "
            "that appears in it is read once.",
            required=True,
            importance="HIGH",
            group="Files",
        ),
        ConfigKey(
            "file.format",
            ConfigType.STRING,
            "text (a message per line), json (JSON lines), csv or parquet.",
            default="text",
            choices=SOURCE_FORMATS,
            importance="HIGH",
            group="Files",
        ),
        ConfigKey(
            "topic",
            ConfigType.STRING,
            "The topic the messages go to.",
            required=True,
            importance="HIGH",
            group="Files",
        ),
        ConfigKey(
            "schema",
            ConfigType.STRING,
            "The files' columns in Spark DDL ('id bigint, name string'); needed by json and csv, "
            "inferred from the files already there for parquet when absent.",
            group="Files",
        ),
        ConfigKey(
            "file.pattern",
            ConfigType.STRING,
            "A glob the file names must match (Spark's pathGlobFilter), e.g. *.json.",
            group="Files",
        ),
        ConfigKey(
            "max.files.per.trigger",
            ConfigType.INT,
            "Files per micro-batch at most (Spark's maxFilesPerTrigger).",
            minimum=1,
            group="Files",
        ),
        ConfigKey(
            "message.key.field",
            ConfigType.STRING,
            "A column whose value (as text) becomes the message key.",
            group="Files",
        ),
        ConfigKey(
            "csv.header",
            ConfigType.BOOLEAN,
            "file.format=csv: the first line of each file names the columns.",
            default="false",
            group="Files",
        ),
        _TOLERANCE,
        _INTERVAL,
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Cross-key rules: the path, the format's schema, the key field, the topic name."""
        return _source_errors(config)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """One task: a directory is one stream (rule 5)."""
        return [dict(config)]

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: the files the committed batches read (module doc)."""
        return [entry for d in scope.checkpoint_dirs for entry in read_files(Path(d))]

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """Always refused: which files were read lives in Spark's file source log."""
        return [_NO_PATCH.format("FileSource")]

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """Fence older owners, then start the task's query: the files into the topic."""
        from pyspark.sql import functions

        from ferrymq.spark.options import WriteOptions
        from ferrymq.spark.sink import start_sink

        _raise_invalid("FileSource", _source_errors(config) | _missing(self, config))
        who = f"FileSource {context.connector}"
        path = config["file.path"].strip()
        form = config.get("file.format") or "text"
        local = _local(path)
        if local is not None and not local.is_dir():
            state = "is not a directory" if local.exists() else "does not exist"
            raise FileConnectorError(
                f"{who}: file.path {path} {state}: create the directory (files are read as "
                "they appear in it)"
            )
        reader = spark.readStream.format(form)
        options: dict[str, str] = {}
        if config.get("file.pattern"):
            options["pathGlobFilter"] = config["file.pattern"]
        if config.get("max.files.per.trigger"):
            options["maxFilesPerTrigger"] = config["max.files.per.trigger"]
        if form in ("json", "csv"):
            tolerant = (config.get("errors.tolerance") or "none") == "all"
            options["mode"] = "DROPMALFORMED" if tolerant else "FAILFAST"
        if form == "csv":
            options["header"] = str(_bool(config, "csv.header", False)).lower()
        schema_text = (config.get("schema") or "").strip()
        if schema_text:
            reader = reader.schema(_parse_schema(spark, schema_text, "schema", who))
        elif form == "parquet":
            reader = reader.schema(_infer_parquet(spark, path, options, who))
        frame = reader.options(**options).load(path)
        if form == "text":
            value = functions.col("value")
        else:
            value = functions.to_json(
                functions.struct(*[functions.col(f"`{c}`") for c in frame.columns])
            )
        columns = [value.alias("value")]
        key_field = (config.get("message.key.field") or "").strip()
        if key_field:
            if key_field.lower() not in {c.lower() for c in frame.columns}:
                raise FileConnectorError(
                    f"{who}: message.key.field {key_field!r} is not a column of the files "
                    f"({', '.join(frame.columns)})"
                )
            columns.append(functions.col(f"`{key_field}`").cast("string").alias("key"))
        topic, fence = config["topic"].strip(), sink_id(context)
        owner = WriteOptions(
            servers=context.namesrv_addr, topic=topic, sink_id=fence, generation=context.generation
        )
        asyncio.run(start_sink(owner))  # rule 3
        writer = (
            frame.select(*columns)
            .writeStream.format("ferrymq")
            .option("servers", context.namesrv_addr)
            .option("topic", topic)
            .option("sinkId", fence)
            .option("generation", str(context.generation))
            .option("checkpointLocation", context.checkpoint_dir)
        )
        return self.start_query(writer, config, context)


def _missing(plugin: ConnectorPlugin, config: Mapping[str, str]) -> dict[str, list[str]]:
    """Each key's own errors (required, type, choices), as `config_infos` reports them."""
    errors: dict[str, list[str]] = {}
    for key in plugin.keys:
        found = key.errors(config.get(key.name))
        if found:
            errors[key.name] = found
    return errors


def _infer_parquet(spark: Any, path: str, options: Mapping[str, str], who: str) -> Any:
    """The schema of the Parquet files already in the directory.

    Raises:
        FileConnectorError: there is none to infer it from.
    """
    reader = spark.read
    if "pathGlobFilter" in options:
        reader = reader.option("pathGlobFilter", options["pathGlobFilter"])
    try:
        schema = reader.parquet(path).schema
    except Exception as exc:  # noqa: BLE001 - AnalysisException: nothing to infer from
        reason = " ".join(str(exc).split())[:300]
        raise FileConnectorError(
            f"{who}: cannot infer the schema of the Parquet files in {path} (none there yet?): "
            f"set schema (Spark DDL). Spark said: {reason}"
        ) from None
    if not schema.fields:
        raise FileConnectorError(
            f"{who}: no Parquet files in {path} to infer the schema from: set schema (Spark DDL)"
        )
    return schema


# ------------------------------------------------------------------------ FileSink


def latest_batch(log_dir: Path) -> int | None:
    """The highest batch id in a Spark metadata log (`offsets/`, `_spark_metadata/`)."""
    if not log_dir.is_dir():
        return None
    found = [
        int(name.removesuffix(".compact"))
        for name in (p.name for p in log_dir.iterdir())
        if name.removesuffix(".compact").isdecimal()
    ]
    return max(found, default=None)


_NO_PATCH: Final = (
    "{} offsets cannot be altered: what was read and written lives in Spark's own logs "
    "(the checkpoint and the directory's _spark_metadata), not in offsets ferrymq sets"
)


def committed_batch(checkpoint: Path) -> tuple[int, list[Any]] | None:
    """A Spark checkpoint's last committed micro-batch and its sources' end offsets (JSON each).

    None before the first commit. A source without an offset is None in the list.
    """
    batch = latest_batch(checkpoint / "commits")
    if batch is None:
        return None
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    # Spark's OffsetSeq: the version, the batch's metadata, then one line per source ("-": none)
    return batch, [None if line == "-" else json.loads(line) for line in lines[2:]]


def read_files(checkpoint: Path) -> list[dict[str, Any]]:
    """FileSource: every file its committed batches read, as KIP-875 entries (module doc).

    Spark's file source log (`sources/0`) has a file per log batch (`n`, or `n.compact` holding
    every entry up to n), each line after the version a `{"path", "timestamp", "batchId"}`.
    """
    committed = committed_batch(checkpoint)
    if committed is None or not committed[1] or not isinstance(committed[1][0], dict):
        return []
    log_offset = int(committed[1][0]["logOffset"])
    log_dir = checkpoint / "sources" / "0"
    read: dict[str, int] = {}
    names = [p.name for p in log_dir.iterdir()] if log_dir.is_dir() else []
    for name in names:
        number = name.removesuffix(".compact")
        if not number.isdecimal() or int(number) > log_offset:
            continue
        for line in (log_dir / name).read_text().splitlines()[1:]:
            if line.strip():
                entry = json.loads(line)
                if int(entry["batchId"]) <= log_offset:
                    read[entry["path"]] = int(entry["batchId"])
    return [
        {"partition": {"filename": path}, "offset": {"logOffset": batch}}
        for path, batch in sorted(read.items(), key=lambda item: (item[1], item[0]))
    ]


def sink_offsets(checkpoint: Path) -> list[dict[str, Any]]:
    """FileSink: the ferrymq queues' next offsets its last committed batch read up to.

    Raises:
        ValueError: the checkpoint's offsets are of neither known shape.
    """
    from ferrymq.spark.plan import parse_offsets

    committed = committed_batch(checkpoint)
    if committed is None or not committed[1] or committed[1][0] is None:
        return []
    offsets = parse_offsets(committed[1][0])
    return [
        {
            "partition": {"topic": topic, "broker": queue.broker_name, "queue": queue.queue_id},
            "offset": {"offset": offset},
        }
        for topic, queues in sorted(offsets.items())
        for queue, offset in sorted(
            queues.items(), key=lambda item: (item[0].broker_name, item[0].queue_id)
        )
    ]


def bind_output(directory: Path, checkpoint: Path, context: TaskContext) -> None:
    """Bind a FileSink directory to this task, or refuse one another writer's log holds (rule 3).

    Raises:
        FileConnectorError: the directory's `_spark_metadata` holds batches this task's
            checkpoint did not plan (another connector, incarnation or checkpoint wrote them).
    """
    owner = {
        "connector": context.connector,
        "incarnation": context.incarnation,
        "task": context.task,
    }
    marker = directory / OWNER_FILE
    logged = latest_batch(directory / _METADATA)
    if logged is None:
        directory.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(owner, sort_keys=True))
        return
    try:
        bound = json.loads(marker.read_text())
    except (OSError, ValueError):
        bound = None
    planned = latest_batch(checkpoint / "offsets")
    if bound == owner and planned is not None and planned >= logged:
        return
    if bound != owner:
        whose = (
            f"connector {bound.get('connector')} (incarnation {bound.get('incarnation')}, task "
            f"{bound.get('task')})"
            if isinstance(bound, dict)
            else "a writer that is not a ferrymq FileSink"
        )
    else:
        whose = "this task with another checkpoint (its checkpoint is missing or behind)"
    raise FileConnectorError(
        f"FileSink {context.connector}: file.path {directory} already holds the output of "
        f"{whose}: its {_METADATA} log has batches up to {logged}, and a query on this task's "
        f"checkpoint ({'nothing planned' if planned is None else f'batch {planned}'}) would "
        "skip its first batches. Write into a new or empty directory, or keep the task's "
        "checkpoint with the directory (storePathRootDir on the same filesystem)"
    )


class FileSink(ConnectorPlugin):
    """Topics into a directory of JSON, CSV, Parquet or text files (module docstring)."""

    type = "sink"
    version = "1.0"
    keys = (
        ConfigKey("topics", ConfigType.LIST, "Topics to read, comma-separated (or topics.regex)."),
        ConfigKey("topics.regex", ConfigType.STRING, "A Python regular expression over topics."),
        ConfigKey(
            "file.path",
            ConfigType.STRING,
            "The output directory (absolute, or a URI); one FileSink writes into it.",
            required=True,
            importance="HIGH",
            group="Files",
        ),
        ConfigKey(
            "file.format",
            ConfigType.STRING,
            "json, csv, parquet, or text (the value as one line).",
            default="json",
            choices=SINK_FORMATS,
            importance="HIGH",
            group="Files",
        ),
        ConfigKey(
            "value.schema",
            ConfigType.STRING,
            "Spark DDL of the JSON values ('id bigint, name string'): its fields become the "
            "columns instead of key, value, topic, partition, offset, timestamp.",
            group="Files",
        ),
        ConfigKey(
            "csv.header",
            ConfigType.BOOLEAN,
            "file.format=csv: write the column names as each file's first line.",
            default="false",
            group="Files",
        ),
        ConfigKey(
            "startingOffsets",
            ConfigType.STRING,
            "Where the task's first run starts.",
            default="earliest",
            choices=("earliest", "latest"),
            group="Spark",
        ),
        ConfigKey(
            "maxOffsetsPerTrigger",
            ConfigType.LONG,
            "Messages per micro-batch at most.",
            minimum=1,
            group="Spark",
        ),
        _INTERVAL,
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Cross-key rules: one of topics/topics.regex, the path, the value schema."""
        return _sink_errors(config)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """One task: one writer per `_spark_metadata` (rule 3)."""
        return [dict(config)]

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: the queues' next offsets the checkpoint committed."""
        return [entry for d in scope.checkpoint_dirs for entry in sink_offsets(Path(d))]

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """Always refused: the directory's `_spark_metadata` log says which batches it holds."""
        return [_NO_PATCH.format("FileSink")]

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """Bind the directory to the task, then start its query: topics into files."""
        from pyspark.sql import functions

        _raise_invalid("FileSink", _sink_errors(config) | _missing(self, config))
        who = f"FileSink {context.connector}"
        path = config["file.path"].strip()
        form = config.get("file.format") or "json"
        schema_text = (config.get("value.schema") or "").strip()
        schema = _parse_schema(spark, schema_text, "value.schema", who) if schema_text else None
        local = _local(path)
        if local is not None:
            if local.exists() and not local.is_dir():
                raise FileConnectorError(f"{who}: file.path {path} is a file, not a directory")
            bind_output(local, Path(context.checkpoint_dir), context)
        reader = (
            spark.readStream.format("ferrymq")
            .option("servers", context.namesrv_addr)
            .option("startingOffsets", config.get("startingOffsets") or "earliest")
        )
        if config.get("topics.regex"):
            reader = reader.option("subscribePattern", config["topics.regex"])
        else:
            reader = reader.option("subscribe", ",".join(list_value(config, "topics")))
        if config.get("maxOffsetsPerTrigger"):
            reader = reader.option("maxOffsetsPerTrigger", config["maxOffsetsPerTrigger"])
        rows = reader.load()
        if schema is not None:
            parsed = functions.from_json(
                functions.col("value").cast("string"), schema, {"mode": "FAILFAST"}
            )
            out = rows.select(parsed.alias("v")).select("v.*")
        elif form == "text":
            out = rows.select(functions.col("value").cast("string").alias("value"))
        else:
            kind = "binary" if form == "parquet" else "string"
            out = rows.select(
                functions.col("key").cast(kind).alias("key"),
                functions.col("value").cast(kind).alias("value"),
                "topic",
                "partition",
                "offset",
                "timestamp",
            )
        writer = out.writeStream.format(form).option("path", path)
        if form == "csv":
            writer = writer.option("header", str(_bool(config, "csv.header", False)).lower())
        if form == "json":
            writer = writer.option("ignoreNullFields", "false")  # every line has every column
        writer = writer.option("checkpointLocation", context.checkpoint_dir)
        return self.start_query(writer, config, context)
