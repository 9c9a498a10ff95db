"""Two gRPC endpoints on one cluster (the endpoint keeps no consumption state): a message sent
through one, received through the other, its receipt handles used across them, acked once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import load
from ferrymq.testing import LocalCluster

from . import raw


async def test_handles_cross_endpoints_and_the_ack_holds(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    """m1 and m2 sent through A and received through B; both made due in 1 s through A with B's
    handles; m1 acked through B with A's handle. m2 comes again (so the wait covered the
    invisible time), m1 never.
    """
    v2 = load()
    topic, group = "ProxyTwoEndpoints", "proxy_two_endpoints"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    other = GrpcEndpoint(cluster.namesrv_addr)
    await other.start()
    try:
        async with (
            asyncio.timeout(60),
            grpc.aio.insecure_channel(endpoint.address) as channel_a,
            grpc.aio.insecure_channel(other.address) as channel_b,
        ):

            def a(name: str, stream: bool = False) -> Any:
                return raw.rpc(channel_a, v2, name, stream=stream)

            def b(name: str, stream: bool = False) -> Any:
                return raw.rpc(channel_b, v2, name, stream=stream)

            for rpc, server in ((a, endpoint), (b, other)):
                route = v2.QueryRouteRequest()
                route.topic.name = topic
                answer = await rpc("QueryRoute")(route, timeout=10)
                assert answer.status.code == v2.code("OK"), answer
                named = {
                    f"{address.host}:{address.port}"
                    for queue in answer.message_queues
                    for address in queue.broker.endpoints.addresses
                }
                assert named == {server.address}

            send = v2.SendMessageRequest()
            for body in (b"m1", b"m2"):
                message = send.messages.add()
                message.topic.name = topic
                message.body = body
                message.system_properties.message_id = body.decode()
            assert (await a("SendMessage")(send, timeout=10)).status.code == v2.code("OK")

            async def receive(rpc: Any, wait_s: int) -> dict[bytes, Any]:
                request = v2.ReceiveMessageRequest(batch_size=8)
                request.group.name = group
                request.message_queue.topic.name = topic
                request.invisible_duration.FromSeconds(30)
                request.long_polling_timeout.FromSeconds(wait_s)
                call = rpc("ReceiveMessage", stream=True)(request, timeout=wait_s + 10)
                parts = [p async for p in call]
                return {p.message.body: p.message for p in parts if p.HasField("message")}

            received: dict[bytes, Any] = {}
            while len(received) < 2:  # POP may answer part of the queue per call
                received |= await receive(b, 2)
            assert set(received) == {b"m1", b"m2"}

            handles: dict[bytes, str] = {}
            for body, message in received.items():
                change = v2.ChangeInvisibleDurationRequest(
                    receipt_handle=message.system_properties.receipt_handle,
                    message_id=message.system_properties.message_id,
                )
                change.group.name = group
                change.topic.name = topic
                change.invisible_duration.FromSeconds(1)
                changed = await a("ChangeInvisibleDuration")(change, timeout=10)
                assert changed.status.code == v2.code("OK"), changed
                handles[body] = changed.receipt_handle

            ack = v2.AckMessageRequest()
            ack.group.name = group
            ack.topic.name = topic
            entry = ack.entries.add(message_id="m1", receipt_handle=handles[b"m1"])
            acked = await b("AckMessage")(ack, timeout=10)
            assert acked.status.code == v2.code("OK"), acked
            assert [e.receipt_handle for e in acked.entries] == [entry.receipt_handle]

            again = await receive(a, 10)  # m2 is due 1 s after its change
            again |= await receive(b, 1)
            assert set(again) == {b"m2"}
            assert again[b"m2"].system_properties.delivery_attempt == 2
    finally:
        await other.close()
