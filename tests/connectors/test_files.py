"""FileSource and FileSink: validation, each format end to end, exactly once across kill -9.

The queries run on the shared SparkSession against the session's ferrymq processes; the crash
tests run the task in a driver process of its own (`driver.py`) and kill that whole process tree
by PID at a random moment (the seed is in every assertion message), then start a driver on the
same checkpoint and check every line or message arrived exactly once.
"""

import asyncio
import csv
import json
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ferrymq.connect.plugin import Plugins, TaskContext, config_infos
from ferrymq.connect.tasks import TaskSpec
from ferrymq.connectors.files import (
    OWNER_FILE,
    FileConnectorError,
    FileSink,
    FileSource,
    latest_batch,
)
from ferrymq.connectors.runtime import SparkTaskRunner

from ..spark.conftest import Ferry
from .conftest import (
    create_topic,
    end_offsets,
    produce_json,
    read_topic,
    run_until,
    start_driver,
    stop_driver,
    wait_until,
)

SOURCE = {
    "name": "files-in",
    "connector.class": "FileSource",
    "file.path": "/data/in",
    "file.format": "json",
    "topic": "orders",
    "schema": "id bigint, customer string, amount decimal(10,2)",
    "message.key.field": "customer",
}
SINK = {
    "name": "files-out",
    "connector.class": "FileSink",
    "topics": "orders",
    "file.path": "/data/out",
    "file.format": "parquet",
    "value.schema": "id bigint, customer string",
}


def errors(infos: dict[str, Any]) -> dict[str, list[str]]:
    return {
        c["value"]["name"]: c["value"]["errors"] for c in infos["configs"] if c["value"]["errors"]
    }


def context(ferry: Ferry, tmp_path: Path, name: str, generation: int = 1) -> TaskContext:
    return TaskContext(name, "inc-1", 0, generation, "tests", ferry.servers, str(tmp_path / name))


def topic_size(ferry: Ferry, topic: str) -> int:
    return sum(asyncio.run(end_offsets(ferry.servers, topic)).values())


def committed_files(directory: Path) -> list[Path]:
    """The data files a FileSink directory's `_spark_metadata` lists (what Spark reads)."""
    files: dict[str, bool] = {}
    log = directory / "_spark_metadata"
    entries = sorted(
        (p for p in log.glob("*") if p.name.removesuffix(".compact").isdecimal()),
        key=lambda p: int(p.name.removesuffix(".compact")),
    )
    for entry in entries:
        for line in entry.read_text().splitlines()[1:]:
            item = json.loads(line)
            files[item["path"]] = item["action"] == "add"
    return [Path(path.removeprefix("file://")) for path, added in files.items() if added]


def committed_lines(directory: Path) -> list[dict[str, Any]]:
    """Every JSON line of the committed files of a FileSink directory (json format)."""
    return [
        json.loads(line)
        for path in committed_files(directory)
        for line in path.read_text().splitlines()
        if line
    ]


# ---------------------------------------------------------------- validation (no servers)


def test_the_file_plugins_are_installed_under_their_short_names() -> None:
    plugins = Plugins()
    assert plugins.resolve("FileSource")[1] is FileSource
    assert plugins.resolve("FileSink")[1] is FileSink
    listed = {p["class"]: p["type"] for p in plugins.listing()}
    assert listed["ferrymq.connectors.files.FileSource"] == "source"
    assert listed["ferrymq.connectors.files.FileSink"] == "sink"


