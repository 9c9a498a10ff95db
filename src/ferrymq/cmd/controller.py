"""`ferry controller`, and the controller embedded in `ferry namesrv`: composition of the parts.

A controller node is a Raft driver (`raft.driver`) whose state machine is the controller state
(`controller.server.ControllerStateMachine`), and a `ControllerNode` answering controller
requests. Both route their codes on one `Router`: the controller's own port (standalone), or the
NameServer's (embedded; seed 001). The NameServer and the controller never import each other;
they meet here. Both answer BROKER_HEARTBEAT (904), so the embedded port composes the two
handlers: the controller's answer is returned, the NameServer's refresh is best effort.

Flags: `--id n1 --peers n1=HOST:PORT,n2=HOST:PORT,n3=HOST:PORT --data-dir DIR --listen HOST:PORT`;
`--config FILE` is a properties file with the controller policy keys (`controller.config`), and
each key also has a `--kebab-case` flag (e.g. `--enable-elect-unclean-master true`). The file may
also set ACL 2.0's keys (`security.acl2guard.Acl2Config`: `authenticationEnabled`, ...): the node
then checks every request against the users the controllers keep, plus its own
`initAuthenticationUser` while they have no user of that name (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import click

from ferrymq.cmd.metrics import metrics_endpoint, metrics_options
from ferrymq.cmd.process import fail, kebab, run_until_signal, setup_logging, write_ready
from ferrymq.cmd.tlsflags import install_tls, tls_server_options
from ferrymq.config import ConfigError, build_config, config_keys, parse_properties
from ferrymq.controller import metrics as controller_metrics
from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.server import ControllerNode, ControllerNodeConfig, ControllerStateMachine
from ferrymq.controller.state import ControllerState
from ferrymq.errors import FerryError
from ferrymq.model import parse_address
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.driver import RaftDriver
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.rpc.testclock import serve_test_clock
from ferrymq.security.acl2guard import (
    Acl2Config,
    Acl2Guard,
    WithInitUser,
    acl2_guard,
    parse_init_user,
    parse_inner_credentials,
    split_acl2_keys,
)
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.security.aclguard import AclGuard, acl_guard
from ferrymq.security.tls import split_tls_keys
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

__all__ = [
    "ControllerParts",
    "ControllerServer",
    "controller_command",
    "controller_policy_options",
    "parse_peers",
    "policy_from",
]

log = logging.getLogger("ferrymq")


def parse_peers(text: str) -> dict[str, str]:
    """Parse `n1=HOST:PORT,n2=HOST:PORT`.

    Raises:
        ValueError: an item is not `id=HOST:PORT`, or an id repeats.
    """
    peers: dict[str, str] = {}
    for item in text.split(","):
        node_id, sep, address = item.strip().partition("=")
        if not sep or not node_id:
            raise ValueError(f"{item!r} is not id=HOST:PORT")
        parse_address(address)
        if node_id in peers:
            raise ValueError(f"controller id {node_id} is given twice")
        peers[node_id] = address
    return peers


class ControllerParts:
    """A controller node (Raft driver, state machine, request handlers) on a router."""

    def __init__(
        self,
        controller_id: str,
        peers: Mapping[str, str],
        data_dir: Path,
        policy: ControllerConfig,
        raft_config: RaftConfig | None = None,
        auth: Acl2Config | None = None,
    ) -> None:
        """`auth`: ACL 2.0's keys (`auth_guard` checks with them; the init user is created)."""
        if controller_id not in peers:
            raise ValueError(
                f"controller id {controller_id} is not among the peers {sorted(peers)}"
            )
        host, _ = parse_address(peers[controller_id])
        # Connections to peers leave from this node's own address (see RpcClient).
        self.client = RpcClient(local_host=None if host in ("0.0.0.0", "::", "") else host)
        self.state_machine = ControllerStateMachine(ControllerState())
        self.raft = RaftDriver(
            controller_id,
            peers,
            data_dir,
            self.state_machine,
            raft_config or RaftConfig(),
            self.client,
        )
        self.auth = auth or Acl2Config()
        init = self.auth.init_authentication_user
        self.init_user = parse_init_user(init) if init else None
        self.node = ControllerNode(
            ControllerNodeConfig(
                controller_id=controller_id, peers=dict(peers), init_user=self.init_user
            ),
            policy,
            self.state_machine,
            self.raft,
            self.client,
        )

    def register(self, router: Router, *, heartbeat: bool = True) -> None:
        """Route Raft messages and controller requests on `router`."""
        self.raft.register(router)
        self.node.register(router, heartbeat=heartbeat)

    def auth_guard(self, router: Router, name: str) -> Acl2Guard[Connection, Any] | None:
        """ACL 2.0 in front of `router` with the kept users (None: authenticationEnabled off)."""
        state = self.state_machine.state
        return acl2_guard(
            router,
            WithInitUser(lambda: state.auth, self.init_user),
            authentication=self.auth.authentication_enabled,
            authorization=self.auth.authorization_enabled,
            authentication_whitelist=self.auth.authentication_whitelist,
            authorization_whitelist=self.auth.authorization_whitelist,
            server_name=name,
        )

    def compose_heartbeat(self, router: Router) -> None:
        """Answer BROKER_HEARTBEAT with the controller, also refreshing the existing handler."""
        other = router.handler(RequestCode.BROKER_HEARTBEAT)
        if other is None:
            router.add(RequestCode.BROKER_HEARTBEAT, self.node.broker_heartbeat)
            return

        async def heartbeat(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
            with contextlib.suppress(FerryError):
                await other(conn, request)
            return await self.node.broker_heartbeat(conn, request)

        router.replace(RequestCode.BROKER_HEARTBEAT, heartbeat)

    def connection_closed(self, conn: Connection) -> None:
        """Tell the controller a connection closed (brokers on it are dead)."""
        self.node.connection_closed(conn)

    async def start(self) -> None:
        """Recover the Raft log and state from disk and join the group."""
        await self.raft.start()
        await self.node.start()

    async def close(self) -> None:
        """Stop serving, stop Raft (its files closed), close connections."""
        await self.node.close()
        await self.raft.stop()
        await self.client.close()


class ControllerServer:
    """A standalone controller node on its own port; use as an async context manager."""

    def __init__(
        self,
        controller_id: str,
        peers: Mapping[str, str],
        data_dir: Path,
        policy: ControllerConfig,
        *,
        listen: str | None = None,
        raft_config: RaftConfig | None = None,
        acl_file: Path | None = None,
        auth: Acl2Config | None = None,
    ) -> None:
        """`acl_file`: ACL 1.0 on this port (`plain_acl.yml`); `auth`: ACL 2.0 (not both).

        Raises:
            ConfigError: both, or a bad ACL 2.0 value.
        """
        host, port = parse_address(listen or peers[controller_id])
        self.parts = ControllerParts(controller_id, peers, data_dir, policy, raft_config, auth)
        self.router = Router(f"controller {controller_id}")
        self.parts.register(self.router)
        serve_test_clock(self.router)
        name = f"controller {controller_id}"
        self.acl: AclGuard[Connection, Any] | None = acl_guard(
            self.router, acl_file is not None, acl_file, name
        )
        self.auth_guard = self.parts.auth_guard(self.router, name)
        if self.acl is not None and self.auth_guard is not None:
            raise ConfigError("authenticationEnabled", "ACL 1.0 (--acl-file) or 2.0, not both")
        self.server = RpcServer(
            self.acl or self.auth_guard or self.router,
            host=host,
            port=port,
            on_close=self.parts.connection_closed,
        )

    @property
    def address(self) -> str:
        """`host:port` the controller listens on."""
        return self.server.address

    async def start(self) -> None:
        """Listen, then start Raft (peers reach us as soon as we campaign)."""
        await self.server.start()
        try:
            await self.parts.start()
        except BaseException:
            await self.server.close()
            raise
        log.info("controller %s listening on %s", self.parts.raft.node_id, self.address)

    async def close(self) -> None:
        """Stop serving and listening."""
        await self.parts.close()
        await self.server.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def controller_policy_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add a hidden `--kebab-case` option for every controller policy key."""
    for key in sorted(config_keys(ControllerConfig), reverse=True):
        command = click.option(
            f"--{kebab(key)}",
            f"policy__{key}",
            default=None,
            metavar="VALUE",
            hidden=True,
            help=f"Controller key {key}.",
        )(command)
    return command


def policy_from(
    config_file: Path | None, keys: Mapping[str, str | None], *, auth_keys: bool = False
) -> ControllerConfig:
    """The policy from a properties file and `policy__KEY` flags (flags win).

    `auth_keys`: the caller reads ACL 2.0's keys itself (`auth_from`); otherwise a file that
    turns them on is refused (they fail closed).

    Raises:
        ConfigError: a bad value, or a file that cannot be read.
    """
    values: dict[str, str] = {}
    if config_file is not None:
        try:
            values.update(parse_properties(config_file.read_text(), str(config_file)))
        except OSError as exc:
            raise ConfigError(str(config_file), exc.strerror or str(exc)) from None
        except UnicodeDecodeError:
            raise ConfigError(str(config_file), "not UTF-8") from None
    values = split_tls_keys(values)[1]  # the process's TLS: `install_tls`
    if auth_keys:
        values = split_acl2_keys(values)[1]  # `auth_from`
    values.update({k.removeprefix("policy__"): v for k, v in keys.items() if v is not None})
    policy, ignored = build_config(ControllerConfig, values)
    for key in ignored:
        log.warning("config key %s is not a controller key; ignored", key)
    return policy


def auth_from(values: Mapping[str, str]) -> Acl2Config:
    """ACL 2.0's keys of a controller's properties; installs its inner credentials.

    `innerClientAuthenticationCredentials` become the process's: this node's Raft messages,
    pushes and seals sign with them (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY).

    Raises:
        ConfigError: a bad value.
    """
    auth = Acl2Config.of(split_acl2_keys(values)[0])
    if auth.inner_client_authentication_credentials:
        install_credentials(parse_inner_credentials(auth.inner_client_authentication_credentials))
    return auth


@click.command("controller", context_settings={"max_content_width": 100})
@click.option("--id", "controller_id", required=True, help="This node's id (a key of --peers).")
@click.option("--peers", required=True, help="Every controller node: n1=HOST:PORT,n2=HOST:PORT,...")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the Raft log, hard state and snapshots live.",
)
@click.option("--listen", help="HOST:PORT to listen on (default: this node's peer address).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Controller policy keys (key=value), e.g. brokerHeartbeatTimeoutMillis.",
)
@click.option(
    "--acl-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="ACL 1.0 on this port (plain_acl.yml): brokers and peers sign with an admin account "
    "(FERRY_ACCESS_KEY/FERRY_SECRET_KEY of this node's own calls).",
)
@click.option(
    "--snapshot-interval",
    type=click.IntRange(min=0),
    default=RaftConfig().snapshot_interval,
    show_default=True,
    help="Applied Raft entries between snapshots (and log compactions); 0 turns them off.",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"addr", "id", "pid"} as JSON here once listening.',
)
@controller_policy_options
@tls_server_options
@metrics_options
def controller_command(
    controller_id: str,
    peers: str,
    data_dir: Path,
    listen: str | None,
    config_file: Path | None,
    acl_file: Path | None,
    snapshot_interval: int,
    log_level: str,
    ready_file: Path | None,
    metrics_exporter_type: str,
    metrics_prom_exporter_host: str,
    metrics_prom_exporter_port: int,
    **keys: str | None,
) -> None:
    """Run a controller node (a Raft group of 3 or 5 keeps broker ids and elects masters)."""
    setup_logging(log_level)
    try:
        peer_map = parse_peers(peers)
        if controller_id not in peer_map:
            raise ValueError(f"--id {controller_id} is not among the peers {sorted(peer_map)}")
        if listen is not None:
            parse_address(listen)
    except ValueError as exc:
        fail(str(exc))
    try:
        file_values = parse_properties(config_file.read_text()) if config_file else {}
    except (OSError, UnicodeDecodeError, ConfigError) as exc:
        fail(f"--config {config_file}: {exc}")
    install_tls(file_values, keys)
    try:
        policy = policy_from(config_file, keys, auth_keys=True)
        auth = auth_from(file_values)
        if auth.authentication_enabled and acl_file is not None:
            raise ConfigError("authenticationEnabled", "ACL 1.0 (--acl-file) or 2.0, not both")
    except ConfigError as exc:
        fail(str(exc))

    async def main(stop: asyncio.Event) -> None:
        server = ControllerServer(
            controller_id,
            peer_map,
            data_dir,
            policy,
            listen=listen,
            raft_config=RaftConfig(snapshot_interval=snapshot_interval),
            acl_file=acl_file,
            auth=auth,
        )
        parts = server.parts
        async with (
            server,
            metrics_endpoint(
                metrics_exporter_type,
                metrics_prom_exporter_host or parse_address(server.address)[0],
                metrics_prom_exporter_port,
                [lambda: controller_metrics.collect(parts.raft, parts.state_machine.state)],
            ) as endpoint,
        ):
            write_ready(
                ready_file,
                {
                    "addr": server.address,
                    "id": controller_id,
                    "metrics": endpoint.address if endpoint else None,
                },
            )
            await stop.wait()

    try:
        run_until_signal(main)
    except OSError as exc:
        fail(f"cannot start controller {controller_id}: {exc.strerror or exc}")
    except FerryError as exc:
        fail(str(exc))
