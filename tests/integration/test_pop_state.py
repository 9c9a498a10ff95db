"""POP state kept small to restart (snapshots), moved by admin offset resets, and RocketMQ 5's
remaining POP codes (PEEK_MESSAGE, POLLING_INFO, POP_ROLLBACK), against in-process brokers."""

import asyncio

import pytest

from ferrymq import Producer
from ferrymq.broker.metadata import METADATA_TOPIC
from ferrymq.broker.metalog import SNAPSHOT_MIN_RECORDS
from ferrymq.client.consumer import decode_messages
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.errors import RemoteError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.security.aclcodes import Kind, kind_of
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.pop import PeekMessageRequestHeader, PollingInfoRequestHeader

from .remoting import command, create_topic
from .test_admin_cli import Ferry


async def _receive(
    consumer: SimpleConsumer, topic: str, count: int, *, invisible: float = 60.0
) -> list[ReceivedMessage]:
    """Receive until `count` messages came (fails after 20 s)."""
    got: list[ReceivedMessage] = []
    async with asyncio.timeout(20):
        while len(got) < count:
            got += await consumer.receive(
                topic, max_messages=count - len(got), invisible_duration=invisible, wait=0.5
            )
    return got


async def _send(cluster: LocalCluster, topic: str, count: int) -> None:
    queue = MessageQueue(topic, "broker-a", 0)
    async with Producer(cluster.namesrv_addr) as producer:
        for first in range(0, count, 128):
            bodies = [f"m{i}".encode() for i in range(first, min(first + 128, count))]
            await producer.send_batch(topic, bodies, queue=queue)


