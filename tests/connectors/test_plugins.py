"""The PostgreSQL plugins without servers: validation (Kafka's ConfigInfos), task splits, rules."""

from typing import Any

import pytest

from ferrymq.connect.plugin import Plugins, config_infos
from ferrymq.connect.records import OffsetEntry
from ferrymq.connectors.postgres import parse_target
from ferrymq.connectors.postgres_columns import parse_fields, row_of
from ferrymq.connectors.postgres_sink import PostgresSink, task_owner
from ferrymq.connectors.postgres_source import (
    Candidate,
    PostgresSource,
    offset_state,
    promote,
    shown_offset,
)
from ferrymq.spark.plan import QueueKey

SINK = {
    "name": "orders-sink",
    "connector.class": "PostgresSink",
    "tasks.max": "2",
    "topics": "orders,refunds",
    "connection.url": "postgresql://app@db.example:5433/shop?sslmode=require",
    "connection.password": "s3cret",
    "fields": "id bigint not null, amount numeric(12,2), at timestamptz",
    "insert.mode": "upsert",
    "pk.mode": "record_value",
    "pk.fields": "id",
}
SOURCE = {
    "name": "orders-source",
    "connector.class": "PostgresSource",
    "connection.url": "postgresql://app@db.example/shop",
    "mode": "timestamp+incrementing",
    "timestamp.column.name": "changed",
    "incrementing.column.name": "id",
    "table.whitelist": "orders,refunds,public.items",
    "topic.prefix": "shop-",
}


def errors(infos: dict[str, Any]) -> dict[str, list[str]]:
    return {
        c["value"]["name"]: c["value"]["errors"] for c in infos["configs"] if c["value"]["errors"]
    }


def test_the_plugins_are_installed_under_their_short_names() -> None:
    plugins = Plugins()
    assert plugins.resolve("PostgresSink")[1] is PostgresSink
    assert plugins.resolve("PostgresSource")[1] is PostgresSource
    listed = {p["class"]: p["type"] for p in plugins.listing()}
    assert listed["ferrymq.connectors.postgres_sink.PostgresSink"] == "sink"
    assert listed["ferrymq.connectors.postgres_source.PostgresSource"] == "source"


def test_a_valid_sink_config_has_no_errors_and_hides_its_password() -> None:
    infos = config_infos("ferrymq.connectors.postgres_sink.PostgresSink", PostgresSink(), SINK)
    assert infos["name"] == "ferrymq.connectors.postgres_sink.PostgresSink"
    assert infos["error_count"] == 0
    assert {"Common", "Connection", "Writes", "Error Handling", "Spark"} <= set(infos["groups"])
    by_name = {c["value"]["name"]: c for c in infos["configs"]}
    assert by_name["connection.password"]["value"]["value"] is None
    assert by_name["connection.password"]["definition"]["type"] == "PASSWORD"
    assert by_name["insert.mode"]["value"]["recommended_values"] == ["insert", "upsert"]
    assert by_name["table.name.format"]["value"]["value"] == "${topic}"
    assert "s3cret" not in repr(infos)
    assert "s3cret" not in repr(parse_target(SINK))


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"topics": ""}, "topics", "exactly one of topics and topics.regex"),
        ({"topics.regex": "ord.*"}, "topics", "exactly one of topics and topics.regex"),
        ({"connection.url": "mysql://db/shop"}, "connection.url", "must start with postgresql://"),
        ({"connection.url": "postgresql://db"}, "connection.url", "names no database"),
        ({"pk.mode": "none"}, "pk.mode", "insert.mode=upsert needs pk.mode=record_value"),
        ({"pk.fields": ""}, "pk.fields", "pk.mode=record_value needs the key columns"),
        ({"pk.fields": "sku"}, "fields", "pk.fields: sku not among the fields"),
        ({"fields": "id bigint, id text"}, "fields", "id named more than once"),
        ({"fields": "id money"}, "fields", "unsupported type 'money'"),
        ({"fields": "id; drop table x bigint"}, "fields", "is not a column name"),
        ({"table.name.format": "a.b.${topic}"}, "table.name.format", "is not a table name"),
        ({"insert.mode": "merge"}, "insert.mode", "must be one of: insert, upsert"),
        ({"batch.size": "0"}, "batch.size", "at least 1"),
        (
            {"errors.deadletterqueue.topic.name": "dead letters"},
            "errors.deadletterqueue.topic.name",
            "only letters, digits",
        ),
    ],
)
def test_a_bad_sink_config_names_the_key_and_the_reason(
    change: dict[str, str], key: str, message: str
) -> None:
    infos = config_infos("PostgresSink", PostgresSink(), {**SINK, **change})
    found = errors(infos)
    assert infos["error_count"] >= 1
    assert any(message in e for e in found.get(key, [])), found


