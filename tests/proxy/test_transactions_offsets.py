"""EndTransaction's ROLLBACK and unknown ids, and QueryOffset by time, over a raw gRPC channel
against an in-process cluster and endpoint (the Python 5.x client has no QueryOffset).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.model import MessageQueue
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import V2, load
from ferrymq.testing import LocalCluster

from . import raw


def _transactional(v2: V2, topic: str, body: str) -> Any:
    send = v2.SendMessageRequest()
    message = send.messages.add()
    message.topic.name = topic
    message.body = body.encode()
    message.system_properties.message_id = f"id-{body}"
    message.system_properties.message_type = v2.enum("MessageType", "TRANSACTION")
    return send


async def _received(rpc: Any, v2: V2, topic: str, group: str, wait_s: int) -> list[bytes]:
    receive = v2.ReceiveMessageRequest(batch_size=8)
    receive.group.name = group
    receive.message_queue.topic.name = topic
    receive.invisible_duration.FromSeconds(60)
    receive.long_polling_timeout.FromSeconds(wait_s)
    parts = [p async for p in rpc("ReceiveMessage", stream=True)(receive, timeout=wait_s + 10)]
    return [p.message.body for p in parts if p.HasField("message")]


async def test_rollback_is_never_delivered_nor_checked_and_unknown_ids(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    """Halves A (rolled back), B (committed), C (left open). The cluster checks halves after 1 s:
    a producer session must get C's check (checks run) and none for A or B; B is delivered, A
    never. An unknown transaction id is answered as RocketMQ's proxy answers it.
    """
    v2 = load()
    topic, group = "ProxyTxEnd", "proxy_tx_end"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:

        def rpc(name: str, stream: bool = False) -> Any:
            return raw.rpc(channel, v2, name, stream=stream)

        hang_up = asyncio.Event()

        session = raw.producer_telemetry(channel, v2, topic, "tx-producer", hang_up)
        try:
            async with asyncio.timeout(60):
                assert (await session.read()).settings.HasField("publishing")
                ids: dict[str, str] = {}
                for body in ("A", "B", "C"):
                    sent = await rpc("SendMessage")(_transactional(v2, topic, body), timeout=10)
                    assert sent.status.code == v2.code("OK"), sent
                    ids[body] = sent.entries[0].transaction_id
                for body, resolution in (("A", "ROLLBACK"), ("B", "COMMIT")):
                    end = v2.EndTransactionRequest(
                        message_id=f"id-{body}",
                        transaction_id=ids[body],
                        resolution=v2.enum("TransactionResolution", resolution),
                    )
                    end.topic.name = topic
                    answer = await rpc("EndTransaction")(end, timeout=10)
                    assert answer.status.code == v2.code("OK"), answer
                # no resolution (a check answered UNKNOWN): OK, as RocketMQ, and C stays checked
                end = v2.EndTransactionRequest(message_id="id-C", transaction_id=ids["C"])
                end.topic.name = topic
                answer = await rpc("EndTransaction")(end, timeout=10)
                assert answer.status.code == v2.code("OK"), answer
                checked: list[str] = []
                while "id-C" not in checked:  # the check loop reaches C after about 1 s
                    command = await session.read()
                    assert command is not grpc.aio.EOF
                    orphan = command.recover_orphaned_transaction_command
                    checked.append(orphan.message.system_properties.message_id)
                assert set(checked) == {"id-C"}, checked

                got = await _received(rpc, v2, topic, group, wait_s=5)
                assert got == [b"B"]
                assert await _received(rpc, v2, topic, group, wait_s=1) == []

                # RocketMQ's proxy: an empty id is INVALID_TRANSACTION_ID, an id it does not
                # know is INTERNAL_SERVER_ERROR ("cannot found transaction data")
                want = {
                    "": "INVALID_TRANSACTION_ID",
                    "7F00000100002A9F0000000000000000": "INTERNAL_SERVER_ERROR",
                    f"0:0:id-X:{cluster.broker.config.broker_name}": "INTERNAL_SERVER_ERROR",
                }
                for transaction_id, code in want.items():
                    end = v2.EndTransactionRequest(
                        transaction_id=transaction_id,
                        resolution=v2.enum("TransactionResolution", "ROLLBACK"),
                    )
                    end.topic.name = topic
                    answer = await rpc("EndTransaction")(end, timeout=10)
                    assert answer.status.code == v2.code(code), (transaction_id, answer)
        finally:
            hang_up.set()
            session.cancel()


async def test_query_offset_by_time_beginning_and_end(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    v2 = load()
    topic = "ProxyOffsetTime"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(3):
            await producer.send(topic, f"early{i}".encode())
        await asyncio.sleep(0.05)  # store times are in ms: the noted one falls between
        noted_ms = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        for i in range(2):
            await producer.send(topic, f"late{i}".encode())

    broker_name = cluster.broker.config.broker_name
    async with PullConsumer(cluster.namesrv_addr, "proxy_offset_time") as reader:
        queue = MessageQueue(topic, broker_name, 0)
        stored = (await reader.pull(queue, 0, max_messages=10)).messages
        lowest, highest = await reader.min_offset(queue), await reader.max_offset(queue)
    assert [m.body for m in stored] == [b"early0", b"early1", b"early2", b"late0", b"late1"]
    first_after = next(m.queue_offset for m in stored if m.store_timestamp_ms >= noted_ms)
    assert first_after == 3
    assert (lowest, highest) == (0, 5)

    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        query_offset = raw.rpc(channel, v2, "QueryOffset")

        async def offset(policy: str, at_ms: int = 0) -> int:
            request = v2.QueryOffsetRequest(
                query_offset_policy=v2.enum("QueryOffsetPolicy", policy)
            )
            request.message_queue.topic.name = topic
            request.message_queue.broker.name = broker_name
            request.message_queue.id = 0
            request.timestamp.FromMilliseconds(at_ms)
            answer = await query_offset(request, timeout=10)
            assert answer.status.code == v2.code("OK"), answer
            return int(answer.offset)

        assert await offset("TIMESTAMP", noted_ms) == first_after
        assert await offset("TIMESTAMP", stored[0].store_timestamp_ms) == 0
        assert await offset("BEGINNING") == lowest
        assert await offset("END") == highest
