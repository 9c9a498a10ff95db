"""PostgresSource on the shared SparkSession: a query in timestamp+incrementing mode, bad setups."""

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ferrymq.connect.plugin import TaskContext
from ferrymq.connect.records import OffsetsPut
from ferrymq.connectors.postgres import PostgresConnectorError
from ferrymq.connectors.postgres_source import PostgresSource

from ..spark.conftest import Ferry
from .conftest import create_topic, end_offsets, read_topic, run_until
from .postgres import Database

pytestmark = [pytest.mark.postgres]


def context(ferry: Ferry, tmp_path: Path, name: str) -> TaskContext:
    return TaskContext(name, "inc-1", 0, 1, "tests", ferry.servers, str(tmp_path / name))


def topic_size(ferry: Ferry, topic: str) -> int:
    return sum(asyncio.run(end_offsets(ferry.servers, topic)).values())


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_query_in_timestamp_incrementing_mode_sends_new_and_updated_rows_once(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    topic = "pg-orders"
    asyncio.run(create_topic(ferry.servers, topic, 2))
    database.query(
        "CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, "
        "amount numeric(10,2) NOT NULL, changed timestamptz NOT NULL DEFAULT now())"
    )
    database.query("CREATE TABLE customers (name text PRIMARY KEY, country text)")
    database.query("INSERT INTO customers VALUES ('ann', 'NO'), ('bob', 'SE')")
    database.query(
        "INSERT INTO orders (customer, amount) "
        "SELECT CASE WHEN g % 2 = 0 THEN 'ann' ELSE 'bob' END, g FROM generate_series(1, 500) g"
    )
    config = {
        "name": "orders",
        "connector.class": "PostgresSource",
        **database.config,
        "mode": "timestamp+incrementing",
        "timestamp.column.name": "changed",
        "incrementing.column.name": "id",
        "query": "SELECT o.xmin, o.*, c.country FROM orders o "
        "JOIN customers c ON c.name = o.customer",
        "topic.prefix": topic,
        "message.key.column": "id",
        "poll.interval.ms": "200",
        "batch.max.rows": "200",
    }
    assert PostgresSource().validate(config) == {}
    [task] = PostgresSource().task_configs(config, 3)
    query = PostgresSource().build(spark, task, context(ferry, tmp_path, "orders"))
    try:
        run_until(query, "the first rows sent", lambda: topic_size(ferry, topic) == 500)
        database.query("UPDATE orders SET amount = amount + 1000, changed = now() WHERE id <= 10")
        database.query("INSERT INTO orders (customer, amount) VALUES ('ann', 7)")
        run_until(query, "changes sent", lambda: topic_size(ferry, topic) == 511)
    finally:
        query.stop()
    messages = asyncio.run(read_topic(ferry.servers, topic))
    bodies = [json.loads(m.body) for m in messages]
    assert len(bodies) == 511
    assert sorted(b["id"] for b in bodies) == sorted([*range(1, 502), *range(1, 11)])
    updated = [b for b in bodies if b["id"] <= 10 and b["amount"] != f"{b['id']}.00"]
    assert sorted((b["id"], b["amount"]) for b in updated) == [
        (i, f"{i + 1000}.00") for i in range(1, 11)
    ]
    assert "xmin" not in bodies[0]
    assert bodies[0]["country"] in ("NO", "SE")
    assert {m.keys[0] for m in messages} == {str(i) for i in range(1, 502)}
    [offset] = PostgresSource().offsets_in_checkpoint(str(tmp_path / "orders"))
    assert offset["partition"] == {"table": "query"}
    assert set(offset["offset"]) == {"lo", "hi", "w", "c"}


@pytest.mark.timeout(60)
def test_a_source_that_cannot_read_its_table_fails_at_start_with_a_clear_error(
    ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    config = {
        "name": "missing",
        "connector.class": "PostgresSource",
        **database.config,
        "mode": "incrementing",
        "incrementing.column.name": "id",
        "table.whitelist": "no_such_table",
        "topic.prefix": "pg-",
    }
    with pytest.raises(PostgresConnectorError, match='relation "no_such_table" does not exist'):
        PostgresSource().build(None, config, context(ferry, tmp_path, "missing"))
    wrong = {**config, "connection.password": "wrong-secret"}
    with pytest.raises(PostgresConnectorError, match="password authentication failed") as failed:
        PostgresSource().build(None, wrong, context(ferry, tmp_path, "missing"))
    assert "wrong-secret" not in str(failed.value)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_an_offsets_reset_sends_every_row_again_once_on_a_new_checkpoint(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    topic = "pg-reset-items"
    asyncio.run(create_topic(ferry.servers, topic, 1))
    database.query("CREATE TABLE items (id serial PRIMARY KEY, name text)")
    database.query("INSERT INTO items (name) SELECT 'i' || g FROM generate_series(1, 100) g")
    config = {
        "name": "reset",
        "connector.class": "PostgresSource",
        **database.config,
        "mode": "incrementing",
        "incrementing.column.name": "id",
        "table.whitelist": "items",
        "topic.prefix": "pg-reset-",
        "poll.interval.ms": "200",
    }
    first = context(ferry, tmp_path, "reset")
    query = PostgresSource().build(spark, {**config, "batch.max.rows": "10"}, first)
    try:
        run_until(query, "sent", lambda: topic_size(ferry, topic) == 100)
    finally:
        query.stop()
    assert (Path(first.checkpoint_dir) / "ferrymq-sink-id").read_text() == "reset:inc-1:0"

    # DELETE /offsets: the runtime starts the task on a fresh checkpoint with the change
    change = OffsetsPut("reset", "inc-1", "req-7", None)
    fresh = replace(first, checkpoint_dir=str(tmp_path / "reset-after"), extra={"offsets": change})
    query = PostgresSource().build(spark, config, fresh)
    try:
        run_until(query, "sent again", lambda: topic_size(ferry, topic) == 200)
    finally:
        query.stop()
    # a restart on that checkpoint without the change: its next batch (1) is not the first
    # checkpoint's batch 1, whose decision would swallow it (the sink numbers batches under
    # <sink id>/<query id>, and the query id is the checkpoint's)
    database.query("INSERT INTO items (name) VALUES ('late')")
    query = PostgresSource().build(spark, config, replace(fresh, extra={}))
    try:
        run_until(query, "the new row", lambda: topic_size(ferry, topic) == 201)
    finally:
        query.stop()
    marker = Path(tmp_path / "reset-after" / "ferrymq-sink-id")
    assert marker.read_text() == "reset:inc-1:0"  # one sink id (fence) for every checkpoint
    ids = sorted(json.loads(m.body)["id"] for m in asyncio.run(read_topic(ferry.servers, topic)))
    assert ids == sorted([*range(1, 101), *range(1, 102)])
