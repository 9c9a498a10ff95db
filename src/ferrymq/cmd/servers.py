"""`ferry namesrv` and `ferry broker`: run a server until SIGINT or SIGTERM.

`ferry namesrv --enable-controller --controller-id n1 --controller-peers n1=HOST:PORT,...
--controller-dir DIR` also runs a controller node on the NameServer's port (seed 001: embedded
controller); the peers' addresses are then NameServer addresses.

The broker takes a RocketMQ `broker.conf` (`--config`), the short flags of the issue
(`--cluster --broker-name --listen --namesrv --store-dir --role --broker-id`) and a
`--kebab-case` flag for every key (`--flush-disk-type SYNC_FLUSH`); flags win over the file.
Keys ferrymq does not use are logged once, by name, as ignored. A bad value stops the command
with one line naming the key, and exit status 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.cmd.controller import (
    ControllerParts,
    controller_policy_options,
    parse_peers,
    policy_from,
)
from ferrymq.cmd.metrics import metrics_endpoint, metrics_options
from ferrymq.cmd.process import fail, kebab, run_until_signal, setup_logging, write_ready
from ferrymq.cmd.proxy import InProcessProxy, endpoint_tls, proxy_metrics
from ferrymq.cmd.tlsflags import install_tls, tls_server_options
from ferrymq.config import ConfigError, build_config, config_keys, parse_properties
from ferrymq.controller import metrics as controller_metrics
from ferrymq.errors import FerryError, StoreLockedError
from ferrymq.metrics.exporter import FuncCollector
from ferrymq.model import format_address, parse_address
from ferrymq.namesrv import metrics as namesrv_metrics
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.security.acl2guard import parse_inner_credentials
from ferrymq.security.aclcredentials import install_credentials

__all__ = ["broker_command", "namesrv_command", "run_until_signal"]

log = logging.getLogger("ferrymq")


@click.command("namesrv")
@click.option(
    "--listen",
    help="HOST:PORT to listen on [default: 127.0.0.1:9876, or the controller peer address].",
)
@click.option(
    "--broker-timeout",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds without a registration before a broker leaves the routes.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A RocketMQ namesrv.properties (key=value); flags win.",
)
@click.option("--enable-controller", is_flag=True, help="Also run a controller node on this port.")
@click.option("--controller-id", help="This controller node's id (a key of --controller-peers).")
@click.option("--controller-peers", help="Every controller node: n1=HOST:PORT,n2=HOST:PORT,...")
@click.option(
    "--controller-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the controller's Raft log and snapshots live.",
)
@click.option(
    "--controller-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Controller policy keys (key=value).",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"addr", "pid"} as JSON here once serving.',
)
@controller_policy_options
@tls_server_options
@metrics_options
def namesrv_command(
    listen: str | None,
    broker_timeout: float,
    config_file: Path | None,
    enable_controller: bool,
    controller_id: str | None,
    controller_peers: str | None,
    controller_dir: Path | None,
    controller_config: Path | None,
    log_level: str,
    ready_file: Path | None,
    metrics_exporter_type: str,
    metrics_prom_exporter_host: str,
    metrics_prom_exporter_port: int,
    **keys: str | None,
) -> None:
    """Run a NameServer (with --enable-controller, also a controller node on the same port)."""
    setup_logging(log_level)
    file_config = _namesrv_file_config(config_file, keys)
    make_parts: Callable[[], ControllerParts] | None = None
    if enable_controller:
        if not (controller_id and controller_peers and controller_dir):
            fail("--enable-controller needs --controller-id, --controller-peers, --controller-dir")
        try:
            peers = parse_peers(controller_peers)
            if controller_id not in peers:
                raise ValueError(f"--controller-id {controller_id} is not among {sorted(peers)}")
            policy = policy_from(controller_config, keys)
        except (ValueError, ConfigError) as exc:
            fail(str(exc))
        listen = listen or peers[controller_id]
        node_id, data_dir = controller_id, controller_dir

        def make_parts() -> ControllerParts:
            return ControllerParts(node_id, peers, data_dir, policy)

    listen = listen or format_address(file_config.listen_host, file_config.listen_port)
    try:
        host, port = parse_address(listen)
    except ValueError as exc:
        fail(f"--listen: {exc}")
    config = dataclasses.replace(
        file_config, listen_host=host, listen_port=port, broker_timeout=broker_timeout
    )

    async def main(stop: asyncio.Event) -> None:
        namesrv = NameServer(config)
        parts = make_parts() if make_parts else None
        if parts is not None:
            parts.register(namesrv.router, heartbeat=False)
            parts.compose_heartbeat(namesrv.router)
            namesrv.close_listeners.append(parts.connection_closed)
        collectors = [lambda: namesrv_metrics.collect(namesrv.routes)]
        if parts is not None:
            node = parts
            collectors.append(
                lambda: controller_metrics.collect(node.raft, node.state_machine.state)
            )
        async with namesrv:
            if parts is not None:
                await parts.start()
            try:
                async with metrics_endpoint(
                    metrics_exporter_type,
                    metrics_prom_exporter_host or host,
                    metrics_prom_exporter_port,
                    collectors,
                ) as endpoint:
                    write_ready(
                        ready_file,
                        {
                            "addr": namesrv.address,
                            "metrics": endpoint.address if endpoint else None,
                        },
                    )
                    await stop.wait()
            finally:
                if parts is not None:
                    await parts.close()

    try:
        run_until_signal(main)
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc.strerror or exc}")
    except FerryError as exc:
        fail(str(exc))


async def _start_proxy(config: BrokerConfig) -> InProcessProxy:
    """The RocketMQ 5 endpoint inside the broker (`enableProxy`), toward its NameServers."""
    proxy = InProcessProxy(
        config.namesrv_addr,
        host=config.listen_host,
        grpc_port=config.grpc_server_port,
        remoting_port=config.remoting_listen_port,
        acl_file=config.acl_file if config.acl_enable else None,  # checks clients as the broker
        # ACL 2.0 (controller mode): the controllers' users, as the broker checks them
        controllers=config.controller_addrs if config.authentication_enabled else None,
        authorization=config.authorization_enabled,
    )
    await proxy.start()
    return proxy


def _namesrv_file_config(config_file: Path | None, flags: dict[str, str | None]) -> NamesrvConfig:
    """The NameServer config of `--config` (defaults without one); exits on a bad file.

    Also installs the process's TLS (the file's `tls.*` keys and the `--tls*` flags).
    """
    if config_file is None:
        install_tls({}, flags)
        return NamesrvConfig()
    try:
        values = parse_properties(config_file.read_text(), str(config_file))
        values = install_tls(values, flags)
        config, ignored = build_config(NamesrvConfig, values)
    except OSError as exc:
        fail(f"--config {config_file}: {exc.strerror or exc}")
    except (ConfigError, UnicodeDecodeError) as exc:
        fail(str(exc))
    for key in ignored:
        log.warning("config key %s is not used by the ferrymq NameServer; ignored", key)
    return config


def _key_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add a `--kebab-case` string option for every broker config key."""
    for key in sorted(set(config_keys(BrokerConfig)) - {"brokerName", "brokerId"}, reverse=True):
        command = click.option(
            f"--{kebab(key)}",
            f"key__{key}",
            default=None,
            metavar="VALUE",
            hidden=True,
            help=f"RocketMQ key {key}.",
        )(command)
    return command


