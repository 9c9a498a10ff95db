"""ACL 1.0 on the endpoint (issue 23): both ports check the client's credentials against the
brokers' plain_acl.yml and call the ACL-on brokers as the endpoint's own admin account.

In-process: a cluster with aclEnable, the gRPC endpoint and the remoting relay on port 0, raw gRPC
calls and ferrymq's SDK on the remoting port. End to end: `ferry proxy` as a process and the
official 5.x Python client (its own venv) with session credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError, SendFailedError
from ferrymq.proxy.metrics import collect
from ferrymq.proxy.remoting import RemotingRelay
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import SERVICE, V2, load
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.security.aclguard import AclFile
from ferrymq.security.grpcacl import grpc_signature
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from ..system.procs import start
from . import raw

ACL = """
accounts:
- accessKey: client-v5
  secretKey: client-secret
  defaultTopicPerm: DENY
  topicPerms: [AclTopic=PUB|SUB, Secret=DENY]
  defaultGroupPerm: SUB
- {accessKey: proxy-admin, secretKey: admin-secret, admin: true}
"""
ADMIN = Credentials("proxy-admin", "admin-secret")
WORKER = Path(__file__).with_name("v5_worker.py")


@pytest.fixture
async def acl_cluster(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, Path]]:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with LocalCluster(tmp_path / "c", acl_enable=True, acl_file=acl_file) as cluster:
        async with AdminClient(cluster.namesrv_addr, credentials=ADMIN) as admin:
            await admin.create_topic("AclTopic", queues=1)
            await admin.create_topic("Secret", queues=1)
        yield cluster, acl_file


def _signed(access_key: str, secret: str, at: float | None = None) -> list[tuple[str, str]]:
    """The metadata a 5.x client sends at `at` (default now; RocketMQ's MQv2-HMAC-SHA1 header)."""
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))
    signature = grpc_signature(secret, date)
    return [
        ("x-mq-date-time", date),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={signature}",
        ),
    ]


def _send(v2: V2, topic: str) -> Any:
    request = v2.SendMessageRequest()
    message = request.messages.add()
    message.topic.name = topic
    message.body = b"raw"
    message.system_properties.message_id = "acl-raw-1"
    message.system_properties.body_encoding = v2.enum("Encoding", "IDENTITY")
    message.system_properties.message_type = v2.enum("MessageType", "NORMAL")
    return request


