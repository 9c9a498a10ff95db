"""Server certificates replaced without a restart (RocketMQ's FileWatchService on its tls files).

Owns noticing that a server's `tls.server.certPath`, `tls.server.keyPath` or
`tls.server.trustCertPath` changed (mtime and size, checked every `CHECK_EVERY_S`) and loading
them into the live SSLContext that every listener of the process shares (remoting, HA, the
console, Connect's REST API): new connections present the new certificate, open ones keep
theirs. The files are first loaded into a scratch context, so a half-written file or a key that
does not match its certificate leaves the certificate in use (one warning) until the next change.
A trust file's new CAs are added; one removed from it stays trusted until a restart (OpenSSL
cannot take a loaded CA out of a context). gRPC's listener (the RocketMQ 5 endpoint) asks
`GrpcCertificates` at each handshake, which reads the files again only when they changed (its
trust file included: there a removed CA is no longer trusted), and owns which client-auth modes
that listener can honour (`grpc_client_auth`: grpcio cannot ask for an optional certificate).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, cast

import grpc

from ferrymq.config import ConfigError
from ferrymq.security.tls import ClientAuth, ServerTls, TlsConfig

__all__ = [
    "CHECK_EVERY_S",
    "FileStamp",
    "GrpcCertificates",
    "ServerCertificates",
    "grpc_client_auth",
    "watch",
]

log = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 1.0
"""Seconds between two looks at a listener's TLS files."""

FileStamp = tuple[tuple[int, int] | None, ...]
"""(mtime_ns, size) of each watched file, None for one that is missing."""


def _stamp(paths: Sequence[Path]) -> FileStamp:
    stamps: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_mtime_ns, info.st_size))
    return tuple(stamps)


class ServerCertificates:
    """The files behind one SSLContext, loaded into it again when they change."""

    def __init__(self, config: TlsConfig, context: ssl.SSLContext) -> None:
        self._config = config
        self._context = context
        self._paths = [
            p
            for p in (
                config.server_cert_path,
                config.server_key_path,
                config.server_trust_cert_path,
            )
            if p is not None
        ]
        self._seen = _stamp(self._paths)
        self.reloads = 0
        """Changes loaded into the context (for tests and logs)."""

    def check(self) -> bool:
        """Load the files into the context if they changed and load; whether they were."""
        now = _stamp(self._paths)
        if now == self._seen:
            return False
        self._seen = now
        config = self._config
        cert, key = config.server_cert_path, config.server_key_path
        if cert is None or key is None:
            return False
        try:
            scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            scratch.load_cert_chain(cert, key, password=config.server_key_password)
            if config.server_trust_cert_path is not None:
                scratch.load_verify_locations(cafile=config.server_trust_cert_path)
        except (ssl.SSLError, OSError) as exc:
            log.warning("TLS files changed but do not load, the certificate in use stays: %s", exc)
            return False
        try:  # the files could change again between the two loads: the next look retries
            self._context.load_cert_chain(cert, key, password=config.server_key_password)
            if config.server_trust_cert_path is not None:
                self._context.load_verify_locations(cafile=config.server_trust_cert_path)
        except (ssl.SSLError, OSError) as exc:
            log.error("TLS files changed while being loaded, looking again: %s", exc)
            self._seen = ()
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", cert)
        return True


async def watch(tls: ServerTls, every_s: float = CHECK_EVERY_S) -> None:
    """Reload `tls`'s files into its context whenever they change, until cancelled.

    Returns at once for plain text, or a context with no files (`tls.test.mode.enable`).
    """
    if tls.context is None or tls.source is None:
        return
    files = ServerCertificates(tls.source, tls.context)
    while True:
        await asyncio.sleep(every_s)
        files.check()


def grpc_client_auth(need: ClientAuth, trust: Path | None) -> bool:
    """Whether a gRPC listener requires a client certificate for `tls.server.need.client.auth`.

    Raises:
        ConfigError: `optional` (grpcio's server either does not ask for a certificate or
            requires one: serving it as either would not be what was asked, and `none` would
            let a wrong certificate in), or a requirement without `tls.server.trustCertPath`.
    """
    if need is ClientAuth.OPTIONAL:
        raise ConfigError(
            "tls.server.need.client.auth",
            "optional is not served on the gRPC endpoint's port (grpcio can only not ask for a "
            "client certificate or require one): use require or none, or turn the gRPC port off",
        )
    if need is ClientAuth.REQUIRE and trust is None:
        raise ConfigError("tls.server.trustCertPath", "required by tls.server.need.client.auth")
    return need is ClientAuth.REQUIRE


class GrpcCertificates:
    """A gRPC server's certificate, key and trust, read again at a handshake when files changed.

    grpcio calls the instance from its own threads (`dynamic_ssl_server_credentials`); a file
    that does not read leaves the configuration in use. `trust` (the CAs client certificates
    must chain to) is required with `client_auth=REQUIRE`; `OPTIONAL` is refused
    (`grpc_client_auth`).
    """

    def __init__(
        self,
        cert: Path,
        key: Path,
        trust: Path | None = None,
        client_auth: ClientAuth = ClientAuth.NONE,
    ) -> None:
        self.require_client_auth = grpc_client_auth(client_auth, trust)
        self._trust = trust
        self._paths = (cert, key) if trust is None else (cert, key, trust)
        self._seen = _stamp(self._paths)
        self.initial = self._read()

    def _read(self) -> grpc.ServerCertificateConfiguration:
        cert, key = self._paths[:2]
        roots = None if self._trust is None else self._trust.read_bytes()
        return grpc.ssl_server_certificate_configuration(
            [(key.read_bytes(), cert.read_bytes())], root_certificates=roots
        )

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by grpcio: a new configuration when the files changed and load, else None."""
        now = _stamp(self._paths)
        if now == self._seen:
            return None
        self._seen = now
        try:
            scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            scratch.load_cert_chain(*self._paths[:2])
            if self._trust is not None:
                scratch.load_verify_locations(cafile=self._trust)
            fresh = self._read()
        except (ssl.SSLError, OSError) as exc:
            log.warning("gRPC TLS files changed but do not read, the certificate stays: %s", exc)
            return None
        log.info("gRPC TLS certificate reloaded from %s", self._paths[0])
        return fresh

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that ask this instance at each new handshake."""
        # grpcio documents None as "keep the configuration in use"; its stubs type it out
        fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], self)
        return grpc.dynamic_ssl_server_credentials(
            self.initial, fetcher, require_client_authentication=self.require_client_auth
        )
