"""ACL 2.0 on a broker (issue 23): users and ACLs by admin request, enforced, kept by a restart."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.controller import ControllerServer
from ferrymq.cmd.ferry import cli
from ferrymq.controller.config import ControllerConfig
from ferrymq.errors import RemoteError, SendFailedError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.proxy.remoting import RemotingRelay
from ferrymq.raft.config import RaftConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials
from ferrymq.security.acl2guard import Acl2Config
from ferrymq.security.aclcodes import Kind, kind_of
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from .remoting import create_topic, send

ROOT = Credentials("root", "root-pw")
ALICE_ACL = [  # ferry's commands, and mqadmin's names for one of them
    ("acl", "create", "User:alice", "--resources", "Topic:*", "--actions", "Pub,Sub"),
    ("createAcl", "-s", "User:alice", "-r", "Topic:secret", "-a", "All", "-d", "Deny"),
    ("acl", "update", "User:alice", "--resources", "Group:g1", "--actions", "Sub",
     "--source-ip", "127.0.0.0/8"),
]  # fmt: skip


def _ferry(namesrv: str, *args: str) -> str:
    """`ferry --access-key root ... admin --namesrv NAMESRV ARGS` (the real command, in-process)."""
    root = ["--access-key", "root", "--secret-key", "root-pw", "admin", "--namesrv", namesrv]
    result = CliRunner().invoke(cli, [*root, *args])
    assert result.exit_code == 0, result.output
    return result.output


async def _admin(
    rpc: RpcClient, addr: str, code: int, fields: dict[str, str], body: object = None
) -> RemotingCommand:
    data = b"" if body is None else json.dumps(body).encode()
    request = RemotingCommand(code=code, ext_fields=dict(fields), body=data)
    return await rpc.call(addr, request, 5.0)


def _alice(addr: str) -> Producer:
    return Producer(addr, "p1", retries=0, access_key="alice", secret_key="a-pw")


async def test_users_and_acls_by_admin_requests_are_enforced_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    async with (
        LocalCluster(
            tmp_path,
            authentication_enabled=True,
            authorization_enabled=True,
            init_authentication_user='{"username": "root", "password": "root-pw"}',
        ) as cluster,
        RpcClient(credentials=ROOT) as root,
        RpcClient(credentials=Credentials("alice", "a-pw")) as as_alice,
    ):
        addr, broker = cluster.namesrv_addr, cluster.broker.address
        try:  # by the CLI, signed as root; then the ACL's entries one command each
            await asyncio.to_thread(_ferry, addr, "createUser", "-u", "alice", "-p", "a-pw")
            for command in ALICE_ACL:
                await asyncio.to_thread(_ferry, addr, *command)
            listed = json.loads(await asyncio.to_thread(_ferry, addr, "acl", "list", "--json"))
        finally:
            install_credentials(None)
        assert [len(p["entries"]) for p in listed[0]["policies"]] == [3]
        subject = {"subject": "User:alice"}
        refused = await _admin(as_alice, broker, RequestCode.AUTH_LIST_USER, {})
        assert refused.code == ResponseCode.NO_PERMISSION
        assert "needs a Super user" in (refused.remark or "")
        async with AdminClient(addr, credentials=ROOT) as admin:
            await admin.create_topic("orders", 1)
            await admin.create_topic("secret", 1)
        async with _alice(addr) as producer:
            sent = await producer.send("orders", b"hello")
            with pytest.raises(SendFailedError, match=r"decision is deny.*code 16"):
                await producer.send("secret", b"no")  # Deny wins over Topic:* Allow
        async with PullConsumer(addr, "g1", access_key="alice", secret_key="a-pw") as g1:
            assert [m.body for m in (await g1.pull(sent.queue, 0)).messages] == [b"hello"]
        async with PullConsumer(addr, "g2", access_key="alice", secret_key="a-pw") as g2:
            with pytest.raises(RemoteError, match="no matched acl policies"):
                await g2.pull(sent.queue, 0)

        broker = (await cluster.restart_broker()).address  # users and ACLs: from the metadata log
        got = await _admin(root, broker, RequestCode.AUTH_GET_ACL, subject)
        assert got.code == ResponseCode.SUCCESS, got.remark
        assert len(json.loads(got.body)["policies"][0]["entries"]) == 3
        listed = await _admin(root, broker, RequestCode.AUTH_LIST_USER, {})
        assert json.loads(listed.body) == [
            {"username": "alice", "userType": "Normal", "userStatus": "enable"},
            {"username": "root", "userType": "Super", "userStatus": "enable"},
        ]  # no password in an answer
        async with _alice(addr) as producer:
            await producer.send("orders", b"after restart")
        deleted = await _admin(root, broker, RequestCode.AUTH_DELETE_USER, {"username": "alice"})
        assert deleted.code == ResponseCode.SUCCESS, deleted.remark
        async with _alice(addr) as producer:
            with pytest.raises(SendFailedError, match="User:alice is not found"):
                await producer.send("orders", b"gone")
        assert cluster.broker.auth_guard is not None
        assert cluster.broker.auth_guard.denied == 1  # the restarted broker: the deleted user


def _group_config(tmp_path: Path, namesrv: str, broker_id: int) -> BrokerConfig:
    """Controller mode with no controller: the test names the master (as test_role_change)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{sock.getsockname()[1]}"
    return BrokerConfig(
        broker_name="broker-a",
        broker_id=broker_id,
        enable_controller_mode=True,
        controller_addr=nobody,
        namesrv_addr=namesrv,
        store_path_root_dir=tmp_path / f"b{broker_id}",
        listen_port=0,
        mapped_file_size_commit_log=1024 * 1024,
        ha_send_heartbeat_interval=200,
        authentication_enabled=True,
        authorization_enabled=True,
        init_authentication_user='{"username": "root", "password": "root-pw"}',
    )


