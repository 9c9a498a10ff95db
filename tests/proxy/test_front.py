"""The gRPC port's front (issue 21): first bytes classified, bad input answered, modes, real peers.

In process, real sockets: `GrpcEndpoint`s on port 0 with no cluster (Heartbeat needs none), raw
bytes and grpcio channels, plain and TLS (a local CA made once for the module).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ferrymq.cmd.proxy import endpoint_tls
from ferrymq.model import parse_address
from ferrymq.proxy.front import H2_PREFACE, GrpcFront, Kind, classify, decide
from ferrymq.proxy.server import GrpcEndpoint, TlsFiles
from ferrymq.proxy.stubs import load
from ferrymq.security.aclguard import AclFile
from ferrymq.security.tls import TlsMode, install, restore, settings_for, tls_config_from
from ferrymq.security.tlscerts import LocalCa, issue_certificate, make_ca

from .raw import rpc
from .test_bad_input import _answer, _frames

SETTINGS, GOAWAY, HEADERS = 4, 7, 1
PROTOCOL_ERROR, INADEQUATE_SECURITY = 1, 12


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", Kind.NEED_MORE),
        (b"\x16", Kind.NEED_MORE),
        (b"\x16\x03\x01\x02\x00\x01", Kind.TLS),
        (b"\x16\x07\x01", Kind.GARBAGE),
        (H2_PREFACE[:10], Kind.NEED_MORE),
        (H2_PREFACE, Kind.H2),
        (H2_PREFACE + b"\x00\x00\x00\x04", Kind.H2),
        (b"PRI * HTTP/1.1\r\n", Kind.HTTP1),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Kind.HTTP1),
        (b"POST /apache.rocketmq.v2 HTT", Kind.NEED_MORE),
        (b"GET " + b"/" * 5000, Kind.GARBAGE),  # no request line within the limit
        (b"GET / SPDY/3\r\n", Kind.GARBAGE),
        (b"\x00garbage\xff", Kind.GARBAGE),
        (b"get / HTTP/1.1\r\n", Kind.GARBAGE),
    ],
)
def test_first_bytes_are_classified(data: bytes, kind: Kind) -> None:
    assert classify(data) is kind


def test_what_each_mode_does_with_each_kind() -> None:
    splices = {
        (mode, kind): decide(kind, mode).to_tls
        for mode in TlsMode
        for kind in (Kind.TLS, Kind.H2, Kind.HTTP1, Kind.GARBAGE)
    }
    assert splices == {
        (TlsMode.DISABLED, Kind.TLS): None,
        (TlsMode.DISABLED, Kind.H2): False,
        (TlsMode.PERMISSIVE, Kind.TLS): True,
        (TlsMode.PERMISSIVE, Kind.H2): False,
        (TlsMode.ENFORCING, Kind.TLS): True,
        (TlsMode.ENFORCING, Kind.H2): None,
        **{(mode, k): None for mode in TlsMode for k in (Kind.HTTP1, Kind.GARBAGE)},
    }


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalCa, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("front-pki")
    ca = make_ca(where)
    return ca, issue_certificate(ca, where, "server")


@contextlib.asynccontextmanager
async def _endpoint(
    tls: TlsFiles | None, acl: AclFile | None = None, first_timeout: float = 0.5
) -> AsyncIterator[GrpcEndpoint]:
    endpoint = GrpcEndpoint("127.0.0.1:9", tls=tls, acl=acl, first_timeout=first_timeout)
    try:
        await endpoint.start()
        yield endpoint
    finally:
        await endpoint.close(0)


async def _heartbeat(
    address: str, credentials: grpc.ChannelCredentials | None = None
) -> tuple[grpc.StatusCode, int, str]:
    """(gRPC code, v2 status code or -1, details) of one Heartbeat."""
    v2 = load()
    channel = (
        grpc.aio.insecure_channel(address)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials)
    )
    async with channel:
        try:
            answer = await rpc(channel, v2, "Heartbeat")(v2.HeartbeatRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), -1, exc.details() or ""
    return grpc.StatusCode.OK, answer.status.code, answer.status.message


async def test_permissive_serves_plain_and_tls_and_answers_bad_input(
    pki: tuple[LocalCa, tuple[Path, Path]],
) -> None:
    ca, server = pki
    trust = grpc.ssl_channel_credentials(root_certificates=ca.cert_path.read_bytes())
    ok = (grpc.StatusCode.OK, load().code("OK"))
    async with asyncio.timeout(60), _endpoint(TlsFiles(*server, mode=TlsMode.PERMISSIVE)) as e:
        assert (await _heartbeat(e.address))[:2] == ok
        assert (await _heartbeat(e.address, trust))[:2] == ok

        frames = _frames(await _answer(e.address, b"\x00garbage\xff" * 100))
        assert [kind for kind, _ in frames] == [SETTINGS, GOAWAY]
        assert int.from_bytes(frames[1][1][4:8]) == PROTOCOL_ERROR
        assert frames[1][1][8:] == (
            b"this port speaks gRPC: expected a TLS ClientHello or the HTTP/2 client preface"
        )
        answer = await _answer(e.address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 505 HTTP Version Not Supported"
        assert {"Content-Type: text/plain; charset=utf-8", "Connection: close"} <= set(lines)
        assert f"Content-Length: {len(body)}" in lines
        assert b"gRPC over HTTP/2" in body

        # silent for longer than first_timeout (0.5 s): closed by the port
        host, port = parse_address(e.address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(H2_PREFACE[:5])
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert e.front is not None
        assert e.front.refused == 3
        assert (await _heartbeat(e.address))[:2] == ok  # still serving
        assert (await _heartbeat(e.address, trust))[:2] == ok


async def test_plain_http2_on_a_tls_port_and_tls_on_a_plain_port_are_refused_clearly(
    pki: tuple[LocalCa, tuple[Path, Path]],
) -> None:
    ca, server = pki
    async with asyncio.timeout(60), _endpoint(TlsFiles(*server)) as enforcing:
        code, _, details = await _heartbeat(enforcing.address)
        assert code is grpc.StatusCode.UNAVAILABLE
        assert details.startswith("this port needs TLS"), details
        # raw: the first call gets a trailers-only answer, then GOAWAY INADEQUATE_SECURITY
        headers = bytes((0, 0, 0, HEADERS, 4, 0, 0, 0, 1))  # an empty block on stream 1
        frames = _frames(await _answer(enforcing.address, H2_PREFACE + headers))
        assert [kind for kind, _ in frames] == [SETTINGS, SETTINGS, HEADERS, GOAWAY]
        goaway = frames[-1][1]
        assert int.from_bytes(goaway[:4]) == 1
        assert int.from_bytes(goaway[4:8]) == INADEQUATE_SECURITY
        assert goaway[8:].startswith(b"this port needs TLS")
        trust = grpc.ssl_channel_credentials(root_certificates=ca.cert_path.read_bytes())
        assert (await _heartbeat(enforcing.address, trust))[0] is grpc.StatusCode.OK

    async with asyncio.timeout(60), _endpoint(None) as plain:
        host, port = parse_address(plain.address)
        context = ssl.create_default_context(cafile=ca.cert_path)
        with pytest.raises(ssl.SSLError) as caught:
            await asyncio.open_connection(host, port, ssl=context, server_hostname="localhost")
        assert "HANDSHAKE_FAILURE" in str(caught.value).upper(), caught.value
        assert (await _heartbeat(plain.address))[0] is grpc.StatusCode.OK


async def _relay_from(source: str, target: str) -> asyncio.Server:
    """A TCP relay on 127.0.0.1:0 that dials `target` from address `source` (bounded copies)."""
    host, port = parse_address(target)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_acl_white_address_sees_the_client_not_the_front(tmp_path: Path) -> None:
    """grpcio sees the front (127.0.0.1); the white address 127.0.0.3 passes only as the client."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(
        "globalWhiteRemoteAddresses: [127.0.0.3]\n"
        "accounts:\n- {accessKey: someone, secretKey: their-secret, admin: false}\n"
    )
    v2 = load()
    async with asyncio.timeout(60), _endpoint(None, acl=AclFile(acl_file)) as e:
        _, status, message = await _heartbeat(e.address)  # from 127.0.0.1, unsigned
        assert status == v2.code("UNAUTHORIZED"), message
        relay = await _relay_from("127.0.0.3", e.address)
        try:
            address = f"127.0.0.1:{relay.sockets[0].getsockname()[1]}"
            assert (await _heartbeat(address))[1] == v2.code("OK")  # from 127.0.0.3
        finally:
            relay.close()
        assert e.front is not None
        while e.front.peers:  # each connection's entry goes with it (bounded: the timeout)
            await asyncio.sleep(0.02)


