"""NotifyClientTermination over a raw gRPC channel, against an in-process cluster and endpoint:
the client is gone at once, not after its heartbeats expire. A consumer leaves its group's
connection list (consumerConnection) in the same breath; a producer is asked no more
transaction checks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from ferrymq.client.mqadmin import MQAdmin
from ferrymq.errors import FerryError
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import SERVICE, V2, load
from ferrymq.testing import LocalCluster

from . import raw


class _Client:
    """One 5.x client as the endpoint sees it: its id, and what its open Telemetry stream got."""

    def __init__(self, v2: V2, channel: grpc.aio.Channel, client_id: str, settings: Any) -> None:
        self.metadata = (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"))
        self.answered = asyncio.Event()
        self.checks: list[str] = []
        """Message ids of the transaction checks sent to this client, in order."""
        hang_up = asyncio.Event()

        async def commands() -> AsyncIterator[Any]:
            yield v2.TelemetryCommand(settings=settings)
            await hang_up.wait()

        telemetry = channel.stream_stream(
            f"/{SERVICE}/Telemetry",
            request_serializer=v2.TelemetryCommand.SerializeToString,
            response_deserializer=v2.TelemetryCommand.FromString,
        )
        stream: Any = telemetry(commands(), metadata=self.metadata)

        async def read() -> None:
            async for command in stream:
                if command.HasField("settings"):
                    self.answered.set()
                orphan = command.recover_orphaned_transaction_command
                if orphan.HasField("message"):
                    self.checks.append(orphan.message.system_properties.message_id)

        self._reader = asyncio.get_running_loop().create_task(read())
        self._hang_up = hang_up
        self._stream = stream

    async def close(self) -> None:
        self._hang_up.set()
        self._stream.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self._reader


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():  # bounded by the test's asyncio.timeout
        await asyncio.sleep(0.02)


async def test_a_terminated_client_is_gone_at_once(
    cluster: LocalCluster, endpoint: GrpcEndpoint
) -> None:
    v2 = load()
    topic, other, group = "ProxyTermination", "ProxyTermination2", "proxy_termination"
    async with MQAdmin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
        await admin.create_topic(other, queues=1)
    clients: list[_Client] = []
    async with asyncio.timeout(60), grpc.aio.insecure_channel(endpoint.address) as channel:

        def client(client_id: str, kind: str, publishes: str = "") -> _Client:
            settings = v2.Settings(client_type=v2.enum("ClientType", kind))
            if kind == "PRODUCER":
                settings.publishing.topics.add().name = publishes
            else:
                settings.subscription.group.name = group
                entry = settings.subscription.subscriptions.add()
                entry.topic.name = topic
                entry.expression.expression = "TagA"
            clients.append(_Client(v2, channel, client_id, settings))
            return clients[-1]

        async def terminate(who: _Client, group_name: str = "") -> None:
            request = v2.NotifyClientTerminationRequest()
            request.group.name = group_name
            answer = await raw.rpc(channel, v2, "NotifyClientTermination")(
                request, metadata=who.metadata, timeout=10
            )
            assert answer.status.code == v2.code("OK"), answer

        try:
            # a simple consumer: listed by the brokers from its settings until it terminates
            consumer = client("simple-1", "SIMPLE_CONSUMER")
            await consumer.answered.wait()
            async with MQAdmin(cluster.namesrv_addr) as admin:
                listed = None
                async with asyncio.timeout(10):  # joined right after the settings were answered
                    while listed is None:
                        with contextlib.suppress(FerryError):
                            listed = await admin.consumer_connection(group)
                        await asyncio.sleep(0.02)
                assert [(c.client_id, c.language) for c in listed.connection_set] == [
                    ("simple-1", "PYTHON")
                ]
                assert listed.consume_type == "CONSUME_ACTIVELY"
                assert listed.subscription_table[topic].sub_string == "TagA"
                heartbeat = v2.HeartbeatRequest(
                    client_type=v2.enum("ClientType", "SIMPLE_CONSUMER")
                )
                heartbeat.group.name = group
                answer = await raw.rpc(channel, v2, "Heartbeat")(
                    heartbeat, metadata=consumer.metadata, timeout=10
                )
                assert answer.status.code == v2.code("OK")
                await terminate(consumer, group)
                with pytest.raises(FerryError, match="is not online"):  # at once, no waiting
                    await admin.consumer_connection(group)

            # producers of two topics, each with an open half: both asked (every 0.3 s after
            # 1 s); after the first terminates, the second is asked on and the first never again
            first = client("producer-1", "PRODUCER", topic)
            second = client("producer-2", "PRODUCER", other)
            await first.answered.wait()
            await second.answered.wait()
            for name, body in ((topic, b"h1"), (other, b"h2")):
                send = v2.SendMessageRequest()
                message = send.messages.add(body=body)
                message.topic.name = name
                message.system_properties.message_id = body.decode()
                message.system_properties.message_type = v2.enum("MessageType", "TRANSACTION")
                sent = await raw.rpc(channel, v2, "SendMessage")(send, timeout=10)
                assert sent.status.code == v2.code("OK"), sent
            await _until(lambda: bool(first.checks))
            await terminate(first)
            asked = len(second.checks)
            await _until(lambda: len(second.checks) >= asked + 2)  # relayed ones delivered
            before = list(first.checks)
            await _until(lambda: len(second.checks) >= asked + 4)
            assert set(before) == {"h1"}
            assert set(second.checks) == {"h2"}
            assert first.checks == before
        finally:
            for each in clients:
                await each.close()