async def test_both_ports_refuse_unsigned_wrong_and_denied_calls_and_serve_the_right_ones(
    acl_cluster: tuple[LocalCluster, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cluster, acl_file = acl_cluster
    v2 = load()
    install_credentials(ADMIN)  # the endpoint calls the brokers as the admin account
    endpoint = GrpcEndpoint(cluster.namesrv_addr, acl=AclFile(acl_file))
    relay = RemotingRelay(cluster.namesrv_addr, acl=AclFile(acl_file))
    caplog.set_level(logging.INFO)
    try:
        await endpoint.start()
        await relay.start()
        async with asyncio.timeout(60), grpc.aio.insecure_channel(endpoint.address) as channel:
            send = raw.rpc(channel, v2, "SendMessage")
            unsigned = await send(_send(v2, "AclTopic"), timeout=10)
            assert unsigned.status.code == v2.code("UNAUTHORIZED") == 40100, unsigned.status
            wrong = _signed("client-v5", "not-the-secret")
            answer = await send(_send(v2, "AclTopic"), metadata=wrong, timeout=10)
            assert answer.status.code == 40100
            assert "Check signature failed for accessKey=client-v5" in answer.status.message
            right = _signed("client-v5", "client-secret")
            denied = await send(_send(v2, "Secret"), metadata=right, timeout=10)
            assert denied.status.code == v2.code("FORBIDDEN") == 40300, denied.status
            assert "No permission for topic Secret" in denied.status.message
            ok = await send(_send(v2, "AclTopic"), metadata=right, timeout=10)
            assert ok.status.code == v2.code("OK"), ok.status
            replayed = _signed("client-v5", "client-secret", at=time.time() - 15 * 3600)
            stale = await send(_send(v2, "AclTopic"), metadata=replayed, timeout=10)
            assert stale.status.code == 40100, stale.status  # a replay 15 h later
            assert "is outside the window of 51300 s" in stale.status.message
            receive = v2.ReceiveMessageRequest(batch_size=1)
            receive.group.name = "g_acl"
            receive.message_queue.topic.name = "Secret"
            parts = [p async for p in raw.rpc(channel, v2, "ReceiveMessage", stream=True)(
                receive, metadata=right, timeout=10)]  # fmt: skip
            assert [p.status.code for p in parts] == [40300]
            telemetry: Any = channel.stream_stream(
                f"/{SERVICE}/Telemetry",
                request_serializer=v2.TelemetryCommand.SerializeToString,
                response_deserializer=v2.TelemetryCommand.FromString,
            )
            call = telemetry(iter(()), timeout=10)  # unsigned: refused before any settings
            assert [c.status.code async for c in call] == [40100]
            assert endpoint.service is not None
            samples = "".join(  # what /metrics shows: refusals by status, no key or secret
                f"{m.name} {s.labels} {s.value}\n"
                for m in collect(endpoint.service.stats)
                for s in m.samples
            )
            calls = endpoint.service.stats.calls
            assert calls[("SendMessage", "UNAUTHORIZED")] == 3
            assert (
                calls[("SendMessage", "FORBIDDEN")] == calls[("ReceiveMessage", "FORBIDDEN")] == 1
            )
            assert "client-v5" not in samples
            assert "secret" not in samples

            # remoting: the 4.x client's ACL 1.0 signature, checked as a broker checks it
            client = Credentials("client-v5", "client-secret")
            async with Producer(relay.address, "p_acl", retries=0, credentials=client) as good:
                sent = await good.send("AclTopic", b"via remoting")
                assert sent.queue.topic == "AclTopic"
                with pytest.raises(SendFailedError, match="No permission for topic Secret"):
                    await good.send("Secret", b"no")
            intruder = Credentials("client-v5", "wrong-secret")
            async with Producer(relay.address, "p_acl", retries=0, credentials=intruder) as bad:
                with pytest.raises(FerryError, match="Check signature failed"):  # its route
                    await bad.send("AclTopic", b"no")
            async with RpcClient(credentials=None) as anonymous:
                anonymous.credentials = None  # not even the process's admin account
                route = RemotingCommand(
                    code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "AclTopic"}
                )
                answer_r = await anonymous.call(relay.address, route, 5.0)
                assert answer_r.code == ResponseCode.NO_PERMISSION
    finally:
        install_credentials(None)
        await relay.close()
        await endpoint.close()
    assert endpoint.guard is not None
    assert endpoint.guard.denied == 6
    for secret in ("client-secret", "admin-secret", "not-the-secret", "wrong-secret"):
        assert secret not in caplog.text


async def test_official_5x_client_with_credentials_through_ferry_proxy(
    acl_cluster: tuple[LocalCluster, Path], v5: Path, tmp_path: Path
) -> None:
    cluster, acl_file = acl_cluster
    ready, log_path = tmp_path / "proxy.json", tmp_path / "proxy.log"
    env = {**os.environ, "FERRY_ACCESS_KEY": "proxy-admin", "FERRY_SECRET_KEY": "admin-secret"}
    command = [sys.executable, "-m", "ferrymq.cmd.ferry", "proxy"]
    command += ["--namesrv", cluster.namesrv_addr, "--grpc-port", "0", "--remoting-port", "-1"]
    command += ["--acl-enable", "true", "--acl-file", str(acl_file), "--ready-file", str(ready)]
    with log_path.open("wb") as log:
        proxy = await asyncio.create_subprocess_exec(*command, env=env, stderr=log, stdout=log)
    try:
        async with asyncio.timeout(90):
            while not ready.exists():
                assert proxy.returncode is None, log_path.read_text()[-2000:]
                await asyncio.sleep(0.05)
            grpc_address = json.loads(ready.read_text())["grpc"]
            keys = {"V5_AK": "client-v5", "V5_SK": "client-secret", "V5_BAD_SK": "bad-secret"}
            worker = await asyncio.create_subprocess_exec(
                str(v5),
                str(WORKER),
                *("acl", grpc_address, "AclTopic", "Secret", "g_acl5"),
                env={**os.environ, **keys},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await worker.communicate()
            finally:
                if worker.returncode is None:
                    worker.kill()
                    await worker.wait()
        assert worker.returncode == 0, err.decode()[-3000:]
        events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
        by_case = {e.get("case"): e for e in events if "case" in e}
        assert by_case["ok"]["event"] == "sent", events
        # the client says only "failed to fetch topic route"; the endpoint's log says why
        assert by_case["wrong-secret"]["event"] == "refused", events
        assert by_case["denied-topic"]["event"] == "refused", events
        assert [e["body"] for e in events if e["event"] == "acked"] == ["ok"], events
    finally:
        if proxy.returncode is None:
            proxy.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proxy.wait(), 15)
        if proxy.returncode is None:
            proxy.kill()
            await proxy.wait()
    text = log_path.read_text()
    assert "QueryRoute from" in text  # the endpoint logged its refusals ...
    assert re.search(
        r"refused UNAUTHORIZED \(\d+ so far\): Check signature failed for accessKey=client-v5", text
    )
    assert re.search(r"refused FORBIDDEN \(\d+ so far\): No permission for topic Secret", text)
    assert "client-secret" not in text  # ... and no secret
    assert "bad-secret" not in text


async def test_a_broker_with_enable_proxy_and_acl_checks_its_endpoints_clients(
    tmp_path: Path,
) -> None:
    """enableProxy with aclEnable (refused before): the in-broker endpoint takes the broker's
    aclFile, so it is no open door (a `ferry broker` process, its NameServer in this loop)."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    v2 = load()
    async with LocalCluster(tmp_path / "c", brokers=0) as cluster:
        args = ["broker", "--listen", "127.0.0.1:0", "--namesrv", cluster.namesrv_addr]
        args += ["--store-dir", str(tmp_path / "store"), "--enable-proxy", "true"]
        args += ["--grpc-server-port", "0", "--remoting-listen-port", "0"]
        args += ["--acl-enable", "true", "--acl-file", str(acl_file)]
        env = {"FERRY_ACCESS_KEY": "proxy-admin", "FERRY_SECRET_KEY": "admin-secret"}
        broker = await asyncio.to_thread(start, args, tmp_path, "broker", 60.0, env)
        try:
            async with AdminClient(cluster.namesrv_addr, credentials=ADMIN) as admin:
                await admin.create_topic("AclTopic", queues=1)
            address = str(broker.info["proxy"])
            async with asyncio.timeout(60), grpc.aio.insecure_channel(address) as channel:
                send = raw.rpc(channel, v2, "SendMessage")
                unsigned = await send(_send(v2, "AclTopic"), timeout=10)
                assert unsigned.status.code == 40100, unsigned.status
                right = _signed("client-v5", "client-secret")
                deadline = time.monotonic() + 30
                while True:  # the topic reaches the NameServer with the next registration
                    ok = await send(_send(v2, "AclTopic"), metadata=right, timeout=10)
                    if ok.status.code == v2.code("OK") or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                assert ok.status.code == v2.code("OK"), ok.status
        finally:
            await asyncio.to_thread(broker.stop)
