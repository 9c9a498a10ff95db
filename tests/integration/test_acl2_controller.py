"""ACL 2.0 with controllers (issue 23): the controllers keep users and ACLs and check them too.

In process, real sockets: three controller nodes with authenticationEnabled (and their init
user root), a NameServer and two single-replica broker groups in controller mode with ACL 2.0.
Every server process signs its own calls as root (the installed process credentials). And one
node alone: a broker signing with a wrong password gets no id, registration or heartbeat in.
"""

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.cmd.controller import ControllerParts, ControllerServer
from ferrymq.controller.config import ControllerConfig
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.raft.config import RaftConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.security.acl import Credentials
from ferrymq.security.acl2guard import Acl2Config, Acl2Guard
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import GetRouteInfoRequestHeader

from .remoting import create_topic, send
from .test_acl_controller import stranger_registration

ROOT = Credentials("root", "root-pw")
ALICE = Credentials("alice", "alice-pw")
AUTH = Acl2Config(
    authentication_enabled=True,
    authorization_enabled=True,
    init_authentication_user='{"username": "root", "password": "root-pw"}',
)
POLICY = ControllerConfig(
    broker_heartbeat_timeout_millis=1000,
    election_grace_period_millis=500,
    first_election_wait_millis=500,
    scan_not_active_broker_interval=100,
)
RAFT = RaftConfig(tick_interval=0.02, election_ticks=10, heartbeat_ticks=1, snapshot_interval=5)


async def _until(condition: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.02)


@dataclasses.dataclass
class _Node:
    node_id: str
    root: Path
    port: int = 0
    parts: ControllerParts | None = None
    server: RpcServer | None = None
    guard: Acl2Guard[Connection, Any] | None = None

    def _closed(self, conn: Connection) -> None:
        if self.parts is not None:
            self.parts.connection_closed(conn)

    async def listen(self) -> str:
        router = Router(f"controller {self.node_id}")
        self.router = router
        self.server = RpcServer(
            _Deferred(self), host="127.0.0.1", port=self.port, on_close=self._closed
        )
        await self.server.start()
        self.port = int(self.server.address.rsplit(":", 1)[1])
        return self.server.address

    async def start(self, peers: dict[str, str]) -> None:
        self.parts = ControllerParts(
            self.node_id, peers, self.root / self.node_id, POLICY, RAFT, AUTH
        )
        self.parts.register(self.router)
        self.guard = self.parts.auth_guard(self.router, self.node_id)
        await self.parts.start()

    async def stop(self) -> None:
        if self.parts is not None:
            await self.parts.close()
        if self.server is not None:
            await self.server.close()
        self.parts = self.server = self.guard = None


class _Deferred:
    """The node's guard, once its parts exist (the port is bound first: peers need it)."""

    def __init__(self, node: _Node) -> None:
        self.node = node

    async def __call__(self, conn: Connection, request: RemotingCommand) -> Any:
        guard = self.node.guard
        assert guard is not None
        return await guard(conn, request)


def _broker_config(root: Path, name: str, controllers: str, namesrv: str) -> BrokerConfig:
    return BrokerConfig(
        broker_name=name,
        enable_controller_mode=True,
        controller_addr=controllers,
        namesrv_addr=namesrv,
        store_path_root_dir=root / name,
        listen_port=0,
        mapped_file_size_commit_log=1024 * 1024,
        register_name_server_period=500,
        broker_heartbeat_interval=100,
        controller_heart_beat_timeout_mills=1000,
        busy_poll_micros=0,
        authentication_enabled=True,
        authorization_enabled=True,
        init_authentication_user=AUTH.init_authentication_user,
    )


async def _admin(rpc: RpcClient, addr: str, code: int, body: object, **fields: str) -> None:
    request = RemotingCommand(code=code, ext_fields=fields, body=json.dumps(body).encode())
    response = await rpc.call(addr, request, 10)
    assert response.code == ResponseCode.SUCCESS, response.remark


def _route(topic: str) -> RemotingCommand:
    header = to_ext_fields(GetRouteInfoRequestHeader(topic=topic))
    return RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields=header)


def _leader(nodes: dict[str, _Node]) -> _Node | None:
    serving = [n for n in nodes.values() if n.parts is not None and n.parts.node.is_serving]
    return serving[0] if len(serving) == 1 else None


