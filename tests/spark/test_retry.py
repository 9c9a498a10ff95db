"""The read path across a broker group without a master (`ferrymq.spark.retry`), in process."""

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import RemoteError, TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.spark import RetryableQueryError
from ferrymq.spark.fetch import DataLossError, read_range
from ferrymq.spark.plan import QueueRange
from ferrymq.spark.retry import retryable, with_failover
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.records import RecordBuffers

pytestmark = pytest.mark.spark


async def started(tmp_path: Path) -> tuple[LocalCluster, MessageQueue]:
    """Two broker groups holding topic Retry; 50 messages in broker-a's queue 0."""
    cluster = LocalCluster(tmp_path, brokers=2)
    await cluster.start()
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Retry", queues=1)
    for broker in cluster.brokers:
        await broker.register()
    queue = MessageQueue("Retry", "broker-a", 0)
    async with Producer(cluster.namesrv_addr) as producer:
        await producer.send_batch("Retry", [f"m-{i}".encode() for i in range(50)], queue=queue)
    return cluster, queue


def offsets_of(chunks: list[RecordBuffers]) -> list[int]:
    return [chunk.queue_offset(i) for chunk in chunks for i in range(chunk.count)]


async def test_a_read_waits_for_the_group_to_come_back(tmp_path: Path) -> None:
    cluster, queue = await started(tmp_path)
    try:
        async with PullConsumer(cluster.namesrv_addr, "retry-tests") as consumer:
            old = cluster.broker
            await old.close()  # broker-a is not routed until it comes back on another port

            async def come_back() -> None:
                await asyncio.sleep(1.0)
                broker = Broker(dataclasses.replace(old.config))
                await broker.start()
                await broker.register()
                cluster.brokers[0] = broker

            returning = asyncio.create_task(come_back())
            r = QueueRange("Retry", 0, queue.broker_name, queue.queue_id, 10, 50)
            chunks = [
                c
                async for c in read_range(
                    consumer, r, fail_on_data_loss=True, max_bytes=1 << 20, failover_timeout=30.0
                )
            ]
            await returning
        assert offsets_of(chunks) == list(range(10, 50))
    finally:
        await cluster.close()


async def test_a_read_gives_up_retryably_and_other_errors_pass_at_once(tmp_path: Path) -> None:
    cluster, queue = await started(tmp_path)
    try:
        async with PullConsumer(cluster.namesrv_addr, "retry-tests") as consumer:
            pulled = await with_failover("pulling", lambda: consumer.pull(queue, 0), budget=1.0)
            assert pulled.status is PullStatus.FOUND

            with pytest.raises(TopicNotFoundError):
                await with_failover("routing", lambda: consumer.queues("NoSuchTopic"), budget=5.0)

            await cluster.broker.close()  # broker-a
            with pytest.raises(RetryableQueryError, match="this error is retryable") as raised:
                await with_failover("pulling", lambda: consumer.pull(queue, 0), budget=1.0)
            assert raised.value.what == "pulling"
    finally:
        await cluster.close()


async def test_a_queue_ending_below_the_range_is_awaited_then_reported_lost(
    tmp_path: Path,
) -> None:
    """A replica whose watermark trails the range's end (after a failover) is asked again for
    failoverTimeoutMs: offsets that arrive meanwhile are read, a shortfall that stays is a loss."""
    cluster, queue = await started(tmp_path)
    try:
        async with (
            PullConsumer(cluster.namesrv_addr, "retry-tests") as consumer,
            Producer(cluster.namesrv_addr) as producer,
        ):

            async def late() -> None:
                await asyncio.sleep(0.5)
                await producer.send_batch("Retry", [b"late-0", b"late-1"], queue=queue)

            arriving = asyncio.create_task(late())
            r = QueueRange("Retry", 0, queue.broker_name, queue.queue_id, 45, 52)
            chunks = [
                c
                async for c in read_range(
                    consumer, r, fail_on_data_loss=True, max_bytes=1 << 20, failover_timeout=10.0
                )
            ]
            await arriving
            assert offsets_of(chunks) == list(range(45, 52))

            short = QueueRange("Retry", 0, queue.broker_name, queue.queue_id, 50, 60)
            read: list[int] = []

            async def read_short() -> None:
                async for c in read_range(
                    consumer, short, fail_on_data_loss=True, max_bytes=1 << 20, failover_timeout=1.0
                ):
                    read.extend(offsets_of([c]))

            with pytest.raises(DataLossError, match=r"\[52, 60\).*maybe truncated by a failover"):
                await read_short()
            assert read == [50, 51]
    finally:
        await cluster.close()


def test_retryable_marks_only_a_failover_s_errors() -> None:
    refused = RemoteError(ResponseCode.NO_PERMISSION, "a slave", code_name="NO_PERMISSION")
    with (
        pytest.raises(RetryableQueryError, match=r"^committing failed .*NO_PERMISSION"),
        retryable("committing"),
    ):
        raise refused
    with pytest.raises(RemoteError, match="expired"), retryable("committing"):
        raise RemoteError(ResponseCode.TRANSACTION_FAILED, "expired")
