"""Double faults in controller mode (issue 7): the controller leader and the master killed
together, then a master killed and one of its slaves killed during the election. Afterwards:
exactly one master, replicas byte-identical up to the confirm offset, nothing acknowledged lost.
"""

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient

from .group_load import BackgroundSends, read_topic, runtime

pytestmark = pytest.mark.system

TOPIC = "DoubleFaults"


def _log_bytes(store: Path, end: int) -> bytes:
    data = b""
    for segment in sorted((store / "commitlog").iterdir()):
        start = int(segment.name)
        if start >= end:
            break
        with segment.open("rb") as file:
            data += file.read(end - start)
    return data[:end]


async def test_two_failures_at_once_leave_one_master_and_lose_nothing(tmp_path: Path) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, replicas=3, controllers=3))
    await cluster.start()
    controller_addr = ";".join(cluster.controller_addrs.values())
    try:
        async with (
            AdminClient(cluster.namesrv_addr) as admin,
            RpcClient() as rpc,
            ControllerAdmin(controller_addr, timeout=1.0) as controllers,
            Producer(cluster.namesrv_addr, send_timeout=1.0) as producer,
        ):
            await admin.create_topic(TOPIC, queues=2)

            async def master() -> tuple[str, str]:
                info = await controllers.replica_info("broker-a")
                address = info.master_address or ""
                names = [n for n, c in cluster.brokers.items() if c.addr == address]
                return address, names[0] if names else ""

            async def until_in_sync() -> None:
                deadline = time.monotonic() + 60
                while True:
                    with contextlib.suppress(FerryError):
                        address, _ = await master()
                        if address:
                            members = (await runtime(rpc, address)).get("syncStateSet", "")
                            if members.count(",") == 2 and await admin.route(TOPIC):
                                return
                    assert time.monotonic() < deadline, "the group never got back in sync"
                    await asyncio.sleep(0.1)

            async def until_new_master(old: str) -> str:
                deadline = time.monotonic() + 60
                while True:
                    with contextlib.suppress(FerryError):
                        address, name = await master()
                        if address and address != old and name:
                            return name
                    assert time.monotonic() < deadline, "no new master"
                    await asyncio.sleep(0.05)

            await until_in_sync()
            async with BackgroundSends(producer, TOPIC, b"d") as load:
                # 1: the controller leader and the master die together
                await asyncio.sleep(1.0)
                leader_addr = await controllers.leader()
                leader = next(n for n, a in cluster.controller_addrs.items() if a == leader_addr)
                old_addr, old_name = await master()
                cluster.controllers[leader].kill()
                cluster.brokers[old_name].kill()
                await until_new_master(old_addr)
                await cluster.controllers[leader].process.wait()
                await cluster.brokers[old_name].process.wait()
                await cluster.restart_controller(leader)
                await cluster.restart(old_name)
                await until_in_sync()

                # 2: the master dies, and one of its slaves dies during the election
                await asyncio.sleep(1.0)
                old_addr, old_name = await master()
                slave = next(n for n in cluster.brokers if n != old_name)
                cluster.brokers[old_name].kill()
                await asyncio.sleep(0.5)
                cluster.brokers[slave].kill()
                survivor = await until_new_master(old_addr)
                assert survivor not in (old_name, slave)
                for name in (old_name, slave):
                    await cluster.brokers[name].process.wait()
                    await cluster.restart(name)
                await until_in_sync()
                await asyncio.sleep(1.0)
            acked = load.acked

            # exactly one master; every replica holds the same bytes up to the confirm offset
            infos = {n: await runtime(rpc, c.addr) for n, c in cluster.brokers.items()}
            roles = sorted(info["brokerRole"] for info in infos.values())
            assert roles == ["SLAVE", "SLAVE", "SYNC_MASTER"], roles
            deadline = time.monotonic() + 30
            while len({info["confirmOffset"] for info in infos.values()}) > 1:
                assert time.monotonic() < deadline, infos
                await asyncio.sleep(0.1)
                infos = {n: await runtime(rpc, c.addr) for n, c in cluster.brokers.items()}
            confirm = int(next(iter(infos.values()))["confirmOffset"])
            copies = {_log_bytes(tmp_path / name, confirm) for name in cluster.brokers}
            assert len(copies) == 1, "replicas differ below the confirm offset"

        consumed = await read_topic(cluster.namesrv_addr, "double-check", TOPIC)
        lost = acked - consumed
        assert acked
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost"
    finally:
        await cluster.stop()