def test_valid_file_configs_have_no_errors_and_one_task() -> None:
    for plugin, config in ((FileSource(), SOURCE), (FileSink(), SINK)):
        infos = config_infos(type(plugin).__name__, plugin, config)
        assert infos["error_count"] == 0, errors(infos)
        assert plugin.task_configs(config, 4) == [config]
    text = {k: v for k, v in SOURCE.items() if k not in ("schema", "message.key.field")}
    assert FileSource().validate({**text, "file.format": "text"}) == {}
    assert FileSource().validate({**text, "file.format": "parquet"}) == {}
    assert FileSink().validate({**SINK, "value.schema": "", "file.format": "text"}) == {}


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"file.path": None}, "file.path", 'Missing required configuration "file.path"'),
        ({"file.path": "data/in"}, "file.path", "is relative"),
        ({"file.format": "avro"}, "file.format", "String must be one of: text, json, csv"),
        ({"topic": None}, "topic", 'Missing required configuration "topic"'),
        ({"topic": "bad topic"}, "topic", "bad topic"),
        ({"schema": None, "message.key.field": None}, "schema", "json needs schema"),
        ({"file.format": "csv", "schema": ""}, "schema", "csv needs schema"),
        ({"schema": "id bigintt, customer string"}, "schema", "'bigintt' is not a Spark SQL type"),
        ({"schema": "id bigint,"}, "schema", "is not 'name type'"),
        ({"schema": "id array<int"}, "schema", "unbalanced"),
        ({"schema": "id int, ID string"}, "schema", "appears twice"),
        ({"message.key.field": "nope"}, "message.key.field", "'nope' is not a field of schema"),
        ({"file.format": "text", "schema": None}, "message.key.field", "text has no fields"),
        ({"csv.header": "true"}, "csv.header", "only file.format=csv"),
        ({"max.files.per.trigger": "0"}, "max.files.per.trigger", "at least 1"),
        ({"errors.tolerance": "some"}, "errors.tolerance", "none, all"),
    ],
)
def test_file_source_validation_names_the_key(
    change: dict[str, str | None], key: str, message: str
) -> None:
    config = {k: v for k, v in {**SOURCE, **change}.items() if v is not None}
    found = errors(config_infos("FileSource", FileSource(), config))
    assert key in found, found
    assert any(message in e for e in found[key]), found[key]


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"topics": None}, "topics", "exactly one of topics and topics.regex"),
        ({"topics.regex": "ord.*"}, "topics", "exactly one of topics and topics.regex"),
        ({"topics": None, "topics.regex": "(bad"}, "topics.regex", "not a regular expression"),
        ({"file.path": "out"}, "file.path", "is relative"),
        ({"file.format": "orc"}, "file.format", "String must be one of: json, csv, parquet"),
        ({"value.schema": "id nosuchtype"}, "value.schema", "not a Spark SQL type"),
        ({"file.format": "text"}, "value.schema", "text writes the value as one line"),
        ({"csv.header": "yes"}, "csv.header", "either true or false"),
        ({"maxOffsetsPerTrigger": "x"}, "maxOffsetsPerTrigger", "Not a number"),
    ],
)
def test_file_sink_validation_names_the_key(
    change: dict[str, str | None], key: str, message: str
) -> None:
    config = {k: v for k, v in {**SINK, **change}.items() if v is not None}
    found = errors(config_infos("FileSink", FileSink(), config))
    assert key in found, found
    assert any(message in e for e in found[key]), found[key]


def test_a_uri_path_is_accepted_and_an_invalid_config_fails_build_naming_the_key(
    tmp_path: Path,
) -> None:
    assert FileSource().validate({**SOURCE, "file.path": "hdfs://nn:8020/in"}) == {}
    ctx = TaskContext("bad", "inc-1", 0, 1, "tests", "127.0.0.1:1", str(tmp_path / "cp"))
    with pytest.raises(FileConnectorError, match=r"invalid FileSource config: schema: .*needs"):
        FileSource().build(None, {**SOURCE, "schema": "", "message.key.field": ""}, ctx)
    with pytest.raises(FileConnectorError, match=r"file\.path .*missing does not exist"):
        FileSource().build(None, {**SOURCE, "file.path": str(tmp_path / "missing")}, ctx)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(FileConnectorError, match="is not a directory"):
        FileSource().build(None, {**SOURCE, "file.path": str(a_file)}, ctx)


# ---------------------------------------------------------------- end to end, in process


def _write_source_files(directory: Path, form: str, first: int, count: int, name: str) -> None:
    """`count` rows (ids first..) in one complete file, moved into `directory` by rename."""
    rows = [
        {"id": i, "customer": f"c{i % 7}", "amount": f"{i}.50"} for i in range(first, first + count)
    ]
    staging = directory.parent / f"{directory.name}.staging"
    staging.mkdir(exist_ok=True)
    target = staging / name
    if form == "json":
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif form == "csv":
        with target.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["id", "customer", "amount"])
            writer.writerows([r["id"], r["customer"], r["amount"]] for r in rows)
    elif form == "text":
        target.write_text("".join(f"line {r['id']}\n" for r in rows))
    else:
        table = pa.table(
            {
                "id": pa.array([r["id"] for r in rows], pa.int64()),
                "customer": [r["customer"] for r in rows],
                "amount": [float(str(r["amount"])) for r in rows],
            }
        )
        pq.write_table(table, target)
    target.rename(directory / name)


