"""kill -9 of a Spark driver mid-stream, restart from the checkpoint: every message exactly once.

Each query runs in its own driver process (`driver.py`, a JVM of its own); the test kills that
whole process tree by PID and starts a new driver on the same checkpoint.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.consumer import PullConsumer

from .conftest import Ferry, create_topic, kill_tree, produce_bulk

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("driver.py")


def start_driver(log: Path, **args: object) -> subprocess.Popen[bytes]:
    # the driver's workers run this venv's Python, also when no other test set the environment
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def finish(process: subprocess.Popen[bytes], log: Path, timeout: float = 150) -> None:
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        raise AssertionError(f"the driver did not finish: {log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.timeout(400)
def test_streaming_read_into_parquet_survives_kill_9_of_the_driver(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    asyncio.run(create_topic(ferry.servers, "CrashRead", 4))
    produced = asyncio.run(produce_bulk(ferry.servers, "CrashRead", "r1", 6_000))
    out, checkpoint, log = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "driver.log"
    args = {
        "mode": "read",
        "servers": ferry.servers,
        "source": "CrashRead",
        "target": str(out),
        "checkpoint": str(checkpoint),
        "max_offsets": 700,
    }
    driver = start_driver(log, **args, trigger="300 milliseconds")
    try:
        deadline = time.monotonic() + 150
        while committed_batches(checkpoint) < 2:
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no micro-batch committed in time"
            time.sleep(0.2)
        produced += asyncio.run(produce_bulk(ferry.servers, "CrashRead", "r2", 1_500))
    finally:
        kill_tree(driver.pid)
        driver.wait(30)
    done_before = committed_batches(checkpoint)
    assert done_before < 10, "the query finished before the crash; nothing was tested"
    produced += asyncio.run(produce_bulk(ferry.servers, "CrashRead", "r3", 1_500))

    finish(start_driver(log, **args, trigger="available_now"), log)
    rows = spark.read.parquet(str(out))
    assert rows.count() == len(produced)
    assert rows.select("partition", "offset").distinct().count() == len(produced)
    assert sorted(r["value"] for r in rows.select("value").collect()) == sorted(produced)


async def topic_bodies(servers: str, topic: str) -> list[bytes]:
    async with PullConsumer(servers, "crash-check") as consumer:
        bodies: list[bytes] = []
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            bodies += [m.body for m in await consumer.fetch_range(queue, 0, end)]
        return bodies


@pytest.mark.timeout(400)
def test_streaming_write_into_ferrymq_survives_kill_9_after_its_commit(
    ferry: Ferry, tmp_path: Path
) -> None:
    async def prepare() -> list[bytes]:
        await create_topic(ferry.servers, "CrashIn", 4)
        await create_topic(ferry.servers, "CrashOut", 3)
        return await produce_bulk(ferry.servers, "CrashIn", "w1", 8_000)

    produced = asyncio.run(prepare())
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    args = {
        "mode": "write",
        "servers": ferry.servers,
        "source": "CrashIn",
        "target": "CrashOut",
        "checkpoint": str(checkpoint),
        "max_offsets": 2000,
    }
    # the driver kills itself (JVM and all) right after the sink committed batch 1: Spark has
    # not recorded commits/1, so the restart replays batch 1 with new tasks and transactions
    crashing = start_driver(log, **args, trigger="300 milliseconds", crash_after_commit=1)
    try:
        crashing.wait(200)
    finally:
        kill_tree(crashing.pid)
    assert Path(str(checkpoint) + ".crashed").read_text() == "1", log.read_text()[-3000:]
    assert committed_batches(checkpoint) == 1  # commits/0 only
    visible = asyncio.run(topic_bodies(ferry.servers, "CrashOut"))
    assert len(visible) == 4000  # batches 0 and 1 were committed into ferrymq

    produced += asyncio.run(produce_bulk(ferry.servers, "CrashIn", "w2", 2_000))
    finish(start_driver(log, **args, trigger="available_now"), log)
    visible = asyncio.run(topic_bodies(ferry.servers, "CrashOut"))
    assert len(visible) == len(produced)
    assert sorted(visible) == sorted(produced)
