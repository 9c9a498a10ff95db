"""Partition the controller leader away and heal it; run inside a private network namespace.

`python -m tests.system.partition_scenario DIR` must run under
`unshare --net --pid --mount-proc --fork --kill-child` (test_controller_partition.py does that):
it brings up `lo`, starts three `ferry controller` processes on 127.0.0.11-13, and cuts the
leader off from the other two with nftables rules on `lo` (the nodes' peer connections leave
from their own addresses, so the rules can tell them apart; this script's own client uses
127.0.0.1 and reaches everyone). It exits 0 when every check holds and prints one JSON line of
measurements.
"""

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import ApplyBrokerIdRequestHeader, GetMetaDataResponseHeader
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields

from .procs import Server, start

T = TypeVar("T")
CLUSTER = "DefaultCluster"
ADDRS = {f"n{i}": f"127.0.0.{10 + i}:9878" for i in (1, 2, 3)}
TABLE = "ferrymq_partition"


def _host(addr: str) -> str:
    return addr.rpartition(":")[0]


def isolate(node_id: str) -> None:
    """Drop every packet between `node_id` and the other controllers, both ways."""
    me = _host(ADDRS[node_id])
    others = ", ".join(_host(a) for n, a in ADDRS.items() if n != node_id)
    rules = f"""table inet {TABLE} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    ip saddr {me} ip daddr {{ {others} }} drop
    ip saddr {{ {others} }} ip daddr {me} drop
  }}
}}
"""
    subprocess.run(["nft", "-f", "-"], input=rules.encode(), check=True)


def heal() -> None:
    """Remove the partition."""
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


async def wait_for(
    predicate: Callable[[], Awaitable[T | None]], what: str, timeout: float = 20.0
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await predicate()
        except FerryError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


async def meta(admin: ControllerAdmin, node_id: str) -> GetMetaDataResponseHeader:
    return await admin.metadata(ADDRS[node_id])


async def scenario(servers: dict[str, Server]) -> dict[str, object]:
    everyone = ";".join(ADDRS.values())
    async with ControllerAdmin(everyone, timeout=10.0) as admin:

        async def one_leader() -> str | None:
            leaders = [n for n in ADDRS if (await meta(admin, n)).is_leader]
            return leaders[0] if len(leaders) == 1 else None

        old = await wait_for(one_leader, "a serving leader")
        acked = []
        for n in range(20):
            await admin.apply_broker_id(CLUSTER, f"before-{n}", 1, f"127.0.0.1:{n};1")
            acked.append(f"before-{n}")

        isolate(old)
        cut_at = time.monotonic()
        majority = [n for n in ADDRS if n != old]
        async with (
            ControllerAdmin(";".join(ADDRS[n] for n in majority), timeout=10.0) as survivors,
            RpcClient() as rpc,
        ):
            refused = []
            isolated_writes = 0

            async def write_to_isolated() -> None:
                nonlocal isolated_writes
                name = f"isolated-{isolated_writes}"
                isolated_writes += 1
                header = ApplyBrokerIdRequestHeader(
                    cluster_name=CLUSTER,
                    broker_name=name,
                    applied_broker_id=1,
                    register_check_code="127.0.0.1:1;1",
                )
                request = RemotingCommand(
                    code=RequestCode.CONTROLLER_APPLY_BROKER_ID, ext_fields=to_ext_fields(header)
                )
                try:
                    response = await rpc.call(ADDRS[old], request, 8.0)
                except FerryError as exc:
                    refused.append(f"{name}: {exc}")
                    return
                assert response.code != ResponseCode.SUCCESS, f"{name} committed on the minority"
                refused.append(f"{name}: {response.code}")

            isolated = asyncio.gather(*(write_to_isolated() for _ in range(5)))

            async def new_leader() -> str | None:
                found = [n for n in majority if (await meta(admin, n)).is_leader]
                return found[0] if found else None

            new = await wait_for(new_leader, "a leader on the majority side")
            failover = time.monotonic() - cut_at
            for n in range(20):
                await survivors.apply_broker_id(CLUSTER, f"after-{n}", 1, f"127.0.0.1:{n};1")
                acked.append(f"after-{n}")
            new_term = (await meta(admin, new)).term

            async def stepped_down() -> bool:
                return not (await meta(admin, old)).is_leader

            await wait_for(stepped_down, "the isolated leader stepping down")
            await isolated
            assert len(refused) == 5, refused
            for _ in range(3):  # later attempts on the isolated node: answered, never committed
                await write_to_isolated()

            heal()
            healed_at = time.monotonic()

            async def caught_up() -> bool:
                a, b = await meta(admin, old), await meta(admin, new)
                return a.applied_index == b.applied_index and not a.is_leader

            await wait_for(caught_up, "the healed node catching up")
            catch_up = time.monotonic() - healed_at
            after = await meta(admin, new)
            assert after.is_leader, "the healed node disturbed the leader"
            assert after.term == new_term, f"the term moved from {new_term} to {after.term}"
            await survivors.apply_broker_id(CLUSTER, "after-heal", 1, "127.0.0.1:9;1")
            acked.append("after-heal")
            names = acked + [f"isolated-{n}" for n in range(isolated_writes)]
            table = (await survivors.sync_state_data(names)).replicas_info_table
            lost = sorted(set(acked) - set(table))
            leaked = sorted(set(table) - set(acked))
            assert not lost, f"acknowledged but lost: {lost}"
            assert not leaked, f"written on the isolated node: {leaked}"
    return {
        "old_leader": old,
        "new_leader": new,
        "failover_s": round(failover, 3),
        "catch_up_s": round(catch_up, 3),
        "isolated_attempts": isolated_writes,
    }


def main() -> None:
    root = Path(sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    peers = ",".join(f"{n}={a}" for n, a in ADDRS.items())
    servers: dict[str, Server] = {}
    try:
        for node_id in ADDRS:
            servers[node_id] = start(
                [
                    "controller",
                    "--id",
                    node_id,
                    "--peers",
                    peers,
                    "--data-dir",
                    str(root / node_id),
                ],
                root,
                node_id,
            )
        result = asyncio.run(scenario(servers))
    finally:
        for server in servers.values():
            server.stop()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
