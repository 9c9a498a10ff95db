"""Topics as controller state (issue 20 section 3), as real processes.

Three controllers, a NameServer and two groups of two replicas (`ferry up --groups 2`), with
broker-b's replicas killed with SIGKILL meanwhile:
- a topic created while broker-b has no master is on broker-b once its replicas are back;
- a topic deleted while broker-b is down never comes back: not in the routes, not on its new
  master, not on its slave (queues and consumer offsets dropped, also on disk);
- with `deleteTopicEnable=false` on the controllers, `ferry admin topic delete` fails with one
  clear line and the topic stays;
- `ferry admin topic status` shows the controller's placement against what each group holds.
Only outcomes are asserted, never how fast anything went.
"""

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import (
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

DOOMED = "DoomedWhileDown"
LATE = "CreatedWhileDown"
READERS = "DoomedReaders"


async def _wait(what: str, predicate: Callable[[], Awaitable[bool]], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.1)


async def _max_offset(rpc: RpcClient, address: str, topic: str, queue_id: int) -> int:
    header = GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
    request = RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=to_ext_fields(header))
    response = await rpc.call(address, request, 5.0)
    assert response.code == ResponseCode.SUCCESS, response.remark
    offset = from_ext_fields(GetMaxOffsetResponseHeader, response.ext_fields).offset
    assert offset is not None
    return offset


async def _committed(rpc: RpcClient, address: str, topic: str, queue_id: int) -> int | None:
    header = QueryConsumerOffsetRequestHeader(
        consumer_group=READERS, topic=topic, queue_id=queue_id, set_zero_if_not_found=False
    )
    request = RemotingCommand(
        code=RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=to_ext_fields(header)
    )
    response = await rpc.call(address, request, 5.0)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["offset"])


def _ferry(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferrymq.cmd.ferry", "admin", "--namesrv", namesrv, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _store_dir(child: Child) -> Path:
    return Path(str(child.info["store_dir"]))


async def test_topics_follow_the_controller_across_a_group_that_was_down(tmp_path: Path) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, groups=2, replicas=2, controllers=3))
    await cluster.start()
    b_names = [name for name in cluster.brokers if name.startswith("broker-b")]
    try:
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as rpc:
            # a topic on both groups, with messages and committed offsets on broker-b
            await admin.create_topic(DOOMED, 2)
            async with Producer(cluster.namesrv_addr) as producer:
                queues_b = [q for q in await producer.queues(DOOMED) if q.broker_name == "broker-b"]
                assert len(queues_b) == 2
                for i in range(10):
                    await producer.send(DOOMED, b"m%d" % i, queue=queues_b[i % 2])
            moved = await admin.reset_offsets(READERS, DOOMED, to_latest=True)
            assert moved[("broker-b", 0)] == 5
            b_children = [cluster.brokers[name] for name in b_names]

            async def replicated() -> bool:
                for child in b_children:
                    if await _max_offset(rpc, child.addr, DOOMED, 0) != 5:
                        return False
                    if await _committed(rpc, child.addr, DOOMED, 0) != 5:
                        return False
                return True

            await _wait("broker-b's replicas hold the messages and offsets", replicated)

            # broker-b loses every replica: the group has no master
            for name in b_names:
                cluster.brokers[name].kill()

            async def b_gone() -> bool:
                info = await admin.cluster_info()
                return "broker-b" not in info.broker_addr_table

            await _wait("broker-b left the routes", b_gone)

            await admin.delete_topic(DOOMED)
            assert await admin.route(DOOMED) is None
            masters = await admin.create_topic(LATE, 3)
            assert len(masters) == 1  # broker-a's master; broker-b gets it when back
            placement = await admin.topic_placement(LATE)
            assert placement is not None
            assert {g.broker_name: g.state for g in placement.groups} == {
                "broker-a": "ok",
                "broker-b": "no master",
            }

            # broker-b's replicas come back, on their stores
            await asyncio.gather(*(cluster.restart(name) for name in b_names))

            async def late_on_b() -> bool:
                route = await admin.route(LATE)
                routed = (
                    {q.broker_name: q.write_queue_nums for q in route.queue_datas} if route else {}
                )
                return routed == {"broker-a": 3, "broker-b": 3}

            await _wait("the topic created while broker-b was down is routed on it", late_on_b)
            for _ in range(20):  # the deleted topic stays gone while broker-b registers again
                assert await admin.route(DOOMED) is None
                await asyncio.sleep(0.1)
            placement = await admin.topic_placement(DOOMED)
            assert placement is not None
            assert placement.record is None
            assert placement.deleted_at is not None
            assert placement.groups == []  # no group holds or routes it

            b_children = [cluster.brokers[name] for name in b_names]
            for child in b_children:  # the new master and its slave alike
                for queue_id in (0, 1):
                    assert await _max_offset(rpc, child.addr, DOOMED, queue_id) == 0, child.name
                    assert await _committed(rpc, child.addr, DOOMED, queue_id) is None, child.name

            async def dropped_on_disk() -> bool:
                for child in b_children:
                    root = _store_dir(child)
                    if (root / "consumequeue" / DOOMED).exists():
                        return False
                    offsets = root / "config" / "consumerOffset.json"
                    if offsets.exists() and f"{DOOMED}@{READERS}" in offsets.read_text():
                        return False
                return True

            await _wait("queues and offsets gone from both replicas' disks", dropped_on_disk)

            # the gate: no deletes while deleteTopicEnable=false
            controllers = await admin.controllers()
            assert controllers is not None
            await controllers.update_config({"deleteTopicEnable": "false"})
        refused = _ferry(cluster.namesrv_addr, "topic", "delete", LATE)
        assert refused.returncode == 1
        assert "deleteTopicEnable=false" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

        shown = _ferry(cluster.namesrv_addr, "topic", "status", LATE, "--json")
        assert shown.returncode == 0, shown.stderr
        groups = json.loads(shown.stdout)["placement"]["groups"]
        assert [
            (g["brokerName"], g["desired"], g["onBroker"], g["routed"], g["state"]) for g in groups
        ] == [
            ("broker-a", 3, 3, 3, "ok"),
            ("broker-b", 3, 3, 3, "ok"),
        ]
        table = _ferry(cluster.namesrv_addr, "topic", "status", LATE)
        assert table.returncode == 0, table.stderr
        assert "placement of" in table.stdout
        assert "desired" in table.stdout
    finally:
        await cluster.stop()
