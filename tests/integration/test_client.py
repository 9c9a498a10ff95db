"""The SDK's producer and offset-addressed consumer against a real broker."""

import asyncio
import dataclasses
import time
from collections.abc import Callable

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerRole
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import SendFailedError, TopicNotFoundError
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster

from .remoting import create_topic


async def _until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_produce_then_fetch_every_queue(cluster: LocalCluster, client: RpcClient) -> None:
    await create_topic(client, cluster.broker.address, "T", 3)
    await cluster.broker.register()
    async with (
        Producer(cluster.namesrv_addr) as producer,
        PullConsumer(cluster.namesrv_addr, "G") as consumer,
    ):
        results = [
            await producer.send(
                "T", f"m{i}".encode(), tags="t", keys=[f"k{i}"], properties={"n": str(i)}
            )
            for i in range(9)
        ]
        assert sorted(r.queue.queue_id for r in results) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        assert len({r.msg_id for r in results}) == 9
        got = []
        for queue in await consumer.queues("T"):
            assert await consumer.max_offset(queue) == 3
            got += await consumer.fetch_range(queue, 0, 3)
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(9)]
        by_body = {m.body: m for m in got}
        first = by_body[b"m0"]
        assert (first.tags, first.keys, first.properties["n"]) == ("t", ["k0"], "0")
        assert first.msg_id == results[0].msg_id
        queue = results[0].queue
        await consumer.commit(queue, 2)
        assert await consumer.committed(queue) == 2
        empty = await consumer.pull(queue, 3)
        assert empty.status is PullStatus.NO_NEW_MSG


async def test_ordered_sends_stay_in_their_queue_and_batches_keep_order(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 4)
    await cluster.broker.register()
    async with (
        Producer(cluster.namesrv_addr) as producer,
        PullConsumer(cluster.namesrv_addr) as consumer,
    ):
        queues = await consumer.queues("T")
        for i in range(5):
            await producer.send("T", f"o{i}".encode(), queue=queues[2])
        batch = await producer.send_batch("T", [b"b0", b"b1", b"b2"], queue=queues[1])
        assert batch.queue_offset == 0
        assert [m.body for m in await consumer.fetch_range(queues[2], 0, 5)] == [
            f"o{i}".encode() for i in range(5)
        ]
        assert [m.body for m in await consumer.fetch_range(queues[1], 0, 3)] == [
            b"b0",
            b"b1",
            b"b2",
        ]


async def test_missing_topics_and_refused_sends_are_typed_errors(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 1)
    await cluster.broker.register()
    async with Producer(cluster.namesrv_addr) as producer:
        with pytest.raises(TopicNotFoundError):
            await producer.send("Nope", b"x")
        await cluster.restart_broker(max_message_size=10)
        with pytest.raises(SendFailedError, match="over the limit"):
            await producer.send("T", b"x" * 100)


async def test_oneway_sends_get_no_answer_and_are_stored(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "OW", 2)
    await cluster.broker.register()
    async with (
        Producer(cluster.namesrv_addr) as producer,
        PullConsumer(cluster.namesrv_addr, "G") as consumer,
    ):
        ids = [await producer.send_oneway("OW", b"log-%d" % i, tags="log") for i in range(6)]
        assert len(set(ids)) == 6
        queues = await consumer.queues("OW")
        stored: list[bytes] = []
        for _ in range(200):  # nothing answers a oneway send: poll until the broker has them
            stored = [m.body for q in queues for m in await consumer.fetch_range(q, 0, 10)]
            if len(stored) == 6:
                break
            await asyncio.sleep(0.01)
        assert sorted(stored) == [b"log-%d" % i for i in range(6)]
        with pytest.raises(TopicNotFoundError):
            await producer.send_oneway("NoSuchTopic", b"x")


async def test_a_route_without_a_master_is_asked_for_again_at_once(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """A route fetched while a group had no master must not refuse sends for the whole refresh
    interval (30 s) once a master registers (a one-hour chaos soak saw 30 s send gaps)."""
    await create_topic(client, cluster.broker.address, "T", 1)
    await cluster.broker.register()
    master_config = cluster.broker.config
    slave = Broker(
        dataclasses.replace(
            master_config,
            broker_id=1,
            broker_role=BrokerRole.SLAVE,
            store_path_root_dir=master_config.store_path_root_dir.parent / "slave",
            ha_listen_port=0,
        )
    )
    await slave.start()
    try:
        async with Producer(cluster.namesrv_addr) as producer:
            queue = (await producer.routes.get("T")).write_queues[0]
            await _until(lambda: slave.state.topics.get("T") is not None)
            await cluster.broker.close()  # the group has no master for a while
            await slave.register()
            route = await producer.routes.get("T", refresh=True)
            assert route.master("broker-a") is None
            with pytest.raises(SendFailedError, match="has no master"):
                await producer.send("T", b"while no master", queue=queue)
            master = Broker(master_config)  # back, on a new port
            await master.start()
            cluster.brokers[0] = master
            await master.register()
            await asyncio.sleep(0.3)
            result = await producer.send("T", b"to the new master", queue=queue)
            assert result.queue == queue
    finally:
        await slave.close()


async def test_a_pull_with_min_bytes_is_held_until_enough_bytes_or_its_wait_is_over(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """Seed 003's delayed fetch: min bytes beside the maximum wait (`minMsgBytes`)."""
    await create_topic(client, cluster.broker.address, "MinBytes", 1)
    await cluster.broker.register()
    body = b"x" * 2000  # stored with about 170 bytes of header, topic and properties
    async with (
        Producer(cluster.namesrv_addr) as producer,
        PullConsumer(cluster.namesrv_addr, "G") as consumer,
    ):
        queue = (await consumer.queues("MinBytes"))[0]
        await producer.send("MinBytes", body, queue=queue)
        held = asyncio.create_task(consumer.pull(queue, 0, wait=20.0, min_bytes=9000))
        sent = 1
        while sent < 5:
            await asyncio.sleep(0.1)  # turns of the loop in which the broker could answer
            assert not held.done(), f"answered with {sent} records, under 9000 bytes"
            await producer.send("MinBytes", body, queue=queue)
            sent += 1
        result = await asyncio.wait_for(held, 10)
        assert result.status is PullStatus.FOUND
        assert [m.queue_offset for m in result.messages] == [0, 1, 2, 3, 4]

        # the wait runs out: what there is, though less than asked for
        short = await consumer.pull(queue, 3, wait=0.3, min_bytes=100_000)
        assert [m.queue_offset for m in short.messages] == [3, 4]
        # at the end of the queue: nothing, after the wait, as a plain long poll
        empty = await consumer.pull(queue, 5, wait=0.3, min_bytes=100_000)
        assert empty.status is PullStatus.NO_NEW_MSG
        # answered at once when the read is cut short by its own limits: waiting cannot help
        capped = await asyncio.wait_for(
            consumer.pull(queue, 0, max_messages=2, wait=20.0, min_bytes=100_000), 10
        )
        assert [m.queue_offset for m in capped.messages] == [0, 1]
        clipped = await asyncio.wait_for(
            consumer.pull(queue, 0, max_bytes=5000, wait=20.0, min_bytes=100_000), 10
        )
        assert 1 <= len(clipped.messages) < 5
        # without min_bytes a pull that finds messages answers at once, as before
        plain = await asyncio.wait_for(consumer.pull(queue, 0, wait=20.0), 10)
        assert len(plain.messages) == 5
