"""ACL 1.0 on controllers (issue 23): brokers and Raft peers sign with the cluster's account."""

from __future__ import annotations

import asyncio
import functools
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.cmd.controller import ControllerParts, ControllerServer
from ferrymq.controller.config import ControllerConfig
from ferrymq.errors import RemoteError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.raft.config import RaftConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.security.aclguard import AclFile, AclGuard
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    ApplyBrokerIdRequestHeader,
    RegisterBrokerToControllerRequestHeader,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import BrokerHeartbeatRequestHeader

ACL = """
accounts:
- {accessKey: cluster-admin, secretKey: cluster-secret, admin: true}
- {accessKey: app-user, secretKey: app-secret, defaultTopicPerm: PUB}
"""
RAFT = RaftConfig(tick_interval=0.02, election_ticks=10, heartbeat_ticks=1)


def stranger_registration(cluster: str, group: str) -> list[tuple[int, RemotingCommand]]:
    """What a stranger that skipped GetNextBrokerId would send to join `group`."""
    addr = "127.0.0.1:1"
    headers = (
        (RequestCode.CONTROLLER_APPLY_BROKER_ID,
         ApplyBrokerIdRequestHeader(cluster, group, 1, f"{addr};0")),
        (RequestCode.CONTROLLER_REGISTER_BROKER,
         RegisterBrokerToControllerRequestHeader(
             cluster_name=cluster, broker_name=group, broker_id=1, broker_address=addr)),
        (RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(cluster, addr, group, 1)),
    )  # fmt: skip
    return [(code, RemotingCommand(code=code, ext_fields=to_ext_fields(h))) for code, h in headers]


