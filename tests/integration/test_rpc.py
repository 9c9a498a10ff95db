"""Remoting over real sockets: calls, errors as responses, bad bytes, timeouts, push, back-off."""

import asyncio
import struct

import pytest

from ferrymq.errors import (
    ConnectError,
    ConnectionClosedError,
    HeaderFieldError,
    RequestError,
    RequestTimeoutError,
)
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.wire.broker import GetMaxOffsetRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand, encode_frame
from ferrymq.wire.headers import from_ext_fields


def _router(release: asyncio.Event | None = None) -> Router:
    router = Router("test server")

    async def echo(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=request.body[::-1])

    async def typed(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        header = from_ext_fields(GetMaxOffsetRequestHeader, request.ext_fields)
        return request.make_response(
            ResponseCode.SUCCESS, ext_fields={"offset": str(header.queue_id)}
        )

    async def refuse(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, "no such topic")

    async def slow(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        if release is not None:
            await release.wait()
        return request.make_response(ResponseCode.SUCCESS)

    async def push(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        answer = await conn.call(RemotingCommand(code=RequestCode.CHECK_TRANSACTION_STATE), 5)
        return request.make_response(ResponseCode.SUCCESS, body=answer.body)

    router.add(RequestCode.HEART_BEAT, echo)
    router.add(RequestCode.GET_MAX_OFFSET, typed)
    router.add(RequestCode.GET_ROUTEINFO_BY_TOPIC, refuse)
    router.add(RequestCode.PULL_MESSAGE, slow)
    router.add(RequestCode.END_TRANSACTION, push)
    return router


async def test_a_call_gets_its_response_and_opaque() -> None:
    async with RpcServer(_router()) as server, RpcClient() as client:
        response = await client.call(
            server.address, RemotingCommand(code=RequestCode.HEART_BEAT, body=b"abc"), 5
        )
        assert response.code == ResponseCode.SUCCESS
        assert response.body == b"cba"
        assert response.is_response


async def test_errors_become_typed_responses_and_the_connection_lives_on() -> None:
    async with RpcServer(_router()) as server, RpcClient() as client:
        unknown = await client.call(server.address, RemotingCommand(code=31999), 5)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "31999" in (unknown.remark or "")
        refused = await client.call(
            server.address, RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC), 5
        )
        assert (refused.code, refused.remark) == (ResponseCode.TOPIC_NOT_EXIST, "no such topic")
        bad_header = await client.call(
            server.address,
            RemotingCommand(
                code=RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "x"}
            ),
            5,
        )
        assert bad_header.code == ResponseCode.SYSTEM_ERROR
        assert "queueId" in (bad_header.remark or "")
        fine = await client.call(
            server.address,
            RemotingCommand(
                code=RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "3"}
            ),
            5,
        )
        assert fine.ext_fields == {"offset": "3"}


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x02xy",  # frame shorter than its header length word
        struct.pack(">i", 1 << 30),  # over the frame limit
        struct.pack(">ii", 10, 6) + b"{bad}!",  # header that is not JSON
        struct.pack(">ii", 8, 5 << 24) + b"abcd",  # unknown serialize type
    ],
)
async def test_malformed_bytes_close_only_that_connection(garbage: bytes) -> None:
    async with RpcServer(_router()) as server, RpcClient() as client:
        host, port = server.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(garbage)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
        response = await client.call(
            server.address, RemotingCommand(code=RequestCode.HEART_BEAT), 5
        )
        assert response.code == ResponseCode.SUCCESS


async def test_a_slow_server_times_out_as_unknown_outcome() -> None:
    release = asyncio.Event()
    async with RpcServer(_router(release)) as server, RpcClient() as client:
        with pytest.raises(RequestTimeoutError) as info:
            await client.call(server.address, RemotingCommand(code=RequestCode.PULL_MESSAGE), 0.1)
        assert info.value.request_sent
        release.set()


async def test_a_lost_connection_fails_waiting_calls_as_unknown_outcome() -> None:
    release = asyncio.Event()
    server = RpcServer(_router(release))
    await server.start()
    async with RpcClient() as client:
        call = asyncio.create_task(
            client.call(server.address, RemotingCommand(code=RequestCode.PULL_MESSAGE), 5)
        )
        await asyncio.sleep(0.05)
        await server.close()
        with pytest.raises(ConnectionClosedError) as info:
            await call
        assert info.value.request_sent


