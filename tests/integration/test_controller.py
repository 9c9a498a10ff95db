"""A controller node over real sockets: the broker-id protocol, elections, liveness, bad input.

Most tests run one node (a one-member Raft group); one runs three nodes in this process. Separate
processes killed with SIGKILL are in tests/system/test_controller.py.
"""

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TypeVar

import pytest

from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.cmd.controller import ControllerParts
from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.server import ControllerNode
from ferrymq.controller.state import ControllerState
from ferrymq.errors import RemoteError
from ferrymq.raft.config import RaftConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    BrokerHeartbeatRequestHeader,
    NotifyBrokerRoleChangedRequestHeader,
    SyncStateSet,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

T = TypeVar("T")

CLUSTER = "DefaultCluster"
NAME = "broker-a"
POLICY = ControllerConfig(
    broker_heartbeat_timeout_millis=400,
    master_lease_millis=150,
    lease_margin_millis=50,
    election_grace_period_millis=400,
    first_election_wait_millis=300,
    scan_not_active_broker_interval=50,
)


async def wait_for(predicate: Callable[[], Awaitable[T | None]], timeout: float = 5.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


RAFT = RaftConfig(tick_interval=0.02, election_ticks=10, heartbeat_ticks=1, snapshot_interval=20)


@dataclasses.dataclass
class Controller:
    parts: ControllerParts
    server: RpcServer
    address: str

    @property
    def node(self) -> ControllerNode:
        return self.parts.node


def _closed(holder: list[ControllerParts], conn: Connection) -> None:
    holder[0].connection_closed(conn)


async def start_controllers(root: Path, count: int, stack: AsyncExitStack) -> dict[str, Controller]:
    """`count` controller nodes in this process, each on its own port and data directory."""
    routers: dict[str, tuple[Router, list[ControllerParts]]] = {}
    servers: dict[str, RpcServer] = {}
    for index in range(1, count + 1):
        node_id = f"n{index}"
        router = Router(f"controller {node_id}")
        holder: list[ControllerParts] = []
        server = RpcServer(router, on_close=functools.partial(_closed, holder))
        await server.start()
        stack.push_async_callback(server.close)
        routers[node_id], servers[node_id] = (router, holder), server
    peers = {node_id: server.address for node_id, server in servers.items()}
    controllers = {}
    for node_id, (router, holder) in routers.items():
        parts = ControllerParts(node_id, peers, root / node_id, POLICY, RAFT)
        holder.append(parts)
        parts.register(router)
        await parts.start()
        stack.push_async_callback(parts.close)
        controllers[node_id] = Controller(parts, servers[node_id], peers[node_id])
    return controllers


async def leader_of(controllers: dict[str, Controller]) -> Controller:
    async def serving() -> Controller | None:
        found = [c for c in controllers.values() if c.node.is_serving]
        return found[0] if len(found) == 1 else None

    return await wait_for(serving)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with AsyncExitStack() as stack:
        controllers = await start_controllers(tmp_path, 1, stack)
        yield await leader_of(controllers)


async def _true(value: bool) -> bool:
    return value


@pytest.fixture
async def admin(controller: Controller) -> AsyncIterator[ControllerAdmin]:
    async with ControllerAdmin(controller.address, timeout=3.0) as client:
        yield client


class Broker:
    """A broker's controller-facing side: its own RPC server records role-change pushes."""

    def __init__(
        self,
        broker_id: int,
        server: RpcServer,
        notified: list[NotifyBrokerRoleChangedRequestHeader],
    ) -> None:
        self.broker_id = broker_id
        self.server = server
        self.notified = notified
        self.rpc = RpcClient()

    async def heartbeat(
        self, controller: str, max_log_offset: int = 0, epoch: int = 0
    ) -> RemotingCommand:
        header = BrokerHeartbeatRequestHeader(
            cluster_name=CLUSTER,
            broker_addr=self.server.address,
            broker_name=NAME,
            broker_id=self.broker_id,
            epoch=epoch,
            max_offset=max_log_offset,
            heartbeat_timeout_mills=400,
        )
        request = RemotingCommand(
            code=RequestCode.BROKER_HEARTBEAT, ext_fields=to_ext_fields(header)
        )
        return await self.rpc.call(controller, request, 3.0)


async def _broker(broker_id: int) -> Broker:
    notified: list[NotifyBrokerRoleChangedRequestHeader] = []
    router = Router("Broker")

    async def on_notify(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        notified.append(from_ext_fields(NotifyBrokerRoleChangedRequestHeader, request.ext_fields))
        return None

    router.add(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, on_notify)
    server = RpcServer(router)
    await server.start()
    return Broker(broker_id, server, notified)


@pytest.fixture
async def brokers() -> AsyncIterator[list[Broker]]:
    made = [await _broker(i) for i in (1, 2, 3)]
    try:
        yield made
    finally:
        for broker in made:
            await broker.rpc.close()
            await broker.server.close()


async def _register_all(admin: ControllerAdmin, brokers: list[Broker]) -> None:
    for broker in brokers:
        next_id = await admin.next_broker_id(CLUSTER, NAME)
        assert next_id == broker.broker_id
        code = f"{broker.server.address};{next_id}"
        await admin.apply_broker_id(CLUSTER, NAME, next_id, code)
        await admin.apply_broker_id(CLUSTER, NAME, next_id, code)  # an idempotent retry
        info = await admin.register_broker(CLUSTER, NAME, next_id, broker.server.address)
        assert info.master_broker_id is None


async def test_brokers_get_ids_and_the_first_election_picks_by_data(
    controller: Controller, admin: ControllerAdmin, brokers: list[Broker]
) -> None:
    await _register_all(admin, brokers)
    with pytest.raises(RemoteError) as taken:
        await admin.apply_broker_id(CLUSTER, NAME, 2, "127.0.0.9:1;9")
    assert taken.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    for broker, log_offset in zip(brokers, (100, 300, 200), strict=True):
        assert (await broker.heartbeat(controller.address, log_offset)).code == ResponseCode.SUCCESS
    result = await admin.elect_master(CLUSTER, NAME, 1)
    assert not result.still_exists
    assert result.header.master_broker_id == 2
    assert result.header.master_epoch == 1
    info = await admin.replica_info(NAME)
    assert (info.master_broker_id, info.master_address) == (2, brokers[1].server.address)
    assert info.sync_state_set == SyncStateSet(sync_state_set=[2], sync_state_set_epoch=1)
    await wait_for(lambda: _true(all(b.notified for b in brokers)))
    assert {b.notified[-1].master_broker_id for b in brokers} == {2}
    again = await admin.elect_master(CLUSTER, NAME, 3)
    assert again.still_exists
    assert again.header.master_broker_id == 2


async def test_a_dead_master_is_replaced_after_its_lease_and_brokers_are_told(
    controller: Controller, admin: ControllerAdmin, brokers: list[Broker]
) -> None:
    await _register_all(admin, brokers)
    for broker in brokers:
        await broker.heartbeat(controller.address, 100)
    await admin.elect_master(CLUSTER, NAME, None, designate=False)
    master = (await admin.replica_info(NAME)).master_broker_id
    assert master is not None
    expanded = await admin.alter_sync_state_set(
        NAME, master, 1, SyncStateSet(sync_state_set=[1, 2, 3], sync_state_set_epoch=1)
    )
    assert expanded == SyncStateSet(sync_state_set=[1, 2, 3], sync_state_set_epoch=2)
    dead = brokers[master - 1]
    survivors = [b for b in brokers if b is not dead]
    await dead.rpc.close()  # kill -9 closes its connections

    async def new_master() -> int | None:
        for broker in survivors:
            await broker.heartbeat(controller.address, 100)
        info = await admin.replica_info(NAME)
        return info.master_broker_id if info.master_broker_id != master else None

    elected = await wait_for(new_master)
    assert elected in {b.broker_id for b in survivors}
    info = await admin.replica_info(NAME)
    assert info.master_epoch == 2
    await wait_for(lambda: _true(all(b.notified for b in survivors)))
    assert all(b.notified[-1].master_epoch == 2 for b in survivors)
    stale = admin.alter_sync_state_set(
        NAME, elected, 1, SyncStateSet(sync_state_set=[1, 2, 3], sync_state_set_epoch=3)
    )
    with pytest.raises(RemoteError) as fenced:
        await stale
    assert fenced.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH


async def test_followers_name_the_leader_and_a_new_leader_keeps_every_committed_event(
    tmp_path: Path, brokers: list[Broker]
) -> None:
    async with AsyncExitStack() as stack:
        controllers = await start_controllers(tmp_path, 3, stack)
        leader = await leader_of(controllers)
        addresses = ";".join(c.address for c in controllers.values())
        async with ControllerAdmin(addresses, timeout=5.0) as admin:
            await _register_all(admin, brokers)
            for broker in brokers:
                for c in controllers.values():
                    await broker.heartbeat(c.address, 100)
            await admin.elect_master(CLUSTER, NAME, 1)
            follower = next(c for c in controllers.values() if c is not leader)
            applied = follower.node.state.applied_index
            async with RpcClient() as rpc:
                request = RemotingCommand(
                    code=RequestCode.CONTROLLER_APPLY_BROKER_ID,
                    ext_fields={
                        "clusterName": CLUSTER,
                        "brokerName": NAME,
                        "appliedBrokerId": "9",
                        "registerCheckCode": "h:1;1",
                    },
                )
                response = await rpc.call(follower.address, request, 3.0)
            assert response.code == ResponseCode.CONTROLLER_NOT_LEADER
            assert response.ext_fields["controllerLeaderAddress"] == leader.address
            assert response.remark
            assert leader.parts.raft.node_id in response.remark
            meta = await admin.metadata(follower.address)
            assert not meta.is_leader
            assert meta.controller_leader_address == leader.address
            await wait_for(lambda: _true(follower.node.state.applied_index >= applied))
            assert 9 not in follower.node.state.groups[NAME].replicas
            before = leader.node.state.snapshot()
            await leader.parts.close()
            survivors = {k: c for k, c in controllers.items() if c is not leader}
            new_leader = await leader_of(survivors)
            info = await admin.replica_info(NAME)
            assert info.master_epoch == 1
            restored = ControllerState()
            restored.restore(before)
            assert new_leader.node.state.groups == restored.groups
            assert await admin.next_broker_id(CLUSTER, NAME) == 4


async def test_a_new_leader_pushes_every_groups_master_an_old_leader_did_not_announce(
    tmp_path: Path, brokers: list[Broker]
) -> None:
    async with AsyncExitStack() as stack:
        controllers = await start_controllers(tmp_path, 3, stack)
        leader = await leader_of(controllers)
        addresses = ";".join(c.address for c in controllers.values())
        async with ControllerAdmin(addresses, timeout=5.0) as admin:
            await _register_all(admin, brokers)
            for broker in brokers:
                await broker.heartbeat(leader.address, 100)
            # the leader elects broker 2 but dies before telling anyone (pushes switched off
            # here stand for the notification lost with it); the brokers do not poll
            await admin.update_config({"notifyBrokerRoleChanged": "false"})
            elected = await admin.elect_master(CLUSTER, NAME, 2, designate=True)
            assert elected.header.master_broker_id == 2
            epoch = elected.header.master_epoch
            await admin.update_config({"notifyBrokerRoleChanged": "true"})
            assert not any(b.notified for b in brokers)
            await leader.parts.close()
            await leader.server.close()
            survivors = {k: c for k, c in controllers.items() if c is not leader}
            await leader_of(survivors)
            # the new leader has heard none of them yet: it tells every registered broker
            await wait_for(lambda: _true(all(b.notified for b in brokers)))
            for broker in brokers:
                assert broker.notified[-1].master_broker_id == 2
                assert broker.notified[-1].master_epoch == epoch


@pytest.mark.parametrize(
    ("code", "ext_fields", "body", "expected"),
    [
        (
            RequestCode.CONTROLLER_APPLY_BROKER_ID,
            {"brokerName": "b"},
            b"",
            ResponseCode.CONTROLLER_INVALID_REQUEST,
        ),
        (
            RequestCode.CONTROLLER_ELECT_MASTER,
            {"brokerId": "x"},
            b"",
            ResponseCode.CONTROLLER_INVALID_REQUEST,
        ),
        (
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            {"brokerName": "b", "masterBrokerId": "1", "masterEpoch": "1"},
            b"{not json",
            ResponseCode.CONTROLLER_INVALID_REQUEST,
        ),
        (
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
            {},
            b'{"a": 1}',
            ResponseCode.CONTROLLER_INVALID_REQUEST,
        ),
        (
            RequestCode.BROKER_HEARTBEAT,
            {"clusterName": "c", "brokerName": "b", "brokerAddr": "h:1"},
            b"",
            ResponseCode.CONTROLLER_INVALID_REQUEST,
        ),
        (RequestCode.UPDATE_CONTROLLER_CONFIG, {}, b"\xff\xfe", ResponseCode.INVALID_PARAMETER),
        (
            RequestCode.UPDATE_CONTROLLER_CONFIG,
            {},
            b"configStorePath=/x",
            ResponseCode.NO_PERMISSION,
        ),
        (
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            {"brokerName": "nope"},
            b"",
            ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
        ),
        (1099, {}, b"", ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
    ],
)
async def test_bad_requests_get_typed_answers_and_change_nothing(
    controller: Controller, code: int, ext_fields: dict[str, str], body: bytes, expected: int
) -> None:
    before = controller.node.state.snapshot()
    async with RpcClient() as rpc:
        request = RemotingCommand(code=code, ext_fields=ext_fields, body=body)
        response = await rpc.call(controller.address, request, 3.0)
    assert response.code == expected, response.remark
    assert response.remark
    assert controller.node.state.snapshot() == before


async def test_config_changes_are_replicated_and_read_back(
    controller: Controller, admin: ControllerAdmin
) -> None:
    assert (await admin.config())["enableElectUncleanMaster"] == "false"
    await admin.update_config({"enableElectUncleanMaster": "true"})
    assert (await admin.config())["enableElectUncleanMaster"] == "true"
    assert controller.node.state.config_overrides == {"enableElectUncleanMaster": "true"}
    with pytest.raises(RemoteError) as refused:
        await admin.update_config({"masterLeaseMillis": "never"})
    assert refused.value.code == ResponseCode.INVALID_PARAMETER


async def test_clean_broker_data_refuses_living_brokers(
    controller: Controller, admin: ControllerAdmin, brokers: list[Broker]
) -> None:
    await _register_all(admin, brokers[:2])
    await brokers[0].heartbeat(controller.address)
    with pytest.raises(RemoteError) as alive:
        await admin.clean_broker_data(CLUSTER, NAME, [1])
    assert alive.value.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    await admin.clean_broker_data(CLUSTER, NAME, [2])
    data = await admin.sync_state_data([NAME])
    replicas = data.replicas_info_table[NAME].not_in_sync_replicas
    assert [(r.broker_id, r.alive) for r in replicas] == [(1, True)]
