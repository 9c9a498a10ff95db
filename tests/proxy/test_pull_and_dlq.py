"""The 5.x pull-consumer RPCs and ForwardMessageToDeadLetterQueue over a raw gRPC channel (the
Python 5.x client has no pull consumer): offsets, pulls by offset, and a message moved to the
group's DLQ, against an in-process cluster.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import load
from ferrymq.testing import LocalCluster

from . import raw


async def test_pull_offsets_and_dead_letter(cluster: LocalCluster, endpoint: GrpcEndpoint) -> None:
    v2 = load()
    topic, group = "ProxyPull", "proxy_pull"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(3):
            await producer.send(topic, f"p{i}".encode())

    async with grpc.aio.insecure_channel(endpoint.address) as channel:

        def rpc(name: str, stream: bool = False) -> Any:
            return raw.rpc(channel, v2, name, stream=stream)

        queue = v2.MessageQueue()
        queue.topic.name = topic
        queue.broker.name = cluster.broker.config.broker_name
        queue.id = 0
        request = v2.GetOffsetRequest(message_queue=queue)
        request.group.name = group
        answer = await rpc("GetOffset")(request, timeout=10)
        assert answer.status.code == v2.code("OFFSET_NOT_FOUND"), answer
        for policy, want in (("BEGINNING", 0), ("END", 3)):
            query = v2.QueryOffsetRequest(
                message_queue=queue, query_offset_policy=v2.enum("QueryOffsetPolicy", policy)
            )
            answer = await rpc("QueryOffset")(query, timeout=10)
            assert (answer.status.code, answer.offset) == (v2.code("OK"), want), answer

        pull = v2.PullMessageRequest(message_queue=queue, offset=1, batch_size=10)
        pull.group.name = group
        parts = [part async for part in rpc("PullMessage", stream=True)(pull, timeout=10)]
        assert parts[0].status.code == v2.code("OK"), parts
        bodies = [p.message.body for p in parts if p.HasField("message")]
        assert bodies == [b"p1", b"p2"]
        assert parts[-1].next_offset == 3

        update = v2.UpdateOffsetRequest(message_queue=queue, offset=2)
        update.group.name = group
        assert (await rpc("UpdateOffset")(update, timeout=10)).status.code == v2.code("OK")
        answer = await rpc("GetOffset")(request, timeout=10)
        assert (answer.status.code, answer.offset) == (v2.code("OK"), 2), answer

        # receive one by POP, then send it to the group's dead-letter queue
        receive = v2.ReceiveMessageRequest(message_queue=queue, batch_size=1)
        receive.group.name = "proxy_dlq"
        receive.invisible_duration.FromSeconds(30)
        parts = [part async for part in rpc("ReceiveMessage", stream=True)(receive, timeout=10)]
        message = next(p.message for p in parts if p.HasField("message"))
        forward = v2.ForwardMessageToDeadLetterQueueRequest(
            receipt_handle=message.system_properties.receipt_handle,
            message_id=message.system_properties.message_id,
            max_delivery_attempts=16,
        )
        forward.group.name = "proxy_dlq"
        forward.topic.name = topic
        answer = await rpc("ForwardMessageToDeadLetterQueue")(forward, timeout=10)
        assert answer.status.code == v2.code("OK"), answer

    dead_queue = MessageQueue("%DLQ%proxy_dlq", queue.broker.name, 0)
    async with PullConsumer(cluster.namesrv_addr, "proxy_dlq_reader") as reader:
        deadline = time.monotonic() + 30
        while True:  # the DLQ topic's route may take a registration to appear
            try:
                dead = (await reader.pull(dead_queue, 0)).messages
            except FerryError:
                dead = []
            if dead or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert [m.body for m in dead] == [message.body]
