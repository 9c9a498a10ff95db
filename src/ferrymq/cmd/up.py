"""`ferry up`: a whole local cluster in one command, supervised until SIGINT/SIGTERM.

The embedded default (issue 7) is an HA cluster: 3 controller nodes (a Raft group), 1 NameServer
and one broker group of 3 replicas in controller mode, each a child process (`cmd.local`) on a
free port. `--controllers 0` runs classic master/slave instead (static roles: a SYNC_MASTER and
SLAVEs); `--embedded-controller` runs the controller nodes inside NameServers (one NameServer
per controller node) instead of as their own processes.

`--connect N` (2 by default in `ferry up`) adds Connect workers (`ferry connect worker`, REST
on free ports, sharing one store directory for task checkpoints), listed in the ready file as
`"connect": [{"id", "url", "pid"}, ...]`; a worker that dies is reported and the cluster goes on.

`--tls` (issue 23) makes a local CA and one certificate for the servers (SAN: the host,
127.0.0.1, localhost) under `<data dir>/tls`, runs every server with TLS only (`--tls`: enforcing,
and TLS on its own connections), and gives the CA's path in the ready file (`"tls_ca"`) for
clients to trust (`ferry ... --tls-ca PATH`, `FERRY_TLS_CA`). Without `--tls` the RocketMQ 5
endpoint's gRPC port still serves TLS and plain text on one port (`permissive`, as RocketMQ's
proxy does: the Java 5.x client uses TLS by default, the Python one plain text), with a
certificate from a local CA made once under `<data dir>/tls-proxy`; the ready file names that CA
(`"proxy_tls_ca"`; with `--tls`, the cluster's CA). The remoting ports stay plain.

`ProcessCluster` is also what `ferry demo` and `ferry bench failover` drive: it can kill and
restart any child. `ferry up` writes the `--ready-file` JSON once everything serves, and stops
every child it started, by PID, when told to. In controller mode a broker that dies is reported
and the cluster goes on (its group elects a new master); in classic mode, or when a NameServer or
controller dies, `ferry up` stops everything and exits 1.

Brokers use laptop-sized commit-log segments (`DEFAULT_SEGMENT_BYTES`, 64 MiB, not RocketMQ's
1 GiB: each broker preallocates one), and `run_up` first checks that the data directory's disk
holds every broker's segment, saying so in one line when it does not. A data directory `ferry up`
made itself (no `--data-dir`) is removed at exit, or kept with its path said when a server failed
(`finish_data_dir`).

`ferry up` also runs the web console (`ferry console`, issue 22; `--no-console` leaves it out) on
a free port, over the NameServer, the controllers and the first Connect worker; the ready file
names it (`"console": URL`). A console that dies is reported and the cluster goes on.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypedDict

from ferrymq.cmd.local import Child, spawn
from ferrymq.cmd.measure import free_port
from ferrymq.security.tls import TLS_ENV
from ferrymq.security.tlscerts import issue_certificate, make_ca
from ferrymq.store.atomic import write_atomic

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "BrokerEntry",
    "ConnectEntry",
    "DiskFullError",
    "ProcessCluster",
    "ReadyInfo",
    "UpConfig",
    "disk_shortage",
    "finish_data_dir",
    "run_up",
]

DEFAULT_SEGMENT_BYTES: Final = 64 * 1024 * 1024
"""Commit-log segment size of `ferry up`'s brokers (`mappedFileSizeCommitLog`)."""
BROKER_DEFAULT_SEGMENT_BYTES: Final = 1024 * 1024 * 1024
"""`BrokerConfig`'s own default (RocketMQ's 1 GiB), when `UpConfig.segment_bytes` is None."""
BROKER_HEADROOM_BYTES: Final = 64 * 1024 * 1024
"""Room each broker needs besides its first segment (consume queues, index, metadata, logs)."""


