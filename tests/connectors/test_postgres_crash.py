"""kill -9 of the Spark driver running PostgreSQL connector tasks: every row exactly once.

Each run is a driver process of its own (`driver.py`: a local SparkSession and the plugin's
`build` per task, as a worker's runtime does); the test kills that whole process tree by PID, or
the sink's test crash point kills it right after the PostgreSQL commits of a micro-batch and
before Spark records the batch. Then a new driver takes over the same tasks, once with its
checkpoints deleted (a new owner elsewhere), and the stored offsets alone say where to go on.
"""

import asyncio
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.connectors.postgres_sink import CRASH_POINT, PostgresSink

from ..spark.conftest import Ferry
from .conftest import (
    count_ids,
    create_topic,
    end_offsets,
    produce_json,
    read_topic,
    start_driver,
    stop_driver,
    stored_offsets,
    wait_until,
)
from .postgres import Database

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def uncommitted_batches(checkpoint: Path) -> set[int]:
    planned = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    done = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    return planned - done


@pytest.mark.timeout(420)
def test_sink_is_exactly_once_across_kill_9_of_the_driver(
    ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic, total = "PgSinkCrash", 50_000
    asyncio.run(create_topic(ferry.servers, topic, 4))
    asyncio.run(
        produce_json(ferry.servers, topic, [{"id": i, "body": f"m{i}"} for i in range(30_000)])
    )
    database.query("CREATE TABLE crash_rows (id bigint, body text)")  # no unique constraint
    checkpoints = [tmp_path / "cp0", tmp_path / "cp1"]
    log = tmp_path / "driver.log"
    args: dict[str, Any] = {
        "plugin": "PostgresSink",
        "servers": ferry.servers,
        "connector": "crash",
        "incarnation": "inc-1",
        "config": {
            "name": "crash",
            "connector.class": "PostgresSink",
            "topics": topic,
            **database.config,
            "table.name.format": "crash_rows",
            "fields": "id bigint not null, body text",
            "maxOffsetsPerTrigger": "3000",
            "trigger.interval.ms": "200",
        },
        "tasks": [
            {"task": i, "generation": 1, "checkpoint": str(cp)} for i, cp in enumerate(checkpoints)
        ],
    }

    # 1: the crash point, after the PostgreSQL commits of batch 2 and before Spark records it
    hooks = {
        "FERRYMQ_TEST_HOOKS": "1",
        "FERRYMQ_TEST_CRASH_AT": CRASH_POINT,
        "FERRYMQ_TEST_CRASH_BATCH": "2",
    }
    driver = start_driver(log, hooks, **args)
    try:
        driver.wait(240)
    finally:
        stop_driver(driver)
    assert driver.returncode == -9, f"seed {seed}: not killed: {log.read_text()[-4000:]}"
    assert any(2 in uncommitted_batches(cp) for cp in checkpoints), log.read_text()[-3000:]
    written_at_crash = count_ids(database, "crash_rows")
    assert written_at_crash[0] == written_at_crash[1] > 0

    # 2: the same checkpoints; more messages arrive; kill -9 at a random moment
    driver = start_driver(log, **args)
    try:
        wait_until("restarted", lambda: b"DRIVER STARTED" in log.read_bytes(), driver, log)
        asyncio.run(
            produce_json(
                ferry.servers, topic, [{"id": i, "body": f"m{i}"} for i in range(30_000, total)]
            )
        )
        wait_until(
            "writing again",
            lambda: count_ids(database, "crash_rows")[0] > written_at_crash[0],
            driver,
            log,
        )
        time.sleep(rng.uniform(0, 3))
    finally:
        stop_driver(driver)
    assert count_ids(database, "crash_rows")[0] == count_ids(database, "crash_rows")[1]

    # 3: a new owner without the checkpoints (generation 2) finishes from the stored offsets
    for checkpoint in checkpoints:
        shutil.rmtree(checkpoint, ignore_errors=True)
    args["tasks"] = [{**t, "generation": 2} for t in args["tasks"]]
    ends = asyncio.run(end_offsets(ferry.servers, topic))
    driver = start_driver(log, **args)
    try:
        wait_until("caught up", lambda: stored_offsets(database, "crash") == ends, driver, log, 240)
    finally:
        stop_driver(driver)

    assert count_ids(database, "crash_rows") == (total, total), f"seed {seed}"
    offsets = PostgresSink().offsets(args["config"], "inc-1")
    assert {
        (o["partition"]["broker"], o["partition"]["queue"]): o["offset"]["offset"] for o in offsets
    } == ends
    assert len(asyncio.run(read_topic(ferry.servers, topic))) == total
