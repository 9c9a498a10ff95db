"""Three `ferry controller` processes: kill -9 the leader, restart it from disk, bad input.

Each test gets its own loopback addresses (127.x.y.1-3, port 9878), because Raft peers must know
each other's addresses before they start.
"""

import asyncio
import logging
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.errors import FerryError, RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    AlterSyncStateSetRequestHeader,
    BrokerHeartbeatRequestHeader,
    GetMetaDataResponseHeader,
    SyncStateSet,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields

from .procs import Server, start

pytestmark = pytest.mark.system
log = logging.getLogger(__name__)

T = TypeVar("T")
CLUSTER = "DefaultCluster"
SNAPSHOT_INTERVAL = 50


class Group:
    """Three controller processes with fixed addresses and data directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        prefix = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
        self.addrs = {f"n{i}": f"{prefix}.{i}:9878" for i in (1, 2, 3)}
        self.servers: dict[str, Server] = {}

    @property
    def peers(self) -> str:
        return ",".join(f"{node_id}={addr}" for node_id, addr in self.addrs.items())

    @property
    def controller_addr(self) -> str:
        return ";".join(self.addrs.values())

    def start(self, node_id: str) -> Server:
        server = start(
            [
                "controller",
                "--id",
                node_id,
                "--peers",
                self.peers,
                "--data-dir",
                str(self.root / node_id),
                "--snapshot-interval",
                str(SNAPSHOT_INTERVAL),
            ],
            self.root,
            node_id,
        )
        self.servers[node_id] = server
        return server

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    controllers = Group(tmp_path)
    try:
        for node_id in controllers.addrs:
            controllers.start(node_id)
        yield controllers
    finally:
        controllers.stop_all()


async def wait_for(
    predicate: Callable[[], Awaitable[T | None]], timeout: float = 20.0, what: str = "condition"
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await predicate()
        except FerryError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        await asyncio.sleep(0.05)


async def metadata(admin: ControllerAdmin, group: Group) -> dict[str, GetMetaDataResponseHeader]:
    found = {}
    for node_id, addr in group.addrs.items():
        if group.servers[node_id].process.poll() is None:
            found[node_id] = await admin.metadata(addr)
    return found


async def serving_leader(admin: ControllerAdmin, group: Group) -> str:
    async def leader() -> str | None:
        leaders = [n for n, m in (await metadata(admin, group)).items() if m.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    return await wait_for(leader, what="one serving leader")


async def test_leader_killed_new_leader_serves_nothing_committed_lost_and_restart_catches_up(
    group: Group,
) -> None:
    async with ControllerAdmin(group.controller_addr, timeout=10.0) as admin:
        first_leader = await serving_leader(admin, group)
        acked: list[str] = []
        stop = asyncio.Event()

        async def writer() -> None:
            """Registers broker groups one after another; remembers the acknowledged ones."""
            for n in range(10_000):
                if stop.is_set():
                    return
                name = f"broker-{n}"
                try:
                    await admin.apply_broker_id(CLUSTER, name, 1, f"127.0.0.1:{n};1")
                except FerryError:
                    await asyncio.sleep(0.05)  # outcome unknown or refused: not counted
                    continue
                acked.append(name)

        task = asyncio.create_task(writer())
        await wait_for(lambda: _true(len(acked) >= 3 * SNAPSHOT_INTERVAL), what="writes")
        killed_at = time.monotonic()
        group.servers[first_leader].kill()
        before_kill = len(acked)
        await wait_for(lambda: _true(len(acked) > before_kill + 20), what="writes after failover")
        failover = time.monotonic() - killed_at
        second_leader = await serving_leader(admin, group)
        assert second_leader != first_leader
        log.info("first write acknowledged by the new leader %.2f s after kill -9", failover)

        group.start(first_leader)
        await wait_for(lambda: _true(len(acked) > before_kill + 100), what="more writes")
        stop.set()
        await task

        data = await admin.sync_state_data(acked)
        missing = sorted(set(acked) - set(data.replicas_info_table))
        assert not missing, f"acknowledged but lost: {missing[:10]}"

        async def caught_up() -> bool:
            meta = await metadata(admin, group)
            applied = {m.applied_index for m in meta.values()}
            return len(meta) == 3 and len(applied) == 1

        await wait_for(caught_up, what="the restarted node applying every entry")

        group.servers[second_leader].kill()
        third = await serving_leader(admin, group)
        assert third != second_leader
        data = await admin.sync_state_data(acked)
        assert set(acked) <= set(data.replicas_info_table)
    starts = re.findall(
        r"starting at term \d+, snapshot (\d+)", group.servers[first_leader].log.read_text()
    )
    assert len(starts) == 2
    assert int(starts[-1]) > 0, "the restarted node recovered from a snapshot plus its log"


async def _true(value: bool) -> bool:
    return value


async def test_bad_input_gets_typed_answers_and_nothing_is_applied(group: Group) -> None:
    async with ControllerAdmin(group.controller_addr, timeout=10.0) as admin:
        leader = await serving_leader(admin, group)
        leader_addr = group.addrs[leader]
        follower = next(n for n in group.addrs if n != leader)
        await admin.apply_broker_id(CLUSTER, "broker-a", 1, "127.0.0.1:1;1")
        await admin.apply_broker_id(CLUSTER, "broker-a", 2, "127.0.0.1:2;2")
        await admin.register_broker(CLUSTER, "broker-a", 1, "127.0.0.1:1")
        for broker_id in (1, 2):
            await admin.heartbeat(
                BrokerHeartbeatRequestHeader(
                    cluster_name=CLUSTER,
                    broker_addr=f"127.0.0.1:{broker_id}",
                    broker_name="broker-a",
                    broker_id=broker_id,
                    heartbeat_timeout_mills=60_000,
                )
            )
        elected = await admin.elect_master(CLUSTER, "broker-a", 1, designate=True)
        assert elected.header.master_broker_id == 1
        assert elected.header.master_epoch == 1

        async def settled() -> dict[str, int] | None:
            applied = {n: m.applied_index or 0 for n, m in (await metadata(admin, group)).items()}
            return applied if len(set(applied.values())) == 1 else None

        before = await wait_for(settled, what="every node at the same index")

        stale = AlterSyncStateSetRequestHeader(
            broker_name="broker-a", master_broker_id=1, master_epoch=7
        )
        cases = [
            (leader_addr, RemotingCommand(code=1234), ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
            (
                leader_addr,
                RemotingCommand(
                    code=RequestCode.CONTROLLER_APPLY_BROKER_ID, ext_fields={"brokerName": "b"}
                ),
                ResponseCode.CONTROLLER_INVALID_REQUEST,
            ),
            (
                leader_addr,
                RemotingCommand(
                    code=RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                    ext_fields=to_ext_fields(stale),
                    body=b"\x00garbage",
                ),
                ResponseCode.CONTROLLER_INVALID_REQUEST,
            ),
            (
                leader_addr,
                RemotingCommand(
                    code=RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                    ext_fields=to_ext_fields(stale),
                    body=b'{"syncStateSet":[1,2],"syncStateSetEpoch":1}',
                ),
                ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
            ),
            (
                group.addrs[follower],
                RemotingCommand(
                    code=RequestCode.CONTROLLER_APPLY_BROKER_ID,
                    ext_fields={
                        "clusterName": CLUSTER,
                        "brokerName": "broker-z",
                        "appliedBrokerId": "1",
                        "registerCheckCode": "h:1;1",
                    },
                ),
                ResponseCode.CONTROLLER_NOT_LEADER,
            ),
        ]
        async with RpcClient() as rpc:
            for addr, request, expected in cases:
                response = await rpc.call(addr, request, 5.0)
                assert response.code == expected, response.remark
                assert response.remark
        with pytest.raises(RemoteError) as fenced:
            await admin.alter_sync_state_set(
                "broker-a", 1, 7, SyncStateSet(sync_state_set=[1, 2], sync_state_set_epoch=1)
            )
        assert fenced.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
        with pytest.raises(RemoteError) as stale_set:
            await admin.alter_sync_state_set(
                "broker-a", 1, 1, SyncStateSet(sync_state_set=[1, 2], sync_state_set_epoch=0)
            )
        assert stale_set.value.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH

        with socket.create_connection(_split(leader_addr), timeout=5) as raw:
            raw.sendall(b"\xff\xff\xff\xff not a frame at all")
            raw.settimeout(5)
            assert raw.recv(100) == b"", "a malformed frame closes that connection"
        assert await settled() == before, "nothing was applied"
        assert await admin.next_broker_id(CLUSTER, "broker-z") == 1
    for server in group.servers.values():
        assert server.process.poll() is None, "every controller is still running"


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)