async def test_a_slave_replicates_users_and_acls_and_enforces_them_after_failover(
    tmp_path: Path,
) -> None:
    install_credentials(ROOT)  # the brokers' own HA link proves root (a Super user)
    namesrv = NameServer(NamesrvConfig(listen_port=0))
    await namesrv.start()
    brokers = [Broker(_group_config(tmp_path, namesrv.address, i)) for i in (1, 2)]
    try:
        for broker in brokers:
            await broker.start()
        first, second = brokers
        assert await first.change_to_master(1, frozenset({1, 2}))
        first.state.lease = None
        assert await second.change_to_slave(first.address, 1)
        async with RpcClient(credentials=ROOT) as root:
            for topic in ("orders", "secret"):
                await create_topic(root, first.address, topic, queues=1)
            user = {"username": "alice", "password": "a-pw"}
            made = await _admin(root, first.address, RequestCode.AUTH_CREATE_USER, {}, user)
            assert made.code == ResponseCode.SUCCESS, made.remark
            acl = {"subject": "User:alice", "policies": [{"entries": [
                {"resource": "Topic:*", "actions": ["Pub"]},
                {"resource": "Topic:secret", "actions": ["Pub"], "decision": "Deny"},
            ]}]}  # fmt: skip
            created = await _admin(root, first.address, RequestCode.AUTH_CREATE_ACL, {}, acl)
            assert created.code == ResponseCode.SUCCESS, created.remark
        deadline = time.monotonic() + 15
        while "User:alice" not in second.state.auth.state.acls:
            assert time.monotonic() < deadline, "the slave never applied the ACL"
            await asyncio.sleep(0.05)

        await first.close()  # the master is gone; the controller would elect broker 2
        assert await second.change_to_master(2, frozenset({2}))
        second.state.lease = None
        async with RpcClient(credentials=Credentials("alice", "a-pw")) as alice:
            sent = await send(alice, second.address, "orders", b"after failover")
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            denied = await send(alice, second.address, "secret", b"no")
            assert denied.code == ResponseCode.NO_PERMISSION
            assert "decision is deny" in (denied.remark or "")
    finally:
        install_credentials(None)
        for broker in brokers:
            await broker.close()
        await namesrv.close()


