"""The gRPC server of the endpoint: grpcio's asyncio server on a port, TLS optional.

Owns the listening side: the port (0 picks a free one; the bound port is read back), server
limits (message size, metadata size, concurrent streams), TLS (a certificate chain and key in
PEM, and the CAs a required client certificate must chain to: `TlsFiles`, reloaded by
`security/tlsreload.py`) and ACL 1.0 (`acl`: every call checked against the client's
credentials, `proxy/auth.py`) or ACL 2.0 (`users`: the controllers' users and ACLs).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from ferrymq.proxy.auth import GrpcGuard
from ferrymq.proxy.service import MessagingService
from ferrymq.proxy.stubs import load
from ferrymq.security.acl2guard import AuthSource
from ferrymq.security.aclguard import AclFile
from ferrymq.security.tls import ClientAuth
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
    """

    cert: Path
    key: Path
    trust: Path | None = None
    client_auth: ClientAuth = ClientAuth.NONE

    def __post_init__(self) -> None:
        grpc_client_auth(self.client_auth, self.trust)  # refused here, before anything binds


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
    ) -> None:
        self.namesrv = namesrv
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or host
        self.tls = tls
        self.guard = (
            GrpcGuard(acl, users=users, authorization=authorization)
            if acl is not None or users is not None
            else None
        )
        self.service: MessagingService | None = None
        self._server: grpc.aio.Server | None = None

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
        bind = f"{self.host}:{self.port}"
        if self.tls is not None:
            # read again at a handshake when the files changed: new certificates, no restart
            tls = self.tls
            credentials = GrpcCertificates(tls.cert, tls.key, tls.trust, tls.client_auth)
            port = server.add_secure_port(bind, credentials.credentials())
        else:
            port = server.add_insecure_port(bind)
        if port == 0:
            raise OSError(f"gRPC endpoint could not bind {bind}")
        self.port = port
        # off the loop: a first start downloads the schema with pip (a broker's loop, with
        # enableProxy, goes on serving meanwhile)
        v2 = await asyncio.to_thread(load)
        self.service = MessagingService(v2, self.namesrv, (self.advertised_host, port), self.guard)
        server.add_generic_rpc_handlers((self.service.generic_handler(),))
        await server.start()
        self._server = server

    async def close(self, grace: float = 1.0) -> None:
        """Stop serving (in-flight calls get `grace` seconds), then close cluster connections."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self.service is not None:
            await self.service.close()
            self.service = None
