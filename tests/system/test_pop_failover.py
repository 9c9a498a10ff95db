"""POP across kill -9 of the master (issue 21): three controllers, a NameServer and a group of
three replicas as processes. Acks and changes of invisible time answered before the kill hold
on the new master: nothing acked comes again, a changed message is acked there by its handle,
and the messages left in flight come again once their invisible time passed.
"""

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

pytestmark = pytest.mark.system

TOPIC = "PopFailover"
GROUP = "PopFailoverGroup"
T = TypeVar("T")


async def _master(admin: AdminClient, *, not_addr: str = "", timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(TOPIC)
        if route is not None:
            for broker in route.broker_datas:
                address = broker.broker_addrs.get(0)
                if address and address != not_addr:
                    return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(0.1)


async def _in_sync(client: RpcClient, master: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        response = await client.call(
            master, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 3
        )
        if decode_body(response.body, KVTable).table.get("syncStateSet", "").count(",") >= 2:
            return
        assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
        await asyncio.sleep(0.1)


async def _retrying(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """Await `call()` until the new master takes it (routes refresh on failures)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await call()
        except FerryError as exc:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what} failed for 60 s: {exc}") from exc
        await asyncio.sleep(0.2)


async def test_pop_acks_hold_and_in_flight_messages_return_across_kill_of_the_master(
    tmp_path: Path,
) -> None:
    cluster = ProcessCluster(
        UpConfig(data_dir=tmp_path, replicas=3, controllers=3, segment_bytes=16 * 1024 * 1024)
    )
    await cluster.start()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as client:
            await admin.create_topic(TOPIC, queues=2)
            old_master = await _master(admin)
            await _in_sync(client, old_master)
            async with Producer(cluster.namesrv_addr) as producer:
                for i in range(20):
                    await producer.send(TOPIC, f"m{i:02d}".encode())
            async with SimpleConsumer(cluster.namesrv_addr, GROUP) as consumer:
                got: list[ReceivedMessage] = []
                deadline = time.monotonic() + 20
                while len(got) < 20:
                    assert time.monotonic() < deadline, f"popped {len(got)} of 20"
                    got += await consumer.receive(
                        TOPIC, max_messages=20, invisible_duration=4.0, wait=1.0
                    )
                acked, changed, left = got[:10], got[10:15], got[15:]
                for received in acked:
                    await consumer.ack(received)  # answered once the SyncStateSet has it
                for received in changed:
                    await consumer.change_invisible_duration(received, 120.0)
                victim = next(
                    name for name, child in cluster.brokers.items() if child.addr == old_master
                )
                cluster.brokers[victim].kill()
                await _master(admin, not_addr=old_master)
                consumer.routes.invalidate(TOPIC)

                # the group's offsets POP committed (below the oldest unacked) were replicated
                lowest: dict[int, int] = {}
                for received in changed + left:
                    queue_id, offset = received.message.queue_id, received.message.queue_offset
                    lowest[queue_id] = min(offset, lowest.get(queue_id, offset))
                async with PullConsumer(cluster.namesrv_addr, GROUP) as puller:
                    for queue in await puller.queues(TOPIC):
                        committed = await _retrying(
                            "query", functools.partial(puller.committed, queue)
                        )
                        end = max(
                            m.message.queue_offset + 1
                            for m in got
                            if m.message.queue_id == queue.queue_id
                        )
                        assert committed == lowest.get(queue.queue_id, end), queue

                # the changes were replicated: their handles ack on the new master
                for received in changed:
                    await _retrying("ack", functools.partial(consumer.ack, received))
                # the ones left in flight come again (attempt 2); nothing acked does
                again: list[ReceivedMessage] = []
                deadline = time.monotonic() + 60
                while len(again) < len(left):
                    assert time.monotonic() < deadline, f"{len(again)} of {len(left)} came again"
                    again += await _retrying(
                        "receive",
                        lambda: consumer.receive(TOPIC, invisible_duration=60.0, wait=1.0),
                    )
                bodies = sorted(m.message.body for m in again)
                assert bodies == sorted(m.message.body for m in left)
                assert {m.delivery_attempt for m in again} == {2}
                for received in again:
                    await consumer.ack(received)
                assert await consumer.receive(TOPIC, invisible_duration=60.0, wait=2.0) == []
    finally:
        await cluster.stop()
