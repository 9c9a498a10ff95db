"""Clock jumps on real processes through TEST_CLOCK (`ferrymq.clock`, started with
FERRYMQ_TEST_CLOCK=1; a process started without it refuses and keeps serving).

- A jump forward on the controllers' leader: broker liveness runs on the leader's clock, so a
  silent master (SIGSTOP) whose heartbeat timeout is ten minutes on a true clock is replaced at
  once; the old master, resumed, takes no write and becomes a slave; nothing acknowledged is lost.
- A jump back on a master cut off from the controllers (needs a private network namespace): its
  lease does not stretch over the step, so it refuses writes and appends nothing until it hears
  from the controllers again (`clock_scenario.py`).

Each test gets its own loopback addresses (127.x.y.*), as Raft peers need theirs before start.
"""

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.producer import Producer
from ferrymq.client.testclock import ClockFault, move_clock
from ferrymq.clock import TEST_CLOCK_ENV
from ferrymq.errors import FerryError, RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import ResponseCode

from .group_load import read_topic, runtime
from .master_partition_scenario import direct_send
from .netns import needs_netns, run_scenario
from .procs import Server, start

pytestmark = pytest.mark.system

TOPIC = "Partitioned"  # what `direct_send` sends to
GROUP = "broker-a"
SILENT_FOR_S = 600
"""The brokers' controllerHeartBeatTimeoutMills, in seconds: far longer than the test runs."""


async def until(condition: Callable[[], Awaitable[bool]], what: str, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if await condition():
                return
        except FerryError:
            pass
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.05)


async def test_a_jump_forward_on_the_controller_leader_replaces_a_silent_master_safely(
    tmp_path: Path,
) -> None:
    prefix = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    controllers = {f"c{i}": f"{prefix}.{i}:9878" for i in (1, 2, 3)}
    namesrv = f"{prefix}.4:9876"
    hosts = [f"{prefix}.5", f"{prefix}.6"]
    test_clock = {TEST_CLOCK_ENV: "1"}
    peers = ",".join(f"{n}={a}" for n, a in controllers.items())
    servers: list[Server] = []
    acked: set[bytes] = set()
    try:
        for node in controllers:
            args = ["controller", "--id", node, "--peers", peers]
            server = start(
                [*args, "--data-dir", str(tmp_path / node)], tmp_path, node, env=test_clock
            )
            servers.append(server)
        # this one was started without the test clock: it refuses, and serves on
        servers.append(start(["namesrv", "--listen", namesrv], tmp_path, "namesrv"))
        controller_addr = ";".join(controllers.values())
        brokers = {
            host: start(
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
                    namesrv,
                    "--store-dir",
                    str(tmp_path / host),
                    "--controller-heart-beat-timeout-mills",
                    str(SILENT_FOR_S * 1000),
                ],
                tmp_path,
                f"broker-{host}",
                timeout=60,
                env=test_clock,
            )
            for host in hosts
        }
        servers += brokers.values()
        async with (
            RpcClient() as rpc,
            AdminClient(namesrv) as admin,
            ControllerAdmin(controller_addr, timeout=1.0) as controller_admin,
        ):
            with pytest.raises(RemoteError) as refused:
                await move_clock(rpc, namesrv, ClockFault.BUMP, delta_ms=1000)
            assert refused.value.code == ResponseCode.NO_PERMISSION

            await admin.create_topic(TOPIC, queues=2)
            info = await controller_admin.replica_info(GROUP)
            old, epoch = info.master_address or "", info.master_epoch or 0

            async def in_sync() -> bool:
                members = (await runtime(rpc, old)).get("syncStateSet", "")
                return len(members.split(",")) == 2 and await admin.route(TOPIC) is not None

            await until(in_sync, "two replicas in sync")
            async with Producer(namesrv, "clock-producer", send_timeout=2.0) as producer:
                for i in range(50):
                    body = b"before-%03d" % i
                    await producer.send(TOPIC, body)
                    acked.add(body)

            old_process = brokers[old.rpartition(":")[0]].process
            os.kill(old_process.pid, signal.SIGSTOP)
            try:
                leader = await controller_admin.leader()
                moved = await move_clock(
                    rpc, leader, ClockFault.BUMP, delta_ms=2 * SILENT_FOR_S * 1000
                )
                assert moved.offset_ms == 2 * SILENT_FOR_S * 1000

                async def replaced() -> bool:
                    now = await controller_admin.replica_info(GROUP)
                    return bool(now.master_address) and now.master_address != old

                await until(replaced, "a new master after the leader's clock jumped")
                info = await controller_admin.replica_info(GROUP)
                new = info.master_address or ""
                assert (info.master_epoch or 0) > epoch
            finally:
                os.kill(old_process.pid, signal.SIGCONT)

            # the old master's lease ran out while it was stopped: it takes nothing, then follows
            assert await direct_send(rpc, old, b"to the deposed master") != ResponseCode.SUCCESS

            async def follows() -> bool:
                return (await runtime(rpc, old)).get("brokerRole") == "SLAVE"

            await until(follows, "the old master as a slave")
            await move_clock(rpc, leader, ClockFault.RESET)
            async with Producer(namesrv, "clock-producer", send_timeout=2.0) as producer:
                for i in range(50):
                    body = b"after-%03d" % i
                    try:
                        await producer.send(TOPIC, body)
                    except FerryError:
                        continue
                    acked.add(body)
            assert any(body.startswith(b"after") for body in acked)
            assert (await runtime(rpc, new)).get("brokerRole") == "SYNC_MASTER"

        consumed = await read_topic(namesrv, "clock-check", TOPIC)
        assert not acked - consumed, f"{len(acked - consumed)} acknowledged messages lost"
        assert b"to the deposed master" not in consumed
    finally:
        for server in reversed(servers):
            server.stop()


@needs_netns
def test_a_jump_back_on_a_master_cut_off_from_the_controllers_does_not_stretch_its_lease(
    tmp_path: Path,
) -> None:
    outcome = run_scenario("clock_scenario", tmp_path)
    assert outcome["appended_while_cut_off"] == 0
    assert outcome["refused_code"] == ResponseCode.SERVICE_NOT_AVAILABLE
