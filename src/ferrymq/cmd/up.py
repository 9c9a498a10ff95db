"""`ferry up`: a whole local cluster in one command, supervised until SIGINT/SIGTERM.

Starts a NameServer and one master broker per broker group as child processes (`cmd.local`),
writes the `--ready-file` JSON once all of them serve, and stops every child it started, by PID,
when told to or when one of them dies.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ferrymq.cmd.local import Child, spawn
from ferrymq.store.atomic import write_atomic

__all__ = ["BrokerEntry", "ReadyInfo", "UpConfig", "cluster_info", "run_up"]


class BrokerEntry(TypedDict):
    """One broker of the `--ready-file` object."""

    broker_name: str
    broker_id: int
    role: str
    addr: str
    ha_addr: str | None
    pid: int
    store_dir: str


class ReadyInfo(TypedDict):
    """The `--ready-file` object: where everything listens and which process it is."""

    namesrv: str
    namesrv_pid: int
    controllers: list[dict[str, object]]
    brokers: list[BrokerEntry]


@dataclass(frozen=True)
class UpConfig:
    """What `ferry up` starts."""

    data_dir: Path
    groups: int = 1
    replicas: int = 1
    """Brokers per group: a master, plus replicas - 1 slaves; with slaves the master is a
    SYNC_MASTER (a send is acknowledged once every in-sync replica has it)."""
    host: str = "127.0.0.1"
    port_base: int = 0  # 0: every server on a free port; else NameServer on it, brokers above
    cluster: str = "DefaultCluster"
    flush_disk_type: str = "ASYNC_FLUSH"
    ready_file: Path | None = None

    def broker_name(self, index: int) -> str:
        """broker-a, broker-b, ... (RocketMQ's naming)."""
        return f"broker-{string.ascii_lowercase[index]}"

    def port(self, index: int) -> int:
        """Listen port of server `index` (0 = NameServer, 1.. = brokers, two ports each)."""
        if not self.port_base:
            return 0
        return self.port_base if index == 0 else self.port_base + 2 * index - 1


def cluster_info(namesrv: Child, brokers: list[Child]) -> ReadyInfo:
    """What the children reported in their own ready files, gathered."""
    entries: list[BrokerEntry] = []
    for child in brokers:
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
            )
        )
    # No controller process exists until controller mode lands; the key is there for clients.
    return ReadyInfo(namesrv=namesrv.addr, namesrv_pid=namesrv.pid, controllers=[], brokers=entries)


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
    on_exit: Callable[[Child], None],
) -> int:
    """Start the cluster, report it, supervise it; returns the exit status for `ferry up`.

    0 when stopped by `stop`; 1 when a child died on its own (`on_exit` says which).

    Raises:
        RuntimeError: a server did not start; everything started before it is stopped.
    """
    if config.groups > len(string.ascii_lowercase):
        raise ValueError(f"at most {len(string.ascii_lowercase)} broker groups")
    children: list[Child] = []
    try:
        namesrv = await spawn(
            "namesrv",
            ["namesrv", "--listen", f"{config.host}:{config.port(0)}"],
            config.data_dir,
        )
        children.append(namesrv)
        brokers: list[Child] = []
        for index in range(config.groups):
            name = config.broker_name(index)
            for broker_id in range(config.replicas):
                if broker_id == 0:
                    role = "SYNC_MASTER" if config.replicas > 1 else "ASYNC_MASTER"
                else:
                    role = "SLAVE"
                child_name = name if broker_id == 0 else f"{name}-s{broker_id}"
                broker = await spawn(
                    child_name,
                    [
                        "broker",
                        "--cluster",
                        config.cluster,
                        "--broker-name",
                        name,
                        "--broker-id",
                        str(broker_id),
                        "--role",
                        role,
                        "--listen",
                        f"{config.host}:{config.port(1 + len(brokers))}",
                        "--namesrv",
                        namesrv.addr,
                        "--store-dir",
                        str(config.data_dir / child_name),
                        "--flush-disk-type",
                        config.flush_disk_type,
                    ],
                    config.data_dir,
                )
                children.append(broker)
                brokers.append(broker)
        info = cluster_info(namesrv, brokers)
        if config.ready_file is not None:
            await asyncio.to_thread(write_atomic, config.ready_file, json.dumps(info).encode())
        on_ready(info)
        stopped = asyncio.ensure_future(stop.wait())
        died = asyncio.ensure_future(_first_exit(children))
        await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if died.done():
            on_exit(died.result())
            return 1
        died.cancel()
        return 0
    finally:
        for child in reversed(children):
            await child.stop()
