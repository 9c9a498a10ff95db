"""TLS on a remoting port (issue 23): trust, refusal of plain text and strangers, client certs."""

import asyncio
import json
import logging
import ssl
from pathlib import Path

import pytest
from click.testing import CliRunner

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.ferry import cli
from ferrymq.errors import ConnectError, ConnectionClosedError, FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.security.tls import (
    ClientTls,
    ServerTls,
    TlsConfig,
    TlsMode,
    install,
    restore,
    tls_config_from,
)
from ferrymq.security.tls import (
    settings_for as tls_settings,
)
from ferrymq.security.tlscerts import LocalCa, issue_certificate, make_ca
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand, encode_frame


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca: LocalCa = make_ca(root / "ca")
        self.server = issue_certificate(self.ca, root / "ca", "server")
        self.client = issue_certificate(self.ca, root / "ca", "client")
        self.other_ca: LocalCa = make_ca(root / "other", name="someone else's CA")
        self.stranger = issue_certificate(self.other_ca, root / "other", "stranger")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _server_tls(pki: Pki, mode: str = "enforcing", client_auth: str = "none") -> ServerTls:
    values = {
        "tls.server.mode": mode,
        "tls.server.certPath": str(pki.server[0]),
        "tls.server.keyPath": str(pki.server[1]),
        "tls.server.need.client.auth": client_auth,
        "tls.server.trustCertPath": str(pki.ca.cert_path),
    }
    return tls_settings(tls_config_from(values)).server


def _client_tls(ca: Path, cert: tuple[Path, Path] | None = None) -> ClientTls:
    values = {"tls.enable": "true", "tls.client.trustCertPath": str(ca)}
    if cert is not None:
        values["tls.client.certPath"], values["tls.client.keyPath"] = map(str, cert)
    return tls_settings(tls_config_from(values), server_side=False).client


def _router() -> Router:
    router = Router("tls test server")

    async def echo(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=request.body[::-1])

    router.add(RequestCode.HEART_BEAT, echo)
    return router


async def _echo(client: RpcClient, address: str) -> bytes:
    response = await client.call(
        address, RemotingCommand(code=RequestCode.HEART_BEAT, body=b"abc"), 5
    )
    return response.body


async def test_right_ca_is_served_and_a_wrong_ca_is_refused_with_a_clear_error(pki: Pki) -> None:
    async with (
        RpcServer(_router(), tls=_server_tls(pki)) as server,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as trusting,
        RpcClient(tls=_client_tls(pki.other_ca.cert_path)) as wrong,
    ):
        assert await _echo(trusting, server.address) == b"cba"
        with pytest.raises(ConnectError, match="certificate is not trusted") as refused:
            await _echo(wrong, server.address)
        assert "tls.client.trustCertPath" in str(refused.value)


