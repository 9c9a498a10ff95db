"""Config keys with a real run: `topics.regex`, `connection.user`, PostgresSource `mode=timestamp`.

Queries run in this process on the shared SparkSession, ferrymq cluster and PostgreSQL server
(conftest.py), built the way a worker's runtime builds them; each test has its own database,
topics and connector name.
"""

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.postgres import PostgresConnectorError
from ferrymq.connectors.postgres_sink import PostgresSink
from ferrymq.connectors.postgres_source import PostgresSource

from ..spark.conftest import Ferry
from .conftest import count_ids, create_topic, end_offsets, produce_json, read_topic, run_until
from .postgres import USER, Database

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def context(ferry: Ferry, tmp_path: Path, name: str) -> TaskContext:
    return TaskContext(name, "inc-1", 0, 1, "tests", ferry.servers, str(tmp_path / name))


@pytest.mark.timeout(180)
def test_a_sink_reads_the_topics_its_regex_matches_with_the_user_from_connection_user(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    taken, other = [f"rx{tag}-a", f"rx{tag}-b"], f"rx{tag}-c"
    for topic in (*taken, other):
        asyncio.run(create_topic(ferry.servers, topic, 1))
    for index, topic in enumerate((*taken, other)):  # ids 0-99 in a, 100-199 in b, 200-299 in c
        documents = [{"id": i, "v": topic} for i in range(100 * index, 100 * (index + 1))]
        asyncio.run(produce_json(ferry.servers, topic, documents))
    assert database.bare_url.startswith(f"postgresql://{USER}@")
    config = {
        "name": "regex",
        "connector.class": "PostgresSink",
        "topics.regex": f"rx{tag}-[ab]",
        # the URL names no user: connection.user gives it (and connection.password the password)
        "connection.url": database.bare_url.replace(f"{USER}@", "", 1),
        "connection.user": USER,
        "connection.password": database.config["connection.password"],
        "table.name.format": "regex_rows",
        "fields": "id bigint not null, v text",
        "auto.create": "true",
        "trigger.interval.ms": "200",
    }
    assert PostgresSink().validate(config) == {}
    [task] = PostgresSink().task_configs(config, 1)
    with pytest.raises(PostgresConnectorError, match="ferry_nobody"):  # the key is what is used
        PostgresSink().build(
            spark, {**task, "connection.user": "ferry_nobody"}, context(ferry, tmp_path, "nobody")
        )
    query = PostgresSink().build(spark, task, context(ferry, tmp_path, "regex"))
    try:
        run_until(query, "200 rows", lambda: count_ids(database, "regex_rows")[0] >= 200)
        time.sleep(1)  # a repeat or a row of the unmatched topic would land now
    finally:
        query.stop()
    assert count_ids(database, "regex_rows") == (200, 200)
    found = database.query("SELECT v, min(id), max(id) FROM regex_rows GROUP BY v ORDER BY v")
    assert found == [(taken[0], 0, 99), (taken[1], 100, 199)]


@pytest.mark.timeout(180)
def test_timestamp_mode_sends_each_row_once_even_one_committed_late_with_a_seen_timestamp(
    spark: Any, ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    """Plain `mode=timestamp`: 25 rows share one timestamp across pages of `batch.max.rows` 10,
    5 have a later one; a transaction that wrote a row with the first timestamp before them
    commits after they were sent. Confluent's timestamp mode misses such a row (its query asks
    for timestamps above the last one seen: what its timestamp+incrementing mode covers); here a
    batch is a diff of snapshots, so it is sent, once. The limit that stays (docs/connect.md): a
    transaction that takes a timestamp and writes it more than `timestamp.delay.interval.ms`
    later than a snapshot that saw a later one can be missed."""
    prefix = f"pgts{uuid.uuid4().hex[:8]}-"
    topic = f"{prefix}items"
    asyncio.run(create_topic(ferry.servers, topic, 1))
    database.query("CREATE TABLE items (id int PRIMARY KEY, changed timestamptz NOT NULL)")
    first, later = "2026-01-01 00:00:00+00", "2026-01-01 00:00:01+00"
    config = {
        "name": "stamps",
        "connector.class": "PostgresSource",
        **database.config,
        "mode": "timestamp",
        "timestamp.column.name": "changed",
        "table.whitelist": "items",
        "topic.prefix": prefix,
        "poll.interval.ms": "200",
        "batch.max.rows": "10",
    }
    assert PostgresSource().validate(config) == {}

    def sent() -> int:
        return sum(asyncio.run(end_offsets(ferry.servers, topic)).values())

    with psycopg.connect(database.url) as late:  # a transaction holding a row with `first`
        late.execute("INSERT INTO items VALUES (0, %s)", [first])
        database.query(
            "INSERT INTO items SELECT g, CASE WHEN g <= 25 THEN %s::timestamptz "
            "ELSE %s::timestamptz END FROM generate_series(1, 30) g",
            first,
            later,
        )
        query = PostgresSource().build(spark, config, context(ferry, tmp_path, "stamps"))
        try:
            run_until(query, "the 30 committed rows", lambda: sent() == 30)
            late.commit()
            run_until(query, "the late row", lambda: sent() >= 31)
            time.sleep(1)  # a repeat would land now
        finally:
            query.stop()
    ids = sorted(json.loads(m.body)["id"] for m in asyncio.run(read_topic(ferry.servers, topic)))
    assert ids == list(range(31))
