"""A transaction check goes to the producer that sent the half message, over a raw gRPC channel
against an in-process cluster and endpoint; once that producer is gone, to another of the topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.errors import InvalidMessageError
from ferrymq.model import MessageQueue
from ferrymq.proxy.convert import TX_CLIENT_ID, message_properties
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import load
from ferrymq.testing import LocalCluster

from . import raw
from .raw import producer_telemetry


async def test_checks_go_to_the_owner_then_to_another_producer(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    """Producers P1 and P2 of one topic each leave a half open. The cluster checks halves after
    1 s, every 0.3 s: over two rounds each producer is asked only about its own half; after P1's
    NotifyClientTermination, P1's half is asked of P2, which commits it.
    """
    v2 = load()
    topic = "ProxyTxOwner"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        hang_up = asyncio.Event()
        clients = ("P1", "P2")
        sessions: dict[str, Any] = {
            c: producer_telemetry(channel, v2, topic, c, hang_up) for c in clients
        }
        checked: dict[str, list[str]] = {c: [] for c in clients}
        shown: list[dict[str, str]] = []
        handles: dict[str, str] = {}
        arrived = asyncio.Condition()

        async def read(client: str) -> None:
            while (command := await sessions[client].read()) is not grpc.aio.EOF:
                orphan = command.recover_orphaned_transaction_command
                async with arrived:
                    checked[client].append(orphan.message.system_properties.message_id)
                    shown.append(dict(orphan.message.user_properties))
                    handles[orphan.message.system_properties.message_id] = orphan.transaction_id
                    arrived.notify_all()

        readers: list[asyncio.Task[None]] = []
        try:
            async with asyncio.timeout(30):
                for client in clients:
                    assert (await sessions[client].read()).settings.HasField("publishing")
                    send = v2.SendMessageRequest()
                    message = send.messages.add()
                    message.topic.name = topic
                    message.body = client.encode()
                    message.system_properties.message_id = f"id-{client}"
                    message.system_properties.message_type = v2.enum("MessageType", "TRANSACTION")
                    sent = await raw.rpc(channel, v2, "SendMessage")(
                        send, metadata=(("x-mq-client-id", client),), timeout=10
                    )
                    assert sent.status.code == v2.code("OK"), sent
                readers = [asyncio.create_task(read(c)) for c in clients]
                async with arrived:  # two rounds of checks, each to the half's owner
                    await arrived.wait_for(
                        lambda: (
                            all(len(checked[c]) >= 2 for c in clients)
                            or sum(map(len, checked.values())) >= 8
                        )  # misrouted: fail now
                    )
                    assert {c: set(ids) for c, ids in checked.items()} == {
                        c: {f"id-{c}"} for c in clients
                    }, checked
                    assert not any(shown), shown  # the owner's property is not shown
                    checked["P2"].clear()
                notify = v2.NotifyClientTerminationRequest()
                answer = await raw.rpc(channel, v2, "NotifyClientTermination")(
                    notify, metadata=(("x-mq-client-id", "P1"),), timeout=10
                )
                assert answer.status.code == v2.code("OK"), answer
                async with arrived:  # P1 is gone: its half is asked of P2
                    await arrived.wait_for(lambda: "id-P1" in checked["P2"])
                # P2 commits it: delivered, with the owner's property kept from v2 consumers
                end = v2.EndTransactionRequest(
                    message_id="id-P1",
                    transaction_id=handles["id-P1"],
                    resolution=v2.enum("TransactionResolution", "COMMIT"),
                    source=v2.enum("TransactionSource", "SOURCE_SERVER_CHECK"),
                )
                end.topic.name = topic
                answer = await raw.rpc(channel, v2, "EndTransaction")(
                    end, metadata=(("x-mq-client-id", "P2"),), timeout=10
                )
                assert answer.status.code == v2.code("OK"), answer
                receive = v2.ReceiveMessageRequest(batch_size=8)
                receive.group.name = "proxy_tx_owner"
                receive.message_queue.topic.name = topic
                receive.invisible_duration.FromSeconds(60)
                receive.long_polling_timeout.FromSeconds(5)
                parts = [
                    p.message
                    async for p in raw.rpc(channel, v2, "ReceiveMessage", stream=True)(
                        receive, timeout=15
                    )
                    if p.HasField("message")
                ]
                assert [(m.body, dict(m.user_properties)) for m in parts] == [(b"P1", {})]
                async with PullConsumer(cluster.namesrv_addr, "proxy_tx_owner_pull") as reader:
                    queue = MessageQueue(topic, cluster.broker.config.broker_name, 0)
                    stored = (await reader.pull(queue, 0, max_messages=4)).messages
                assert [m.properties.get(TX_CLIENT_ID) for m in stored] == ["P1"]  # committed
        finally:
            hang_up.set()
            for task in readers:
                task.cancel()
            for session in sessions.values():
                session.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


def test_the_owner_property_is_reserved() -> None:
    v2 = load()
    message = v2.Message()
    message.user_properties[TX_CLIENT_ID] = "forged"
    with pytest.raises(InvalidMessageError):
        message_properties(message, transactional=True)