def test_the_grpc_ports_mode_follows_the_flag_else_the_process_tls_mode(
    pki: tuple[LocalCa, tuple[Path, Path]],
) -> None:
    """`ferry proxy --tls-mode permissive` (or a broker's enableProxy) serves both on gRPC too."""
    _, (cert, key) = pki
    assert endpoint_tls((cert, key)) == TlsFiles(cert, key, mode=TlsMode.ENFORCING)
    assert endpoint_tls((cert, key), TlsMode.PERMISSIVE) == TlsFiles(
        cert, key, mode=TlsMode.PERMISSIVE
    )
    values = {"tls.server.mode": "permissive", "tls.server.certPath": str(cert)}
    values["tls.server.keyPath"] = str(key)
    token = install(settings_for(tls_config_from(values)))
    try:
        files = endpoint_tls(None)
        assert files is not None
        assert (files.cert, files.mode) == (cert, TlsMode.PERMISSIVE)
        assert endpoint_tls(None, TlsMode.ENFORCING) == dataclasses.replace(
            files, mode=TlsMode.ENFORCING
        )
    finally:
        restore(token)


async def test_the_splice_relays_both_ways_with_bounded_buffers_and_closes_both_sides() -> None:
    """Through a plain-only front to an echo server, 32 MiB in and back; while the client does not
    read, the writes stall (backpressure) with at most ~1 MiB buffered in the front."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    front = GrpcFront(TlsMode.DISABLED, plain=("127.0.0.1", upstream.sockets[0].getsockname()[1]))
    port = await front.start("127.0.0.1", 0)
    sent = H2_PREFACE + bytes(range(256)) * (32 * 4096)
    written = 0
    try:
        async with asyncio.timeout(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def write() -> None:
                nonlocal written
                for at in range(0, len(sent), 1 << 18):
                    writer.write(sent[at : at + (1 << 18)])
                    await writer.drain()
                    written = at + (1 << 18)
                writer.write_eof()

            writing = asyncio.create_task(write())
            before = -1
            while written != before:  # until the writes stall: nobody reads the echo
                before = written
                await asyncio.sleep(0.3)
            assert not writing.done()
            (client,) = front.clients
            assert client.transport is not None
            assert client.peer is not None
            assert client.peer.transport is not None
            sides = (client.transport, client.peer.transport)
            buffered = [side.get_write_buffer_size() for side in sides]
            assert max(buffered) <= 1 << 20, buffered
            back, _ = await asyncio.gather(reader.read(-1), writing)  # -1: to EOF
            writer.close()
            assert back == sent
            while front.clients or front.peers:  # both sides closed and forgotten
                await asyncio.sleep(0.02)
    finally:
        await front.close()
        upstream.close()


async def test_connections_waiting_for_their_first_bytes_are_bounded() -> None:
    front = GrpcFront(TlsMode.DISABLED, plain=("127.0.0.1", 9), max_pending=2, first_timeout=30)
    port = await front.start("127.0.0.1", 0)
    writers: list[asyncio.StreamWriter] = []
    try:
        async with asyncio.timeout(30):
            opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            writers += [writer for _, writer in opened]
            while len(front.pending) < 2:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writers.append(writer)
            with contextlib.suppress(ConnectionResetError):  # aborted: a reset or an EOF
                assert await reader.read() == b""
            assert front.refused == 1
            assert len(front.pending) == 2
    finally:
        for writer in writers:
            writer.close()
        await front.close()