def test_sink_tasks_split_every_queue_by_its_name_alone() -> None:
    configs = PostgresSink().task_configs(SINK, 3)
    assert [(c["task.index"], c["task.count"]) for c in configs] == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]
    assert all(c["topics"] == "orders,refunds" for c in configs)
    queues = [
        (t, QueueKey(b, q))
        for t in ("orders", "refunds")
        for b in ("broker-a", "broker-b")
        for q in range(8)
    ]
    owners = [task_owner(t, k, 3) for t, k in queues]
    assert set(owners) == {0, 1, 2}
    assert all(owners.count(i) >= 6 for i in range(3))  # 32 queues, none left without work
    assert [task_owner(t, k, 1) for t, k in queues] == [0] * len(queues)
    # the same queue has the same owner whatever else the route holds
    assert (
        task_owner("orders", QueueKey("broker-b", 3), 3)
        == owners[queues.index(("orders", QueueKey("broker-b", 3)))]
    )


def test_sink_offsets_edits_are_checked() -> None:
    sink = PostgresSink()
    good = OffsetEntry({"topic": "orders", "broker": "broker-a", "queue": 3}, {"offset": 10})
    reset = OffsetEntry({"topic": "orders", "broker": "broker-a", "queue": "3"}, None)
    assert sink.check_offsets(SINK, [good, reset]) == []
    assert sink.check_offsets(SINK, [OffsetEntry({"topic": "orders", "queue": 1}, {"offset": 1})])
    assert sink.check_offsets(SINK, [OffsetEntry(good.partition, {"offset": "x"})])
    assert sink.check_offsets(SINK, [OffsetEntry(good.partition, {"kafka_offset": 1})])
    assert sink.check_offsets(SINK, [OffsetEntry({**good.partition, "queue": 5000}, {"offset": 1})])


def test_a_valid_source_config_and_its_task_split() -> None:
    assert PostgresSource().validate(SOURCE) == {}
    infos = config_infos("PostgresSource", PostgresSource(), SOURCE)
    assert infos["error_count"] == 0
    configs = PostgresSource().task_configs(SOURCE, 2)
    assert [c["table.whitelist"] for c in configs] == ["orders,public.items", "refunds"]
    assert len(PostgresSource().task_configs(SOURCE, 10)) == 3
    query = {**SOURCE, "table.whitelist": "", "query": "SELECT o.xmin, o.* FROM orders o"}
    assert PostgresSource().validate(query) == {}
    assert PostgresSource().task_configs(query, 4) == [query]
    state: dict[str, str | int] = {"lo": "", "hi": "10:12:11", "w": "", "c": "[5]"}
    assert PostgresSource().check_offsets(SOURCE, [OffsetEntry({"table": "orders"}, state)]) == []
    assert PostgresSource().check_offsets(SOURCE, [OffsetEntry({"table": "orders"}, None)]) == []
    assert PostgresSource().check_offsets(SOURCE, [OffsetEntry({"table": "nope"}, state)])
    assert PostgresSource().check_offsets(SOURCE, [OffsetEntry({"table": "orders"}, {"id": 5})])
    # what GET shows of a checkpoint's offset is what PATCH takes back
    checkpointed = {
        "c": ["2024-05-01T10:00:00+00:00", 7],
        "hi": "90:95:91,93",
        "lo": "80:80:",
        "w": ["2024-05-01T09:00:00+00:00", 3],
    }
    shown = shown_offset(checkpointed)
    assert all(isinstance(v, str) for v in shown.values())
    assert PostgresSource().check_offsets(SOURCE, [OffsetEntry({"table": "orders"}, shown)]) == []
    assert offset_state(shown) == checkpointed
    for bad in ({"hi": "x"}, {"c": "5"}, {"c": ""}, {"w": 3}):
        entry = OffsetEntry({"table": "orders"}, {**state, **bad})
        assert PostgresSource().check_offsets(SOURCE, [entry]), bad


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"mode": "bulk"}, "mode", "must be one of"),
        ({"incrementing.column.name": ""}, "incrementing.column.name", "needs incrementing"),
        ({"timestamp.column.name": "a b"}, "timestamp.column.name", "is not a column name"),
        ({"query": "SELECT 1"}, "table.whitelist", "exactly one of table.whitelist and query"),
        ({"topic.prefix": "shop."}, "table.whitelist", "only letters, digits"),
        ({"poll.interval.ms": "soon"}, "poll.interval.ms", "Not a number"),
    ],
)
def test_a_bad_source_config_names_the_key_and_the_reason(
    change: dict[str, str], key: str, message: str
) -> None:
    found = errors(config_infos("PostgresSource", PostgresSource(), {**SOURCE, **change}))
    assert any(message in e for e in found.get(key, [])), found


