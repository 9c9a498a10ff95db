"""TLS on the RocketMQ 5 endpoint's gRPC port (issue 23): trust, plain text, client certificates.

The endpoint runs in the test's loop on port 0 with no cluster behind it: Heartbeat is answered
by the endpoint itself, so a completed call shows the handshake and the port.
"""

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from ferrymq.broker.config import BrokerConfig
from ferrymq.cmd.ferry import cli
from ferrymq.cmd.proxy import endpoint_tls
from ferrymq.cmd.servers import _start_proxy
from ferrymq.config import ConfigError
from ferrymq.proxy.server import GrpcEndpoint, TlsFiles
from ferrymq.proxy.stubs import load
from ferrymq.security.tls import (
    TLS_ENV,
    ClientAuth,
    install,
    restore,
    settings_for,
    tls_config_from,
)

from ..integration.test_tls import Pki
from .raw import rpc

_CALL_TIMEOUT = 10.0
"""Seconds a call may take before it counts as failed (a refused handshake ends far sooner)."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The CA, server, client and stranger certificates of tests/integration/test_tls.py."""
    return Pki(tmp_path_factory.mktemp("pki"))


@asynccontextmanager
async def _endpoint(tls: TlsFiles) -> AsyncIterator[str]:
    endpoint = GrpcEndpoint("127.0.0.1:9", tls=tls)  # no cluster: Heartbeat needs none
    try:
        await endpoint.start()
        yield endpoint.address
    finally:
        await endpoint.close(0)


def _credentials(ca: Path, cert: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
    if cert is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=cert[1].read_bytes(),
        certificate_chain=cert[0].read_bytes(),
    )


async def _heartbeat(address: str, credentials: grpc.ChannelCredentials | None) -> bool:
    """Whether a Heartbeat completes (False: UNAVAILABLE, the handshake was refused)."""
    v2 = load()
    channel = (
        grpc.aio.insecure_channel(address)
        if credentials is None
        else grpc.aio.secure_channel(address, credentials)
    )
    async with channel:
        call = rpc(channel, v2, "Heartbeat")(v2.HeartbeatRequest(), timeout=_CALL_TIMEOUT)
        with suppress(grpc.aio.AioRpcError):  # its code says which
            answer = await call
    if await call.code() is not grpc.StatusCode.OK:
        # refused at once, not a deadline: the port answered the handshake
        assert await call.code() is grpc.StatusCode.UNAVAILABLE, await call.details()
        return False
    assert answer.status.code == v2.code("OK"), answer.status
    return True


async def test_the_grpc_port_serves_its_ca_and_refuses_a_wrong_ca_and_plain_text(
    pki: Pki,
) -> None:
    async with _endpoint(TlsFiles(*pki.server)) as address:
        assert await _heartbeat(address, _credentials(pki.ca.cert_path))
        assert not await _heartbeat(address, _credentials(pki.other_ca.cert_path))
        assert not await _heartbeat(address, None)  # plain text to the TLS port
        assert await _heartbeat(address, _credentials(pki.ca.cert_path))  # still serving


async def test_a_required_client_certificate_is_enforced_on_the_grpc_port(pki: Pki) -> None:
    files = TlsFiles(*pki.server, trust=pki.ca.cert_path, client_auth=ClientAuth.REQUIRE)
    async with _endpoint(files) as address:
        assert not await _heartbeat(address, _credentials(pki.ca.cert_path))  # no certificate
        assert not await _heartbeat(address, _credentials(pki.ca.cert_path, pki.stranger))
        assert await _heartbeat(address, _credentials(pki.ca.cert_path, pki.client))
        assert not await _heartbeat(address, _credentials(pki.ca.cert_path))
        assert await _heartbeat(address, _credentials(pki.ca.cert_path, pki.client))