@pytest.mark.spark
@pytest.mark.timeout(240)
@pytest.mark.parametrize("form", ["json", "csv", "text", "parquet"])
def test_file_source_sends_each_row_once_with_its_key(
    spark: Any, ferry: Ferry, tmp_path: Path, form: str
) -> None:
    topic = f"files-in-{form}"
    asyncio.run(create_topic(ferry.servers, topic, 4))
    directory = tmp_path / "in"
    directory.mkdir()
    suffix = {"json": "json", "csv": "csv", "text": "txt", "parquet": "parquet"}[form]
    _write_source_files(directory, form, 0, 300, f"a.{suffix}")
    (directory / "ignored.tmp").write_text("not matched by file.pattern\n")
    config: dict[str, str] = {
        "name": topic,
        "connector.class": "FileSource",
        "file.path": str(directory),
        "file.format": form,
        "topic": topic,
        "file.pattern": f"*.{suffix}",
        "trigger.interval.ms": "200",
    }
    if form in ("json", "csv"):
        config["schema"] = "id bigint, customer string, amount decimal(10,2)"
    if form == "csv":
        config["csv.header"] = "true"
    if form != "text":
        config["message.key.field"] = "customer"
    assert FileSource().validate(config) == {}
    query = FileSource().build(spark, config, context(ferry, tmp_path, topic))
    try:
        run_until(query, "the first file sent", lambda: topic_size(ferry, topic) == 300)
        _write_source_files(directory, form, 300, 200, f"b.{suffix}")
        run_until(query, "the second file sent", lambda: topic_size(ferry, topic) == 500)
    finally:
        query.stop()
    messages = asyncio.run(read_topic(ferry.servers, topic))
    assert len(messages) == 500
    if form == "text":
        assert sorted(m.body.decode() for m in messages) == sorted(f"line {i}" for i in range(500))
        assert all(not m.keys for m in messages)
        return
    bodies = [json.loads(m.body) for m in messages]
    assert sorted(b["id"] for b in bodies) == list(range(500))
    assert {(m.keys[0], json.loads(m.body)["customer"]) for m in messages} == {
        (f"c{i}", f"c{i}") for i in range(7)
    }
    # one key, one queue
    queues: dict[str, set[tuple[str, int]]] = {m.keys[0]: set() for m in messages}
    for m in messages:
        queues[m.keys[0]].add((m.broker_name, m.queue_id))
    assert all(len(q) == 1 for q in queues.values())
    first = next(b for b in bodies if b["id"] == 3)
    assert first["customer"] == "c3"
    assert float(first["amount"]) == 3.5


@pytest.mark.spark
@pytest.mark.timeout(240)
@pytest.mark.parametrize("form", ["json", "parquet", "csv", "text"])
def test_file_sink_writes_each_message_once(
    spark: Any, ferry: Ferry, tmp_path: Path, form: str
) -> None:
    topic = f"files-out-{form}"
    asyncio.run(create_topic(ferry.servers, topic, 2))
    documents = [{"id": i, "customer": f"c{i % 5}"} for i in range(400)]
    asyncio.run(produce_json(ferry.servers, topic, documents))
    out = tmp_path / "out"
    config = {
        "name": topic,
        "connector.class": "FileSink",
        "topics": topic,
        "file.path": str(out),
        "file.format": form,
        "trigger.interval.ms": "200",
    }
    if form == "parquet":
        config["value.schema"] = "id bigint, customer string"
    if form == "csv":
        config["csv.header"] = "true"
    assert FileSink().validate(config) == {}
    query = FileSink().build(spark, config, context(ferry, tmp_path, topic))
    expected = 400

    def output() -> Any:
        reader = spark.read.format(form)
        if form == "csv":
            reader = reader.option("header", "true")
        return reader.load(str(out))

    def written() -> bool:
        done = latest_batch(out / "_spark_metadata") is not None
        return done and int(output().count()) == expected

    try:
        run_until(query, "every message written", written)
        asyncio.run(produce_json(ferry.servers, topic, [{"id": 400, "customer": "late"}]))
        expected = 401
        run_until(query, "the late message written", written)
    finally:
        query.stop()
    assert json.loads((out / OWNER_FILE).read_text()) == {
        "connector": topic,
        "incarnation": "inc-1",
        "task": 0,
    }
    frame = output()
    if form == "parquet":
        assert frame.columns == ["id", "customer"]
        assert sorted(r["id"] for r in frame.collect()) == list(range(401))
        return
    if form == "text":
        values = sorted(json.loads(r["value"])["id"] for r in frame.collect())
        assert values == list(range(401))
        return
    assert set(frame.columns) == {"key", "value", "topic", "partition", "offset", "timestamp"}
    rows = frame.collect()
    assert sorted(json.loads(r["value"])["id"] for r in rows) == list(range(401))
    assert {r["topic"] for r in rows} == {topic}
    assert len({(r["partition"], r["offset"]) for r in rows}) == 401


