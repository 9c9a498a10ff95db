"""PostgresSink on the shared SparkSession: upsert, the offsets API, fencing, bad input, bad setups.

Queries run in this process (`spark` fixture), built the way a worker's runtime builds them;
each test has its own database, topics and connector name.
"""

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ferrymq.connect.plugin import TaskContext
from ferrymq.connect.records import OffsetEntry, OffsetsPut
from ferrymq.connectors.postgres import FencedError, PostgresConnectorError
from ferrymq.connectors.postgres_sink import (
    PostgresSink,
    create_offsets_tables,
    sink_spec,
    write_task,
)

from ..spark.conftest import Ferry
from .conftest import (
    create_topic,
    end_offsets,
    ended_with,
    produce_json,
    produce_raw,
    read_topic,
    run_until,
    stored_offsets,
)
from .postgres import PASSWORD, Database, PostgresServer

pytestmark = [pytest.mark.postgres]


def context(ferry: Ferry, tmp_path: Path, name: str, generation: int, task: int = 0) -> TaskContext:
    checkpoint = tmp_path / f"{name}-g{generation}-t{task}"
    return TaskContext(name, "inc-1", task, generation, "tests", ferry.servers, str(checkpoint))


def sink_config(database: Database, name: str, topic: str, **extra: str) -> dict[str, str]:
    return {
        "name": name,
        "connector.class": "PostgresSink",
        "topics": topic,
        **database.config,
        "trigger.interval.ms": "200",
        **extra,
    }


