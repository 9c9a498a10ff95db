"""The push consumer against a real broker: filtering, sharing, retries, broadcasting, order."""

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, MessageModel, PushConsumer, allocate_average
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster

from .remoting import create_topic

FAST = {"message_delay_level": "1s 1s 1s 1s 1s 1s"}


def test_average_allocation_gives_contiguous_even_shares() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(5)]
    shares = [allocate_average(queues, ["c2", "c1"], me) for me in ("c1", "c2")]
    assert [[q.queue_id for q in s] for s in shares] == [[0, 1, 2], [3, 4]]
    assert allocate_average(queues, ["c1"], "stranger") == []


async def _until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _consumer(
    cluster: LocalCluster, group: str, seen: list[Message], **options: object
) -> PushConsumer:
    async def listener(message: Message) -> None:
        seen.append(message)

    options.setdefault("consume_from", ConsumeFrom.FIRST_OFFSET)
    options.setdefault("pull_wait", 0.5)
    options.setdefault("rebalance_interval", 0.5)
    return PushConsumer(cluster.namesrv_addr, group, listener, **options)  # type: ignore[arg-type]


async def test_a_consumer_gets_exactly_the_matching_tags(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 4)
    await cluster.broker.register()
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(40):
            await producer.send("T", f"m{i}".encode(), tags="A" if i % 2 else "B")
    seen: list[Message] = []
    consumer = _consumer(cluster, "G", seen)
    consumer.subscribe("T", "A")
    async with consumer:
        await _until(lambda: len(seen) >= 20)
        await asyncio.sleep(0.3)
    assert sorted(m.body for m in seen) == sorted(f"m{i}".encode() for i in range(1, 40, 2))
    assert {m.tags for m in seen} == {"A"}


async def test_two_consumers_share_the_queues_and_one_takes_over(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 4)
    await cluster.broker.register()
    first_seen: list[Message] = []
    second_seen: list[Message] = []
    first = _consumer(cluster, "G", first_seen)
    second = _consumer(cluster, "G", second_seen)
    for consumer in (first, second):
        consumer.subscribe("T")
    await first.start()
    await second.start()
    try:

        def owned(consumer: PushConsumer) -> set[MessageQueue]:
            return {queue for queue in consumer.assigned if queue.topic == "T"}

        await _until(lambda: len(owned(first)) + len(owned(second)) == 4 and len(owned(first)) == 2)
        assert owned(first).isdisjoint(owned(second))
        async with Producer(cluster.namesrv_addr) as producer:
            for i in range(40):
                await producer.send("T", f"a{i}".encode())
            await _until(lambda: len(first_seen) + len(second_seen) >= 40)
            assert first_seen
            assert second_seen
            await second.close()
            await _until(lambda: len(owned(first)) == 4)
            for i in range(40):
                await producer.send("T", f"b{i}".encode())
            await _until(lambda: sum(1 for m in first_seen if m.body.startswith(b"b")) >= 40)
    finally:
        await first.close()
        await second.close()
    bodies = Counter(m.body for m in first_seen + second_seen)
    assert set(bodies) == {f"{p}{i}".encode() for p in "ab" for i in range(40)}
    assert all(count == 1 for count in bodies.values())  # clean hand-over: committed, no repeats


@pytest.mark.parametrize("cluster", [FAST], indirect=True)
async def test_a_failed_message_comes_back_through_the_retry_topic(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 1)
    await cluster.broker.register()
    attempts: list[Message] = []

    async def listener(message: Message) -> None:
        attempts.append(message)
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    consumer = PushConsumer(
        cluster.namesrv_addr,
        "G",
        listener,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        pull_wait=0.5,
        rebalance_interval=0.5,
    )
    consumer.subscribe("T")
    async with consumer, Producer(cluster.namesrv_addr) as producer:
        sent = await producer.send("T", b"flaky", keys=["k"])
        await _until(lambda: len(attempts) >= 3, timeout=30)
    assert [m.body for m in attempts] == [b"flaky"] * 3
    assert [m.reconsume_times for m in attempts] == [0, 1, 2]
    assert {m.topic for m in attempts} == {"T"}
    assert {m.msg_id for m in attempts} == {sent.msg_id}


async def test_broadcasting_consumers_each_get_everything(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 2)
    await cluster.broker.register()
    seen: tuple[list[Message], list[Message]] = ([], [])
    consumers = [
        _consumer(cluster, "B", seen[i], message_model=MessageModel.BROADCASTING) for i in range(2)
    ]
    for consumer in consumers:
        consumer.subscribe("T")
        await consumer.start()
    try:
        async with Producer(cluster.namesrv_addr) as producer:
            for i in range(10):
                await producer.send("T", f"x{i}".encode())
        await _until(lambda: len(seen[0]) >= 10 and len(seen[1]) >= 10)
    finally:
        for consumer in consumers:
            await consumer.close()
    assert sorted(m.body for m in seen[0]) == sorted(m.body for m in seen[1])


@pytest.mark.parametrize("cluster", [FAST], indirect=True)
async def test_an_orderly_consumer_keeps_queue_order_and_retries_in_place(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 2)
    await cluster.broker.register()
    order: list[bytes] = []
    failures = {b"q0-3": 2}

    async def listener(message: Message) -> None:
        if failures.get(message.body, 0) > 0:
            failures[message.body] -= 1
            raise RuntimeError("retry me")
        order.append(message.body)

    consumer = PushConsumer(
        cluster.namesrv_addr,
        "O",
        listener,
        orderly=True,
        suspend=0.1,
        pull_wait=0.5,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        commit_interval=0.5,
    )
    consumer.subscribe("T")
    async with Producer(cluster.namesrv_addr) as producer:
        queues = (await producer.routes.get("T")).write_queues
        for i in range(10):
            await producer.send("T", f"q0-{i}".encode(), queue=queues[0])
        async with consumer:
            await _until(lambda: len(order) >= 10)
    assert order == [f"q0-{i}".encode() for i in range(10)]


async def test_flow_control_bounds_messages_in_flight(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "T", 1)
    await cluster.broker.register()
    release = asyncio.Event()
    in_flight: list[int] = []
    peak = [0]

    async def slow(message: Message) -> None:
        in_flight.append(1)
        peak[0] = max(peak[0], len(in_flight))
        await release.wait()
        in_flight.pop()

    consumer = PushConsumer(
        cluster.namesrv_addr,
        "F",
        slow,
        max_cached_messages=5,
        pull_batch=2,
        pull_wait=0.2,
        consume_from=ConsumeFrom.FIRST_OFFSET,
    )
    consumer.subscribe("T")
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(30):
            await producer.send("T", f"s{i}".encode())
        async with consumer:
            await _until(lambda: peak[0] >= 5)
            await asyncio.sleep(0.5)
            assert peak[0] <= 6  # at most one pull batch past the bound
            release.set()
            await _until(lambda: consumer.consumed >= 30)
