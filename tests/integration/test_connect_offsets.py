"""GET /connectors/{c}/offsets of a FerrymqReplicator over REST, on an in-process worker.

The worker runs its tasks as real Spark queries (connect_workers.py) copying topics of a
LocalCluster. The answer comes from the target's sink coordinator (SINK_QUERY_FENCE), while the
tasks run and after a stop, and it is a PATCH body the connector accepts: one position set back
and resumed copies exactly those messages again, on the task that reads them, while the other
task starts on the same body untouched.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.consumer import PullConsumer
from ferrymq.testing import LocalCluster

from .connect_workers import (
    MESSAGES,
    TaskSpark,
    call,
    copied,
    leader_of,
    replicator,
    task_spark,
    task_states,
    workers,
)

REWIND = 3


@pytest.fixture(scope="module")
def spark() -> Iterator[TaskSpark]:
    """The module's SparkSession for its workers' tasks (started by the first task)."""
    with task_spark() as shared:
        yield shared


async def end_offsets(cluster: LocalCluster, topics: list[str]) -> list[dict[str, Any]]:
    """Every queue of `topics` that holds messages, at its end, as GET /offsets shows it.

    A queue the tasks copied nothing from has no decided position: it is not shown.
    """
    async with PullConsumer(cluster.namesrv_addr, "offsets-tests") as consumer:
        queues = [q for topic in topics for q in await consumer.queues(topic)]
        ends = [(q, await consumer.max_offset(q)) for q in queues]
    entries = [
        {
            "partition": {"topic": q.topic, "broker": q.broker_name, "queue": q.queue_id},
            "offset": {"offset": end},
        }
        for q, end in ends
        if end > 0
    ]
    return sorted(entries, key=lambda e: tuple(e["partition"].values()))


@pytest.mark.spark
@pytest.mark.timeout(300)  # a first task starts the SparkSession
async def test_replicator_offsets_are_the_decided_positions_and_patch_back(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 1) as group:
        url = (await leader_of(group)).url
        config = replicator("src,more", **{"tasks.max": "2", "trigger.interval.ms": "300"})
        created = await call(url, "POST", "/connectors", {"name": "m", "config": config})
        assert created.status_code == 201, created.text
        for topic in ("src-copy", "more-copy"):
            assert await copied(cluster, topic, MESSAGES) == MESSAGES
        ends = await end_offsets(cluster, ["more", "src"])
        running = await call(url, "GET", "/connectors/m/offsets")
        assert running.json() == {"offsets": ends}

        assert (await call(url, "PUT", "/connectors/m/stop")).status_code == 204
        stopped = (await call(url, "GET", "/connectors/m/offsets")).json()
        assert stopped == {"offsets": ends}
        # the GET body, one position of src set back, is the PATCH body
        rewound = max(
            (e for e in stopped["offsets"] if e["partition"]["topic"] == "src"),
            key=lambda e: e["offset"]["offset"],
        )
        rewound["offset"]["offset"] -= REWIND
        patched = await call(url, "PATCH", "/connectors/m/offsets", stopped)
        assert patched.status_code == 200, patched.text
        assert (await call(url, "GET", "/connectors/m/offsets")).json() == {"offsets": ends}

        assert (await call(url, "PUT", "/connectors/m/resume")).status_code == 202
        assert await copied(cluster, "src-copy", MESSAGES + REWIND) == MESSAGES + REWIND
        await task_states(url, "m", {"RUNNING"})
        assert (await call(url, "GET", "/connectors/m/offsets")).json() == {"offsets": ends}
        assert await copied(cluster, "src-copy", MESSAGES + REWIND + 1, timeout=2) == 0
        assert await copied(cluster, "more-copy", MESSAGES + 1, timeout=0) == 0