async def test_a_restart_replays_only_the_records_after_the_last_snapshot(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """Every ack is a metadata record; a start applies the last snapshot and what follows it,
    not every ack since the log began, and gets the same POP state and offsets back."""
    count = 3 * SNAPSHOT_MIN_RECORDS
    await create_topic(client, cluster.broker.address, "PopS", queues=1)
    await _send(cluster, "PopS", count + 1)
    async with SimpleConsumer(cluster.namesrv_addr, "GS") as consumer:
        acked = 0
        while acked < count:  # 32 in flight at a time: snapshots stay small
            for received in await _receive(consumer, "PopS", min(32, count - acked)):
                await consumer.ack(received)
                acked += 1
        [last] = await _receive(consumer, "PopS", 1)
        state = cluster.broker.state
        records = state.store.max_queue_offset(METADATA_TOPIC, 0)
        assert records > count  # one record per ack at least
        pop_before = {(g, t, q): p for g, t, q, p in state.pop.snapshot()}
        offsets_before = state.offsets.of_group("GS")
        assert pop_before[("GS", "PopS", 0)].inflight.keys() == {last.message.queue_offset}

        broker = await cluster.restart_broker(0)

        assert broker.metadata_replayed <= SNAPSHOT_MIN_RECORDS + 2, (
            broker.metadata_replayed,
            records,
        )
        assert {(g, t, q): p for g, t, q, p in broker.state.pop.snapshot()} == pop_before
        assert broker.state.offsets.of_group("GS") == offsets_before
        consumer.routes.invalidate("PopS")
        await consumer.ack(last)  # its handle still names the delivery in flight
        assert broker.state.pop.in_flight_count(("GS", "PopS", 0)) == 0


async def test_an_online_offset_reset_moves_the_pop_position_and_drops_what_is_in_flight(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """`ferry admin offset reset-by-time` on a POP group (no heartbeat, so never 'online' to the
    old check): served by the broker, the pop starts again at the reset offset, backwards
    too (after a restart as well), and the handles of messages in flight before it are stale."""
    await create_topic(client, cluster.broker.address, "PopRS", queues=1)
    await _send(cluster, "PopRS", 6)
    async with SimpleConsumer(cluster.namesrv_addr, "GRS") as consumer:
        got = await _receive(consumer, "PopRS", 4)
        await consumer.ack(got[0])
        await consumer.ack(got[1])
        args = ["offset", "reset-by-time", "--group", "GRS", "--topic", "PopRS"]
        reset = await Ferry(cluster.namesrv_addr)(*args, "--timestamp", "0", "--json")
        assert reset == {
            "online": True,
            "offsets": [{"brokerName": "broker-a", "queueId": 0, "offset": 0}],
        }
        assert cluster.broker.state.pop.in_flight_count(("GRS", "PopRS", 0)) == 0
        broker = await cluster.restart_broker(0)  # the reset is in the metadata log
        consumer.routes.invalidate("PopRS")
        assert broker.state.pop.position(("GRS", "PopRS", 0)) == 0
        assert broker.state.pop.in_flight_count(("GRS", "PopRS", 0)) == 0
        with pytest.raises(RemoteError) as stale:
            await consumer.ack(got[2])
        assert stale.value.code == ResponseCode.NO_MESSAGE
        again = await _receive(consumer, "PopRS", 6)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [
            (f"m{i}".encode(), 1) for i in range(6)
        ]


async def test_an_offline_offset_reset_moves_the_pop_position_both_ways(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """`ferry admin offset reset` (UPDATE_CONSUMER_OFFSET, what an offline reset sends) on a
    POP group: back to the earliest (in-flight handles stale, everything popped again with
    attempt 1, after a restart too), then forward to the latest (nothing left to pop)."""
    await create_topic(client, cluster.broker.address, "PopRO", queues=1)
    await _send(cluster, "PopRO", 4)
    key = ("GRO", "PopRO", 0)
    args = ["offset", "reset", "--group", "GRO", "--topic", "PopRO", "--json"]
    async with SimpleConsumer(cluster.namesrv_addr, "GRO") as consumer:
        got = await _receive(consumer, "PopRO", 3)
        await consumer.ack(got[0])
        moved = await Ferry(cluster.namesrv_addr)(*args, "--to", "earliest")
        assert moved == [{"brokerName": "broker-a", "queueId": 0, "offset": 0}]
        assert (
            cluster.broker.state.pop.position(key),
            cluster.broker.state.pop.in_flight_count(key),
        ) == (0, 0)
        broker = await cluster.restart_broker(0)  # the reset is in the metadata log
        consumer.routes.invalidate("PopRO")
        assert (broker.state.pop.position(key), broker.state.pop.in_flight_count(key)) == (0, 0)
        with pytest.raises(RemoteError) as stale:
            await consumer.ack(got[1])
        assert stale.value.code == ResponseCode.NO_MESSAGE
        again = await _receive(consumer, "PopRO", 4)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [
            (f"m{i}".encode(), 1) for i in range(4)
        ]
        moved = await Ferry(cluster.namesrv_addr)(*args, "--to", "latest")
        assert moved == [{"brokerName": "broker-a", "queueId": 0, "offset": 4}]
        assert (broker.state.pop.position(key), broker.state.pop.in_flight_count(key)) == (4, 0)
        assert broker.state.offsets.query("PopRO", "GRO", 0) == 4
        assert await consumer.receive("PopRO", invisible_duration=60, wait=0.2) == []


async def test_peek_polling_info_and_pop_rollback(cluster: LocalCluster, client: RpcClient) -> None:
    """PEEK_MESSAGE shows what a pop would read next and moves nothing; POLLING_INFO counts the
    pops waiting; POP_ROLLBACK (exportPopRecord) answers SUCCESS; bad input is refused with
    RocketMQ's codes."""
    addr = cluster.broker.address
    await create_topic(client, addr, "PopP", queues=1)
    await _send(cluster, "PopP", 3)

    async def peek(group: str = "GP", queue_id: int = -1) -> RemotingCommand:
        header = PeekMessageRequestHeader(
            consumer_group=group, topic="PopP", queue_id=queue_id, max_msg_nums=8
        )
        return await client.call(addr, command(RequestCode.PEEK_MESSAGE, header), 5)

    async def polling() -> int:
        header = PollingInfoRequestHeader(consumer_group="GP", topic="PopP", queue_id=-1)
        answer = await client.call(addr, command(RequestCode.POLLING_INFO, header), 5)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        return int(answer.ext_fields["pollingNum"])

    async with SimpleConsumer(cluster.namesrv_addr, "GP") as consumer:
        [first] = await _receive(consumer, "PopP", 1)
        for _ in range(2):  # the same twice: a peek moves nothing
            answer = await peek()
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert [m.body for m in decode_messages(answer.body, "broker-a")] == [b"m1", b"m2"]
            assert answer.ext_fields["restNum"] == "2"
        got = await _receive(consumer, "PopP", 2)
        assert [m.message.body for m in got] == [b"m1", b"m2"]
        assert (await peek()).code == ResponseCode.PULL_NOT_FOUND
        assert await polling() == 0
        waiting = asyncio.ensure_future(consumer.receive("PopP", invisible_duration=60, wait=15))
        try:
            async with asyncio.timeout(10):
                while await polling() != 1:
                    await asyncio.sleep(0.02)
            await _send(cluster, "PopP", 1)
            async with asyncio.timeout(10):
                assert [m.message.body for m in await waiting] == [b"m0"]
        finally:
            waiting.cancel()
        assert await polling() == 0
        assert (await peek(group="Nobody")).code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert (await peek(queue_id=1)).code == ResponseCode.INVALID_PARAMETER
        rollback = await client.call(addr, command(RequestCode.POP_ROLLBACK), 5)
        assert rollback.code == ResponseCode.SUCCESS, rollback.remark
        assert kind_of(RequestCode.POP_ROLLBACK) is Kind.ADMIN  # an admin command in RocketMQ
        await consumer.ack(first)  # the state is as it was
