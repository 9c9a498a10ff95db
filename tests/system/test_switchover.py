"""Planned master switches under load, as real processes (issue 20 section 5).

Controller mode: `ferry admin controller elect-master GROUP --broker-id N` makes a slave of the
SyncStateSet master while a producer keeps sending; the old master carries on as a slave of the
new one, and every acknowledged message is read back. Only outcomes are asserted.
"""

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient

from .group_load import read_topic, rejoined_as_slave, runtime

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]

TOPIC = "Switchover"
_MAX_SENDS = 20_000


@dataclass
class _Load:
    """A producer sending one message after another until told to stop; every outcome kept."""

    producer: Producer
    acked: dict[bytes, str] = field(default_factory=dict)
    """Body -> address of the master that acknowledged it."""
    unknown: set[bytes] = field(default_factory=set)
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        for i in range(_MAX_SENDS):
            if self.stop.is_set():
                return
            body = b"m-%05d" % i
            try:
                result = await self.producer.send(TOPIC, body)
            except SendOutcomeUnknownError:
                self.unknown.add(body)
            except FerryError:
                self.failed += 1
                await asyncio.sleep(0.05)
            else:
                master = self.producer.routes.master_of(result.queue.broker_name)
                self.acked[body] = master or "?"


def _acked(load: _Load, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(load.acked) >= count

    return check


async def _wait(what: str, predicate: Callable[[], Awaitable[bool]], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.1)


async def _ferry(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _master(admin: AdminClient) -> str | None:
    route = await admin.route(TOPIC)
    if route is None:
        return None
    return route.broker_datas[0].broker_addrs.get(0)


def _check_nothing_lost(load: _Load, stored: set[bytes]) -> None:
    lost = sorted(set(load.acked) - stored)
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    unexpected = sorted(stored - set(load.acked) - load.unknown)
    assert not unexpected, unexpected[:5]


async def test_elect_master_with_a_broker_id_switches_masters_under_load(tmp_path: Path) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, replicas=3, controllers=3))
    await cluster.start()
    try:
        async with (
            AdminClient(cluster.namesrv_addr) as admin,
            RpcClient() as rpc,
            Producer(cluster.namesrv_addr, send_timeout=5.0) as producer,
        ):
            await admin.create_topic(TOPIC, queues=2)
            old_master: str | None = None

            async def in_sync() -> bool:
                nonlocal old_master
                old_master = await _master(admin)
                if old_master is None:
                    return False
                info = await runtime(rpc, old_master)
                return len(info.get("syncStateSet", "").split(",")) == 3

            await _wait("a full SyncStateSet", in_sync)
            assert old_master is not None
            target = next(c for c in cluster.brokers.values() if c.addr != old_master)
            target_id = int(str(target.info["broker_id"]))

            load = _Load(producer)
            sending = asyncio.create_task(load.run())

            await _wait("sends before the switch", _acked(load, 100))
            code, out, err = await _ferry(
                "admin",
                "controller",
                "--controller",
                ";".join(cluster.controller_addrs.values()),
                "elect-master",
                "broker-a",
                "--broker-id",
                str(target_id),
                "--json",
            )
            assert code == 0, err
            answer = json.loads(out)
            assert answer["masterBrokerId"] == target_id
            assert answer["masterAddress"] == target.addr
            assert answer["stillExists"] is False

            async def moved() -> bool:
                return await _master(admin) == target.addr

            await _wait("the route names the new master", moved)
            before = len(load.acked)
            await _wait("sends after the switch", _acked(load, before + 100))
            load.stop.set()
            await sending

            async def rejoined() -> bool:
                assert old_master is not None
                return await rejoined_as_slave(rpc, old_master, target.addr)

            await _wait("the old master follows the new one", rejoined)

            async def settled() -> bool:
                info = await runtime(rpc, target.addr)
                return info.get("confirmOffset") == info.get("commitLogMaxOffset")

            await _wait("the new master committed its whole log", settled)
            assert any(address == target.addr for address in load.acked.values())
        _check_nothing_lost(load, await read_topic(cluster.namesrv_addr, "Check", TOPIC))
    finally:
        await cluster.stop()


async def test_a_classic_switchover_swaps_master_and_slave_under_load_and_survives_restarts(
    tmp_path: Path,
) -> None:
    """Classic mode (no controllers): `ferry admin broker switchover` at runtime, seed 004."""
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, replicas=3, controllers=0))
    await cluster.start()
    try:
        async with (
            AdminClient(cluster.namesrv_addr) as admin,
            RpcClient() as rpc,
            Producer(cluster.namesrv_addr, send_timeout=5.0) as producer,
        ):
            await admin.create_topic(TOPIC, queues=2)
            names = {int(str(c.info["broker_id"])): n for n, c in cluster.brokers.items()}
            old_master = cluster.brokers[names[0]].addr
            target = cluster.brokers[names[1]].addr
            other = cluster.brokers[names[2]].addr

            async def in_sync() -> bool:
                info = await runtime(rpc, old_master)
                return info.get("syncStateSet") == "0,1,2" and await _master(admin) == old_master

            await _wait("a full SyncStateSet", in_sync)
            old_epoch = int((await runtime(rpc, old_master))["masterEpoch"])
            load = _Load(producer)
            sending = asyncio.create_task(load.run())
            await _wait("sends before the switch", _acked(load, 100))
            code, out, err = await _ferry(
                "admin",
                "--namesrv",
                cluster.namesrv_addr,
                "broker",
                "switchover",
                "broker-a",
                "--to-broker-id",
                "1",
                "--json",
            )
            assert code == 0, err
            answer = json.loads(out)
            assert (answer["oldMaster"], answer["newMaster"]) == (old_master, target)
            assert answer["oldMasterBrokerId"] == 1
            assert answer["masterEpoch"] == old_epoch + 1

            async def moved() -> bool:
                return await _master(admin) == target

            await _wait("the route names the new master", moved)
            before = len(load.acked)
            await _wait("sends after the switch", _acked(load, before + 100))
            load.stop.set()
            await sending
            assert any(address == target for address in load.acked.values())

            async def followed() -> bool:
                return await rejoined_as_slave(rpc, old_master, target) and await rejoined_as_slave(
                    rpc, other, target
                )

            await _wait("the old master and the other slave follow the new master", followed)
            info = await runtime(rpc, old_master)
            assert info["brokerRole"] == "SLAVE"
            assert (await runtime(rpc, target))["brokerRole"] == "SYNC_MASTER"

            # the switched roles outlive a crash: both restart in them, not in their flags'
            for name in (names[0], names[1]):
                cluster.brokers[name].kill()
                await cluster.brokers[name].process.wait()
                await cluster.restart(name)
            old_master = cluster.brokers[names[0]].addr  # restarted on new ports
            target = cluster.brokers[names[1]].addr

            async def again() -> bool:
                return await _master(admin) == target and await rejoined_as_slave(
                    rpc, old_master, target
                )

            await _wait("the same roles after restarts", again)
            async with Producer(cluster.namesrv_addr) as after:
                result = await after.send(TOPIC, b"after the restarts")
            assert after.routes.master_of(result.queue.broker_name) == target
            load.acked[b"after the restarts"] = target

            async def settled() -> bool:
                info = await runtime(rpc, target)
                return info.get("confirmOffset") == info.get("commitLogMaxOffset")

            await _wait("the new master committed its whole log", settled)
        _check_nothing_lost(load, await read_topic(cluster.namesrv_addr, "Check", TOPIC))
    finally:
        await cluster.stop()
