"""Timer (delivery-time) messages on a real broker, its wall clock moved forward by the test."""

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.errors import InvalidMessageError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props

from .remoting import create_topic


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def visible(cluster: LocalCluster) -> list[Message]:
    async with PullConsumer(cluster.namesrv_addr, "Reader") as consumer:
        queue = MessageQueue("Timed", cluster.broker.config.broker_name, 0)
        return await consumer.fetch_range(queue, 0, 100)


async def bodies(cluster: LocalCluster) -> list[bytes]:
    return [m.body for m in await visible(cluster)]


def shift_clock(broker: Broker, ahead_ms: int) -> None:
    """Make the broker's wall clock run `ahead_ms` ahead of the real one."""
    broker.state.wall_ms = lambda: time.time_ns() // 1_000_000 + ahead_ms


async def deliver(broker: Broker) -> int:
    assert broker.timer is not None
    return await broker.timer.deliver_due()


async def setup_topic(cluster: LocalCluster, client: RpcClient) -> None:
    await create_topic(client, cluster.broker.address, "Timed", 1)
    await cluster.broker.register()


async def test_timer_messages_wait_for_their_time(cluster: LocalCluster, client: RpcClient) -> None:
    await setup_topic(cluster, client)
    async with Producer(cluster.namesrv_addr) as producer:
        now_ms = time.time_ns() // 1_000_000
        await producer.send("Timed", b"in-a-minute", delay_ms=60_000)
        await producer.send("Timed", b"in-two-minutes", deliver_at_ms=now_ms + 120_000)
        await producer.send("Timed", b"in-three-minutes", properties={props.TIMER_DELAY_SEC: "180"})
        await producer.send("Timed", b"already-due", deliver_at_ms=now_ms - 1000)
        await producer.send("Timed", b"now", delay_ms=0)
        await deliver(cluster.broker)
        assert await bodies(cluster) == [b"already-due", b"now"]
        timer = cluster.broker.timer
        assert timer is not None
        assert timer.pending == 3

        shift_clock(cluster.broker, 61_000)
        assert await deliver(cluster.broker) == 1
        assert await bodies(cluster) == [b"already-due", b"now", b"in-a-minute"]
        shift_clock(cluster.broker, 121_000)
        assert await deliver(cluster.broker) == 1
        shift_clock(cluster.broker, 181_000)
        assert await deliver(cluster.broker) == 1
        got = await visible(cluster)
        assert [m.body for m in got][2:] == [b"in-a-minute", b"in-two-minutes", b"in-three-minutes"]
        due_ms = int(got[3].properties[props.TIMER_OUT_MS])
        assert due_ms == now_ms + 120_000
        assert props.TIMER_DELIVER_MS not in got[3].properties
        assert got[3].msg_id
        assert got[3].topic == "Timed"
        assert timer.pending == 0


async def test_a_short_delay_is_delivered_by_the_broker_on_its_own(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)
    async with Producer(cluster.namesrv_addr) as producer:
        sent = await producer.send("Timed", b"soon", delay_ms=500)
        assert await bodies(cluster) == []

        async def arrived() -> bool:
            return await bodies(cluster) == [b"soon"]

        await wait_until(arrived)
        (message,) = await visible(cluster)
        assert message.msg_id == sent.msg_id
        assert message.store_timestamp_ms >= int(message.properties[props.TIMER_OUT_MS])


async def test_the_schedule_survives_a_restart_and_nothing_is_delivered_twice(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)
    async with Producer(cluster.namesrv_addr) as producer:
        # the long one first: the delivered short ones sit above the pending floor
        await producer.send("Timed", b"in-an-hour", delay_ms=3_600_000)
        for i in range(3):
            await producer.send("Timed", f"in-a-minute-{i}".encode(), delay_ms=60_000)
        shift_clock(cluster.broker, 61_000)
        assert await deliver(cluster.broker) == 3
        delivered_before = await bodies(cluster)
        assert len(delivered_before) == 3

        broker = await cluster.restart_broker()
        shift_clock(broker, 61_000)
        assert await deliver(broker) == 0
        assert await bodies(cluster) == delivered_before
        assert broker.timer is not None
        assert broker.timer.pending == 1
        shift_clock(broker, 3_601_000)
        assert await deliver(broker) == 1
        assert await bodies(cluster) == [*delivered_before, b"in-an-hour"]


@pytest.mark.parametrize("cluster", [{"timer_max_delay_sec": 3600}], indirect=True)
async def test_bad_schedules_are_typed_errors_and_store_nothing(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)
    async with Producer(cluster.namesrv_addr) as producer:
        for kwargs in (
            {"delay_ms": -1},
            {"deliver_at_ms": -5},
            {"delay_ms": 1.5},
            {"delay_ms": True},
            {"delay_ms": 10, "deliver_at_ms": 10},
            {"delay_ms": 10, "delay_level": 2},
        ):
            with pytest.raises(InvalidMessageError):
                await producer.send("Timed", b"bad", **kwargs)
        with pytest.raises(InvalidMessageError, match="max delay 3600000ms"):
            await producer.send("Timed", b"too-far", delay_ms=3_600_001)
        with pytest.raises(InvalidMessageError, match="not a whole number"):
            await producer.send("Timed", b"garbled", properties={props.TIMER_DELAY_SEC: "soon"})
        with pytest.raises(ValueError, match="delay_ms"):  # also a ValueError
            await producer.send("Timed", b"bad", delay_ms=-1)
        assert await bodies(cluster) == []
        assert cluster.broker.store.max_queue_offset("rmq_sys_wheel_timer", 0) == 0
