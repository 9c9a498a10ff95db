"""`ferry up`: one command runs a local cluster, reports it, and stops every child it started."""

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.proxy.stubs import load
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

from ..proxy.raw import rpc
from .procs import FERRY

pytestmark = pytest.mark.system


def _up(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    ready = tmp_path / "cluster.json"
    with (tmp_path / "up.log").open("ab") as log:
        process = subprocess.Popen(
            [*FERRY, "up", "--data-dir", str(tmp_path / "data"), "--ready-file", str(ready), *args],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 120  # a loaded 2-core box; quiet, about 10-20 s
    try:
        while not ready.exists():
            assert process.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "ferry up never became ready"
            time.sleep(0.05)
    except BaseException:
        process.terminate()  # ferry up stops every child it started on SIGTERM
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    info: dict[str, object] = json.loads(ready.read_text())
    return process, info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(info: dict[str, object]) -> list[int]:
    brokers = info["brokers"]
    assert isinstance(brokers, list)
    return [int(str(info["namesrv_pid"])), *(int(b["pid"]) for b in brokers)]


async def test_up_serves_every_group_and_sigterm_stops_every_child(tmp_path: Path) -> None:
    process, info = _up(tmp_path, "--controllers", "0", "--replicas", "1", "--groups", "2")
    try:
        brokers = info["brokers"]
        assert isinstance(brokers, list)
        assert [(b["broker_name"], b["broker_id"], b["role"]) for b in brokers] == [
            ("broker-a", 0, "ASYNC_MASTER"),
            ("broker-b", 0, "ASYNC_MASTER"),
        ]
        assert info["controllers"] == []
        dirs = [Path(b["store_dir"]) for b in brokers]
        assert all(await asyncio.gather(*(asyncio.to_thread(d.is_dir) for d in dirs)))
        namesrv = str(info["namesrv"])
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("UpTopic", queues=2)
            deadline = time.monotonic() + 30
            while True:
                route = await admin.route("UpTopic")
                if route is not None and len(route.queue_datas) == 2:
                    break
                assert time.monotonic() < deadline, "both groups never served the topic"
                await asyncio.sleep(0.05)
        sent: set[str] = set()
        async with Producer(namesrv) as producer:
            for i in range(40):
                result = await producer.send("UpTopic", f"m{i}".encode())
                sent.add(f"{result.queue.broker_name}:m{i}")
        assert {s.split(":")[0] for s in sent} == {"broker-a", "broker-b"}
        received: set[str] = set()
        async with PullConsumer(namesrv, "UpCheck") as consumer:
            for queue in await consumer.queues("UpTopic"):
                pulled = await consumer.pull(queue, 0, max_messages=100)
                assert pulled.status is PullStatus.FOUND
                received |= {f"{queue.broker_name}:{m.body.decode()}" for m in pulled.messages}
        assert received == sent
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert not [pid for pid in _pids(info) if _alive(pid)], "a child outlived ferry up"


def test_classic_up_stops_the_cluster_and_fails_when_a_child_dies(tmp_path: Path) -> None:
    process, info = _up(tmp_path, "--controllers", "0", "--replicas", "1")
    try:
        brokers = info["brokers"]
        assert isinstance(brokers, list)
        os.kill(int(brokers[0]["pid"]), signal.SIGKILL)
        assert process.wait(30) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert not [pid for pid in _pids(info) if _alive(pid)]
    assert "broker-a" in (tmp_path / "up.log").read_text()


async def test_classic_up_with_replicas_runs_a_sync_master_and_its_slaves(
    tmp_path: Path,
) -> None:
    process, info = _up(tmp_path, "--controllers", "0", "--replicas", "3")
    try:
        brokers = info["brokers"]
        assert isinstance(brokers, list)
        assert [(b["broker_name"], b["broker_id"], b["role"]) for b in brokers] == [
            ("broker-a", 0, "SYNC_MASTER"),
            ("broker-a", 1, "SLAVE"),
            ("broker-a", 2, "SLAVE"),
        ]
        assert brokers[0]["ha_addr"]
        assert brokers[1]["ha_addr"] is None
        namesrv = str(info["namesrv"])
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("UpR3", queues=1)
            deadline = time.monotonic() + 30
            while await admin.route("UpR3") is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        async with RpcClient() as client:
            deadline = time.monotonic() + 30
            while True:
                response = await client.call(
                    str(brokers[0]["addr"]),
                    RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO),
                    5,
                )
                if decode_body(response.body, KVTable).table.get("syncStateSet") == "0,1,2":
                    break
                assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
                await asyncio.sleep(0.1)
        async with Producer(namesrv) as producer:
            await producer.send("UpR3", b"replicated")  # committed: every replica has it
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert not [pid for pid in _pids(info) if _alive(pid)]
    for store in ("broker-a-2", "broker-a-3"):
        segments = list((tmp_path / "data" / store / "commitlog").iterdir())
        heads = []
        for segment in segments:  # 1 GiB sparse files: the message is in the first bytes
            with segment.open("rb") as file:
                heads.append(file.read(64 * 1024))
        assert any(b"replicated" in head for head in heads)


@pytest.mark.parametrize("embedded", [False, True], ids=["controllers", "embedded-controllers"])
async def test_up_defaults_to_an_ha_group_run_by_three_controllers(
    tmp_path: Path, embedded: bool
) -> None:
    process, info = _up(tmp_path, *(["--embedded-controller"] if embedded else []))
    try:
        controllers = info["controllers"]
        brokers = info["brokers"]
        assert isinstance(controllers, list)
        assert isinstance(brokers, list)
        assert [c["id"] for c in controllers] == ["n1", "n2", "n3"]
        assert sorted(b["broker_id"] for b in brokers) == [1, 2, 3]
        assert sorted(b["role"] for b in brokers) == ["SLAVE", "SLAVE", "SYNC_MASTER"]
        namesrv = str(info["namesrv"])
        assert namesrv.count(";") == (2 if embedded else 0)
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("UpHA", queues=1)
            deadline = time.monotonic() + 30
            while await admin.route("UpHA") is None:  # the master registers it with the NameServer
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        async with Producer(namesrv) as producer:
            result = await producer.send("UpHA", b"through the elected master")
        assert result.queue_offset == 0
        # the 5.x endpoint's gRPC port: plain text (Python 5.x default) and TLS (Java's) at once
        v2 = load()
        request = v2.QueryRouteRequest()
        request.topic.name = "UpHA"
        ca = await asyncio.to_thread(Path(str(info["proxy_tls_ca"])).read_bytes)
        for channel in (
            grpc.aio.insecure_channel(str(info["proxy"])),
            grpc.aio.secure_channel(
                str(info["proxy"]), grpc.ssl_channel_credentials(root_certificates=ca)
            ),
        ):
            async with channel:
                route = await rpc(channel, v2, "QueryRoute")(request, timeout=30)
            assert route.status.code == v2.code("OK"), route.status
            assert route.message_queues
        pids = [int(c["pid"]) for c in controllers]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert not [pid for pid in [*_pids(info), *pids] if _alive(pid)], "a child outlived ferry up"
