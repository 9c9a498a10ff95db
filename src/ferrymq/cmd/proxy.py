"""`ferry proxy`: the RocketMQ 5 endpoint as its own process (gRPC and remoting ports).

Composition root of `ferrymq.proxy`: a `GrpcEndpoint` (MessagingService v2) and a `RemotingRelay`
toward the cluster the NameServers name, until SIGINT/SIGTERM. Stateless, so any number may run.
Ports follow RocketMQ's proxy (`grpcServerPort` 8081, `remotingListenPort` 8080); 0 picks a free
one, -1 turns a side off. The ready file names both: {"addr" (gRPC), "grpc", "remoting", "pid"},
and the Prometheus endpoint (`--metrics-exporter-type PROM`) as "metrics". With `--acl-enable true
--acl-file plain_acl.yml` (the brokers' file) both ports check each client's ACL 1.0 credentials;
the endpoint calls the cluster with this process's (`ferry --credentials-file`, FERRY_ACCESS_KEY).
With `--authentication-enabled true --controller-addr ...` (ACL 2.0) both ports check each client
against the users and ACLs the controllers keep, pulled every second as a NameServer pulls them
(`namesrv/auth.py`); the process then signs as a Super user (`--inner-client-authentication-
credentials` or FERRY_ACCESS_KEY). Without controllers ACL 2.0 is refused: only they give out the
users' passwords. The gRPC port is served by a front (`proxy/front.py`) that tells TLS from plain
HTTP/2 by the first bytes: `--grpc-tls-mode permissive` (or the process's `--tls-mode
permissive`) serves both on it, as RocketMQ's proxy does, and bad input gets a clear answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from prometheus_client.metrics_core import Metric

from ferrymq.cmd.metrics import metrics_endpoint, metrics_options
from ferrymq.cmd.process import fail, run_until_signal, setup_logging, write_ready
from ferrymq.cmd.tlsflags import install_tls, tls_server_options
from ferrymq.config import ConfigError
from ferrymq.errors import FerryError
from ferrymq.metrics.exporter import MetricsExporterType
from ferrymq.security.grpcacl import DEFAULT_MAX_CLOCK_SKEW
from ferrymq.security.tls import TlsMode, process_server_tls

if TYPE_CHECKING:
    from ferrymq.proxy.server import TlsFiles

__all__ = ["InProcessProxy", "endpoint_tls", "proxy_command", "proxy_metrics", "run_proxy"]


def endpoint_tls(tls: tuple[Path, Path] | None, mode: TlsMode | None = None) -> TlsFiles | None:
    """The gRPC port's TLS, with the process's client auth and trust.

    `tls`'s certificate and key, else the process's listeners' when they use TLS (a broker's
    enableProxy). `mode`: enforcing (TLS only) or permissive (TLS and plain text); None: the
    process's `tls.server.mode` when it is one of them, else enforcing.

    Raises:
        ConfigError: `tls.server.need.client.auth=optional` (grpcio cannot serve it), or
            listeners with TLS but no certificate file (`tls.test.mode.enable`).
    """
    from ferrymq.proxy.server import TlsFiles  # grpcio only where the endpoint runs

    source = process_server_tls().source
    if mode is None:
        process_mode = None if source is None else source.server_mode
        mode = TlsMode.PERMISSIVE if process_mode is TlsMode.PERMISSIVE else TlsMode.ENFORCING
    if tls is None:
        if source is None or source.server_mode is TlsMode.DISABLED:
            return None
        cert, key = source.server_cert_path, source.server_key_path
        if cert is None or key is None:
            raise ConfigError(
                "tls.server.certPath", "the gRPC endpoint serves TLS from a certificate file"
            )
        tls = (cert, key)
    if source is None:
        return TlsFiles(*tls, mode=mode)
    trust, need = source.server_trust_cert_path, source.server_need_client_auth
    return TlsFiles(*tls, trust=trust, client_auth=need, mode=mode)


class InProcessProxy:
    """Both sides of the endpoint in this process (`ferry proxy`, or a broker's `enableProxy`)."""

    def __init__(
        self,
        namesrv: str,
        *,
        host: str = "127.0.0.1",
        grpc_port: int = 8081,
        remoting_port: int = 8080,
        tls: tuple[Path, Path] | None = None,
        acl_file: Path | None = None,
        controllers: list[str] | None = None,
        authorization: bool = False,
        max_clock_skew: float | None = None,
        tls_mode: TlsMode | None = None,
    ) -> None:
        """`acl_file`: check each client against this `plain_acl.yml` (AclConfigError: unusable).

        `controllers`: ACL 2.0, each client checked against the users these controllers keep
        (`authorization`: and against its ACL). `max_clock_skew`: seconds a gRPC call's signed
        `x-mq-date-time` may be from this host's clock (None: `GrpcGuard`'s 15 min). `tls_mode`:
        the gRPC port's (`endpoint_tls`).
        """
        # imported here: grpcio loads only in the processes that serve it
        from ferrymq.namesrv.auth import AuthPull
        from ferrymq.proxy.remoting import RemotingRelay
        from ferrymq.proxy.server import GrpcEndpoint
        from ferrymq.security.acl2guard import AuthStore
        from ferrymq.security.aclguard import AclFile

        files = endpoint_tls(tls, tls_mode) if grpc_port >= 0 else None
        acl = AclFile(acl_file) if acl_file is not None else None
        self.users = AuthStore() if controllers else None
        """ACL 2.0: the controllers' users and ACLs (None: not on)."""
        self.auth_pull = AuthPull(controllers, self.users) if controllers and self.users else None
        self._pulling: asyncio.Task[None] | None = None
        self.endpoint = (
            GrpcEndpoint(
                namesrv,
                host=host,
                port=grpc_port,
                tls=files,
                acl=acl,
                users=self.users,
                authorization=authorization,
            )
            if grpc_port >= 0
            else None
        )
        if max_clock_skew is not None and self.endpoint and self.endpoint.guard:
            self.endpoint.guard.max_clock_skew = max_clock_skew
        self.relay = (
            RemotingRelay(
                namesrv,
                host=host,
                port=remoting_port,
                acl=acl,
                users=self.users,
                authorization=authorization,
            )
            if remoting_port >= 0
            else None
        )

    async def start(self) -> None:
        """Listen on both ports (with ACL 2.0, after a first pull of the users was tried)."""
        if self.auth_pull is not None:
            with contextlib.suppress(FerryError):  # run() retries and logs
                await self.auth_pull.pull()
            self._pulling = asyncio.get_running_loop().create_task(self.auth_pull.run())
        if self.endpoint is not None:
            await self.endpoint.start()
        if self.relay is not None:
            await self.relay.start()

    def info(self) -> dict[str, object]:
        """Where it listens: {"proxy": gRPC, "proxy_remoting": remoting} (None: off)."""
        return {
            "proxy": self.endpoint.address if self.endpoint else None,
            "proxy_remoting": self.relay.address if self.relay else None,
        }

    async def close(self) -> None:
        """Stop both sides (and the pull of ACL 2.0's users)."""
        if self._pulling is not None:
            self._pulling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pulling
        if self.relay is not None:
            await self.relay.close()
        if self.endpoint is not None:
            await self.endpoint.close()


async def run_proxy(
    stop: asyncio.Event,
    *,
    namesrv: str,
    host: str,
    grpc_port: int,
    remoting_port: int,
    tls: tuple[Path, Path] | None,
    ready_file: Path | None,
    metrics: tuple[str, str, int] = (MetricsExporterType.DISABLE.value, "", 0),
    acl_file: Path | None = None,
    controllers: list[str] | None = None,
    authorization: bool = False,
    max_clock_skew: float | None = None,
    tls_mode: TlsMode | None = None,
) -> None:
    """Serve both sides until `stop` is set; write the ready file once both listen.

    `tls`: the gRPC port's certificate chain and key (PEM files). `metrics`: exporter type,
    host (empty: `host`) and port of the Prometheus endpoint (`proxy/metrics.py`). `acl_file`:
    ACL 1.0 on both ports. `controllers`, `authorization`: ACL 2.0 on both (`InProcessProxy`).
    """
    proxy = InProcessProxy(
        namesrv,
        host=host,
        grpc_port=grpc_port,
        remoting_port=remoting_port,
        tls=tls,
        acl_file=acl_file,
        controllers=controllers,
        authorization=authorization,
        max_clock_skew=max_clock_skew,
        tls_mode=tls_mode,
    )
    try:
        await proxy.start()
        where = proxy.info()
        endpoint = proxy.endpoint
        collectors = [] if endpoint is None else [lambda: proxy_metrics(endpoint)]
        exporter, metrics_host, metrics_port = metrics
        async with metrics_endpoint(
            exporter, metrics_host or host, metrics_port, collectors
        ) as served:
            write_ready(
                ready_file,
                {
                    "addr": where["proxy"] or where["proxy_remoting"],
                    "grpc": where["proxy"],
                    "remoting": where["proxy_remoting"],
                    "metrics": served.address if served else None,
                },
            )
            await stop.wait()
    finally:
        await proxy.close()


def proxy_metrics(endpoint: Any) -> Iterable[Metric]:
    """The gRPC endpoint's metrics now (none before it serves)."""
    from ferrymq.proxy.metrics import collect

    service = endpoint.service
    return [] if service is None else collect(service.stats)


@click.command("proxy")
@click.option("--namesrv", required=True, help="NameServer addresses, ';' between.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--grpc-port", type=int, default=8081, show_default=True, help="-1: no gRPC port.")
@click.option(
    "--remoting-port", type=int, default=8080, show_default=True, help="-1: no remoting port."
)
@click.option(
    "--grpc-tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PEM certificate chain: the gRPC port serves TLS (with --grpc-tls-key).",
)
@click.option("--grpc-tls-key", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--grpc-tls-mode",
    type=click.Choice(["enforcing", "permissive"]),
    help="The gRPC port with TLS: enforcing (TLS only) or permissive (TLS and plain text on the "
    "one port, told apart by the first bytes, as RocketMQ's proxy does) [default: --tls-mode's "
    "when permissive, else enforcing].",
)
@click.option(
    "--acl-enable",
    type=click.BOOL,
    default=False,
    help="aclEnable: check each client's ACL 1.0 credentials on both ports (needs --acl-file).",
)
@click.option(
    "--acl-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="aclFile: the brokers' plain_acl.yml (reloaded when it changes).",
)
@click.option(
    "--authentication-enabled",
    type=click.BOOL,
    default=False,
    help="authenticationEnabled: ACL 2.0, each client signs as a user the controllers keep "
    "(needs --controller-addr).",
)
@click.option(
    "--authorization-enabled",
    type=click.BOOL,
    default=False,
    help="authorizationEnabled: ACL 2.0, a Normal user may do only what its ACL allows.",
)
@click.option(
    "--controller-addr",
    default="",
    help="controllerAddr: controllers (';' between) whose users and ACLs are pulled.",
)
@click.option(
    "--inner-client-authentication-credentials",
    default="",
    help='innerClientAuthenticationCredentials: {"accessKey": ..., "secretKey": ...} of a '
    "Super user this process signs its calls with (default: FERRY_ACCESS_KEY/SECRET_KEY).",
)
@click.option(
    "--auth-max-clock-skew-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_MAX_CLOCK_SKEW,
    show_default=True,
    help="With ACL on, a gRPC call whose signed x-mq-date-time is further than this from this "
    "host's clock is refused (UNAUTHORIZED): a captured call replays only inside the window. "
    "The default is 15 min beyond every time zone, as the 5.x clients stamp local time; a fleet "
    "on UTC clocks sets 900.",
)
@click.option("--log-level", default="INFO", show_default=True)
@tls_server_options
@metrics_options
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"grpc", "remoting", "pid"} as JSON here once serving.',
)
def proxy_command(
    namesrv: str,
    host: str,
    grpc_port: int,
    remoting_port: int,
    grpc_tls_cert: Path | None,
    grpc_tls_key: Path | None,
    grpc_tls_mode: str | None,
    acl_enable: bool,
    acl_file: Path | None,
    authentication_enabled: bool,
    authorization_enabled: bool,
    controller_addr: str,
    inner_client_authentication_credentials: str,
    auth_max_clock_skew_seconds: float,
    log_level: str,
    ready_file: Path | None,
    metrics_exporter_type: str,
    metrics_prom_exporter_host: str,
    metrics_prom_exporter_port: int,
    **flags: Any,
) -> None:
    """Run the RocketMQ 5 endpoint: gRPC for 5.x clients, remoting for 4.x clients.

    With `--tls`, the remoting port and the connections to the cluster use TLS as every ferrymq
    server does, and the gRPC port serves the same certificate (unless `--grpc-tls-*` name one).
    """
    setup_logging(log_level)
    if flags.get("tls__enable") and grpc_tls_cert is None:
        grpc_tls_cert, grpc_tls_key = flags.get("tls__cert"), flags.get("tls__key")
        if grpc_tls_cert is None or grpc_tls_key is None:
            fail("--tls needs --tls-cert and --tls-key (the gRPC port serves them too)")
    if any(value for name, value in flags.items() if name.startswith("tls__")):
        install_tls({}, flags)  # else the client side may come from FERRYMQ_TLS (ferry up --tls)
    if (grpc_tls_cert is None) != (grpc_tls_key is None):
        fail("--grpc-tls-cert and --grpc-tls-key go together")
    tls = (grpc_tls_cert, grpc_tls_key) if grpc_tls_cert and grpc_tls_key else None
    tls_mode = TlsMode(grpc_tls_mode) if grpc_tls_mode else None
    if grpc_port >= 0:
        try:  # client auth the gRPC port cannot honour: refused before anything listens
            if endpoint_tls(tls, tls_mode) is None and tls_mode is not None:
                fail("--grpc-tls-mode needs a certificate (--grpc-tls-cert or --tls --tls-cert)")
        except ConfigError as exc:
            fail(str(exc))
    if acl_enable and acl_file is None:
        fail("--acl-enable true needs --acl-file (the brokers' plain_acl.yml)")
    if acl_file is not None and not acl_enable:
        fail("--acl-file is read only with --acl-enable true")
    controllers = [a.strip() for a in controller_addr.split(";") if a.strip()]
    _check_acl2(authentication_enabled, authorization_enabled, controllers, acl_enable)
    if inner_client_authentication_credentials:
        from ferrymq.security.acl2guard import parse_inner_credentials
        from ferrymq.security.aclcredentials import install_credentials

        try:
            install_credentials(parse_inner_credentials(inner_client_authentication_credentials))
        except ConfigError as exc:
            fail(str(exc))

    async def main(stop: asyncio.Event) -> None:
        await run_proxy(
            stop,
            namesrv=namesrv,
            host=host,
            grpc_port=grpc_port,
            remoting_port=remoting_port,
            tls=tls,
            ready_file=ready_file,
            metrics=(
                metrics_exporter_type,
                metrics_prom_exporter_host,
                metrics_prom_exporter_port,
            ),
            acl_file=acl_file,
            controllers=controllers if authentication_enabled else None,
            authorization=authorization_enabled,
            max_clock_skew=auth_max_clock_skew_seconds,
            tls_mode=tls_mode,
        )

    try:
        run_until_signal(main)
    except OSError as exc:
        fail(f"cannot listen on {host}: {exc.strerror or exc}")
    except FerryError as exc:
        fail(str(exc))


def _check_acl2(
    authentication: bool, authorization: bool, controllers: list[str], acl_enable: bool
) -> None:
    """Refuse (exit 2) ACL 2.0 settings the endpoint cannot honour: it fails closed."""
    if authorization and not authentication:
        fail("--authorization-enabled true needs --authentication-enabled true (the signing user)")
    if not authentication:
        return
    if not controllers:
        fail(
            "--authentication-enabled true needs --controller-addr: the endpoint checks ACL 2.0 "
            "users against the controllers' (brokers do not give out passwords); refused"
        )
    if acl_enable:
        fail("ACL 1.0 (--acl-enable) or 2.0 (--authentication-enabled), not both")