class BrokerEntry(TypedDict):
    """One broker of the `--ready-file` object."""

    broker_name: str
    broker_id: int
    role: str
    addr: str
    ha_addr: str | None
    pid: int
    store_dir: str
    metrics: str | None
    """Its Prometheus endpoint, `host:port` (docs/metrics.md)."""


class ControllerEntry(TypedDict):
    """One controller node of the `--ready-file` object."""

    id: str
    addr: str
    pid: int
    metrics: str | None


class ConnectEntry(TypedDict):
    """One Connect worker of the `--ready-file` object."""

    id: str
    url: str
    pid: int
    metrics: str | None


class NamesrvEntry(TypedDict):
    """One NameServer of the `--ready-file` object."""

    addr: str
    pid: int
    metrics: str | None


METRICS_FLAGS: Final = ("--metrics-exporter-type", "PROM", "--metrics-prom-exporter-port", "0")
"""Every server of `ferry up` serves Prometheus metrics on a free port."""


def _metrics(child: Child) -> str | None:
    found = child.info.get("metrics")
    return None if found is None else str(found)


class ReadyInfo(TypedDict):
    """The `--ready-file` object: where everything listens and which process it is."""

    namesrv: str
    namesrv_pid: int
    namesrvs: list[NamesrvEntry]
    controllers: list[ControllerEntry]
    brokers: list[BrokerEntry]
    console: str | None
    """The web console's URL (None: not run)."""
    connect: list[ConnectEntry]
    tls_ca: str | None
    """The CA file clients trust (`--tls`), else None."""
    proxy: str | None
    """The RocketMQ 5 endpoint's gRPC address, `host:port` (`ferry proxy`; None: not run)."""
    proxy_remoting: str | None
    """The same endpoint's remoting address, for 4.x clients (None: not run)."""
    proxy_metrics: str | None
    """The endpoint's Prometheus endpoint, `host:port` (None: not run)."""
    proxy_tls_ca: str | None
    """The CA that signed the endpoint's gRPC certificate, for TLS clients (None: not run)."""


@dataclass(frozen=True)
class UpConfig:
    """What `ferry up` starts."""

    data_dir: Path
    groups: int = 1
    replicas: int = 3
    """Brokers per group. Controller mode: the controller picks the master. Classic mode: a
    master plus replicas - 1 slaves; with slaves the master is a SYNC_MASTER."""
    controllers: int = 3
    """Controller nodes; 0 = classic master/slave with static roles."""
    embedded_controller: bool = False
    host: str = "127.0.0.1"
    port_base: int = 0  # 0: every server on a free port; else NameServer on it, brokers above
    cluster: str = "DefaultCluster"
    flush_disk_type: str = "ASYNC_FLUSH"
    ready_file: Path | None = None
    connect: int = 0
    """Connect workers (`ferry connect worker`, REST on free ports); `ferry up` asks for 2."""
    console: bool = False
    """Run the web console (`ferry console`) too; `ferry up` does."""
    proxy: bool = False
    """Run the RocketMQ 5 endpoint (`ferry proxy`: gRPC and remoting) too; `ferry up` does."""
    segment_bytes: int | None = None
    """Every broker's commit-log segment size (`mappedFileSizeCommitLog`); None: the broker's
    default (1 GiB). `ferry up` gives `DEFAULT_SEGMENT_BYTES`."""
    tls: bool = False
    """Every server with TLS only; a local CA under `<data_dir>/tls`."""
    broker_flags: tuple[str, ...] = ()
    """Extra flags for every broker (e.g. `--mapped-file-size-commit-log N` in tests: these
    come last, so they win over `segment_bytes`)."""

    @property
    def controller_mode(self) -> bool:
        """Whether brokers take their ids and roles from controllers."""
        return self.controllers > 0

    def broker_name(self, index: int) -> str:
        """broker-a, broker-b, ... (RocketMQ's naming)."""
        return f"broker-{string.ascii_lowercase[index]}"

    def port(self, index: int) -> int:
        """Listen port of server `index` (0 = NameServer, 1.. = brokers, two ports each)."""
        if not self.port_base:
            return 0
        return self.port_base if index == 0 else self.port_base + 2 * index - 1


