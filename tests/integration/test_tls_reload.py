"""Server certificates replaced on disk are served without a restart (issue 23: "ACL and TLS
changes without a restart where RocketMQ allows it"); files that do not load change nothing."""

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from ferrymq.errors import ConnectError
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.security.tls import ClientTls, ServerTls, settings_for, tls_config_from
from ferrymq.security.tlscerts import issue_certificate, make_ca
from ferrymq.security.tlsreload import GrpcCertificates
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand


class Files:
    """A server's cert and key paths, and two CAs' certificates to put there."""

    def __init__(self, root: Path) -> None:
        self.first_ca, self.second_ca = make_ca(root / "first"), make_ca(root / "second", "2nd")
        self.first = issue_certificate(self.first_ca, root / "first", "server")
        self.second = issue_certificate(self.second_ca, root / "second", "server")
        self.cert, self.key = root / "live" / "server.pem", root / "live" / "server-key.pem"
        self.cert.parent.mkdir()
        self.put(self.first)

    def put(self, pair: tuple[Path, Path]) -> None:
        """Replace the live files as a deployment tool would: each written aside, then renamed."""
        for source, target in zip(pair, (self.cert, self.key), strict=True):
            aside = target.with_suffix(".new")
            shutil.copyfile(source, aside)
            os.replace(aside, target)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def _server_tls(files: Files) -> ServerTls:
    values = {
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(files.cert),
        "tls.server.keyPath": str(files.key),
    }
    return settings_for(tls_config_from(values)).server


def _trusting(ca: Path) -> ClientTls:
    values = {"tls.enable": "true", "tls.client.trustCertPath": str(ca)}
    return settings_for(tls_config_from(values), server_side=False).client


async def _served(address: str, ca: Path) -> bool:
    """Whether a new connection that trusts only `ca` is served."""
    async with RpcClient(tls=_trusting(ca)) as client:
        try:
            answer = await client.call(address, RemotingCommand(code=RequestCode.HEART_BEAT), 5)
        except ConnectError:
            return False
        return answer.code == ResponseCode.SUCCESS


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.2)


async def test_a_replaced_certificate_is_served_to_new_connections_without_a_restart(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router("reload test")

    async def heartbeat(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS)

    router.add(RequestCode.HEART_BEAT, heartbeat)
    first_ca, second_ca = files.first_ca.cert_path, files.second_ca.cert_path
    async with (
        RpcServer(router, tls=_server_tls(files)) as server,
        RpcClient(tls=_trusting(first_ca)) as kept,
    ):
        ping = RemotingCommand(code=RequestCode.HEART_BEAT)
        assert (await kept.call(server.address, ping, 5)).code == ResponseCode.SUCCESS
        assert not await _served(server.address, second_ca)

        files.put(files.second)
        await _until(lambda: _served(server.address, second_ca), "the new certificate served")
        assert not await _served(server.address, first_ca)  # new connections: the new one only
        again = RemotingCommand(code=RequestCode.HEART_BEAT)
        assert (await kept.call(server.address, again, 5)).code == ResponseCode.SUCCESS

        # a key that does not match its certificate: one warning, the certificate stays
        with caplog.at_level(logging.WARNING, logger="ferrymq.security.tlsreload"):
            files.put((files.first[0], files.second[1]))
            await _until(lambda: _has_warning(caplog), "the refused files logged")
        assert await _served(server.address, second_ca)


async def _has_warning(caplog: pytest.LogCaptureFixture) -> bool:
    return any("do not load" in r.getMessage() for r in caplog.records)


async def test_the_grpc_listener_reads_a_replaced_certificate_at_the_next_handshake(
    files: Files,
) -> None:
    certificates = GrpcCertificates(files.cert, files.key)
    assert certificates() is None  # unchanged: grpcio keeps what it has
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", certificates.credentials())
    await server.start()
    try:

        async def ready(ca: Path) -> bool:
            pem = await asyncio.to_thread(ca.read_bytes)
            credentials = grpc.ssl_channel_credentials(root_certificates=pem)
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
                try:
                    await asyncio.wait_for(channel.channel_ready(), 3)
                except TimeoutError:
                    return False
                return True

        assert await ready(files.first_ca.cert_path)
        files.put(files.second)
        assert await ready(files.second_ca.cert_path)
        assert not await ready(files.first_ca.cert_path)
        files.put((files.first[0], files.second[1]))  # mismatched: kept, as on remoting
        assert certificates() is None
        assert await ready(files.second_ca.cert_path)
    finally:
        await server.stop(0)