def test_the_scan_bound_waits_for_every_older_transaction_to_end_before_the_diff() -> None:
    # snapshots taken at 0, 100, 200, 300 ms; their xmax and the highest id each showed
    taken = [
        Candidate(0, 100, [10]),
        Candidate(100, 105, [20]),
        Candidate(200, 112, [30]),
        Candidate(300, 120, [40]),
    ]
    # candidate j may bound a diff once the snapshot after it (which saw every transaction that
    # could hold an id up to j's) has an xmax at or below the xmin of the diff's first snapshot
    assert promote(taken, 104, 0) is None  # xids 100..104 may still commit an id below 10
    assert promote(taken, 105, 0) == 0
    assert promote(taken, 112, 0) == 1
    assert promote(taken, 120, 0) == 2  # the newest has no later snapshot to vouch for it
    # with a delay of 150 ms the vouching snapshot is the first one 150 ms later
    assert promote(taken, 111, 150) is None
    assert promote(taken, 112, 150) == 0
    assert promote(taken, 120, 150) == 1
    assert promote([], 500, 0) is None


def test_json_bodies_map_to_typed_columns_or_a_reason() -> None:
    columns = parse_fields(
        "id bigint not null, price numeric(6,2), name varchar(4), ok boolean, "
        "at timestamp, tags jsonb, day date, ref uuid"
    )
    assert [c.sql_type for c in columns] == [
        "bigint",
        "numeric(6,2)",
        "varchar(4)",
        "boolean",
        "timestamp",
        "jsonb",
        "date",
        "uuid",
    ]
    row = row_of(
        columns,
        b'{"id": 1, "price": "1234.5", "name": "abcd", "ok": true, '
        b'"at": "2024-05-01T10:00:00", "tags": {"a": 1}, "day": "2024-05-01", '
        b'"ref": "12345678-1234-5678-1234-567812345678", "extra": 1}',
    )
    assert isinstance(row, tuple)
    assert row[0] == 1
    assert str(row[1]) == "1234.5"
    for body, reason in [
        (b'{"id": 1, "price": 12345}', "too many digits for numeric(6,2)"),
        (b'{"id": 1, "name": "abcde"}', "longer than varchar(4)"),
        (b'{"id": 1, "ok": "yes"}', "expected true or false"),
        (b'{"id": 1, "day": "May 1"}', "not an ISO 8601 date"),
        (b'{"id": 9223372036854775808}', "out of range for bigint"),
        (b'{"id": 1, "ref": "nope"}', "is not a UUID"),
        (b'{"id": null}', "missing or null"),
        (b"\xff", "not UTF-8"),
        (None, "no body"),
    ]:
        assert reason in str(row_of(columns, body)), body