async def test_a_controller_with_acl_answers_only_the_clusters_admin_account(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    server = ControllerServer(
        "n1", {"n1": "127.0.0.1:0"}, tmp_path / "n1", ControllerConfig(), raft_config=RAFT,
        acl_file=acl_file,
    )  # fmt: skip
    async with server:
        for credentials, allowed in (
            (Credentials("cluster-admin", "cluster-secret"), True),
            (Credentials("cluster-admin", "wrong-secret"), False),
            (Credentials("app-user", "app-secret"), False),
            (None, False),
        ):
            async with (
                RpcClient(credentials=credentials) as rpc,
                ControllerAdmin(server.address, timeout=3.0, rpc=rpc) as admin,
            ):
                if allowed:
                    deadline = time.monotonic() + 10
                    while not (await admin.metadata()).is_leader:
                        assert time.monotonic() < deadline, "the controller never led"
                        await asyncio.sleep(0.05)
                    assert await admin.next_broker_id("c", "broker-a") == 1
                else:
                    with pytest.raises(RemoteError) as refused:
                        await admin.metadata(server.address)
                    assert refused.value.code == ResponseCode.NO_PERMISSION, credentials
        assert server.acl is not None
        assert server.acl.denied == 3


def _closed(holder: list[ControllerParts], conn: Connection) -> None:
    holder[0].connection_closed(conn)


async def test_a_controller_peer_with_a_wrong_secret_gets_none_of_its_raft_messages_in(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with AsyncExitStack() as stack:
        guards: dict[str, AclGuard[Connection, Any]] = {}
        holders: dict[str, tuple[Router, list[ControllerParts]]] = {}
        peers = {}
        for node_id in ("n1", "n2", "n3"):
            router = Router(f"controller {node_id}")
            holder: list[ControllerParts] = []
            guards[node_id] = AclGuard(router, AclFile(acl_file), node_id)
            server = RpcServer(guards[node_id], on_close=functools.partial(_closed, holder))
            await server.start()
            stack.push_async_callback(server.close)
            holders[node_id], peers[node_id] = (router, holder), server.address
        parts = {}
        for node_id, (router, holder) in holders.items():
            secret = "wrong-secret" if node_id == "n3" else "cluster-secret"
            install_credentials(Credentials("cluster-admin", secret))  # this node's process
            try:
                node = ControllerParts(node_id, peers, tmp_path / node_id, ControllerConfig(), RAFT)
            finally:
                install_credentials(None)
            holder.append(node)
            node.register(router)
            await node.start()
            stack.push_async_callback(node.close)
            parts[node_id] = node
        deadline = time.monotonic() + 15
        while not (
            any(parts[n].node.is_serving for n in ("n1", "n2"))
            and guards["n1"].denied + guards["n2"].denied > 0
        ):
            assert time.monotonic() < deadline, "no leader among n1/n2, or n3 never refused"
            await asyncio.sleep(0.05)
        assert not parts["n3"].node.is_serving
        assert guards["n3"].denied == 0  # n1 and n2 sign right: n3 hears them


def _controller_broker(tmp_path: Path, name: str, controller: str, namesrv: str) -> Broker:
    return Broker(
        BrokerConfig(
            broker_name="broker-a",
            enable_controller_mode=True,
            controller_addr=controller,
            namesrv_addr=namesrv,
            store_path_root_dir=tmp_path / name,
            listen_port=0,
            mapped_file_size_commit_log=1024 * 1024,
            broker_heartbeat_interval=100,
            busy_poll_micros=0,
        )
    )


async def test_a_broker_with_a_wrong_secret_gets_no_id_no_registration_and_no_heartbeat_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    controller = ControllerServer(
        "n1", {"n1": "127.0.0.1:0"}, tmp_path / "n1", ControllerConfig(), raft_config=RAFT,
        acl_file=acl_file,
    )  # fmt: skip
    wrong = Credentials("cluster-admin", "wrong-secret")
    async with (
        controller,
        NameServer(NamesrvConfig(listen_port=0)) as namesrv,
        RpcClient(credentials=Credentials("cluster-admin", "cluster-secret")) as right_rpc,
        ControllerAdmin(controller.address, timeout=3.0, rpc=right_rpc) as admin,
        RpcClient(credentials=wrong) as wrong_rpc,
    ):
        deadline = time.monotonic() + 10
        while not (await admin.metadata()).is_leader:
            assert time.monotonic() < deadline, "the controller never led"
            await asyncio.sleep(0.05)
        assert controller.acl is not None
        install_credentials(wrong)  # the broker process's own account, with a wrong secret
        try:
            broker = _controller_broker(tmp_path, "wrong", controller.address, namesrv.address)
        finally:
            install_credentials(None)
        async with broker:
            deadline = time.monotonic() + 15
            while controller.acl.denied < 2:  # it asked for an id, was refused, asked again
                assert time.monotonic() < deadline, "the broker never tried to register"
                await asyncio.sleep(0.05)
            assert not broker.state.is_master
        assert "GetNextBrokerId: the controller answered 16" in caplog.text
        assert "wrong-secret" not in caplog.text
        for code, request in stranger_registration("DefaultCluster", "broker-a"):
            answer = await wrong_rpc.call(controller.address, request, 5.0)
            assert answer.code == ResponseCode.NO_PERMISSION, (code, answer.remark)
            assert (answer.remark or "").startswith("Check signature failed"), code
        assert await admin.next_broker_id("DefaultCluster", "broker-a") == 1  # no id was given
        with pytest.raises(RemoteError):
            await admin.replica_info("broker-a")  # no such group: nothing registered

        install_credentials(Credentials("cluster-admin", "cluster-secret"))
        try:
            broker = _controller_broker(tmp_path, "right", controller.address, namesrv.address)
        finally:
            install_credentials(None)
        async with broker:
            deadline = time.monotonic() + 15
            while not broker.state.is_master:
                assert time.monotonic() < deadline, "the right secret never registered"
                await asyncio.sleep(0.05)
            replicas = await admin.replica_info("broker-a")
            assert replicas.master_address == broker.address
            assert await admin.next_broker_id("DefaultCluster", "broker-a") == 2
