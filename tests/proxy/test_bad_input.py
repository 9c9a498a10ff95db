"""Bad input on the gRPC port: a clear status (a GOAWAY, an HTTP/1.1 answer, a v2 status, a gRPC
status), and the endpoint serves on."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from ferrymq.model import parse_address
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import SERVICE, load


async def _answer(address: str, data: bytes) -> bytes:
    """What the server writes after `data`, until it closes (bounded: 10 s)."""
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closes
    finally:
        writer.close()


def _frames(answer: bytes) -> list[tuple[int, bytes]]:
    """HTTP/2 frames as (type, payload)."""
    frames, pos = [], 0
    while pos + 9 <= len(answer):
        size = int.from_bytes(answer[pos : pos + 3])
        frames.append((answer[pos + 3], answer[pos + 9 : pos + 9 + size]))
        pos += 9 + size
    return frames


SETTINGS, GOAWAY, PROTOCOL_ERROR = 4, 7, 1


async def test_garbage_http1_wrong_types_and_huge_metadata(endpoint: GrpcEndpoint) -> None:
    v2 = load()
    # garbage: SETTINGS then GOAWAY PROTOCOL_ERROR saying what the port expected
    frames = _frames(await _answer(endpoint.address, b"\x00garbage\xff" * 100))
    assert [kind for kind, _ in frames] == [SETTINGS, GOAWAY], frames
    goaway = frames[1][1]
    assert int.from_bytes(goaway[4:8]) == PROTOCOL_ERROR
    assert goaway[8:] == b"this port speaks gRPC: expected the HTTP/2 client preface"
    # HTTP/1: an HTTP/1.1 answer a browser or curl shows
    answer = await _answer(endpoint.address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n"), answer
    assert answer.endswith(
        b"\r\n\r\nThis port speaks gRPC over HTTP/2 (RocketMQ 5 MessagingService), not HTTP/1.x.\n"
    ), answer

    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        raw_send: Any = channel.unary_unary(
            f"/{SERVICE}/SendMessage", response_deserializer=v2.SendMessageResponse.FromString
        )
        answer = await raw_send(b"\xff\xff\xff\xff", timeout=10)  # no SendMessageRequest
        assert answer.status.code == v2.code("BAD_REQUEST"), answer
        answer = await raw_send(b"\x0a\x03\x08\x01\x10", timeout=10)  # cut short
        assert answer.status.code == v2.code("BAD_REQUEST"), answer
        answer = await raw_send(b"\x0a\x02\x08\x01", timeout=10)  # topic given as an integer
        assert answer.status.code in (v2.code("BAD_REQUEST"), v2.code("ILLEGAL_TOPIC")), answer

        unknown: Any = channel.unary_unary(f"/{SERVICE}/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unknown(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED

        route = channel.unary_unary(
            f"/{SERVICE}/QueryRoute",
            request_serializer=v2.QueryRouteRequest.SerializeToString,
            response_deserializer=v2.QueryRouteResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await route(v2.QueryRouteRequest(), metadata=[("x-big", "x" * 64 * 1024)], timeout=10)
        assert caught.value.code() in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.INTERNAL,
        ), caught.value

        send = channel.unary_unary(
            f"/{SERVICE}/SendMessage",
            request_serializer=v2.SendMessageRequest.SerializeToString,
            response_deserializer=v2.SendMessageResponse.FromString,
        )
        request = v2.SendMessageRequest()
        message = request.messages.add()
        message.topic.name = "bad topic name!"
        message.body = b"x"
        answer = await send(request, timeout=10)
        assert answer.status.code == v2.code("ILLEGAL_TOPIC"), answer

        request = v2.QueryRouteRequest()
        request.topic.name = "NoSuchTopic"
        answer = await route(request, timeout=10)  # still serving, and says why it cannot
        assert answer.status.code == v2.code("TOPIC_NOT_FOUND"), answer