async def test_plain_text_on_an_enforcing_port_is_closed_with_one_line_and_the_port_serves_on(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ferrymq.security.tlsserve")
    async with (
        RpcServer(_router(), tls=_server_tls(pki)) as server,
        RpcClient(tls=ClientTls(None)) as plain,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as trusting,
    ):
        for _ in range(3):  # a client that keeps trying: one line a minute
            with pytest.raises(ConnectionClosedError):  # closed before any answer
                await _echo(plain, server.address)
            plain.forget_backoff(server.address)
        assert await _echo(trusting, server.address) == b"cba"
    lines = [r.getMessage() for r in caplog.records if "plain text" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "tls.server.mode=enforcing" in lines[0]


async def test_permissive_port_serves_plain_and_tls_clients(pki: Pki) -> None:
    async with (
        RpcServer(_router(), tls=_server_tls(pki, "permissive")) as server,
        RpcClient(tls=ClientTls(None)) as plain,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as trusting,
    ):
        assert await _echo(plain, server.address) == b"cba"
        assert await _echo(trusting, server.address) == b"cba"


async def test_a_required_client_certificate_is_checked(pki: Pki) -> None:
    async with (
        RpcServer(_router(), tls=_server_tls(pki, client_auth="require")) as server,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as anonymous,
        RpcClient(tls=_client_tls(pki.ca.cert_path, pki.stranger)) as stranger,
        RpcClient(tls=_client_tls(pki.ca.cert_path, pki.client)) as known,
    ):
        for refused in (anonymous, stranger):
            # TLS 1.3: the server's refusal arrives after the client's handshake finished
            with pytest.raises((ConnectError, ConnectionClosedError)):
                await _echo(refused, server.address)
        assert await _echo(known, server.address) == b"cba"


async def test_an_optional_client_certificate_is_verified_when_one_is_presented(pki: Pki) -> None:
    """No certificate is served, an untrusted one is refused.

    RocketMQ (TlsHelper) verifies a presented one only with tls.server.authClient=true (its
    default false trusts any certificate): ferrymq always verifies against trustCertPath.
    """
    async with (
        RpcServer(_router(), tls=_server_tls(pki, client_auth="optional")) as server,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as anonymous,
        RpcClient(tls=_client_tls(pki.ca.cert_path, pki.client)) as known,
        RpcClient(tls=_client_tls(pki.ca.cert_path, pki.stranger)) as stranger,
    ):
        assert await _echo(anonymous, server.address) == b"cba"
        assert await _echo(known, server.address) == b"cba"
        with pytest.raises((ConnectError, ConnectionClosedError)):
            await _echo(stranger, server.address)
        assert await _echo(anonymous, server.address) == b"cba"  # and the port serves on


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x00\x05hello" + bytes(range(256)),  # a TLS record header, then junk
        b"\x16" * 3,  # a handshake byte, then the peer goes away
        encode_frame(RemotingCommand(code=RequestCode.HEART_BEAT)),  # a real frame, no TLS
        b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n",
    ],
)
async def test_handshake_garbage_never_stops_the_server(pki: Pki, garbage: bytes) -> None:
    async with (
        RpcServer(_router(), tls=_server_tls(pki, "permissive")) as server,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as trusting,
    ):
        host, port = server.address.rsplit(":", 1)
        for _ in range(3):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(garbage)
            await writer.drain()
            writer.close()
        assert await _echo(trusting, server.address) == b"cba"


