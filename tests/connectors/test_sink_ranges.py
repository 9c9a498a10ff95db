"""The sink's ranges mode (postgres_sink rule 8): the writer pulls a planned range itself.

A real broker whose retention deleted the start of a queue, a real PostgreSQL, `write_task` fed
the one-row range batches `readStream.format("ferrymq").option("rowsAs", "ranges")` yields: a
range over deleted offsets fails the task (failOnDataLoss=true, nothing stored) or is written
from what is left (false); the same range again (a replayed micro-batch) writes nothing twice.
The Spark query around it is the one of test_postgres_sink and test_postgres_crash.
"""

import asyncio
import time
from pathlib import Path

import pytest

from ferrymq.client.consumer import PullConsumer
from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.postgres_sink import (
    SinkSpec,
    create_offsets_tables,
    sink_spec,
    write_task,
)
from ferrymq.spark.fetch import DataLossError
from ferrymq.spark.plan import QueueRange, stable_partition
from ferrymq.spark.rows import range_batch

from ..spark.conftest import start_ferry
from .conftest import count_ids, create_topic, produce_json, stored_offsets
from .postgres import PASSWORD, Database

pytestmark = [pytest.mark.postgres]

EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))


@pytest.mark.timeout(180)
def test_a_range_retention_deleted_fails_or_is_skipped_and_a_replay_writes_nothing_twice(
    database: Database, tmp_path: Path
) -> None:
    # 128 KiB commit-log segments, kept 0 hours, deleted at every hour: retention runs every 10 s
    ferry = start_ferry(
        tmp_path / "ferry",
        "--mapped-file-size-commit-log",
        "131072",
        "--file-reserved-time",
        "0",
        "--delete-when",
        EVERY_HOUR,
    )
    try:

        async def produce_until_deleted() -> tuple[str, int, int]:
            await create_topic(ferry.servers, "Lossy", 1)
            documents = [{"id": i, "pad": "x" * 100} for i in range(2000)]
            await produce_json(ferry.servers, "Lossy", documents)
            async with PullConsumer(ferry.servers, "probe") as consumer:
                queue = (await consumer.queues("Lossy"))[0]
                deadline = time.monotonic() + 60
                while (low := await consumer.min_offset(queue)) == 0:
                    assert time.monotonic() < deadline, "retention never deleted a segment"
                    await asyncio.sleep(0.5)
                return queue.broker_name, low, await consumer.max_offset(queue)

        broker, low, high = asyncio.run(produce_until_deleted())
        assert 0 < low < high == 2000
        batch = range_batch(QueueRange("Lossy", stable_partition(broker, 0), broker, 0, 0, high))

        def spec(fail: str) -> SinkSpec:
            config = {
                "name": "sink",
                "connector.class": "PostgresSink",
                "topics": "Lossy",
                **database.config,
                "fields": "id bigint not null",
                "auto.create": "true",
                "failOnDataLoss": fail,
            }
            context = TaskContext("sink", "inc-1", 0, 1, "tests", ferry.servers, str(tmp_path))
            return sink_spec(config, context)

        with spec("true").target.with_password(PASSWORD).connect("tests", autocommit=True) as conn:
            create_offsets_tables(conn)
        with pytest.raises(DataLossError, match=r"queue offsets \[0, \d+\) are no longer stored"):
            write_task(spec("true"), PASSWORD, iter([batch]))
        assert stored_offsets(database, "sink") == {}

        first = write_task(spec("false"), PASSWORD, iter([batch]))
        assert low <= high - first.written
        assert first.written > 0
        assert stored_offsets(database, "sink") == {(broker, 0): high}
        assert count_ids(database, '"Lossy"') == (first.written, first.written)
        [(lowest, highest)] = database.query('SELECT min(id), max(id) FROM "Lossy"')
        assert (int(str(lowest)), int(str(highest))) == (high - first.written, high - 1)

        replay = write_task(spec("false"), PASSWORD, iter([batch]))
        assert replay.written == 0
        assert replay.skipped > 0
        assert count_ids(database, '"Lossy"') == (first.written, first.written)
        assert stored_offsets(database, "sink") == {(broker, 0): high}
    finally:
        ferry.stop()


def test_ranges_rows_carry_no_message_and_batch_reads_refuse_them() -> None:
    from ferrymq.spark.options import OptionError, parse_read_options

    base = {"servers": "127.0.0.1:9876", "subscribe": "T", "rowsAs": "ranges"}
    assert parse_read_options(base, streaming=True).rows_as_ranges
    assert not parse_read_options({**base, "rowsAs": "messages"}, streaming=True).rows_as_ranges
    with pytest.raises(OptionError, match="rowsAs"):
        parse_read_options(base, streaming=False)
    with pytest.raises(OptionError, match="includeHeaders"):
        parse_read_options({**base, "includeHeaders": "true"}, streaming=True)
    with pytest.raises(OptionError, match="rowsAs"):
        parse_read_options({**base, "rowsAs": "bytes"}, streaming=True)
    row = range_batch(QueueRange("T", 1025, "broker-a", 1, -2, 7)).to_pylist()
    assert row == [
        {
            "topic": "T",
            "partition": 1025,
            "brokerName": "broker-a",
            "queueId": 1,
            "startOffset": -2,
            "endOffset": 7,
        }
    ]