async def test_every_code_is_refused_unsigned_and_admin_codes_for_normal_users(
    tmp_path: Path,
) -> None:
    """On the broker, a controller and the endpoint's remoting port (one of each, ACL 2.0)."""
    init_user = '{"username": "root", "password": "root-pw"}'
    controller = ControllerServer(
        "n1", {"n1": "127.0.0.1:0"}, tmp_path / "n1", ControllerConfig(),
        raft_config=RaftConfig(tick_interval=0.02, election_ticks=5, heartbeat_ticks=1),
        auth=Acl2Config(authentication_enabled=True, authorization_enabled=True,
                        init_authentication_user=init_user),
    )  # fmt: skip
    async with (
        LocalCluster(
            tmp_path,
            authentication_enabled=True,
            authorization_enabled=True,
            init_authentication_user=init_user,
        ) as cluster,
        controller,
        RpcClient() as unsigned,
        RpcClient(credentials=ROOT) as root,
        RpcClient(credentials=Credentials("bob", "b-pw")) as bob,
    ):
        broker = cluster.broker.address
        user = {"username": "bob", "password": "b-pw"}
        assert (await _admin(root, broker, RequestCode.AUTH_CREATE_USER, {}, user)).code == 0
        deadline = time.monotonic() + 15
        while not controller.parts.node.is_serving:
            assert time.monotonic() < deadline, "the controller never led"
            await asyncio.sleep(0.02)
        made = await _admin(root, controller.address, RequestCode.AUTH_CREATE_USER, {}, user)
        assert made.code == ResponseCode.SUCCESS, made.remark
        relay = RemotingRelay("127.0.0.1:9", users=cluster.broker.state.auth)
        await relay.start()
        try:
            servers = [(broker, cluster.broker.router.codes),
                       (controller.address, controller.router.codes),
                       (relay.address, relay._router.codes)]  # fmt: skip
            for address, codes in servers:
                for code in sorted(codes):
                    response = await _admin(unsigned, address, code, {"topic": "t"})
                    assert response.code == ResponseCode.NO_PERMISSION, (address, code, response)
                    assert response.remark == "No accessKey is configured"
                    if kind_of(code) in (Kind.ADMIN, Kind.INTERNAL):
                        response = await _admin(bob, address, code, {"topic": "t"})
                        assert response.code == ResponseCode.NO_PERMISSION, (address, code)
                        assert "User:bob is not" in (response.remark or ""), (address, code)
                        assert "Super" in (response.remark or ""), (address, code)
        finally:
            await relay.close()
        codes = cluster.broker.router.codes
        assert RequestCode.AUTH_CREATE_ACL in codes
        assert RequestCode.CONTROLLER_REGISTER_BROKER in controller.router.codes
        assert RequestCode.PULL_MESSAGE in relay._router.codes
        bad_bodies = [
            b"{not json",
            json.dumps({"username": "x" * 5000, "password": "p"}).encode(),
            json.dumps({"username": "eve", "password": "p", "userType": "Root"}).encode(),
        ]
        for body in bad_bodies:  # typed refusals; the broker keeps serving
            request = RemotingCommand(code=RequestCode.AUTH_CREATE_USER, body=body)
            response = await root.call(broker, request, 5.0)
            assert response.code == ResponseCode.INVALID_PARAMETER, response
        bad_acl = {"subject": "User:bob", "policies": [{"entries": [{"resource": "Queue:q"}]}]}
        refused = await _admin(root, broker, RequestCode.AUTH_CREATE_ACL, {}, bad_acl)
        assert refused.code == ResponseCode.INVALID_PARAMETER
        listed = await _admin(root, broker, RequestCode.AUTH_LIST_USER, {})
        assert [u["username"] for u in json.loads(listed.body)] == ["bob", "root"]


async def test_a_broker_process_signs_its_own_calls_with_inner_client_credentials(
    tmp_path: Path,
) -> None:
    """innerClientAuthenticationCredentials in broker.conf: the broker process registers with a
    NameServer that checks ACL (its admin account), with no credentials in its environment."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(
        "accounts:\n- accessKey: inner-key\n  secretKey: inner-secret\n  admin: true\n"
    )
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerName=broker-inner\n"
        'innerClientAuthenticationCredentials={"accessKey":"inner-key","secretKey":"inner-secret"}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    namesrv = NameServer(NamesrvConfig(listen_port=0, acl_enable=True, acl_file=acl_file))
    async with namesrv:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ferrymq.cmd.ferry", "broker", "--config", str(conf),
            "--store-dir", str(tmp_path / "store"), "--listen", "127.0.0.1:0",
            "--namesrv", namesrv.address, "--mapped-file-size-commit-log", str(1 << 20),
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90  # a process start on a loaded 2-core box
            while "broker-inner" not in namesrv.routes.cluster_info().broker_addr_table:
                assert process.returncode is None, "the broker exited"
                assert time.monotonic() < deadline, "the broker never registered"
                await asyncio.sleep(0.1)
        finally:
            if process.returncode is None:
                process.terminate()
            _, err = await process.communicate()
        assert b"inner-secret" not in err
