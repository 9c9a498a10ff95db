"""The gRPC server of the endpoint: grpcio's asyncio server behind the port's front, TLS optional.

Owns the listening side: the port (0 picks a free one; the bound port is read back), served by
`proxy/front.py`'s front, which splices each connection to grpcio on 127.0.0.1 (a plain and/or
a TLS listener: plain only without TLS, TLS only with `TlsFiles` enforcing, both permissive) and
answers bad input with a clear status; server limits (message size, metadata size, concurrent
streams), TLS (a certificate chain and key in PEM, and the CAs a required client certificate
must chain to: `TlsFiles`, reloaded by `security/tlsreload.py`) and ACL 1.0 (`acl`: every call
checked against the client's credentials, `proxy/auth.py`) or ACL 2.0 (`users`: the
controllers' users and ACLs), which see the real client's address (the front's `resolve`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from ferrymq.proxy.auth import GrpcGuard
from ferrymq.proxy.front import FIRST_TIMEOUT, GrpcFront
from ferrymq.proxy.service import MessagingService
from ferrymq.proxy.stubs import load
from ferrymq.security.acl import Perm
from ferrymq.security.acl2guard import AuthSource
from ferrymq.security.aclguard import AclFile
from ferrymq.security.grpcacl import Refusal
from ferrymq.security.tls import ClientAuth, TlsMode
from ferrymq.security.tlsreload import GrpcCertificates, grpc_client_auth

__all__ = ["GrpcEndpoint", "TlsFiles"]

_MAX_MESSAGE: Final = 16 * 1024 * 1024
_MAX_METADATA: Final = 16 * 1024


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The server's certificate chain and private key (PEM files), and who may connect.

    `client_auth` REQUIRE: a client certificate chaining to `trust` (PEM CAs) is required.
    OPTIONAL is refused (ConfigError naming `tls.server.need.client.auth`): grpcio cannot ask
    for a certificate without requiring one, and a security setting never fails open.
    `mode` ENFORCING: TLS only; PERMISSIVE: TLS and plain text on the one port.
    """

    cert: Path
    key: Path
    trust: Path | None = None
    client_auth: ClientAuth = ClientAuth.NONE
    mode: TlsMode = TlsMode.ENFORCING

    def __post_init__(self) -> None:
        grpc_client_auth(self.client_auth, self.trust)  # refused here, before anything binds
        if self.mode is TlsMode.DISABLED:
            raise ValueError("TlsFiles: mode is enforcing or permissive (no TLS: tls=None)")


class _FrontGuard(GrpcGuard):
    """`GrpcGuard` judging the real client behind the front, not the front's own address."""

    front: GrpcFront | None = None

    def check(
        self,
        name: str,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        peer: str,
        wanted: list[tuple[str, Perm]],
    ) -> Refusal | None:
        front = self.front
        real = peer if front is None else front.resolve(peer)
        return super().check(name, metadata, real, wanted)


class GrpcEndpoint:
    """MessagingService v2 on `host:port`, relaying to the cluster the NameServers name."""

    def __init__(
        self,
        namesrv: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
        tls: TlsFiles | None = None,
        acl: AclFile | None = None,
        users: AuthSource | None = None,
        authorization: bool = True,
        first_timeout: float = FIRST_TIMEOUT,
    ) -> None:
        """`first_timeout`: seconds a connection has to show its protocol (`GrpcFront`)."""
        self.namesrv = namesrv
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or host
        self.tls = tls
        self.first_timeout = first_timeout
        self.guard = (
            _FrontGuard(acl, users=users, authorization=authorization)
            if acl is not None or users is not None
            else None
        )
        self.service: MessagingService | None = None
        self._server: grpc.aio.Server | None = None
        self.front: GrpcFront | None = None
        self.upstream: dict[str, str] = {}
        """grpcio's own listeners, `plain` and/or `tls` -> 127.0.0.1:port (behind the front)."""

    @property
    def address(self) -> str:
        """`host:port` clients dial (valid once started)."""
        return f"{self.advertised_host}:{self.port}"

    async def start(self) -> None:
        """Bind (reading the port back when 0) and serve."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_metadata_size", _MAX_METADATA),
                ("grpc.max_concurrent_streams", 1000),
                ("grpc.so_reuseport", 0),
            ]
        )
        mode = TlsMode.DISABLED if self.tls is None else self.tls.mode
        upstream: dict[str, tuple[str, int]] = {}
        if self.tls is not None:
            # read again at a handshake when the files changed: new certificates, no restart
            tls = self.tls
            credentials = GrpcCertificates(tls.cert, tls.key, tls.trust, tls.client_auth)
            upstream["tls"] = (
                "127.0.0.1",
                server.add_secure_port("127.0.0.1:0", credentials.credentials()),
            )
        if mode is not TlsMode.ENFORCING:
            upstream["plain"] = ("127.0.0.1", server.add_insecure_port("127.0.0.1:0"))
        if not all(port for _, port in upstream.values()):
            raise OSError("gRPC endpoint could not bind 127.0.0.1 (behind its front)")
        self.upstream = {name: f"{h}:{p}" for name, (h, p) in upstream.items()}
        front = GrpcFront(
            mode,
            plain=upstream.get("plain"),
            tls=upstream.get("tls"),
            first_timeout=self.first_timeout,
        )
        port = await front.start(self.host, self.port)
        self.front = front
        self.port = port
        if isinstance(self.guard, _FrontGuard):
            self.guard.front = front
        # off the loop: a first start downloads the schema with pip (a broker's loop, with
        # enableProxy, goes on serving meanwhile)
        v2 = await asyncio.to_thread(load)
        self.service = MessagingService(v2, self.namesrv, (self.advertised_host, port), self.guard)
        server.add_generic_rpc_handlers((self.service.generic_handler(),))
        await server.start()
        self._server = server

    async def close(self, grace: float = 1.0) -> None:
        """Stop serving (in-flight calls get `grace` seconds), then close cluster connections."""
        if self.front is not None:
            self.front.stop_accepting()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self.front is not None:
            await self.front.close()
            self.front = None
        if self.service is not None:
            await self.service.close()
            self.service = None