async def test_a_brokers_enable_proxy_endpoint_serves_the_brokers_tls_and_client_auth(
    pki: Pki, tmp_path: Path
) -> None:
    """Before, the in-broker endpoint's gRPC port served plain text whatever the broker's TLS."""
    values = {
        "tlsEnable": "true",
        "tls.server.certPath": str(pki.server[0]),
        "tls.server.keyPath": str(pki.server[1]),
        "tls.server.trustCertPath": str(pki.ca.cert_path),
        "tls.server.need.client.auth": "require",
    }
    token = install(settings_for(tls_config_from(values)))
    try:
        config = BrokerConfig(
            namesrv_addr="127.0.0.1:9",
            store_path_root_dir=tmp_path,
            enable_proxy=True,
            grpc_server_port=0,
            remoting_listen_port=-1,
        )
        proxy = await _start_proxy(config)
    finally:
        restore(token)
    try:
        assert proxy.endpoint is not None
        address = proxy.endpoint.address
        assert not await _heartbeat(address, None)
        assert not await _heartbeat(address, _credentials(pki.ca.cert_path))
        assert await _heartbeat(address, _credentials(pki.ca.cert_path, pki.client))
    finally:
        await proxy.close()


def test_the_endpoint_takes_client_auth_from_the_process_and_refuses_optional(pki: Pki) -> None:
    """A broker's enableProxy: the process's listener keys make the gRPC port's TLS."""

    def files(need: str, mode: str = "enforcing") -> TlsFiles | None:
        values = {
            "tls.server.mode": mode,
            "tls.server.certPath": str(pki.server[0]),
            "tls.server.keyPath": str(pki.server[1]),
            "tls.server.trustCertPath": str(pki.ca.cert_path),
            "tls.server.need.client.auth": need,
        }
        install(settings_for(tls_config_from(values)))
        return endpoint_tls(None)

    def in_fresh_context(need: str, mode: str = "enforcing") -> TlsFiles | None:
        return contextvars.Context().run(files, need, mode)  # install() stays in there

    assert in_fresh_context("require") == TlsFiles(
        *pki.server, trust=pki.ca.cert_path, client_auth=ClientAuth.REQUIRE
    )
    assert in_fresh_context("none") == TlsFiles(*pki.server, trust=pki.ca.cert_path)
    assert in_fresh_context("require", "disabled") is None  # plain listeners: plain gRPC
    with pytest.raises(ConfigError, match=r"tls\.server\.need\.client\.auth"):
        in_fresh_context("optional")
    with pytest.raises(ConfigError, match=r"tls\.server\.need\.client\.auth"):
        TlsFiles(*pki.server, trust=pki.ca.cert_path, client_auth=ClientAuth.OPTIONAL)
    with pytest.raises(ConfigError, match=r"tls\.server\.trustCertPath"):
        TlsFiles(*pki.server, client_auth=ClientAuth.REQUIRE)


@pytest.mark.parametrize("command", ["proxy", "broker"])
def test_optional_client_auth_with_the_grpc_port_exits_at_start_naming_the_key(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv(TLS_ENV, "")  # install_tls sets it for children; restored after
    tls = [
        "--tls",
        "--tls-cert",
        str(pki.server[0]),
        "--tls-key",
        str(pki.server[1]),
        "--tls-ca",
        str(pki.ca.cert_path),
        "--tls-client-auth",
        "optional",
    ]
    ready = tmp_path / "ready.json"
    if command == "proxy":
        args = ["proxy", "--namesrv", "127.0.0.1:9", "--grpc-port", "0", "--remoting-port", "0"]
    else:
        args = ["broker", "--store-dir", str(tmp_path / "store"), "--enable-proxy", "true"]
        args += ["--grpc-server-port", "0", "--listen", "127.0.0.1:0"]
    result = contextvars.Context().run(
        CliRunner().invoke, cli, [*args, *tls, "--ready-file", str(ready)]
    )
    assert result.exit_code == 2, result.output
    assert "tls.server.need.client.auth" in result.output
    assert "optional" in result.output
    assert not ready.exists()  # nothing listened