async def test_refused_connects_fail_fast_and_back_off() -> None:
    async with RpcServer(_router()) as server:
        address = server.address
    async with RpcClient() as client:
        with pytest.raises(ConnectError) as first:
            await client.call(address, RemotingCommand(code=RequestCode.HEART_BEAT), 5)
        assert not first.value.request_sent
        with pytest.raises(ConnectError, match="retrying in"):
            await client.call(address, RemotingCommand(code=RequestCode.HEART_BEAT), 5)


async def test_servers_push_requests_that_clients_answer() -> None:
    async def on_push(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        assert request.code == RequestCode.CHECK_TRANSACTION_STATE
        return request.make_response(ResponseCode.SUCCESS, body=b"committed")

    async with RpcServer(_router()) as server, RpcClient(on_push) as client:
        response = await client.call(
            server.address, RemotingCommand(code=RequestCode.END_TRANSACTION), 5
        )
        assert response.body == b"committed"


async def test_reading_pauses_at_the_in_flight_bound_and_every_request_completes() -> None:
    release = asyncio.Event()
    async with RpcServer(_router(release), max_in_flight=4) as server, RpcClient() as client:
        calls = [
            asyncio.create_task(
                client.call(server.address, RemotingCommand(code=RequestCode.PULL_MESSAGE), 10)
            )
            for _ in range(20)
        ]
        await asyncio.sleep(0.1)
        (conn,) = server.connections
        assert len(conn._tasks) == 4  # the rest wait, and the socket is not read meanwhile
        release.set()
        responses = await asyncio.gather(*calls)
        assert {r.code for r in responses} == {ResponseCode.SUCCESS}


async def test_a_client_keeps_at_most_its_bound_in_flight_and_a_cancelled_wait_frees_nothing() -> (
    None
):
    release = asyncio.Event()
    async with RpcServer(_router(release)) as server, RpcClient(max_in_flight=2) as client:

        def pull() -> asyncio.Task[RemotingCommand]:
            request = RemotingCommand(code=RequestCode.PULL_MESSAGE)
            return asyncio.create_task(client.call(server.address, request, 10))

        calls = [pull() for _ in range(6)]
        await asyncio.sleep(0.1)
        (conn,) = server.connections
        assert len(conn._tasks) == 2  # the other four wait in the client, not on the wire
        calls[3].cancel()  # a waiting caller gives up: it held no slot and frees none
        with pytest.raises(asyncio.CancelledError):
            await calls[3]
        await asyncio.sleep(0.05)
        assert len(conn._tasks) == 2
        release.set()
        responses = await asyncio.gather(*calls[:3], *calls[4:])
        assert {r.code for r in responses} == {ResponseCode.SUCCESS}
        assert client._free_slots == 2
        assert not client._slot_waiters


async def test_oneway_requests_get_no_response() -> None:
    seen = asyncio.Event()
    router = Router("oneway")

    async def note(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        seen.set()
        return request.make_response(ResponseCode.SUCCESS)

    router.add(RequestCode.UNREGISTER_CLIENT, note)
    async with RpcServer(router) as server, RpcClient() as client:
        await client.oneway(server.address, RemotingCommand(code=RequestCode.UNREGISTER_CLIENT))
        await asyncio.wait_for(seen.wait(), 5)
        host, port = server.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(encode_frame(RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, flag=2)))
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.2)
        writer.close()


def test_header_field_error_names_the_field() -> None:
    error = HeaderFieldError("H", "queueId", "Expected `int`")
    assert (error.field, str(error)) == ("queueId", "H.queueId: Expected `int`")


async def test_a_peer_that_stops_reading_times_calls_out_instead_of_hanging() -> None:
    # a server that accepts and then reads nothing (a SIGSTOPped process looks like this): the
    # socket buffers fill, the client's transport pauses writing, and calls must still end
    # within their timeout
    held: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(never_read, "127.0.0.1", 0, limit=1024)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    big = RemotingCommand(code=RequestCode.SEND_MESSAGE, body=b"x" * (1 << 20))
    try:
        async with RpcClient() as client:
            outcomes = await asyncio.gather(
                *(client.call(address, big, 0.5) for _ in range(64)), return_exceptions=True
            )
            assert all(isinstance(o, RequestTimeoutError) for o in outcomes), outcomes[:3]
            conn = await client.connection(address)
            assert not conn._writable.is_set()  # the buffers really are full
            with pytest.raises(RequestTimeoutError):  # before: a hang as long as the peer's
                await client.call(address, big, 0.3)
    finally:
        for writer in held:
            writer.transport.abort()
        server.close()
        await server.wait_closed()
