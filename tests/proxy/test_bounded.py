"""The endpoint's tables of relays and consumers stay bounded (idle expiry, LRU cap, busy entries
kept), and a FIFO group (`consumeMessageOrderly`) is popped orderly. In-process cluster and
endpoint, raw gRPC channel.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.client.mqadmin import MQAdmin
from ferrymq.proxy.pool import EntryState, to_close
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import V2, load
from ferrymq.testing import LocalCluster

from . import raw


def test_to_close_takes_idle_then_least_recent_never_busy() -> None:
    entries = {
        "old": EntryState(0.0),
        "busy": EntryState(0.0, busy=1),
        "pinned": EntryState(1.0),
        "a": EntryState(50.0),
        "b": EntryState(90.0),
    }
    pinned = {"pinned"}.__contains__
    # idle after 60 s: "old" (not "busy", not "pinned"); 4 left <= cap 4
    assert to_close(entries, 100.0, cap=4, idle_s=60, pinned=pinned) == ["old"]
    # cap 2: then the least recent non-busy ones, pinned or not
    assert to_close(entries, 100.0, cap=2, idle_s=60, pinned=pinned) == ["old", "pinned", "a"]
    # nothing idle yet, cap 0: everything but the busy one
    assert to_close(entries, 0.0, cap=0, idle_s=60) == ["old", "pinned", "a", "b"]


def _rpcs(v2: V2, channel: grpc.aio.Channel) -> Any:
    def rpc(name: str, stream: bool = False) -> Any:
        return raw.rpc(channel, v2, name, stream=stream)

    return rpc


def _send(v2: V2, topic: str, bodies: list[str], *, kind: str = "NORMAL", group: str = "") -> Any:
    send = v2.SendMessageRequest()
    for i, body in enumerate(bodies):
        message = send.messages.add()
        message.topic.name = topic
        message.body = body.encode()
        message.system_properties.message_id = f"{topic}-{body}-{i}"
        message.system_properties.body_encoding = v2.enum("Encoding", "IDENTITY")
        message.system_properties.message_type = v2.enum("MessageType", kind)
        if group:
            message.system_properties.message_group = group
    return send


async def _receive(v2: V2, rpc: Any, topic: str, group: str, wait: int) -> list[Any]:
    receive = v2.ReceiveMessageRequest(batch_size=1)
    receive.group.name = group
    receive.message_queue.topic.name = topic
    receive.invisible_duration.FromSeconds(60)
    receive.long_polling_timeout.FromSeconds(wait)
    parts = [p async for p in rpc("ReceiveMessage", stream=True)(receive, timeout=wait + 10)]
    return [p.message for p in parts if p.HasField("message")]


async def _ack(v2: V2, rpc: Any, topic: str, group: str, handle: str) -> Any:
    request = v2.AckMessageRequest()
    request.group.name = group
    request.topic.name = topic
    entry = request.entries.add()
    entry.message_id = "m"
    entry.receipt_handle = handle
    return await rpc("AckMessage")(request, timeout=10)


async def test_groups_and_relays_stay_at_the_cap(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    v2 = load()
    service = endpoint.service
    assert service is not None
    service.consumers.cap = 50
    service.relays.cap = 2
    topics = [f"ProxyBound{i}" for i in range(3)]
    async with AdminClient(cluster.namesrv_addr) as admin:
        for topic in topics:
            await admin.create_topic(topic, queues=1)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        rpc = _rpcs(v2, channel)
        # a receive long-polling meanwhile: its group is in use, so it is not closed under it
        live = asyncio.ensure_future(_receive(v2, rpc, topics[1], "proxy_bound_live", 8))
        deadline = asyncio.get_running_loop().time() + 10
        while "proxy_bound_live" not in service.consumers:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        for i in range(200):  # a garbage handle: the group's consumer is opened, no broker call
            answer = await _ack(v2, rpc, topics[0], f"proxy_bound_{i}", "not-a-handle")
            assert answer.status.code == v2.code("INVALID_RECEIPT_HANDLE"), answer.status
        assert len(service.consumers) == 50
        assert service.consumers.closed_total == 151
        assert "proxy_bound_live" in service.consumers
        sent = await rpc("SendMessage")(_send(v2, topics[1], ["live"]), timeout=10)
        assert sent.status.code == v2.code("OK"), sent.status
        assert [m.body for m in await live] == [b"live"]
        assert "proxy_bound_0" not in service.consumers
        # an evicted group used again works
        sent = await rpc("SendMessage")(_send(v2, topics[0], ["again"]), timeout=10)
        assert sent.status.code == v2.code("OK"), sent.status
        got = await _receive(v2, rpc, topics[0], "proxy_bound_0", 5)
        assert [m.body for m in got] == [b"again"]
        handle = got[0].system_properties.receipt_handle
        assert (await _ack(v2, rpc, topics[0], "proxy_bound_0", handle)).status.code == v2.code(
            "OK"
        )
        assert len(service.consumers) == 50

        # transactional sends to 3 topics: 2 relays stay, the first is closed (unregistered)
        for topic in topics:
            sent = await rpc("SendMessage")(
                _send(v2, topic, ["half"], kind="TRANSACTION"), timeout=10
            )
            assert sent.status.code == v2.code("OK"), sent.status
        assert len(service.relays) == 2
        assert topics[0] not in service.relays
        await service.relays.close_pending()
        clients = cluster.broker.state.clients
        assert clients.producer_connection(f"ferryproxy_tx_{topics[0]}") is None
        assert clients.producer_connection(f"ferryproxy_tx_{topics[2]}") is not None
        # the evicted topic's relay opens again on use
        sent = await rpc("SendMessage")(
            _send(v2, topics[0], ["half2"], kind="TRANSACTION"), timeout=10
        )
        assert sent.status.code == v2.code("OK"), sent.status
        assert topics[0] in service.relays
        assert len(service.relays) == 2


async def test_fifo_group_gets_a_message_group_in_order_one_at_a_time(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    v2 = load()
    topic, group = "ProxyFifo", "proxy_fifo"
    async with MQAdmin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=2)
        await admin.update_group(group, {"consumeMessageOrderly": True})
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        rpc = _rpcs(v2, channel)
        sent = await rpc("SendMessage")(_send(v2, topic, ["f0", "f1", "f2"], group="g"), timeout=10)
        assert sent.status.code == v2.code("OK"), sent.status
        bodies: list[bytes] = []
        for _ in range(3):
            got = await _receive(v2, rpc, topic, group, 3)
            assert len(got) == 1, got
            assert got[0].system_properties.message_type == v2.enum("MessageType", "FIFO")
            bodies.append(got[0].body)
            # the next one is not handed out while this one is not acked
            assert await _receive(v2, rpc, topic, group, 0) == []
            answer = await _ack(v2, rpc, topic, group, got[0].system_properties.receipt_handle)
            assert answer.status.code == v2.code("OK"), answer.status
        assert bodies == [b"f0", b"f1", b"f2"]


async def test_an_idle_pull_consumer_is_closed(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    v2 = load()
    service = endpoint.service
    assert service is not None
    service.pullers.idle_s = 0.3  # before the first use: the sweeper runs every idle_s / 4
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("ProxyIdle", queues=1)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        request = v2.GetOffsetRequest()
        request.group.name = "proxy_idle"
        request.message_queue.topic.name = "ProxyIdle"
        request.message_queue.broker.name = "broker-a"
        request.message_queue.id = 0
        answer = await _rpcs(v2, channel)("GetOffset")(request, timeout=10)
        assert answer.status.code == v2.code("OFFSET_NOT_FOUND"), answer.status
    assert "proxy_idle" in service.pullers
    deadline = asyncio.get_running_loop().time() + 10
    while "proxy_idle" in service.pullers and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert "proxy_idle" not in service.pullers
    assert service.pullers.closed_total == 1
