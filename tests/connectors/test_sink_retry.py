"""A PostgresSink writer task that fails after its PostgreSQL commit and is retried by Spark.

The session is a worker's (`runtime.SPARK_MASTER`, `local[N,4]`: Spark retries a failed task,
which plain `local[N]` never does). The sink's test hook makes every writer task's first attempt
raise right after its transaction committed, a real task failure; the retry reads the same
range and must skip every row of it (rule 1), so the table holds each message once. Both read
modes: in `ranges` the retry pulls the range from the broker again itself (rule 8).
"""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.postgres_sink import FAIL_FIRST_ATTEMPTS_ENV, READ_MODES, PostgresSink

from ..spark.conftest import Ferry
from .conftest import count_ids, create_topic, end_offsets, produce_json, run_until, stored_offsets
from .postgres import Database

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", READ_MODES)
def test_a_writer_task_retried_after_its_commit_writes_nothing_twice(
    spark: Any,
    ferry: Ferry,
    database: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    topic, total = f"PgSinkRetry-{mode}", 2000
    asyncio.run(create_topic(ferry.servers, topic, 4))
    asyncio.run(produce_json(ferry.servers, topic, [{"id": i} for i in range(total)]))
    database.query("CREATE TABLE retried (id bigint)")  # no unique constraint
    ends = asyncio.run(end_offsets(ferry.servers, topic))
    failed = tmp_path / "failed-attempts"
    failed.mkdir()
    monkeypatch.setenv("FERRYMQ_TEST_HOOKS", "1")
    monkeypatch.setenv(FAIL_FIRST_ATTEMPTS_ENV, str(failed))
    config = {
        "name": "retry",
        "connector.class": "PostgresSink",
        "topics": topic,
        **database.config,
        "table.name.format": "retried",
        "fields": "id bigint not null",
        "ferrymq.read.mode": mode,
    }
    ctx = TaskContext("retry", "inc-1", 0, 1, "tests", ferry.servers, str(tmp_path / "cp"))
    [task] = PostgresSink().task_configs(config, 1)
    query = PostgresSink().build(spark, task, ctx)
    try:
        run_until(query, "all written", lambda: stored_offsets(database, "retry") == ends)
    finally:
        query.stop()
    assert sorted(p.name for p in failed.iterdir()), "no writer attempt failed"
    assert count_ids(database, "retried") == (total, total)
