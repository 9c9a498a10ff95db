"""A Connect worker's metrics while a real task (a replicator on Spark) runs."""

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ferrymq.cmd.metrics import metrics_endpoint
from ferrymq.connect import metrics as connect_metrics
from ferrymq.testing import LocalCluster
from tests.integration.connect_workers import (
    MESSAGES,
    TaskSpark,
    call,
    leader_of,
    replicator,
    task_spark,
    workers,
)
from tests.metrics.scrape import scrape, value

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[TaskSpark]:
    with task_spark() as shared:
        yield shared


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path / "cluster") as local:
        yield local


@pytest.mark.timeout(360)  # Spark's start at high load
async def test_worker_reports_its_task_rows_and_lag(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path, 1) as (worker,):
        await leader_of([worker])
        created = await call(
            worker.url, "POST", "/connectors", {"name": "rep", "config": replicator()}
        )
        assert created.status_code == 201, created.text
        async with metrics_endpoint(
            "PROM", "127.0.0.1", 0, [lambda: connect_metrics.collect(worker.herder.tasks)]
        ) as endpoint:
            assert endpoint is not None
            deadline = time.monotonic() + 240  # Spark's start and first batch at high load
            while True:  # the first micro-batch copies the topic's messages
                samples = await scrape(endpoint.address)
                batches = [
                    v for (n, _), v in samples.items() if n == "ferrymq_connect_task_batch_id"
                ]
                if batches and batches[0] >= 0:
                    break
                failed = [k for k in samples if ("state", "FAILED") in k[1]]
                assert not failed, worker.runner.failure(next(iter(worker.herder.tasks.runs)))
                assert time.monotonic() < deadline, samples
                await asyncio.sleep(0.5)
        labels = {"worker": "w1", "connector": "rep", "task": "0"}
        assert value(samples, "ferrymq_connect_task_state", state="RUNNING", **labels) == 1
        assert value(samples, "ferrymq_connect_task_lag_messages", **labels) == 0
        assert value(samples, "ferrymq_connect_task_input_rows_per_second", **labels) >= 0
        copied = worker.runner.metrics(("rep", next(iter(worker.herder.tasks.runs))[1], 0))
        assert copied["num_input_rows"] == MESSAGES  # what the rows/s figures were made from
