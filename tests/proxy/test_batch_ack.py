"""AckMessage with several entries over a raw gRPC channel, against an in-process cluster: each
entry answered on its own (a stale handle among good ones), and the good ones leave flight.
"""

from __future__ import annotations

from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import load
from ferrymq.testing import LocalCluster

from . import raw


async def test_batch_ack_answers_each_entry(cluster: LocalCluster, endpoint: GrpcEndpoint) -> None:
    v2 = load()
    topic, group = "ProxyBatchAck", "proxy_batch_ack"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(4):
            await producer.send(topic, f"b{i}".encode())

    async with grpc.aio.insecure_channel(endpoint.address) as channel:

        def rpc(name: str, stream: bool = False) -> Any:
            return raw.rpc(channel, v2, name, stream=stream)

        receive = v2.ReceiveMessageRequest(batch_size=4)
        receive.group.name = group
        receive.message_queue.topic.name = topic
        receive.invisible_duration.FromSeconds(60)
        receive.long_polling_timeout.FromSeconds(2)
        handles: list[str] = []
        for _ in range(5):  # POP may answer part of the queue per call
            parts = [p async for p in rpc("ReceiveMessage", stream=True)(receive, timeout=10)]
            handles += [
                p.message.system_properties.receipt_handle for p in parts if p.HasField("message")
            ]
            if len(handles) == 4:
                break
        assert len(handles) == 4
        assert cluster.broker.state.pop.in_flight_count((group, topic, 0)) == 4

        def ack_request(chosen: list[str]) -> Any:
            request = v2.AckMessageRequest()
            request.group.name = group
            request.topic.name = topic
            for i, handle in enumerate(chosen):
                entry = request.entries.add()
                entry.message_id = f"m{i}"
                entry.receipt_handle = handle
            return request

        first = await rpc("AckMessage")(ack_request(handles[:1]), timeout=10)
        assert first.status.code == v2.code("OK"), first
        # the first handle again (stale now) among the three others
        batch = handles[1:] + handles[:1]
        answer = await rpc("AckMessage")(ack_request(batch), timeout=10)
        assert answer.status.code == v2.code("MULTIPLE_RESULTS"), answer
        codes = [(e.receipt_handle, e.status.code) for e in answer.entries]
        ok, stale = v2.code("OK"), v2.code("INVALID_RECEIPT_HANDLE")
        assert codes == [(h, ok) for h in handles[1:]] + [(handles[0], stale)]
    assert cluster.broker.state.pop.in_flight_count((group, topic, 0)) == 0
