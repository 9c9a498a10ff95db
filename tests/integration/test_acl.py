"""ACL 1.0 on a broker, NameServer, controller, endpoint (issue 23): in-process, real sockets."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.controller import ControllerServer
from ferrymq.controller.config import ControllerConfig
from ferrymq.errors import RemoteError, SendFailedError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.proxy.remoting import RemotingRelay
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import ACCESS_KEY, SIGNATURE, Credentials, sign
from ferrymq.security.aclcodes import Kind, kind_of
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.security.aclguard import AclFile
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

ACL = """
accounts:
- accessKey: producer1
  secretKey: producer-secret
  defaultTopicPerm: DENY
  topicPerms: [topicA=PUB, topicD=DENY]
- accessKey: consumer1
  secretKey: consumer-secret
  topicPerms: [topicA=SUB]
  groupPerms: [g1=SUB]
- accessKey: admin-key
  secretKey: admin-secret
  admin: true
"""


def _producer(addr: str) -> Producer:
    return Producer(addr, "p1", retries=0, access_key="producer1", secret_key="producer-secret")


async def _raw(rpc: RpcClient, addr: str, code: int, fields: dict[str, str]) -> RemotingCommand:
    return await rpc.call(addr, RemotingCommand(code=code, ext_fields=dict(fields)), 5.0)


async def test_accounts_send_and_pull_with_their_perms_and_a_changed_file_applies_at_once(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with LocalCluster(tmp_path, acl_enable=True, acl_file=acl_file) as cluster:
        addr = cluster.namesrv_addr
        async with AdminClient(addr, access_key="admin-key", secret_key="admin-secret") as admin:
            await admin.create_topic("topicA", 1)
            await admin.create_topic("topicD", 1)
        async with _producer(addr) as producer:
            sent = await producer.send("topicA", b"hello")
            with pytest.raises(SendFailedError, match=r"No permission for topic topicD.*code 16"):
                await producer.send("topicD", b"no")
        async with Producer(addr, "p1", retries=0, access_key="producer1",
                            secret_key="wrong-secret") as intruder:  # fmt: skip
            with pytest.raises(SendFailedError, match=r"Check signature failed.*code 16") as bad:
                await intruder.send("topicA", b"no")
            assert "wrong-secret" not in str(bad.value)
        async with PullConsumer(
            addr, "g1", access_key="consumer1", secret_key="consumer-secret"
        ) as consumer:
            result = await consumer.pull(sent.queue, 0)
            assert [m.body for m in result.messages] == [b"hello"]
        async with PullConsumer(addr, "g2", access_key="consumer1",
                                secret_key="consumer-secret") as other:  # fmt: skip
            with pytest.raises(RemoteError, match="No permission for group g2"):
                await other.pull(sent.queue, 0)

        # reload without restart: topicD becomes PUB for producer1
        acl_file.write_text(ACL.replace("topicD=DENY", "topicD=PUB"))
        os.utime(acl_file, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
        async with _producer(addr) as producer:
            deadline = time.monotonic() + 15
            while True:
                try:
                    await producer.send("topicD", b"now allowed")
                    break
                except SendFailedError:
                    assert time.monotonic() < deadline, "plain_acl.yml change not applied"
                    await asyncio.sleep(0.1)
        guard = cluster.broker.acl
        assert guard is not None
        assert guard.acl.reloads == 1


async def test_every_handled_code_is_refused_without_credentials_and_admin_codes_for_non_admins(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    namesrv = NameServer(NamesrvConfig(listen_port=0, acl_enable=True, acl_file=acl_file))
    controller = ControllerServer(
        "n1", {"n1": "127.0.0.1:0"}, tmp_path / "n1", ControllerConfig(), acl_file=acl_file
    )
    relay = RemotingRelay("127.0.0.1:9", acl=AclFile(acl_file))  # refused before any relaying
    async with (
        LocalCluster(tmp_path, acl_enable=True, acl_file=acl_file) as cluster,
        namesrv,
        controller,
        RpcClient() as rpc,
        RpcClient(credentials=Credentials("producer1", "producer-secret")) as signed,
    ):
        await relay.start()
        try:
            servers = [(cluster.broker.address, cluster.broker.router.codes),
                       (namesrv.address, namesrv.router.codes),
                       (controller.address, controller.router.codes),
                       (relay.address, relay._router.codes)]  # fmt: skip
            checked = 0
            for addr, codes in servers:
                for code in sorted(codes):
                    response = await _raw(rpc, addr, code, {"topic": "topicA"})
                    assert response.code == ResponseCode.NO_PERMISSION, (addr, code, response)
                    assert response.remark == "No accessKey is configured"
                    if kind_of(code) in (Kind.ADMIN, Kind.INTERNAL):
                        response = await _raw(signed, addr, code, {"topic": "topicA"})
                        assert response.code == ResponseCode.NO_PERMISSION, (addr, code)
                        assert (response.remark or "").startswith("Need admin permission"), code
                    checked += 1
        finally:
            await relay.close()
        assert checked == sum(len(codes) for _, codes in servers)
        assert RequestCode.CONTROLLER_APPLY_BROKER_ID in controller.router.codes
        assert RequestCode.SEND_MESSAGE_V2 in relay._router.codes


async def test_malformed_huge_and_replayed_credentials_are_refused_and_the_broker_keeps_serving(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with LocalCluster(tmp_path, acl_enable=True, acl_file=acl_file) as cluster, RpcClient(
        max_frame_bytes=64 * 1024 * 1024
    ) as rpc:  # fmt: skip
        addr = cluster.broker.address
        base = {"topic": "topicA", "queueId": "0"}
        bad_fields = [
            {**base, ACCESS_KEY: "producer1", SIGNATURE: "not base64 !!"},
            {**base, ACCESS_KEY: "producer1", SIGNATURE: "签名é\u0000" * 10},
            {**base, ACCESS_KEY: "producer1", SIGNATURE: "A" * 4_000_000},
            {**base, ACCESS_KEY: "x" * 4_000_000, SIGNATURE: "AAAA"},
            {**base, ACCESS_KEY: "producer1"},
        ]
        for fields in bad_fields:
            response = await _raw(rpc, addr, RequestCode.GET_MAX_OFFSET, fields)
            assert response.code == ResponseCode.NO_PERMISSION
            assert len(response.remark or "") < 200
        # a signed request replayed as is passes again (ACL 1.0 has no nonce, as in RocketMQ);
        # replayed with any field changed, it fails the signature
        signed = dict(base)
        sign(signed, b"", Credentials("consumer1", "consumer-secret"), 479)
        for _ in range(2):
            response = await _raw(rpc, addr, RequestCode.GET_MAX_OFFSET, signed)
            assert response.code == ResponseCode.SUCCESS, response.remark
        response = await _raw(rpc, addr, RequestCode.GET_MAX_OFFSET, {**signed, "queueId": "1"})
        assert response.code == ResponseCode.NO_PERMISSION
        assert (response.remark or "").startswith("Check signature failed")
        assert cluster.broker.acl is not None
        assert cluster.broker.acl.denied == len(bad_fields) + 1


async def test_a_broker_registers_with_an_acl_namesrv_only_with_the_clusters_admin_account(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    namesrv = NameServer(NamesrvConfig(listen_port=0, acl_enable=True, acl_file=acl_file))
    async with namesrv:
        registered = {}
        for name, secret in (("broker-a", "admin-secret"), ("broker-b", "not-the-secret")):
            # the broker process's own account (`FERRY_ACCESS_KEY`/`FERRY_SECRET_KEY` in `ferry`)
            install_credentials(Credentials("admin-key", secret))
            try:
                broker = Broker(
                    BrokerConfig(
                        broker_name=name,
                        namesrv_addr=namesrv.address,
                        listen_port=0,
                        store_path_root_dir=tmp_path / name,
                        mapped_file_size_commit_log=1024 * 1024,
                        busy_poll_micros=0,
                    )
                )
            finally:
                install_credentials(None)
            async with broker:
                accepted = await broker.register()
                routed = name in namesrv.routes.cluster_info().broker_addr_table
                registered[name] = (accepted, routed)
        assert registered == {"broker-a": (1, True), "broker-b": (0, False)}
