"""GET /offsets of FileSource and FileSink: read from the task's checkpoint, running and stopped.

On the session's SparkSession and ferrymq processes (conftest): a FileSource sends two files
(one micro-batch each), then a FileSink writes that topic into a directory. FileSource's answer
lists each file with the file source log batch that read it; FileSink's is every queue's next
offset, the topic's end offsets. Both answers are the same after the query stops, and neither
connector takes a PATCH.
"""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ferrymq.connect.plugin import OffsetsScope, TaskContext
from ferrymq.connect.records import OffsetEntry
from ferrymq.connectors.files import FileSink, FileSource

from ..spark.conftest import Ferry
from .conftest import create_topic, end_offsets, run_until

TOPIC = "files-offsets"


def drop_file(directory: Path, name: str, lines: int) -> Path:
    """A complete text file moved into `directory` by rename (as Spark's file source needs)."""
    staging = directory.parent / "staging"
    staging.mkdir(exist_ok=True)
    (staging / name).write_text("".join(f"{name} {i}\n" for i in range(lines)))
    return (staging / name).rename(directory / name)


def task(ferry: Ferry, tmp_path: Path, name: str) -> tuple[TaskContext, OffsetsScope]:
    checkpoint = str(tmp_path / "checkpoints" / name)
    return (
        TaskContext(name, "inc-1", 0, 1, "tests", ferry.servers, checkpoint),
        OffsetsScope(name, "inc-1", ferry.servers, (checkpoint,)),
    )


def sent(ferry: Ferry) -> int:
    return sum(asyncio.run(end_offsets(ferry.servers, TOPIC)).values())


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_file_offsets_come_from_the_checkpoint_while_running_and_after_a_stop(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    asyncio.run(create_topic(ferry.servers, TOPIC, 2))
    directory = tmp_path / "in"
    directory.mkdir()
    first = drop_file(directory, "a.txt", 5)
    source = FileSource()
    config = {
        "name": "fs",
        "file.path": str(directory),
        "topic": TOPIC,
        "trigger.interval.ms": "200",
    }
    context, scope = task(ferry, tmp_path, "fs")
    assert source.connector_offsets(config, scope) == []  # nothing committed yet
    query = source.build(spark, config, context)
    try:
        run_until(query, "a.txt sent", lambda: sent(ferry) == 5)
        second = drop_file(directory, "b.txt", 3)
        run_until(query, "b.txt sent", lambda: sent(ferry) == 8)
        read = [
            {"partition": {"filename": first.as_uri()}, "offset": {"logOffset": 0}},
            {"partition": {"filename": second.as_uri()}, "offset": {"logOffset": 1}},
        ]
        # the batch's commit is recorded once the sink has committed its rows
        run_until(query, "b.txt listed", lambda: source.connector_offsets(config, scope) == read)
    finally:
        query.stop()
    assert source.connector_offsets(config, scope) == read
    entry = OffsetEntry({"filename": first.as_uri()}, {"logOffset": 0})
    assert "cannot be altered" in source.check_offsets(config, [entry])[0]

    sink = FileSink()
    config = {
        "name": "fk",
        "topics": TOPIC,
        "file.path": str(tmp_path / "out"),
        "trigger.interval.ms": "200",
    }
    context, scope = task(ferry, tmp_path, "fk")
    ends = asyncio.run(end_offsets(ferry.servers, TOPIC))
    written = [
        {
            "partition": {"topic": TOPIC, "broker": broker, "queue": queue_id},
            "offset": {"offset": offset},
        }
        for (broker, queue_id), offset in sorted(ends.items())
    ]
    query = sink.build(spark, config, context)
    try:
        run_until(query, "all written", lambda: sink.connector_offsets(config, scope) == written)
    finally:
        query.stop()
    assert sink.connector_offsets(config, scope) == written
    entry = OffsetEntry({"topic": TOPIC, "broker": "broker-a", "queue": 0}, {"offset": 0})
    assert "cannot be altered" in sink.check_offsets(config, [entry])[0]
