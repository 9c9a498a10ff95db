"""The admin client against a real NameServer and broker: a created topic is routable at once."""

import asyncio
import dataclasses
import socket

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.errors import ConnectError, FerryError, SendFailedError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.rpc.connection import Connection, EncodedFrame, LaterResponse
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_created_topic_is_routed_when_create_returns(cluster: LocalCluster) -> None:
    register = cluster.namesrv.router.handler(RequestCode.REGISTER_BROKER)
    assert register is not None

    async def late(
        conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
        await asyncio.sleep(0.2)  # the fault: a NameServer slow to take a registration
        return await register(conn, request)

    cluster.namesrv.router.replace(RequestCode.REGISTER_BROKER, late)
    async with (
        AdminClient(cluster.namesrv_addr) as admin,
        PullConsumer(cluster.namesrv_addr, "G") as consumer,
    ):
        for round_no in range(3):  # the broker registers in the background: no window is left
            topic = f"Fresh{round_no}"
            await admin.create_topic(topic, queues=3)
            route = await admin.route(topic)
            assert route is not None, f"{topic} had no route right after create_topic"
            assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [
                ("broker-a", 3)
            ]
            await consumer.commit((await consumer.queues(topic))[0], 7)
        await admin.create_topic("Fresh0", queues=5)  # a change is awaited too, not only a create
        route = await admin.route("Fresh0")
        assert route is not None
        assert route.queue_datas[0].write_queue_nums == 5


async def test_a_nameserver_that_never_routes_the_topic_is_named(cluster: LocalCluster) -> None:
    async with (
        NameServer(NamesrvConfig(listen_port=0)) as stray,  # no broker registers here
        AdminClient(f"{cluster.namesrv_addr};{stray.address}", timeout=1) as admin,
    ):
        with pytest.raises(FerryError, match=f"NameServer {stray.address} did not route it"):
            await admin.create_topic("Half", queues=2)
        route = await admin.route("Half")  # the broker and the first NameServer have it
        assert route is not None
        assert route.queue_datas[0].write_queue_nums == 2


async def test_an_unreachable_nameserver_is_skipped_but_not_all(cluster: LocalCluster) -> None:
    down = f"127.0.0.1:{_closed_port()}"
    async with AdminClient(f"{cluster.namesrv_addr};{down}", timeout=1) as admin:
        assert await admin.create_topic("Partly", queues=2) == [cluster.broker.address]
        assert await admin.route("Partly") is not None
    async with AdminClient(down, timeout=1) as admin:
        with pytest.raises(ConnectError):
            await admin.create_topic("Nowhere", queues=2)


@pytest.mark.parametrize("cluster", [{"brokers": 2}], indirect=True)
async def test_a_wiped_group_takes_no_sends_but_serves_reads_until_added_back(
    cluster: LocalCluster,
) -> None:
    async with NameServer(NamesrvConfig(listen_port=0)) as second:
        for broker in cluster.brokers:  # a second NameServer: the wipe must reach both
            broker.config = dataclasses.replace(
                broker.config, namesrv_addr=f"{cluster.namesrv_addr};{second.address}"
            )
            await broker.register()
        namesrvs = f"{cluster.namesrv_addr};{second.address}"
        async with AdminClient(namesrvs) as admin:
            await admin.create_topic("Drained", queues=2)
            async with Producer(namesrvs) as producer:
                before = {(await producer.send("Drained", b"before")).queue for _ in range(8)}
            assert {q.broker_name for q in before} == {"broker-a", "broker-b"}
            counts = await admin.wipe_write_perm("broker-a")
            assert set(counts) == {cluster.namesrv_addr, second.address}
            assert len(set(counts.values())) == 1  # every topic on the group, system ones too
            assert min(counts.values()) >= 1
            for namesrv in (cluster.namesrv_addr, second.address):
                async with AdminClient(namesrv) as one:
                    route = await one.route("Drained")
                    assert route is not None
                    assert {q.broker_name: q.perm for q in route.queue_datas} == {
                        "broker-a": 4,
                        "broker-b": 6,
                    }
            for broker in cluster.brokers:
                await broker.register()  # a registration does not undo the wipe
            async with Producer(namesrvs) as producer:
                during = {(await producer.send("Drained", b"during")).queue for _ in range(8)}
            assert {q.broker_name for q in during} == {"broker-b"}
            async with PullConsumer(namesrvs, "Drainer") as consumer:
                queues = await consumer.queues("Drained")
                assert {q.broker_name for q in queues} == {"broker-a", "broker-b"}
                left = [
                    m
                    for q in queues
                    if q.broker_name == "broker-a"
                    for m in (await consumer.pull(q, 0, max_messages=32)).messages
                ]
            assert [m.body for m in left] == [b"before"] * 4
            await admin.wipe_write_perm("broker-b")  # no group takes writes: a typed refusal
            async with Producer(namesrvs) as producer:
                with pytest.raises(SendFailedError, match="no writable queue"):
                    await producer.send("Drained", b"nowhere")
            await admin.add_write_perm("broker-b")
            assert await admin.add_write_perm("broker-a") == counts
            async with Producer(namesrvs) as producer:
                after = {(await producer.send("Drained", b"after")).queue for _ in range(8)}
            assert {q.broker_name for q in after} == {"broker-a", "broker-b"}