# ---------------------------------------------------------------- failures: FAILED with a trace


def active_here(spark: Any) -> Any:
    """The shared session, made the active one of the calling thread (the runtime's Spark thread).

    Spark looks a streaming sink's Python data source up in the calling thread's active session.
    """
    from pyspark.sql import SparkSession

    SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
    return spark


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_bad_setups_are_failed_tasks_with_clear_traces(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    runner = SparkTaskRunner(
        Plugins(),
        cluster_id="tests",
        namesrv_addr=ferry.servers,
        state_dir=tmp_path / "state",
        session_factory=lambda *_: active_here(spark),
    )

    def spec(name: str, config: dict[str, str]) -> TaskSpec:
        full = {"name": name, **config}
        return TaskSpec((name, "inc-1", 0), 1, 1, 0, full, full, None)

    async def start_fails(name: str, config: dict[str, str]) -> str:
        try:
            await runner.start(spec(name, config))
        except FileConnectorError as exc:
            return str(exc)
        raise AssertionError(f"{name} started")

    directory = tmp_path / "in"
    directory.mkdir()
    source = {
        "connector.class": "FileSource",
        "file.path": str(directory),
        "file.format": "json",
        "topic": "files-bad",
        "schema": "id bigint",
    }
    missing = asyncio.run(start_fails("missing", {**source, "file.path": str(tmp_path / "nope")}))
    assert f"file.path {tmp_path / 'nope'} does not exist" in missing
    # passes the check without a JVM, but Spark cannot parse it
    bad = asyncio.run(start_fails("bad-schema", {**source, "schema": "id decimal(x)"}))
    assert "schema 'id decimal(x)' is not a Spark DDL schema" in bad
    empty = asyncio.run(
        start_fails("no-parquet", {**source, "file.format": "parquet", "schema": ""})
    )
    assert "cannot infer the schema of the Parquet files" in empty
    assert "set schema" in empty

    # a sink directory another connector's _spark_metadata holds
    taken = tmp_path / "taken"
    (taken / "_spark_metadata").mkdir(parents=True)
    (taken / "_spark_metadata" / "0").write_text("v1\n")
    (taken / OWNER_FILE).write_text(
        json.dumps({"connector": "other", "incarnation": "i", "task": 0})
    )
    sink = {"connector.class": "FileSink", "topics": "files-bad", "file.path": str(taken)}
    bound = asyncio.run(start_fails("second-writer", sink))
    assert "already holds the output of connector other" in bound
    assert "batches up to 0" in bound

    # a malformed line at run time: the query ends, and the runtime reports its trace
    asyncio.run(create_topic(ferry.servers, "files-bad", 1))
    (directory / "bad.json").write_text('{"id": 1}\n{"id": \n')
    started = spec("malformed", {**source, "trigger.interval.ms": "100"})

    async def run_malformed() -> str | None:
        await runner.start(started)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            await runner.refresh()
            trace = runner.failure(started.key)
            if trace is not None:
                return trace
            await asyncio.sleep(0.3)
        return None

    try:
        trace = asyncio.run(run_malformed())
    finally:
        asyncio.run(runner.stop(started.key))
    assert trace is not None, "the query did not fail"
    assert "error while reading file" in trace, trace[-2000:]
    assert f"{directory}/bad.json" in trace
    assert topic_size(ferry, "files-bad") == 0


# ---------------------------------------------------------------- kill -9 of the driver


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_file_source_is_exactly_once_across_kill_9_of_the_driver(
    ferry: Ferry, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic, per_file = "files-crash", 400
    asyncio.run(create_topic(ferry.servers, topic, 4))
    directory = tmp_path / "in"
    directory.mkdir()
    files = 0

    def add_files(count: int) -> None:
        nonlocal files
        for _ in range(count):
            _write_source_files(directory, "json", files * per_file, per_file, f"f{files:04d}.json")
            files += 1

    add_files(40)
    log = tmp_path / "driver.log"
    args: dict[str, Any] = {
        "plugin": "FileSource",
        "servers": ferry.servers,
        "connector": "files-crash",
        "incarnation": "inc-1",
        "config": {
            "name": "files-crash",
            "connector.class": "FileSource",
            "file.path": str(directory),
            "file.format": "json",
            "topic": topic,
            "schema": "id bigint, customer string, amount decimal(10,2)",
            "message.key.field": "customer",
            "max.files.per.trigger": "2",
            "trigger.interval.ms": "100",
        },
        "tasks": [{"task": 0, "generation": 1, "checkpoint": str(tmp_path / "cp")}],
    }
    for round_ in range(2):
        driver = start_driver(log, **args)
        try:
            before = topic_size(ferry, topic)
            wait_until(
                f"round {round_} sending",
                lambda before=before: topic_size(ferry, topic) > before,  # type: ignore[misc]
                driver,
                log,
            )
            time.sleep(rng.uniform(0, 1.5))
        finally:
            stop_driver(driver)
        assert topic_size(ferry, topic) < files * per_file, f"seed {seed}: finished before the kill"
        add_files(10)
    driver = start_driver(log, **args)
    try:
        wait_until(
            "every file sent",
            lambda: topic_size(ferry, topic) >= files * per_file,
            driver,
            log,
            240,
        )
        time.sleep(1)  # nothing more may come
    finally:
        stop_driver(driver)
    ids = [json.loads(m.body)["id"] for m in asyncio.run(read_topic(ferry.servers, topic))]
    assert len(ids) == files * per_file, f"seed {seed}: {len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == list(range(files * per_file)), f"seed {seed}"


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_file_sink_is_exactly_once_across_kill_9_of_the_driver(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic = "files-sink-crash"
    asyncio.run(create_topic(ferry.servers, topic, 4))
    total = 20_000
    asyncio.run(produce_json(ferry.servers, topic, [{"id": i} for i in range(total)]))
    out = tmp_path / "out"
    log = tmp_path / "driver.log"
    args: dict[str, Any] = {
        "plugin": "FileSink",
        "servers": ferry.servers,
        "connector": "files-sink-crash",
        "incarnation": "inc-1",
        "config": {
            "name": "files-sink-crash",
            "connector.class": "FileSink",
            "topics": topic,
            "file.path": str(out),
            "file.format": "json",
            "maxOffsetsPerTrigger": "1000",
            "trigger.interval.ms": "100",
        },
        "tasks": [{"task": 0, "generation": 1, "checkpoint": str(tmp_path / "cp")}],
    }
    for round_ in range(2):
        driver = start_driver(log, **args)
        try:
            before = len(committed_files(out)) if out.exists() else 0
            wait_until(
                f"round {round_} writing",
                lambda before=before: out.exists() and len(committed_files(out)) > before,  # type: ignore[misc]
                driver,
                log,
            )
            time.sleep(rng.uniform(0, 1.5))
        finally:
            stop_driver(driver)
        assert len(committed_lines(out)) < total, f"seed {seed}: finished before the kill"
        asyncio.run(
            produce_json(ferry.servers, topic, [{"id": i} for i in range(total, total + 1000)])
        )
        total += 1000
    driver = start_driver(log, **args)
    try:
        wait_until(
            "every message written", lambda: len(committed_lines(out)) >= total, driver, log, 240
        )
        time.sleep(1)
    finally:
        stop_driver(driver)
    lines = committed_lines(out)
    ids = [json.loads(line["value"])["id"] for line in lines]
    assert len(ids) == total, f"seed {seed}: {len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == list(range(total)), f"seed {seed}"
    assert len({(line["partition"], line["offset"]) for line in lines}) == total
    # Spark's own reader sees the same: only the committed files
    assert spark.read.json(str(out)).count() == total