def start(spark: Any, config: dict[str, str], ctx: TaskContext) -> Any:
    [task] = PostgresSink().task_configs(config, 1)
    return PostgresSink().build(spark, task, ctx)


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_upsert_and_an_offsets_rewind_write_exactly_the_rewound_messages_again(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    topic = "PgUpsert"
    asyncio.run(create_topic(ferry.servers, topic, 2))
    # 3,000 messages for 1,000 keys, each key's messages in one queue (in order)
    documents = [{"id": i % 1000, "v": i} for i in range(3000)]
    asyncio.run(produce_json(ferry.servers, topic, documents, queue_of=lambda d: d["id"] % 2))
    database.query("CREATE TABLE upserts (id bigint PRIMARY KEY, v bigint NOT NULL)")
    database.query("CREATE TABLE applied (n bigserial, id bigint, v bigint)")  # every write
    database.query(
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO applied (id, v) VALUES (NEW.id, NEW.v); RETURN NEW; END $$"
    )
    database.query(
        "CREATE TRIGGER audit AFTER INSERT OR UPDATE ON upserts "
        "FOR EACH ROW EXECUTE FUNCTION audit()"
    )
    config = sink_config(
        database,
        "upsert",
        topic,
        fields="id bigint, v bigint not null",
        **{
            "table.name.format": "upserts",
            "insert.mode": "upsert",
            "pk.mode": "record_value",
            "pk.fields": "id",
            "maxOffsetsPerTrigger": "1000",
        },
    )
    assert PostgresSink().validate(config) == {}
    ends = asyncio.run(end_offsets(ferry.servers, topic))

    query = start(spark, config, context(ferry, tmp_path, "upsert", 1))
    try:
        run_until(query, "all written", lambda: stored_offsets(database, "upsert") == ends)
    finally:
        query.stop()
    assert database.query("SELECT count(*), sum(v) FROM upserts") == [
        (1000, sum(range(2000, 3000)))
    ]
    [(applied_before,)] = database.query("SELECT max(n) FROM applied")

    # GET /offsets, a bad PATCH, and an alter rewinding each queue by 500
    sink = PostgresSink()
    shown = sink.offsets(config, "inc-1")
    assert shown == [
        {"partition": {"topic": topic, "broker": b, "queue": q}, "offset": {"offset": n}}
        for (b, q), n in sorted(ends.items())
    ]
    assert sink.check_offsets(config, [OffsetEntry({"topic": topic}, {"offset": 1})])
    assert sink.check_offsets(config, [OffsetEntry(shown[0]["partition"], {"offset": -1})])
    rewind = [OffsetEntry(e["partition"], {"offset": e["offset"]["offset"] - 500}) for e in shown]
    assert sink.check_offsets(config, rewind) == []
    change = OffsetsPut("upsert", "inc-1", "request-1", rewind)
    rewound = context(ferry, tmp_path, "upsert", 2)
    query = PostgresSink().build(spark, config, replace(rewound, extra={"offsets": change}))
    try:
        run_until(query, "rewritten", lambda: stored_offsets(database, "upsert") == ends)
    finally:
        query.stop()
    again = database.query("SELECT id, v FROM applied WHERE n > %s", applied_before)
    assert sorted(again) == [(k, k + 2000) for k in range(1000)]  # the last 500 of each queue
    assert database.query("SELECT count(*), sum(v) FROM upserts") == [
        (1000, sum(range(2000, 3000)))
    ]

    # the same change again (a task restarted on a fresh checkpoint): applied once only
    assert sink.apply_offsets(config, change) is False
    sink.apply_offsets(config, OffsetsPut("upsert", "inc-1", "request-2", None))  # reset
    assert sink.offsets(config, "inc-1") == []


def rows(topic: str, offsets: range, queue: int = 0) -> pa.RecordBatch:
    """What the sink's query hands a writer task: one queue's messages at these offsets."""
    count = len(offsets)
    return pa.RecordBatch.from_pydict(
        {
            "topic": [topic] * count,
            "brokerName": ["broker-a"] * count,
            "queueId": pa.array([queue] * count, pa.int32()),
            "offset": pa.array(list(offsets), pa.int64()),
            "key": pa.array([None] * count, pa.binary()),
            "value": [json.dumps({"id": o}).encode() for o in offsets],
        }
    )


@pytest.mark.timeout(120)
def test_an_older_generation_is_refused_once_a_newer_one_has_written(
    ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    config = sink_config(
        database, "fenced", "Fenced", fields="id bigint", **{"auto.create": "true"}
    )
    zombie = sink_spec(config, context(ferry, tmp_path, "fenced", 1))
    owner = sink_spec(config, context(ferry, tmp_path, "fenced", 2))
    with owner.target.with_password(PASSWORD).connect("tests", autocommit=True) as conn:
        create_offsets_tables(conn)  # what build does first

    assert write_task(zombie, PASSWORD, iter([rows("Fenced", range(10))])).written == 10
    done = write_task(owner, PASSWORD, iter([rows("Fenced", range(5, 15))]))
    assert (done.written, done.skipped) == (5, 5)
    with pytest.raises(FencedError, match=r"generation 2 owns Fenced/broker-a/0"):
        write_task(zombie, PASSWORD, iter([rows("Fenced", range(15, 20))]))
    assert database.query('SELECT count(*), max(id) FROM "Fenced"') == [(15, 14)]
    assert stored_offsets(database, "fenced") == {("broker-a", 0): 15}
    assert database.query("SELECT generation FROM ferry_connect_offsets") == [(2,)]

    # a zombie owner that starts after the newer one did is refused before its query starts
    asyncio.run(create_topic(ferry.servers, "Fenced", 1))
    with pytest.raises(FencedError, match="zombie"):
        PostgresSink().build(None, config, context(ferry, tmp_path, "fenced", 1))


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_malformed_messages_go_to_the_dead_letter_topic_or_fail_the_task(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    topic, dead = "PgBad", "PgBad-dlq"
    asyncio.run(create_topic(ferry.servers, topic, 1))
    asyncio.run(create_topic(ferry.servers, dead, 1))
    bad = [b"not json", b'{"id": "seven"}', b"[1, 2]", b'{"name": "no id"}']
    asyncio.run(
        produce_json(ferry.servers, topic, [{"id": i, "name": f"n{i}"} for i in range(100)])
    )
    asyncio.run(produce_raw(ferry.servers, topic, bad))
    asyncio.run(produce_json(ferry.servers, topic, [{"id": i} for i in range(100, 200)]))
    fields = "id bigint not null, name text"
    ends = asyncio.run(end_offsets(ferry.servers, topic))

    tolerant = sink_config(
        database,
        "tolerant",
        topic,
        fields=fields,
        **{
            "auto.create": "true",
            "errors.tolerance": "all",
            "errors.deadletterqueue.topic.name": dead,
        },
    )
    query = start(spark, tolerant, context(ferry, tmp_path, "tolerant", 1))
    try:
        run_until(query, "all handled", lambda: stored_offsets(database, "tolerant") == ends)
    finally:
        query.stop()
    assert database.query('SELECT count(*), count(DISTINCT id) FROM "PgBad"') == [(200, 200)]
    letters = asyncio.run(read_topic(ferry.servers, dead))
    assert sorted(m.body for m in letters) == sorted(bad)
    reasons = {m.body: m.properties["__connect.errors.exception.message"] for m in letters}
    assert reasons[b"not json"].startswith("the body is not JSON")
    assert reasons[b'{"id": "seven"}'] == 'field id (bigint): expected an integer, got "seven"'
    assert reasons[b'{"name": "no id"}'].startswith("field id: missing or null")
    assert {m.properties["__connect.errors.offset"] for m in letters} == {
        "100",
        "101",
        "102",
        "103",
    }

    strict = sink_config(
        database,
        "strict",
        topic,
        fields=fields,
        **{"table.name.format": "strict_rows", "auto.create": "true"},
    )
    query = start(spark, strict, context(ferry, tmp_path, "strict", 1))
    message = ended_with(query)
    assert "malformed message at PgBad/broker-a/0 offset 100: the body is not JSON" in message
    assert "errors.tolerance=none" in message
    assert database.query("SELECT count(*) FROM strict_rows") == [(0,)]  # rolled back


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_a_wrong_password_a_missing_table_or_no_server_fail_with_a_clear_error(
    spark: Any, ferry: Ferry, postgres: PostgresServer, database: Database, tmp_path: Path
) -> None:
    topic = "PgSetup"
    asyncio.run(create_topic(ferry.servers, topic, 1))
    config = sink_config(
        database, "setup", topic, fields="id bigint", **{"table.name.format": "setup_rows"}
    )
    ctx = context(ferry, tmp_path, "setup", 1)

    wrong = {**config, "connection.password": "not-the-password"}
    with pytest.raises(PostgresConnectorError) as failed:
        PostgresSink().build(spark, wrong, ctx)
    assert 'password authentication failed for user "postgres"' in str(failed.value)
    assert "not-the-password" not in str(failed.value)
    assert f"postgresql://postgres@127.0.0.1:{postgres.port}/{database.name}" in str(failed.value)

    with pytest.raises(
        PostgresConnectorError, match=r'"setup_rows" does not exist .* auto.create is false'
    ):
        PostgresSink().build(spark, config, ctx)

    closed = {**config, "connection.url": f"postgresql://postgres@127.0.0.1:1/{database.name}"}
    with pytest.raises(PostgresConnectorError, match=r"cannot connect to PostgreSQL at .*:1/"):
        PostgresSink().build(spark, closed, ctx)

    # a table dropped under a running query ends it with the same clear error
    database.query("CREATE TABLE setup_rows (id bigint)")
    asyncio.run(produce_json(ferry.servers, topic, [{"id": i} for i in range(10)]))
    query = PostgresSink().build(spark, config, ctx)
    try:
        run_until(
            query, "written", lambda: database.query("SELECT count(*) FROM setup_rows") == [(10,)]
        )
        database.query("DROP TABLE setup_rows")
        asyncio.run(produce_json(ferry.servers, topic, [{"id": i} for i in range(10, 20)]))
        assert 'table "setup_rows" does not exist' in ended_with(query)
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_spark_sql_expressions_compute_the_columns_and_a_bad_one_fails_the_start(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    topic = "PgExpr"
    asyncio.run(create_topic(ferry.servers, topic, 2))
    documents = [{"a": str(i), "name": f"n{i}", "x": i * 10} for i in range(40)]
    asyncio.run(produce_json(ferry.servers, topic, documents, batch=20))
    ends = asyncio.run(end_offsets(ferry.servers, topic))
    expressions = (
        "CAST(get_json_object(value, '$.a') AS BIGINT) AS id, "
        "upper(get_json_object(value, '$.name')) AS name, "
        "concat(topic, '/', brokerName, '/', queueId, '@', offset) AS place, "
        "get_json_object(value, '$.x') + 1 AS x"
    )
    config = sink_config(
        database,
        "expr",
        topic,
        fields="id bigint not null, name text, place text, x bigint",
        **{"fields.expressions": expressions, "auto.create": "true"},
    )
    ctx = replace(
        context(ferry, tmp_path, "expr", 1), query_name="runtime-named", trigger_interval_ms=200
    )
    query = start(spark, config, ctx)
    try:
        assert query.name == "runtime-named"  # the runtime's name, applied by start_query
        run_until(query, "all written", lambda: stored_offsets(database, "expr") == ends)
    finally:
        query.stop()
    rows = database.query('SELECT id, name, place, x FROM "PgExpr" ORDER BY id')
    assert len(rows) == 40
    queue_places = {str(r[2]).rsplit("@", 1)[0] for r in rows}
    assert queue_places == {f"PgExpr/{b}/{q}" for b, q in ends}
    for i, (row_id, name, place, x) in enumerate(rows):
        assert (row_id, name, x) == (i, f"N{i}", i * 10 + 1)
        assert str(place).startswith("PgExpr/")

    bad = {**config, "fields.expressions": "no_such_function(value) AS name"}
    with pytest.raises(PostgresConnectorError) as refused:
        start(spark, bad, context(ferry, tmp_path, "expr-bad", 1))
    assert str(refused.value).startswith(
        "PostgresSink expr-bad: Spark refused fields.expressions (no_such_function(value) AS "
        "name): [UNRESOLVED_ROUTINE] Cannot resolve routine `no_such_function`"  # Spark's message
    )
