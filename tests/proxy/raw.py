"""Raw gRPC calls of MessagingService v2 for the proxy tests (no 5.x client)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ferrymq.proxy.stubs import SERVICE, V2


def rpc(channel: grpc.aio.Channel, v2: V2, name: str, *, stream: bool = False) -> Any:
    """A callable for RPC `name` on `channel`, with its request and response classes."""
    method = v2.service.methods_by_name[name]
    make = channel.unary_stream if stream else channel.unary_unary
    return make(
        f"/{SERVICE}/{name}",
        request_serializer=getattr(v2, method.input_type.name).SerializeToString,
        response_deserializer=getattr(v2, method.output_type.name).FromString,
    )


def producer_telemetry(
    channel: grpc.aio.Channel, v2: V2, topic: str, client_id: str, hang_up: asyncio.Event
) -> Any:
    """A producer's Telemetry session for `topic` as `client_id`: its settings, then held open
    until `hang_up` is set (the endpoint sends its transaction checks on it)."""

    async def settings() -> AsyncIterator[Any]:
        command = v2.TelemetryCommand()
        command.settings.client_type = v2.enum("ClientType", "PRODUCER")
        command.settings.publishing.topics.add().name = topic
        yield command
        await hang_up.wait()

    telemetry = channel.stream_stream(
        f"/{SERVICE}/Telemetry",
        request_serializer=v2.TelemetryCommand.SerializeToString,
        response_deserializer=v2.TelemetryCommand.FromString,
    )
    return telemetry(settings(), metadata=(("x-mq-client-id", client_id),))
