"""Raw gRPC calls of MessagingService v2 for the proxy tests (no 5.x client)."""

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
