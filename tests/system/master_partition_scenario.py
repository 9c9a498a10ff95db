"""Partition a group's master away from the controllers and its slaves; run in a private netns.

`python -m tests.system.master_partition_scenario DIR` must run under
`unshare --net --pid --mount-proc --fork --kill-child` (test_master_partition.py does that). It
brings up `lo`, starts three controllers on 127.0.0.11-13, a NameServer on 127.0.0.1 and a group
of three replicas on 127.0.0.21-23 in controller mode, then, with a producer running from
127.0.0.1, drops every packet between the master and the other servers (nftables on `lo`). The
producer can still reach the old master: the old master must stop accepting writes once its lease
runs out, a new master must take over, and after healing the old master must rejoin as a slave.
Exits 0 when every check holds and prints one JSON line of measurements.
"""

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import SendMessageRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields

from .group_load import BackgroundSends, read_topic, rejoined_as_slave, runtime
from .procs import Server, start

CONTROLLERS = {f"n{i}": f"127.0.0.{10 + i}:9878" for i in (1, 2, 3)}
BROKERS = [f"127.0.0.{20 + i}" for i in (1, 2, 3)]
NAMESRV = "127.0.0.1:9876"
TABLE = "ferrymq_master_partition"
TOPIC = "Partitioned"
LEASE_S = 1.2  # the controller's default masterLeaseMillis


def isolate(host: str) -> None:
    """Drop every packet between `host` and the other servers (not the client at 127.0.0.1)."""
    others = ", ".join(
        [h.rpartition(":")[0] for h in CONTROLLERS.values()] + [b for b in BROKERS if b != host]
    )
    rules = f"""table inet {TABLE} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    ip saddr {host} ip daddr {{ {others} }} drop
    ip saddr {{ {others} }} ip daddr {host} drop
  }}
}}
"""
    subprocess.run(["nft", "-f", "-"], input=rules.encode(), check=True)


def heal() -> None:
    """Remove the partition."""
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


async def until(condition: Callable[[], Awaitable[bool]], what: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit_s:g} s")
        await asyncio.sleep(0.05)


async def direct_send(rpc: RpcClient, address: str, body: bytes) -> int:
    """One send straight to `address`, bypassing routes; returns the response code."""
    header = SendMessageRequestHeader(
        producer_group="P",
        topic=TOPIC,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
    )
    request = RemotingCommand(
        code=RequestCode.SEND_MESSAGE, ext_fields=to_ext_fields(header), body=body
    )
    try:
        return (await rpc.call(address, request, 3)).code
    except FerryError:
        return -1


async def scenario(workdir: Path) -> dict[str, object]:
    peers = ",".join(f"{n}={a}" for n, a in CONTROLLERS.items())
    servers: list[Server] = [
        start(
            ["controller", "--id", node, "--peers", peers, "--data-dir", str(workdir / node)],
            workdir,
            node,
        )
        for node in CONTROLLERS
    ]
    servers.append(start(["namesrv", "--listen", NAMESRV], workdir, "namesrv"))
    controller_addr = ";".join(CONTROLLERS.values())
    try:
        processes = [
            start(
                [
                    "broker",
                    "--controller-mode",
                    "--controller",
                    controller_addr,
                    "--listen",
                    f"{host}:10911",
                    "--broker-ip1",
                    host,
                    "--namesrv",
                    NAMESRV,
                    "--store-dir",
                    str(workdir / host),
                ],
                workdir,
                f"broker-{host}",
                timeout=60,
            )
            for host in BROKERS
        ]
        servers += processes
        async with (
            RpcClient() as rpc,
            AdminClient(NAMESRV) as admin,
            ControllerAdmin(controller_addr, timeout=1.0) as controllers,
        ):
            await admin.create_topic(TOPIC, queues=2)
            old = (await controllers.replica_info("broker-a")).master_address or ""

            async def in_sync() -> bool:
                members = (await runtime(rpc, old)).get("syncStateSet", "")
                return len(members.split(",")) == 3 and await admin.route(TOPIC) is not None

            await until(in_sync, "three replicas in sync")
            async with (
                Producer(NAMESRV, "partition-producer", send_timeout=1.0) as producer,
                BackgroundSends(producer, TOPIC) as load,
            ):
                await asyncio.sleep(1.0)
                isolate(old.rpartition(":")[0])
                cut_at = time.monotonic()
                # past its lease the old master takes nothing, though the client still reaches it
                await asyncio.sleep(LEASE_S + 0.5)
                refused = await direct_send(rpc, old, b"after the lease")
                assert refused not in (ResponseCode.SUCCESS, -1), refused

                async def replaced() -> bool:
                    info = await controllers.replica_info("broker-a")
                    return bool(info.master_address) and info.master_address != old

                await until(replaced, "a new master")
                elected_s = time.monotonic() - cut_at
                new = (await controllers.replica_info("broker-a")).master_address or ""
                await load.until_more("acknowledged writes on the new master")
                heal()
                await until(
                    lambda: rejoined_as_slave(rpc, old, new), "the old master back as a slave"
                )
            acked = load.acked
        consumed = await read_topic(NAMESRV, "partition-check", TOPIC)
        lost = acked - consumed
        assert not lost, f"{len(lost)} acknowledged messages lost"
        assert b"after the lease" not in consumed
        return {
            "old_master": old,
            "new_master": new,
            "refused_code": refused,
            "elected_s": round(elected_s, 2),
            "acknowledged": len(acked),
        }
    finally:
        for server in reversed(servers):
            server.stop()


def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    outcome = asyncio.run(scenario(Path(sys.argv[1])))
    sys.stdout.write(json.dumps(outcome) + "\n")


if __name__ == "__main__":
    main()
