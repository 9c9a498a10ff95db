"""A master cut off from the controllers whose clock then jumps back; run in a private netns.

`python -m tests.system.clock_scenario DIR` must run under `unshare --net --pid --mount-proc
--fork --kill-child` (test_clock.py does that). Three controllers, a NameServer and a group of
three replicas (started with FERRYMQ_TEST_CLOCK=1) as in `master_partition_scenario`; with a
producer running, the master loses the controllers (nftables on `lo`; its slaves and the clients
still reach it) and its clock is stepped back ten minutes. The lease it got from its last
heartbeat answer must not cover the stepped-back clock: sends straight to it are refused before
anything is appended, until healing. The controllers elect another master meanwhile. After
healing and a clock reset the old master rejoins as a slave and nothing acknowledged is lost.
Exits 0 when every check holds and prints one JSON line.
"""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.producer import Producer
from ferrymq.client.testclock import ClockFault, move_clock
from ferrymq.clock import TEST_CLOCK_ENV
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import ResponseCode

from .group_load import BackgroundSends, read_topic, rejoined_as_slave, runtime
from .master_partition_scenario import BROKERS, CONTROLLERS, NAMESRV, TOPIC, direct_send
from .master_partition_scenario import until as until_true
from .procs import Server, start

TABLE = "ferrymq_clock"
BACK_MS = -600_000


def cut_from_controllers(host: str) -> None:
    """Drop every packet between `host` and the controllers."""
    controllers = ", ".join(a.rpartition(":")[0] for a in CONTROLLERS.values())
    rules = f"""table inet {TABLE} {{
  chain input {{
    type filter hook input priority 0; policy accept;
    ip saddr {host} ip daddr {{ {controllers} }} drop
    ip saddr {{ {controllers} }} ip daddr {host} drop
  }}
}}
"""
    subprocess.run(["nft", "-f", "-"], input=rules.encode(), check=True)


def heal() -> None:
    """Remove the cut."""
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


async def scenario(workdir: Path) -> dict[str, object]:
    env = {TEST_CLOCK_ENV: "1"}
    peers = ",".join(f"{n}={a}" for n, a in CONTROLLERS.items())
    servers: list[Server] = [
        start(
            ["controller", "--id", node, "--peers", peers, "--data-dir", str(workdir / node)],
            workdir,
            node,
            env=env,
        )
        for node in CONTROLLERS
    ]
    servers.append(start(["namesrv", "--listen", NAMESRV], workdir, "namesrv", env=env))
    controller_addr = ";".join(CONTROLLERS.values())
    try:
        for host in BROKERS:
            args = ["broker", "--controller-mode", "--controller", controller_addr]
            args += ["--listen", f"{host}:10911", "--broker-ip1", host, "--namesrv", NAMESRV]
            args += ["--store-dir", str(workdir / host)]
            servers.append(start(args, workdir, f"broker-{host}", timeout=60, env=env))
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

            await until_true(in_sync, "three replicas in sync")
            assert await direct_send(rpc, old, b"before the cut") == ResponseCode.SUCCESS
            async with (
                Producer(NAMESRV, "clock-producer", send_timeout=1.0) as producer,
                BackgroundSends(producer, TOPIC) as load,
            ):
                await asyncio.sleep(1.0)
                cut_from_controllers(old.rpartition(":")[0])
                await move_clock(rpc, old, ClockFault.BUMP, delta_ms=BACK_MS)
                end = int((await runtime(rpc, old))["commitLogMaxOffset"])
                refused = await direct_send(rpc, old, b"after the jump")

                async def replaced() -> bool:
                    info = await controllers.replica_info("broker-a")
                    return bool(info.master_address) and info.master_address != old

                await until_true(replaced, "a new master")
                new = (await controllers.replica_info("broker-a")).master_address or ""
                again = await direct_send(rpc, old, b"after the election")
                appended = int((await runtime(rpc, old))["commitLogMaxOffset"]) - end
                heal()
                await move_clock(rpc, old, ClockFault.RESET)
                await until_true(
                    lambda: rejoined_as_slave(rpc, old, new), "the old master back as a slave"
                )
                await load.until_more("acknowledged writes after healing")
            acked = load.acked
        consumed = await read_topic(NAMESRV, "clock-check", TOPIC)
        lost = acked - consumed
        assert not lost, f"{len(lost)} acknowledged messages lost"
        assert b"after the jump" not in consumed
        assert b"after the election" not in consumed
        assert again != ResponseCode.SUCCESS, again
        return {
            "old_master": old,
            "new_master": new,
            "refused_code": refused,
            "appended_while_cut_off": appended,
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
