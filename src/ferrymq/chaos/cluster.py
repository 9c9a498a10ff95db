"""The cluster under test: server processes on per-node loopback addresses, handled by PID.

Node i listens on 127.0.0.i: node 1 is the NameServer, nodes 2.. are the brokers of the first
group (broker-a), and (controller topology, the default) nodes 5-7 are the three controllers, a
Raft group; the brokers run in controller mode, take persistent ids from it, and the controller
picks and moves each group's master. With `groups=2` (topology controller-2groups) a second group,
broker-b, runs on nodes 21.. beside the first, under the same controllers and NameServer. The
classic topology (`controllers=0`) has static roles instead: broker id 0 is the SYNC_MASTER, the
others are SLAVEs. Each broker's store lives on its own
small loop-mounted ext4 image (mounted in the harness's private mount namespace), so fsync has a
disk's cost and a full disk can be caused for real. Logs append to `<out>/logs/<node>.log` across
restarts. Every node runs with `FERRYMQ_TEST_CLOCK=1`, so the clock nemesis can move its clock.
Processes are started in their own session and signalled by PID only; the namespace's PID 1 (the
harness) takes every one of them down when it exits.

Roles are looked up, not assumed: `master(group)` asks the controllers (GET_REPLICA_INFO), or the
group's brokers (GET_BROKER_RUNTIME_INFO) when no controller answers or there is none, so nemeses
aimed at "the master" hit whoever holds the role when the fault begins.

With `connect_workers`, Connect workers (`ferry connect worker`, ids w1, w2, ...) run on nodes
15, 16, ... (REST on port 8083), started once the brokers serve (`start_workers`). They keep their
config log on the first group (a fenced topic), so the broker faults aimed at that group hit it
too. A worker runs under `ferrymq.chaos.bindsource`, which binds its outgoing connections to its
own address, so a partition cuts it off like any node. `connect_leader` asks the workers who
leads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import ssl
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx

from ferrymq.chaos.bindsource import SOURCE_IP_ENV
from ferrymq.client.controller_admin import ControllerAdmin, ReplicaInfo
from ferrymq.clock import TEST_CLOCK_ENV
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import export_credentials
from ferrymq.security.tls import TlsSettings, install, settings_for, tls_config_from
from ferrymq.security.tlscerts import issue_certificate, make_ca
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

__all__ = [
    "BROKER_PORT",
    "CONNECT_PORT",
    "CONTROLLER_PORT",
    "NAMESRV_PORT",
    "Cluster",
    "ClusterConfig",
    "Node",
    "RuntimeInfo",
]

log = logging.getLogger(__name__)

NAMESRV_PORT: Final = 9876
BROKER_PORT: Final = 10911
CONTROLLER_PORT: Final = 9878
CONNECT_PORT: Final = 8083
_WORKER_FIRST_IP: Final = 15
_WORKER_TIMINGS: Final = (
    "--heartbeat-interval-ms",
    "250",
    "--session-timeout-ms",
    "2000",
    "--leader-failover-grace-ms",
    "500",
    "--task-reassign-grace-ms",
    "1000",
    "--rest-request-timeout-ms",
    "10000",
)
"""A worker gone 2 s leaves the group, a leader gone 0.5 s more is replaced (the Connect system
tests' timings); a write not committed in 10 s is answered 504."""
_BIND_SOURCE: Final = [sys.executable, "-m", "ferrymq.chaos.bindsource"]
_CONTROLLER_FIRST_IP: Final = 5
_GROUP_IP_STRIDE: Final = 20
"""Group g > 0 puts its brokers on 127.0.0.(20 g + 1), ... (clear of controllers and clients)."""
_HARNESS_IP: Final = "127.0.0.9"
_FERRY: Final = [sys.executable, "-m", "ferrymq.cmd.ferry"]
_READY_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class ClusterConfig:
    """What to start."""

    out_dir: Path
    replicas: int = 3
    group: str = "broker-a"
    """The first group's name (its brokers keep the one-group topology's names and addresses)."""
    groups: int = 1
    """Broker groups: broker-a, broker-b, ... (each `replicas` brokers)."""
    segment_bytes: int = 1024 * 1024
    disk_bytes: int = 256 * 1024 * 1024
    """Size of each broker's store filesystem (a full-disk fault fills it)."""
    min_in_sync_replicas: int = 2
    bugs: tuple[str, ...] = ()
    """FERRYMQ_TEST_BUG switches for every broker (testbugs.BUGS)."""
    use_disk_images: bool = True
    controllers: int = 3
    """Controller nodes (a Raft group) choosing the master; 0 = classic static roles."""
    connect_workers: int = 0
    """Connect workers (w1, w2, ...); 0: none."""
    tls: bool = False
    """Every server with TLS only (issue 23), certificates from a CA under `out_dir/tls`; the
    harness's own clients connect with TLS too. Connect workers have no TLS yet: none with it."""
    acl: bool = False
    """ACL 1.0 on every server (issue 23): one `plain_acl.yml` under `out_dir/acl` with a
    cluster admin account of a fresh secret; every process (servers, their HA links, the
    harness's clients) signs with it through FERRY_ACCESS_KEY / FERRY_SECRET_KEY."""

    @property
    def controller_mode(self) -> bool:
        """Whether brokers take their ids and roles from controllers."""
        return self.controllers > 0

    @property
    def group_names(self) -> list[str]:
        """Every group's brokerName, the first one first."""
        if self.groups == 1:
            return [self.group]
        return [self.group, *(f"broker-{string.ascii_lowercase[g]}" for g in range(1, self.groups))]


@dataclass
class Node:
    """One server: where it listens, how it starts, and its current process."""

    name: str
    ip: str
    args: list[str]
    log_path: Path
    env: dict[str, str]
    port: int
    kind: str = "broker"
    """namesrv, controller, broker or worker (Connect)."""
    broker_id: int | None = None
    """Classic topology: the static broker id (controller mode: the controller assigns it)."""
    store_dir: Path | None = None
    group: str | None = None
    """A broker's group (brokerName)."""
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    launcher: tuple[str, ...] = ()
    """The command before `args` (default: `python -m ferrymq.cmd.ferry`)."""
    worker_id: str | None = None
    """A Connect worker's id."""
    scheme: str = "http"
    """A Connect worker's REST scheme: https when the run has TLS."""

    @property
    def addr(self) -> str:
        """HOST:PORT of its remoting listener."""
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        """A Connect worker's REST address."""
        return f"{self.scheme}://{self.addr}"

    @property
    def running(self) -> bool:
        """Whether its process is alive (paused counts as alive)."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process; `wait_ready` waits until it serves."""
        if self.running:
            return
        ready = self.log_path.with_suffix(".ready.json")
        ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log_file:
            log_file.write(f"--- start {self.starts} at {time.time():.3f}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(
                [*(self.launcher or _FERRY), *self.args, "--ready-file", str(ready)],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        self.starts += 1
        self.paused = False

    async def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        """Wait for the ready file.

        Raises:
            FerryError: it exited or did not get ready in time.
        """
        ready = self.log_path.with_suffix(".ready.json")
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if not self.running:
                raise FerryError(f"{self.name} exited: see {self.log_path}")
            if time.monotonic() > deadline:
                raise FerryError(f"{self.name} not ready in {timeout:g} s: see {self.log_path}")
            await asyncio.sleep(0.05)
        json.loads(ready.read_text())

    def kill(self) -> None:
        """SIGKILL and reap: a crash."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: alive, holding its sockets, answering nothing."""
        if self.running and self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.running and self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGCONT + SIGTERM, then SIGKILL after `timeout`: a clean stop."""
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %g s: killing it", self.name, timeout)
            self.kill()


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What a broker says about itself."""

    node: str
    role: str
    epoch: int | None
    max_log_offset: int
    confirm_log_offset: int
    sync_state_set: str | None


def logs_path(config: ClusterConfig, name: str) -> Path:
    """Where node `name` logs."""
    return config.out_dir / "logs" / f"{name}.log"


@dataclass
class Cluster:
    """A NameServer, (controller topology) three controllers, and broker groups, as processes."""

    config: ClusterConfig
    namesrv: Node = field(init=False)
    controllers: list[Node] = field(init=False)
    brokers: list[Node] = field(init=False)
    workers: list[Node] = field(init=False)
    ledger_path: Path = field(init=False)
    rpc: RpcClient = field(init=False)
    _tls_flags: list[str] = field(init=False, default_factory=list)
    _rest_ca: Path | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        config = self.config
        logs = config.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        tls_flags = self._make_tls() if config.tls else []
        self._tls_flags = tls_flags
        acl_file = self._make_acl() if config.acl else None
        self.ledger_path = config.out_dir / "fsync-ledger.txt"
        self.namesrv = Node(
            "n1-namesrv",
            "127.0.0.1",
            [
                "namesrv",
                "--listen",
                f"127.0.0.1:{NAMESRV_PORT}",
                "--broker-timeout",
                "10",
                *tls_flags,
                *(["--config", str(acl_file.with_name("namesrv.properties"))] if acl_file else []),
            ],
            logs / "n1-namesrv.log",
            {TEST_CLOCK_ENV: "1"},
            NAMESRV_PORT,
            kind="namesrv",
        )
        env = {"FERRYMQ_TEST_FSYNC_LEDGER": str(self.ledger_path), TEST_CLOCK_ENV: "1"}
        if config.bugs:
            env["FERRYMQ_TEST_BUG"] = ",".join(config.bugs)
        self.controllers = []
        controller_ips = [f"127.0.0.{_CONTROLLER_FIRST_IP + i}" for i in range(config.controllers)]
        peers = ",".join(f"c{i + 1}={ip}:{CONTROLLER_PORT}" for i, ip in enumerate(controller_ips))
        for i, ip in enumerate(controller_ips):
            name = f"n{_CONTROLLER_FIRST_IP + i}-controller{i + 1}"
            args = [
                "controller",
                "--id",
                f"c{i + 1}",
                "--peers",
                peers,
                "--data-dir",
                str(config.out_dir / "data" / name),
                *tls_flags,
                *(["--acl-file", str(acl_file)] if acl_file else []),
            ]
            self.controllers.append(
                Node(name, ip, args, logs / f"{name}.log", env, CONTROLLER_PORT, kind="controller")
            )
        self.brokers = [
            self._broker(g, i, env)
            for g in range(len(config.group_names))
            for i in range(config.replicas)
        ]
        for broker in self.brokers:
            broker.args += tls_flags
            if acl_file is not None:
                broker.args += ["--acl-enable", "true", "--acl-file", str(acl_file)]
        self.workers = [self._worker(i) for i in range(config.connect_workers)]
        self.rpc = RpcClient(local_host=_HARNESS_IP, connect_timeout=1.0)

    def _make_tls(self) -> list[str]:
        """A CA and one certificate for every 127.0.0.x; this process's clients trust the CA."""
        where = self.config.out_dir / "tls"
        ca = make_ca(where, name="ferrymq chaos CA")
        hosts = ("localhost", *(f"127.0.0.{octet}" for octet in range(1, 255)))
        cert, key = issue_certificate(ca, where, "servers", hosts=hosts)
        values = {"tls.enable": "true", "tls.client.trustCertPath": str(ca.cert_path)}
        install(TlsSettings(client=settings_for(tls_config_from(values), server_side=False).client))
        ca_path = str(ca.cert_path)
        self._rest_ca = ca.cert_path
        return ["--tls", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", ca_path]

    def _make_acl(self) -> Path:
        """`plain_acl.yml` of one admin account; this process and its children sign with it."""
        where = self.config.out_dir / "acl"
        where.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_hex(16)
        acl_file = where / "plain_acl.yml"
        acl_file.touch(mode=0o600)
        acl_file.write_text(
            f"accounts:\n- accessKey: chaos-admin\n  secretKey: {secret}\n  admin: true\n"
        )
        (where / "namesrv.properties").write_text(f"aclEnable=true\naclFile={acl_file}\n")
        export_credentials(Credentials("chaos-admin", secret))
        return acl_file

    @property
    def controller_addr(self) -> str:
        """The controllers' addresses as brokers and admin tools take them (`;`-separated)."""
        return ";".join(c.addr for c in self.controllers)

    def group_brokers(self, group: str | None = None) -> list[Node]:
        """The brokers of `group` (default: the first group)."""
        group = group or self.config.group
        return [b for b in self.brokers if b.group == group]

    def _broker(self, group_index: int, index: int, env: dict[str, str]) -> Node:
        config = self.config
        group = config.group_names[group_index]
        octet = index + 2 if group_index == 0 else _GROUP_IP_STRIDE * group_index + 1 + index
        ip = f"127.0.0.{octet}"
        if group_index:
            name = f"n{octet}-{group.removeprefix('broker-')}-broker{index + 1}"
        elif config.controller_mode:
            name = f"n{octet}-broker{index + 1}"
        else:
            name = f"n{octet}-{'master' if index == 0 else f'slave{index}'}"
        store_dir = config.out_dir / "data" / name
        args = [
            "broker",
            "--cluster",
            "ChaosCluster",
            "--broker-name",
            group,
            "--listen",
            f"{ip}:{BROKER_PORT}",
            "--broker-ip1",
            ip,
            "--namesrv",
            self.namesrv.addr,
            "--store-dir",
            str(store_dir),
            "--flush-disk-type",
            "SYNC_FLUSH",
            "--mapped-file-size-commit-log",
            str(config.segment_bytes),
            "--min-in-sync-replicas",
            str(min(config.min_in_sync_replicas, config.replicas)),
            "--ha-send-heartbeat-interval",
            "300",
            "--ha-housekeeping-interval",
            "3000",
            "--ha-max-time-slave-not-catchup",
            "3000",
            "--slave-timeout",
            "2000",
            "--register-name-server-period",
            "1000",
            # RocketMQ's forced deletion of the oldest segments above 75 % disk use would
            # delete unconsumed acked messages when the full-disk fault fills the disk
            "--disk-max-used-space-ratio",
            "100",
        ]
        if config.controller_mode:
            args += ["--controller-mode", "--controller", self.controller_addr]
            broker_id = None
        else:
            role = "SYNC_MASTER" if index == 0 else "SLAVE"
            args += ["--broker-id", str(index), "--role", role]
            broker_id = index
        return Node(
            name,
            ip,
            args,
            logs_path(config, name),
            env,
            BROKER_PORT,
            "broker",
            broker_id,
            store_dir,
            group,
        )

    def _worker(self, index: int) -> Node:
        octet = _WORKER_FIRST_IP + index
        ip = f"127.0.0.{octet}"
        name = f"n{octet}-worker{index + 1}"
        args = [
            "connect",
            "worker",
            "--namesrv-addr",
            self.namesrv.addr,
            "--worker-id",
            f"w{index + 1}",
            "--http-host",
            ip,
            "--http-port",
            str(CONNECT_PORT),
            "--store-path-root-dir",
            str(self.config.out_dir / "data" / "connect"),  # shared, as docs/connect.md says
            *_WORKER_TIMINGS,
            *self._tls_flags,  # REST over TLS, and TLS toward the brokers
        ]
        return Node(
            name,
            ip,
            args,
            logs_path(self.config, name),
            {SOURCE_IP_ENV: ip},
            CONNECT_PORT,
            kind="worker",
            launcher=tuple(_BIND_SOURCE),
            worker_id=f"w{index + 1}",
            scheme="https" if self._tls_flags else "http",
        )

    def http_transport(
        self, local_address: str, limits: httpx.Limits | None = None
    ) -> httpx.AsyncHTTPTransport:
        """A transport to the workers' REST API from `local_address` (the run's CA trusted)."""
        verify: ssl.SSLContext | bool = True
        if self._rest_ca is not None:
            verify = ssl.create_default_context(cafile=str(self._rest_ca))
        if limits is None:
            return httpx.AsyncHTTPTransport(local_address=local_address, verify=verify)
        return httpx.AsyncHTTPTransport(local_address=local_address, verify=verify, limits=limits)

    @property
    def nodes(self) -> list[Node]:
        """Every node: NameServer, controllers, brokers, Connect workers."""
        return [self.namesrv, *self.controllers, *self.brokers, *self.workers]

    def node(self, name: str) -> Node:
        """The node called `name`."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def node_at(self, addr: str) -> Node | None:
        """The node listening on HOST:PORT `addr`."""
        return next((n for n in self.nodes if n.addr == addr), None)

    def mount_stores(self) -> None:
        """Give each broker store its own small ext4 filesystem (inside the mount namespace).

        A sparse image under `<out>/disks/`, loop-mounted with autoclear (the loop device goes
        when the namespace's mount does): fsync costs what it costs on a disk, and a full disk
        is a real ENOSPC. The images stay behind as artifacts when a run finds anomalies.
        """
        disks = self.config.out_dir / "disks"
        disks.mkdir(parents=True, exist_ok=True)
        for broker in self.brokers:
            assert broker.store_dir is not None
            broker.store_dir.mkdir(parents=True, exist_ok=True)
            if not self.config.use_disk_images:
                continue
            image = disks / f"{broker.name}.img"
            image.unlink(missing_ok=True)
            with image.open("wb") as file:
                file.truncate(self.config.disk_bytes)
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            subprocess.run(["mount", "-o", "loop", str(image), str(broker.store_dir)], check=True)

    def remove_disk_images(self) -> None:
        """Delete the store images (after the stores were unmounted, or the namespace ended)."""
        for broker in self.brokers:
            (self.config.out_dir / "disks" / f"{broker.name}.img").unlink(missing_ok=True)

    async def start(self) -> None:
        """Start the NameServer and controllers, then the brokers; wait until each serves."""
        for node in [self.namesrv, *self.controllers]:
            node.start()
        for node in [self.namesrv, *self.controllers]:
            await node.wait_ready()
        for broker in self.brokers:
            broker.start()
        for broker in self.brokers:
            await broker.wait_ready(timeout=60.0)

    async def start_workers(self) -> None:
        """Start the Connect workers (once the brokers serve); wait until each serves.

        The first one alone, so it creates the config log and claims before the others join.
        """
        for i, worker in enumerate(self.workers):
            worker.start()
            if i == 0:
                await worker.wait_ready(timeout=60.0)
        for worker in self.workers:
            await worker.wait_ready(timeout=60.0)

    def worker(self, worker_id: str) -> Node | None:
        """The Connect worker with this id."""
        return next((w for w in self.workers if w.worker_id == worker_id), None)

    async def connect_leader(self, timeout: float = 2.0) -> Node | None:
        """The Connect worker that the running workers name as leader.

        The highest epoch any of them reports wins; None when none answers or none knows one.
        """
        best: tuple[int, str] | None = None
        transport = self.http_transport(_HARNESS_IP)
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as http:
            for worker in self.workers:
                if not worker.running or worker.paused:
                    continue
                try:
                    root = (await http.get(worker.url + "/")).json()
                    leader = root["leader"]
                    epoch, leader_id = int(leader["epoch"]), str(leader["worker_id"])
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    continue
                if leader_id and (best is None or epoch > best[0]):
                    best = (epoch, leader_id)
        return self.worker(best[1]) if best is not None else None

    async def restart(self, node: Node) -> None:
        """Start a stopped node and wait until it serves (or its start fails, logged)."""
        node.start()
        try:
            await node.wait_ready()
        except FerryError as exc:
            log.error("restart of %s failed: %s", node.name, exc)

    async def runtime(self, node: Node, timeout: float = 1.0) -> RuntimeInfo | None:
        """The broker's runtime info, or None when it does not answer."""
        if not node.running or node.paused:
            return None
        try:
            response = await self.rpc.call(
                node.addr, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), timeout
            )
        except FerryError:
            return None
        if response.code != ResponseCode.SUCCESS:
            return None
        table = decode_body(response.body, KVTable).table
        role = table.get("brokerRole", "")
        epoch = table.get("masterEpoch")
        return RuntimeInfo(
            node=node.name,
            role="master" if role.endswith("MASTER") else "slave",
            epoch=int(epoch) if epoch else None,
            max_log_offset=int(table.get("commitLogMaxOffset", "0")),
            confirm_log_offset=int(table.get("confirmOffset", "0")),
            sync_state_set=table.get("syncStateSet"),
        )

    async def replica_info(self, group: str | None = None) -> ReplicaInfo | None:
        """The controllers' view of a group (None in classic mode or when none answers)."""
        if not self.config.controller_mode:
            return None
        admin = ControllerAdmin(self.controller_addr, timeout=1.5, rpc=self.rpc)
        try:
            return await admin.replica_info(group or self.config.group)
        except (FerryError, TimeoutError):
            return None

    async def master(self, group: str | None = None) -> Node | None:
        """A group's master now: the controllers' choice, else the broker that says it is."""
        info = await self.replica_info(group)
        if info is not None and info.master_address:
            found = self.node_at(info.master_address)
            if found is not None:
                return found
        for broker in self.group_brokers(group):
            runtime = await self.runtime(broker)
            if runtime is not None and runtime.role == "master":
                return broker
        return None

    async def slaves(self, group: str | None = None) -> list[Node]:
        """Every broker of a group that is not its current master (running or not)."""
        brokers = self.group_brokers(group)
        master = await self.master(group)
        if master is None:
            return brokers[1:]
        return [b for b in brokers if b is not master]

    async def controller_leader(self) -> Node | None:
        """The controller that says it leads the Raft group (None when none does)."""
        admin = ControllerAdmin(self.controller_addr, timeout=1.0, rpc=self.rpc)
        for node in self.controllers:
            if not node.running or node.paused:
                continue
            try:
                meta = await admin.metadata(node.addr)
            except (FerryError, TimeoutError):
                continue
            if meta.is_leader:
                return node
        return None

    async def controller_followers(self) -> list[Node]:
        """Every running controller that is not the leader."""
        leader = await self.controller_leader()
        return [c for c in self.controllers if c is not leader and c.running]

    def stop(self) -> None:
        """Stop every node cleanly (Connect workers first, then brokers)."""
        for node in reversed(self.nodes):
            node.terminate()