@click.command("broker", context_settings={"max_content_width": 100})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A RocketMQ broker.conf (key=value).",
)
@click.option("--cluster", help="brokerClusterName.")
@click.option("--broker-name", "short_broker_name", help="brokerName.")
@click.option("--listen", help="HOST:PORT (listenHost, listenPort).")
@click.option("--namesrv", help="namesrvAddr: HOST:PORT;HOST:PORT.")
@click.option("--store-dir", help="storePathRootDir.")
@click.option(
    "--role",
    type=click.Choice(["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"], case_sensitive=False),
    help="brokerRole.",
)
@click.option("--broker-id", "short_broker_id", help="brokerId.")
@click.option(
    "--controller-mode",
    is_flag=True,
    default=None,
    help="enableControllerMode: id, role and failover come from the controller.",
)
@click.option("--controller", help="controllerAddr: HOST:PORT;HOST:PORT;HOST:PORT.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"addr", "pid"} as JSON here once serving and registered.',
)
@_key_options
@tls_server_options
def broker_command(
    config_file: Path | None,
    cluster: str | None,
    short_broker_name: str | None,
    listen: str | None,
    namesrv: str | None,
    store_dir: str | None,
    role: str | None,
    short_broker_id: str | None,
    controller_mode: bool | None,
    controller: str | None,
    log_level: str,
    ready_file: Path | None,
    **keys: str | None,
) -> None:
    """Run a broker. Every RocketMQ key also has a --kebab-case flag (e.g. --flush-disk-type)."""
    setup_logging(log_level)
    values: dict[str, str] = {}
    if config_file is not None:
        try:
            values.update(parse_properties(config_file.read_text(), str(config_file)))
        except OSError as exc:
            fail(f"--config {config_file}: {exc.strerror or exc}")
        except (ConfigError, UnicodeDecodeError) as exc:
            fail(str(exc))
    values = install_tls(values, keys)
    values.update({name.removeprefix("key__"): v for name, v in keys.items() if v is not None})
    shorts = {
        "brokerClusterName": cluster,
        "brokerName": short_broker_name,
        "namesrvAddr": namesrv,
        "storePathRootDir": store_dir,
        "brokerRole": role,
        "brokerId": short_broker_id,
        "enableControllerMode": "true" if controller_mode else None,
        "controllerAddr": controller,
    }
    values.update({k: v for k, v in shorts.items() if v is not None})
    if listen is not None:
        try:
            host, port = parse_address(listen)
        except ValueError as exc:
            fail(f"--listen: {exc}")
        values["listenHost"], values["listenPort"] = host, str(port)
    if values.get("brokerRole", "").upper() == "SLAVE" and "brokerId" not in values:
        values["brokerId"] = "1"
    try:
        config, ignored = build_config(BrokerConfig, values)
        if config.enable_proxy and config.grpc_server_port >= 0:
            endpoint_tls(None)  # the endpoint's gRPC TLS: refused before anything listens
        if config.inner_client_authentication_credentials:  # the broker's own calls sign so
            install_credentials(
                parse_inner_credentials(config.inner_client_authentication_credentials)
            )
    except ConfigError as exc:
        fail(str(exc))
    for key in ignored:
        log.warning("config key %s is not used by ferrymq; ignored", key)

    async def main(stop: asyncio.Event) -> None:
        async with Broker(config) as broker:
            if config.enable_controller_mode:
                # ready once the controller named this broker's id and role
                role_known = asyncio.ensure_future(broker.role_assigned.wait())
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({role_known, stopped}, return_when=asyncio.FIRST_COMPLETED)
                role_known.cancel()
                stopped.cancel()
                if stop.is_set():
                    return
            await broker.register()
            proxy = await _start_proxy(config) if config.enable_proxy else None
            if proxy is not None and proxy.endpoint is not None and broker.metrics is not None:
                endpoint = proxy.endpoint  # the broker's scrape shows the endpoint's calls too
                broker.metrics.registry.register(FuncCollector(lambda: proxy_metrics(endpoint)))
            write_ready(
                ready_file,
                {
                    **({} if proxy is None else proxy.info()),
                    "addr": broker.address,
                    "cluster": config.broker_cluster_name,
                    "broker_name": config.broker_name,
                    "broker_id": broker.broker_id,
                    "role": broker.state.role.value,
                    "ha_addr": broker.ha_address,  # None on a slave
                    "metrics": broker.metrics.address if broker.metrics else None,
                    "store_dir": str(config.store_path_root_dir),
                },
            )
            try:
                await stop.wait()
            finally:
                if proxy is not None:
                    await proxy.close()

    try:
        run_until_signal(main)
    except StoreLockedError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot start the broker on port {config.listen_port}: {exc.strerror or exc}")
    except FerryError as exc:
        fail(str(exc))