class ProcessCluster:
    """The child processes of one local cluster: start, kill, restart, stop (by PID)."""

    def __init__(self, config: UpConfig) -> None:
        if config.groups > len(string.ascii_lowercase):
            raise ValueError(f"at most {len(string.ascii_lowercase)} broker groups")
        self.config = config
        self.controller_addrs = {
            f"n{i}": f"{config.host}:{free_port()}" for i in range(1, config.controllers + 1)
        }
        self.controllers: dict[str, Child] = {}
        self.namesrvs: list[Child] = []
        self.brokers: dict[str, Child] = {}
        """Child name (`broker-a-1`, ...) -> process."""
        self.workers: dict[str, Child] = {}
        """Connect worker id (`connect-1`, ...) -> process."""
        self.console: Child | None = None
        self.proxy: Child | None = None
        self.proxy_tls_ca: Path | None = None
        """The CA of the endpoint's gRPC certificate, once `start_proxy` ran."""
        self._args: dict[str, list[str]] = {}
        self.tls_ca: Path | None = None
        """The local CA's certificate (with `UpConfig.tls`), once `start` made it."""
        self._tls_flags: list[str] = []
        self._tls_env: dict[str, str] | None = None
        """`FERRYMQ_TLS` for the console and the proxy: how they reach the cluster (both also
        take the `--tls*` flags for their own ports: the console serves https)."""

    def _make_tls(self) -> None:
        """The local CA and the servers' certificate (kept: a restart reuses them)."""
        where = self.config.data_dir / "tls"
        ca_path = where / "ca.pem"
        cert, key = where / "server.pem", where / "server-key.pem"
        if not (ca_path.is_file() and cert.is_file() and key.is_file()):
            ca = make_ca(where)
            hosts = dict.fromkeys((self.config.host, "127.0.0.1", "localhost"))
            cert, key = issue_certificate(ca, where, "server", hosts=tuple(hosts))
        self.tls_ca = ca_path
        trust = {"tls.enable": "true", "tls.client.trustCertPath": str(ca_path)}
        self._tls_env = {TLS_ENV: json.dumps(trust)}
        self._tls_flags = [
            "--tls",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-ca",
            str(ca_path),
        ]

    @property
    def namesrv_addr(self) -> str:
        """Every NameServer, `;`-separated."""
        return ";".join(child.addr for child in self.namesrvs)

    @property
    def children(self) -> list[Child]:
        """Every child, in start order."""
        return [
            *self.controllers.values(),
            *self.namesrvs,
            *self.brokers.values(),
            *self.workers.values(),
            *([] if self.console is None else [self.console]),
            *([] if self.proxy is None else [self.proxy]),
        ]

    async def start(self) -> None:
        """Controllers, NameServer(s), then every broker (started together, ready together).

        Raises:
            RuntimeError: a server did not start (its log tail says why).
        """
        config = self.config
        if config.tls:
            await asyncio.to_thread(self._make_tls)
        peers = ",".join(f"{node}={addr}" for node, addr in self.controller_addrs.items())
        if config.embedded_controller and config.controller_mode:
            await asyncio.gather(
                *(
                    self._start_namesrv(
                        f"namesrv-{node}",
                        addr,
                        [
                            "--enable-controller",
                            "--controller-id",
                            node,
                            "--controller-peers",
                            peers,
                            "--controller-dir",
                            str(config.data_dir / f"controller-{node}"),
                        ],
                    )
                    for node, addr in self.controller_addrs.items()
                )
            )
        else:
            await asyncio.gather(
                *(self._start_controller(node, peers) for node in self.controller_addrs)
            )
            self.controllers = {node: self.controllers[node] for node in self.controller_addrs}
            await self._start_namesrv("namesrv", f"{config.host}:{config.port(0)}", [])
        self.namesrvs.sort(key=lambda child: child.name)
        names = []
        for index in range(config.groups):
            for replica in range(config.replicas):
                name = f"{config.broker_name(index)}-{replica + 1}"
                self._args[name] = self._broker_args(index, replica, name)
                names.append(name)
        await asyncio.gather(*(self.restart(name) for name in names))
        self.brokers = {name: self.brokers[name] for name in names}
        workers = [f"connect-{i}" for i in range(1, config.connect + 1)]
        await asyncio.gather(*(self.restart_worker(worker) for worker in workers))
        self.workers = {worker: self.workers[worker] for worker in workers}
        if config.console:
            await self.start_console()
        if config.proxy:
            await self.start_proxy()

    async def start_proxy(self) -> Child:
        """Start the RocketMQ 5 endpoint (again) over this cluster, both ports free ones."""
        config = self.config
        args = ["proxy", "--namesrv", self.namesrv_addr, "--host", config.host]
        grpc_tls = self._tls_flags
        self.proxy_tls_ca = self.tls_ca
        if not config.tls:  # TLS and plain text on the gRPC port, with a local certificate
            ca, cert, key = await asyncio.to_thread(self._proxy_certificate)
            self.proxy_tls_ca = ca
            grpc_tls = ["--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key)]
            grpc_tls += ["--grpc-tls-mode", "permissive"]
        self.proxy = await spawn(
            "proxy",
            [*args, "--grpc-port", "0", "--remoting-port", "0", *METRICS_FLAGS, *grpc_tls],
            config.data_dir,
            env=self._tls_env,
        )
        return self.proxy

    def _proxy_certificate(self) -> tuple[Path, Path, Path]:
        """(CA, certificate, key) of the gRPC port without `--tls` (kept: a restart reuses them)."""
        where = self.config.data_dir / "tls-proxy"
        ca_path = where / "ca.pem"
        cert, key = where / "proxy.pem", where / "proxy-key.pem"
        if not (ca_path.is_file() and cert.is_file() and key.is_file()):
            ca = make_ca(where, name="ferrymq local proxy CA")
            hosts = dict.fromkeys((self.config.host, "127.0.0.1", "localhost"))
            cert, key = issue_certificate(ca, where, "proxy", hosts=tuple(hosts))
        return ca_path, cert, key

    async def start_console(self) -> Child:
        """Start the web console (again) over this cluster, on a free port."""
        config = self.config
        args = ["console", "--namesrv", self.namesrv_addr, "--host", config.host, "--port", "0"]
        if config.controller_mode:
            args += ["--controller", ";".join(self._controller_api())]
        if self.workers:
            args += ["--connect", str(next(iter(self.workers.values())).info["url"])]
        self.console = await spawn(
            "console", [*args, *self._tls_flags], config.data_dir, env=self._tls_env
        )
        return self.console

    async def restart_worker(
        self, worker_id: str, *, env: dict[str, str] | None = None, extra: Sequence[str] = ()
    ) -> Child:
        """Start Connect worker `worker_id` (again: it rejoins the cluster and replays the log).

        `env` adds to its environment (test hooks), `extra` to its flags.
        """
        config = self.config
        child = await spawn(
            worker_id,
            [
                "connect",
                "worker",
                "--namesrv-addr",
                self.namesrv_addr,
                "--worker-id",
                worker_id,
                "--http-host",
                config.host,
                "--http-port",
                "0",
                "--store-path-root-dir",
                # shared by the cluster's workers: a task that moves continues from its checkpoint
                str(config.data_dir / "connect"),
                *METRICS_FLAGS,
                *self._tls_flags,
                *extra,
            ],
            config.data_dir,
            env=env,
        )
        self.workers[worker_id] = child
        return child

    async def _start_controller(
        self, node: str, peers: str, env: dict[str, str] | None = None
    ) -> None:
        config = self.config
        self.controllers[node] = await spawn(
            f"controller-{node}",
            [
                "controller",
                "--id",
                node,
                "--peers",
                peers,
                "--listen",
                self.controller_addrs[node],
                "--data-dir",
                str(config.data_dir / f"controller-{node}"),
                *self._tls_flags,
                *METRICS_FLAGS,
            ],
            config.data_dir,
            env=env,
        )

    async def _start_namesrv(self, name: str, listen: str, extra: list[str]) -> None:
        self.namesrvs.append(
            await spawn(
                name,
                ["namesrv", "--listen", listen, *extra, *self._tls_flags, *METRICS_FLAGS],
                self.config.data_dir,
            )
        )

    def _broker_args(self, index: int, replica: int, name: str) -> list[str]:
        config = self.config
        args = [
            "broker",
            "--cluster",
            config.cluster,
            "--broker-name",
            config.broker_name(index),
            "--listen",
            f"{config.host}:{config.port(1 + index * config.replicas + replica)}",
            "--namesrv",
            self.namesrv_addr,
            "--store-dir",
            str(config.data_dir / name),
            "--flush-disk-type",
            config.flush_disk_type,
            *(
                ()
                if config.segment_bytes is None
                else ("--mapped-file-size-commit-log", str(config.segment_bytes))
            ),
            *self._tls_flags,
            *METRICS_FLAGS,
            *config.broker_flags,
        ]
        if config.controller_mode:
            return [*args, "--controller-mode", "--controller", ";".join(self._controller_api())]
        role = "SLAVE" if replica else ("SYNC_MASTER" if config.replicas > 1 else "ASYNC_MASTER")
        return [*args, "--broker-id", str(replica), "--role", role]

    def _controller_api(self) -> list[str]:
        """Where brokers and admin tools reach the controllers."""
        if self.config.embedded_controller:
            return [child.addr for child in sorted(self.namesrvs, key=lambda c: c.name)]
        return list(self.controller_addrs.values())

    async def restart(
        self, name: str, timeout: float = 30.0, *, env: dict[str, str] | None = None
    ) -> Child:
        """Start broker `name` (again, on its store: after a kill it recovers and rejoins).

        `timeout` bounds the wait for its ready file (recovery after a kill included); `env`
        adds to its environment (test hooks).
        """
        child = await spawn(name, self._args[name], self.config.data_dir, timeout=timeout, env=env)
        self.brokers[name] = child
        return child

    async def restart_controller(self, node: str, *, env: dict[str, str] | None = None) -> Child:
        """Start controller node `node` again from its data directory (`env`: test hooks)."""
        peers = ",".join(f"{n}={a}" for n, a in self.controller_addrs.items())
        await self._start_controller(node, peers, env)
        return self.controllers[node]

    def info(self) -> ReadyInfo:
        """What the children reported in their own ready files, gathered."""
        entries: list[BrokerEntry] = []
        for child in self.brokers.values():
            ha_addr = child.info.get("ha_addr")
            entries.append(
                BrokerEntry(
                    broker_name=str(child.info["broker_name"]),
                    broker_id=int(str(child.info["broker_id"])),
                    role=str(child.info["role"]),
                    addr=child.addr,
                    ha_addr=None if ha_addr is None else str(ha_addr),
                    pid=child.pid,
                    store_dir=str(child.info["store_dir"]),
                    metrics=_metrics(child),
                )
            )
        if self.config.embedded_controller:
            controllers = [
                ControllerEntry(id=node, addr=child.addr, pid=child.pid, metrics=_metrics(child))
                for node, child in zip(self.controller_addrs, self.namesrvs, strict=False)
            ]
        else:
            controllers = [
                ControllerEntry(id=node, addr=child.addr, pid=child.pid, metrics=_metrics(child))
                for node, child in self.controllers.items()
            ]
        first = self.namesrvs[0]
        return ReadyInfo(
            namesrv=self.namesrv_addr,
            namesrv_pid=first.pid,
            namesrvs=[
                NamesrvEntry(addr=child.addr, pid=child.pid, metrics=_metrics(child))
                for child in self.namesrvs
            ],
            controllers=controllers,
            brokers=entries,
            console=None if self.console is None else self.console.addr,
            connect=[
                ConnectEntry(
                    id=worker_id, url=str(child.info["url"]), pid=child.pid, metrics=_metrics(child)
                )
                for worker_id, child in self.workers.items()
            ],
            tls_ca=None if self.tls_ca is None else str(self.tls_ca),
            proxy=None if self.proxy is None else str(self.proxy.info["grpc"]),
            proxy_remoting=None if self.proxy is None else str(self.proxy.info["remoting"]),
            proxy_metrics=None if self.proxy is None else _metrics(self.proxy),
            proxy_tls_ca=None if self.proxy_tls_ca is None else str(self.proxy_tls_ca),
        )

    async def stop(self) -> None:
        """Stop every child: brokers first, then NameServers and controllers."""
        for child in reversed(self.children):
            await child.stop()


class DiskFullError(RuntimeError):
    """The data directory's disk cannot hold the cluster: nothing was started."""


def disk_shortage(free_bytes: int, config: UpConfig) -> str | None:
    """Why the data directory's disk cannot hold the cluster's brokers, or None if it can."""
    brokers = config.groups * config.replicas
    segment = config.segment_bytes
    if segment is None:
        segment = BROKER_DEFAULT_SEGMENT_BYTES
    need = brokers * (segment + BROKER_HEADROOM_BYTES)
    if free_bytes >= need:
        return None
    mib = 1024 * 1024
    return (
        f"not enough disk space in {config.data_dir}: {free_bytes // mib} MiB free, "
        f"{brokers} broker(s) need {need // mib} MiB ({segment // mib} MiB "
        "commit-log segment each, plus room for queues and logs); free some space, "
        "give --data-dir on another disk, or a smaller --mapped-file-size-commit-log"
    )


def finish_data_dir(data_dir: Path, *, own: bool, ok: bool, say: Callable[[str], None]) -> None:
    """Remove the data directory `ferry up` made itself; keep it (and say where) after a failure.

    A directory the user gave (`--data-dir`) is theirs and always stays.
    """
    if not own:
        return
    if ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    else:
        say(f"the cluster's data and logs are kept in {data_dir}")


async def _first_exit(children: list[Child]) -> Child:
    waits = {asyncio.ensure_future(child.process.wait()): child for child in children}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return waits[next(iter(done))]


async def run_up(
    config: UpConfig,
    stop: asyncio.Event,
    on_ready: Callable[[ReadyInfo], None],
    on_exit: Callable[[Child, bool], None],
) -> int:
    """Start the cluster, report it, supervise it; returns the exit status for `ferry up`.

    0 when stopped by `stop`; 1 when a child whose loss stops the cluster died on its own
    (`on_exit(child, fatal)` reports every death).

    Raises:
        DiskFullError: the disk is too full to start (one line); nothing was started.
        RuntimeError: a server did not start; everything started before it is stopped.
    """
    await asyncio.to_thread(config.data_dir.mkdir, parents=True, exist_ok=True)
    usage = await asyncio.to_thread(shutil.disk_usage, config.data_dir)
    shortage = disk_shortage(usage.free, config)
    if shortage is not None:
        raise DiskFullError(shortage)
    cluster = ProcessCluster(config)
    try:
        await cluster.start()
        info = cluster.info()
        if config.ready_file is not None:
            await asyncio.to_thread(write_atomic, config.ready_file, json.dumps(info).encode())
        on_ready(info)
        watched = [child for child in cluster.children if child.running]
        while True:
            stopped = asyncio.ensure_future(stop.wait())
            died = asyncio.ensure_future(_first_exit(watched))
            await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not died.done():
                died.cancel()
                return 0
            child = died.result()
            fatal = not (
                (config.controller_mode and child in cluster.brokers.values())
                or child in cluster.workers.values()
                or child is cluster.console
            )
            on_exit(child, fatal)
            if fatal:
                return 1
            watched = [c for c in watched if c is not child]
            if not watched:
                return 1
    finally:
        await cluster.stop()