async def test_users_made_through_one_group_are_enforced_by_another_and_outlive_the_leader(
    tmp_path: Path,
) -> None:
    install_credentials(ROOT)  # every server's own calls sign as root
    try:
        async with AsyncExitStack() as stack:
            nodes = {n: _Node(n, tmp_path) for n in ("n1", "n2", "n3")}
            peers = {n: await node.listen() for n, node in nodes.items()}
            for node in nodes.values():
                stack.push_async_callback(node.stop)
                await node.start(peers)
            await _until(lambda: _leader(nodes) is not None, "a controller leader")
            namesrv = NameServer(
                NamesrvConfig(
                    listen_port=0,
                    scan_interval=0.2,
                    authentication_enabled=True,
                    authorization_enabled=True,
                    init_authentication_user=AUTH.init_authentication_user,
                    controller_addr=";".join(peers.values()),
                )
            )
            await namesrv.start()
            stack.push_async_callback(namesrv.close)
            brokers = {}
            for name in ("broker-a", "broker-b"):
                config = _broker_config(tmp_path, name, ";".join(peers.values()), namesrv.address)
                broker = Broker(config)
                await broker.start()
                stack.push_async_callback(broker.close)
                brokers[name] = broker
            await _until(
                lambda: all(b.state.is_master and not b.fenced for b in brokers.values()),
                "both masters",
            )
            a, b = brokers["broker-a"].address, brokers["broker-b"].address
            root_rpc = await stack.enter_async_context(RpcClient(credentials=ROOT))
            for topic in ("open", "secret"):
                for address in (a, b):  # each asks the controller to place it on its group
                    await create_topic(root_rpc, address, topic)
            shown = await root_rpc.call(a, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG), 5)
            assert shown.code == ResponseCode.SUCCESS, shown.remark
            assert b"\ninitAuthenticationUser=******\n" in shown.body  # a secret, never shown
            assert b"root-pw" not in shown.body
            for address in (a, b):  # as the CLI does: once per group; b's is already so
                await _admin(
                    root_rpc,
                    address,
                    RequestCode.AUTH_CREATE_USER,
                    {"username": "alice", "password": "alice-pw"},
                )
            await _admin(
                root_rpc,
                a,
                RequestCode.AUTH_CREATE_ACL,
                {"subject": "User:alice", "policies": [{"entries": [
                    {"resource": "Topic:*", "actions": ["Pub"], "decision": "Allow"},
                    {"resource": "Topic:secret", "actions": ["All"], "decision": "Deny"},
                ]}]},
            )  # fmt: skip
            held = brokers["broker-b"].state.auth
            await _until(lambda: "User:alice" in held.state.acls, "broker-b took alice's ACL")
            async with RpcClient(credentials=ALICE) as alice:
                assert (await send(alice, b, "open", b"hi")).code == ResponseCode.SUCCESS
                refused = await send(alice, b, "secret", b"hi")
                assert refused.code == ResponseCode.NO_PERMISSION, refused.remark
                pulled = namesrv.auth
                await _until(lambda: "alice" in pulled.state.users, "the NameServer pulled alice")
                route = await alice.call(namesrv.address, _route("open"), 5)
                assert route.code == ResponseCode.SUCCESS, route.remark

                old = _leader(nodes)
                assert old is not None
                await old.stop()  # its Raft log and snapshots stay on disk
                await _until(lambda: _leader(nodes) is not None, "a new controller leader")
                await _admin(
                    root_rpc,
                    b,
                    RequestCode.AUTH_CREATE_USER,
                    {"username": "bob", "password": "bob-pw"},
                )
                await old.start(peers | {old.node_id: await old.listen()})
                assert old.parts is not None
                kept = old.parts.state_machine.state
                await _until(
                    lambda: {"alice", "bob"} <= kept.auth.users.keys(), "the old leader caught up"
                )
                assert "User:alice" in kept.auth.acls
                await _until(
                    lambda: "bob" in brokers["broker-a"].state.auth.state.users, "broker-a took bob"
                )
                assert (await send(alice, a, "secret", b"hi")).code == ResponseCode.NO_PERMISSION
            install_credentials(None)
            unsigned = RpcClient()
            install_credentials(ROOT)
            async with unsigned:
                for address in peers.values():
                    metadata = RemotingCommand(code=RequestCode.CONTROLLER_GET_METADATA_INFO)
                    answer = await unsigned.call(address, metadata, 5)
                    assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
                answer = await unsigned.call(namesrv.address, _route("open"), 5)
                assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
            assert namesrv.routes.route_of("open") is not None  # brokers registered, as root
    finally:
        install_credentials(None)


def _signing_broker(
    root: Path, name: str, controller: str, namesrv: str, as_: Credentials
) -> Broker:
    """A controller-mode broker whose process signs as `as_` (broker ACL off: only its calls)."""
    install_credentials(as_)
    try:
        return Broker(
            BrokerConfig(
                broker_name="broker-a",
                enable_controller_mode=True,
                controller_addr=controller,
                namesrv_addr=namesrv,
                store_path_root_dir=root / name,
                listen_port=0,
                mapped_file_size_commit_log=1024 * 1024,
                broker_heartbeat_interval=100,
                busy_poll_micros=0,
            )
        )
    finally:
        install_credentials(None)


async def test_a_broker_with_a_wrong_password_gets_no_id_no_registration_and_no_heartbeat_in(
    tmp_path: Path,
) -> None:
    """One controller node with ACL 2.0: the broker process signs as root with a wrong password."""
    controller = ControllerServer(
        "n1", {"n1": "127.0.0.1:0"}, tmp_path / "n1", POLICY, raft_config=RAFT, auth=AUTH
    )
    wrong = Credentials("root", "not-root-pw")
    async with (
        controller,
        NameServer(NamesrvConfig(listen_port=0)) as namesrv,
        RpcClient(credentials=ROOT) as root_rpc,
        ControllerAdmin(controller.address, timeout=3.0, rpc=root_rpc) as admin,
        RpcClient(credentials=wrong) as wrong_rpc,
    ):
        await _until(lambda: controller.parts.node.is_serving, "the controller leads")
        guard = controller.auth_guard
        assert guard is not None
        args = (controller.address, namesrv.address)
        async with _signing_broker(tmp_path, "wrong", *args, wrong) as intruder:
            await _until(lambda: guard.denied >= 2, "the broker asked for an id twice")
            assert not intruder.state.is_master
        cluster, group = "DefaultCluster", "broker-a"
        for code, request in stranger_registration(cluster, group):
            answer = await wrong_rpc.call(controller.address, request, 5.0)
            assert answer.code == ResponseCode.NO_PERMISSION, (code, answer.remark)
        assert await admin.next_broker_id(cluster, group) == 1  # no id was given
        async with _signing_broker(tmp_path, "right", *args, ROOT) as broker:
            await _until(lambda: broker.state.is_master, "the right password registers")
            assert (await admin.replica_info(group)).master_address == broker.address
        assert await admin.next_broker_id(cluster, group) == 2