async def test_a_silent_tls_handshake_is_given_up_without_blocking_others(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferrymq.security import tlsserve

    monkeypatch.setattr(tlsserve, "HANDSHAKE_TIMEOUT", 0.3)
    async with (
        RpcServer(_router(), tls=_server_tls(pki)) as server,
        RpcClient(tls=_client_tls(pki.ca.cert_path)) as trusting,
    ):
        host, port = server.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await _echo(trusting, server.address) == b"cba"  # while the silent one waits
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # then closed by the server
        writer.close()


def test_a_client_with_tls_enable_verifies_by_default(pki: Pki) -> None:
    client = tls_settings(TlsConfig(enable=True), server_side=False).client
    assert client.context is not None
    assert client.context.verify_mode is ssl.CERT_REQUIRED
    assert client.context.check_hostname
    assert tls_settings(TlsConfig()).server.mode is TlsMode.DISABLED


@pytest.mark.parametrize("mode", [TlsMode.ENFORCING, TlsMode.PERMISSIVE])
async def test_a_tls_mode_without_a_context_never_listens_in_plain_text(mode: TlsMode) -> None:
    """ServerTls(enforcing or permissive, None) used to listen in plain text (fail open)."""
    server = RpcServer(Router("t"), tls=ServerTls(mode, None))
    with pytest.raises(ValueError, match="needs an SSLContext"):
        await server.start()


async def test_sdk_clients_send_and_consume_over_tls_and_a_wrong_ca_is_told_why(
    pki: Pki, tmp_path: Path
) -> None:
    # every server and client of this test's context: TLS only, our CA
    server_values = {
        "tlsEnable": "true",
        "tls.server.certPath": str(pki.server[0]),
        "tls.server.keyPath": str(pki.server[1]),
        "tls.client.trustCertPath": str(pki.ca.cert_path),
    }
    token = install(tls_settings(tls_config_from(server_values)))
    try:
        await _send_and_consume(pki, tmp_path)
    finally:
        restore(token)


async def _send_and_consume(pki: Pki, tmp_path: Path) -> None:
    async with (
        LocalCluster(tmp_path, mapped_file_size_commit_log=1024 * 1024) as cluster,
        AdminClient(cluster.namesrv_addr) as admin,
    ):
        await admin.create_topic("TlsTopic", queues=1)
        async with Producer(cluster.namesrv_addr) as producer:
            await producer.send("TlsTopic", b"secret")
        async with PullConsumer(cluster.namesrv_addr, "TlsGroup") as consumer:
            (queue,) = await consumer.queues("TlsTopic")
            pulled = await consumer.pull(queue, 0, max_messages=8)
            assert [m.body for m in pulled.messages] == [b"secret"]
        async with (
            RpcClient(tls=_client_tls(pki.other_ca.cert_path)) as wrong,
            Producer(cluster.namesrv_addr, rpc=wrong) as stranger,
        ):
            with pytest.raises(FerryError, match="certificate is not trusted"):
                await stranger.send("TlsTopic", b"never")


async def test_connect_rest_api_serves_https_to_our_ca_only(pki: Pki, tmp_path: Path) -> None:
    import httpx

    from .test_connect import make_worker

    values = {
        "tlsEnable": "true",
        "tls.server.certPath": str(pki.server[0]),
        "tls.server.keyPath": str(pki.server[1]),
        "tls.client.trustCertPath": str(pki.ca.cert_path),
    }
    token = install(tls_settings(tls_config_from(values)))
    try:
        async with (
            LocalCluster(tmp_path, mapped_file_size_commit_log=1024 * 1024) as cluster,
            make_worker(cluster, tmp_path, "w1") as worker,  # its self-check is over TLS
        ):
            assert worker.url.startswith("https://127.0.0.1:")
            trusting = _client_tls(pki.ca.cert_path).context
            assert trusting is not None
            async with httpx.AsyncClient(verify=trusting) as http:
                assert (await http.get(f"{worker.url}/connectors")).status_code == 200
            wrong = _client_tls(pki.other_ca.cert_path).context
            assert wrong is not None
            async with httpx.AsyncClient(verify=wrong) as http:
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await http.get(f"{worker.url}/connectors")
            async with httpx.AsyncClient() as http:
                with pytest.raises(httpx.HTTPError):
                    await http.get(worker.url.replace("https://", "http://") + "/connectors")
            ferry = ["connect", "--url", worker.url, "--json", "list"]
            listed = await asyncio.to_thread(
                CliRunner().invoke, cli, ["--tls-ca", str(pki.ca.cert_path), *ferry]
            )
            assert listed.exit_code == 0, listed.output
            assert json.loads(listed.stdout) == []
            untrusting = await asyncio.to_thread(CliRunner().invoke, cli, ferry)
            assert untrusting.exit_code != 0
            assert "CERTIFICATE_VERIFY_FAILED" in untrusting.output, untrusting.output
    finally:
        restore(token)


async def test_the_console_serves_https_and_reads_a_tls_cluster(pki: Pki, tmp_path: Path) -> None:
    import httpx

    from ferrymq.console.server import Console

    values = {
        "tlsEnable": "true",
        "tls.server.certPath": str(pki.server[0]),
        "tls.server.keyPath": str(pki.server[1]),
        "tls.client.trustCertPath": str(pki.ca.cert_path),
    }
    token = install(tls_settings(tls_config_from(values)))  # as `ferry console --tls` does
    try:
        async with (
            LocalCluster(tmp_path, mapped_file_size_commit_log=1024 * 1024) as cluster,
            Console(cluster.namesrv_addr, port=0, interval=5) as console,
        ):
            assert console.url.startswith("https://127.0.0.1:")
            trusting = _client_tls(pki.ca.cert_path).context
            assert trusting is not None
            async with httpx.AsyncClient(verify=trusting, timeout=10) as http:
                answer = await http.get(f"{console.url}/api/cluster")
            assert answer.status_code == 200, answer.text
            assert cluster.broker.address in answer.text  # read from the broker over TLS
            async with httpx.AsyncClient(timeout=10) as http:
                with pytest.raises(httpx.HTTPError):
                    await http.get(console.url.replace("https://", "http://") + "/api/cluster")
    finally:
        restore(token)
