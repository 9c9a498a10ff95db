"""A queue whose data retention deleted: failOnDataLoss decides between a clear error and a skip."""

import asyncio
import time
from typing import Any

import pytest

from ferrymq.client.consumer import PullConsumer

from .conftest import create_topic, produce_bulk, start_ferry

pytestmark = pytest.mark.spark

EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))


@pytest.mark.timeout(240)
def test_deleted_offsets_fail_the_read_or_are_skipped(spark: Any, tmp_path: Any) -> None:
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

        async def produce_until_deleted() -> tuple[int, int]:
            await create_topic(ferry.servers, "Lossy", 1)
            await produce_bulk(ferry.servers, "Lossy", "x" * 100, 2000)
            async with PullConsumer(ferry.servers, "probe") as consumer:
                queue = (await consumer.queues("Lossy"))[0]
                deadline = time.monotonic() + 60
                while (low := await consumer.min_offset(queue)) == 0:
                    assert time.monotonic() < deadline, "retention never deleted a segment"
                    await asyncio.sleep(0.5)
                return low, await consumer.max_offset(queue)

        low, high = asyncio.run(produce_until_deleted())
        assert 0 < low < high

        def read(fail: str) -> Any:
            return (
                spark.read.format("ferrymq")
                .option("servers", ferry.servers)
                .option("subscribe", "Lossy")
                .option("startingOffsets", '{"Lossy": {"0": 0}}')
                .option("failOnDataLoss", fail)
                .load()
            )

        with pytest.raises(Exception, match=r"queue offsets \[0, \d+\) are no longer stored"):
            read("true").count()
        kept = read("false").select("offset").collect()
        assert max(r["offset"] for r in kept) == high - 1
        assert len(kept) == high - min(r["offset"] for r in kept)

        query = (
            spark.readStream.format("ferrymq")
            .option("servers", ferry.servers)
            .option("subscribe", "Lossy")
            .option("startingOffsets", '{"Lossy": {"0": 0}}')
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="Set failOnDataLoss=false to skip"):
            query.awaitTermination(60)
    finally:
        ferry.stop()
