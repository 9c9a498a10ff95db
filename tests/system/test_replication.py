"""A 3-replica group under sync replication, as processes: kill -9 a slave mid-transfer, restart
it, and the slaves' commit logs end up byte-identical to the master's up to the confirm offset."""

import asyncio
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.errors import ConnectError, NotCommittedError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.broker import QueryConsumerOffsetRequestHeader, UpdateConsumerOffsetRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from ..integration.remoting import command, pull, send
from .procs import Server, start

pytestmark = pytest.mark.system

SEGMENT = 64 * 1024


def _broker(
    tmp_path: Path, namesrv: Server, name: str, role: str, broker_id: int, *extra: str
) -> Server:
    return start(
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(tmp_path / name),
            "--role",
            role,
            "--broker-id",
            str(broker_id),
            "--mapped-file-size-commit-log",
            str(SEGMENT),
            "--ha-send-heartbeat-interval",
            "300",
            "--ha-max-time-slave-not-catchup",
            "3000",
            "--slave-timeout",
            "1000",
            "--register-name-server-period",
            "1000",
            *extra,
        ],
        tmp_path,
        name,
    )


async def _runtime(client: RpcClient, address: str) -> dict[str, str]:
    response = await client.call(
        address, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 5
    )
    assert response.code == ResponseCode.SUCCESS
    return decode_body(response.body, KVTable).table


def _queue_of(body: bytes) -> int:
    return int(body.split(b"-")[1]) % 2


def expected_of(acked: list[bytes], queue_id: int) -> list[bytes]:
    return [b for b in acked if _queue_of(b) == queue_id]


def _log_bytes(store_dir: Path, end: int) -> bytes:
    data = b""
    for segment in sorted((store_dir / "commitlog").iterdir()):
        data += segment.read_bytes()
    return data[:end]


async def test_slaves_match_the_master_after_one_is_killed_mid_transfer(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    # consumers far behind (here: any lag) are sent to slave 1; slave 2 serves no reads
    master = _broker(
        tmp_path,
        namesrv,
        "master",
        "SYNC_MASTER",
        0,
        "--slave-read-enable",
        "true",
        "--access-message-in-memory-max-ratio",
        "0",
    )
    readable = ("--slave-read-enable", "true")
    slaves = {
        1: _broker(tmp_path, namesrv, "slave1", "SLAVE", 1, *readable),
        2: _broker(tmp_path, namesrv, "slave2", "SLAVE", 2),
    }
    acked: list[bytes] = []
    refused = 0
    try:
        async with RpcClient() as client:
            async with AdminClient(namesrv.addr) as admin:
                await admin.create_topic("R3", queues=2)
            deadline = time.monotonic() + 30
            while (await _runtime(client, master.addr)).get("syncStateSet") != "0,1,2":
                assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
                await asyncio.sleep(0.1)

            async def produce(count: int, tag: str) -> None:
                nonlocal refused
                for i in range(count):
                    body = f"{tag}-{i:05d}-".encode() * 20
                    response = await send(client, master.addr, "R3", body, queue_id=i % 2)
                    if response.code == ResponseCode.SUCCESS:
                        acked.append(body)
                    else:
                        assert response.code in (
                            ResponseCode.FLUSH_SLAVE_TIMEOUT,
                            ResponseCode.SYSTEM_ERROR,
                        ), response.remark
                        refused += 1

            await produce(300, "before")
            slaves[1].kill()  # mid-stream: the master keeps sending to slave 2
            async with Producer(namesrv.addr) as producer:
                # slave 1 is still in the SyncStateSet (for 3 s): an explicit not-committed
                with pytest.raises(NotCommittedError) as refused_by_sdk:
                    await producer.send("R3", b"while a member is down")
                assert refused_by_sdk.value.status == "FLUSH_SLAVE_TIMEOUT"
                refused += 1
            # an offset commit is acknowledged only once replicated too
            early = UpdateConsumerOffsetRequestHeader(
                consumer_group="G", topic="R3", queue_id=0, commit_offset=7
            )
            response = await client.call(
                master.addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, early), 10
            )
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert "not replicated" in (response.remark or "")
            await produce(300, "during")
            slaves[1] = _broker(tmp_path, namesrv, "slave1", "SLAVE", 1, *readable)
            await produce(300, "after")
            update = UpdateConsumerOffsetRequestHeader(
                consumer_group="G", topic="R3", queue_id=1, commit_offset=123
            )
            response = await client.call(
                master.addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, update), 5
            )
            assert response.code == ResponseCode.SUCCESS
            # a slave refuses commits: the master's replicated offsets would overwrite its copy
            response = await client.call(
                slaves[2].addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, update), 5
            )
            assert response.code == ResponseCode.NO_PERMISSION, response.remark
            deadline = time.monotonic() + 30
            while True:
                info = await _runtime(client, master.addr)
                end = int(info["commitLogMaxOffset"])
                caught_up = [
                    int((await _runtime(client, s.addr))["commitLogMaxOffset"]) == end
                    for s in slaves.values()
                ]
                in_sync = info["syncStateSet"] == "0,1,2"  # the restarted slave expanded back in
                if all(caught_up) and in_sync and int(info["confirmOffset"]) == end:
                    break
                assert time.monotonic() < deadline, f"slaves never caught up: {info}"
                await asyncio.sleep(0.1)
            # a slave serves everything committed, in queue order, and the master's metadata
            for queue_id in (0, 1):
                expected = [b for b in acked if _queue_of(b) == queue_id]
                served: list[bytes] = []
                while True:
                    response, records = await pull(
                        client, slaves[1].addr, "R3", queue_id, len(served), max_msgs=32
                    )
                    if response.code != ResponseCode.SUCCESS:
                        break
                    served += [r.body for r in records]
                assert [b for b in served if b in set(expected)] == expected
            no_reads, _ = await pull(client, slaves[2].addr, "R3", 0, 0)
            assert no_reads.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert no_reads.ext_fields["suggestWhichBrokerId"] == "0"
            behind, _ = await pull(client, master.addr, "R3", 0, 0)
            assert behind.ext_fields["suggestWhichBrokerId"] == "1"
            async with PullConsumer(namesrv.addr, "FollowsSuggestions") as consumer:
                queue = MessageQueue("R3", "broker-a", 0)
                end_offset = await consumer.max_offset(queue)
                fetched = await consumer.fetch_range(queue, 0, end_offset)
                assert [m.body for m in fetched if m.body in set(acked)] == expected_of(acked, 0)
            query = QueryConsumerOffsetRequestHeader(consumer_group="G", topic="R3", queue_id=1)
            deadline = time.monotonic() + 10
            while True:
                response = await client.call(
                    slaves[1].addr, command(RequestCode.QUERY_CONSUMER_OFFSET, query), 5
                )
                if response.ext_fields.get("offset") == "123":
                    break
                assert time.monotonic() < deadline, "the offset commit never reached the slave"
                await asyncio.sleep(0.1)
    finally:
        for server in (*slaves.values(), master):
            server.stop()
        namesrv.stop()
    assert len(acked) >= 600, f"only {len(acked)} sends committed ({refused} refused)"
    assert refused > 0, "the killed member held commits until it was shrunk out"
    master_log = _log_bytes(tmp_path / "master", end)
    assert len(master_log) == end
    assert end > 2 * SEGMENT, "the log rolled segments during the test"
    for name in ("slave1", "slave2"):
        assert _log_bytes(tmp_path / name, end) == master_log, f"{name} differs from the master"
    for body in acked:
        assert body in master_log


async def test_committed_offsets_are_read_from_the_master_only(tmp_path: Path) -> None:
    """With the master gone the SDK raises rather than answer from a slave, whose copy may be
    older than a position the master acknowledged (a commit-regression `ferry chaos` found)."""
    namesrv = start(
        ["namesrv", "--listen", "127.0.0.1:0", "--broker-timeout", "2"], tmp_path, "namesrv"
    )
    master = _broker(tmp_path, namesrv, "master", "ASYNC_MASTER", 0)
    slave = _broker(tmp_path, namesrv, "slave", "SLAVE", 1)
    queue = MessageQueue("Offsets", "broker-a", 0)
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Offsets", queues=1)
        async with PullConsumer(namesrv.addr, "G") as consumer, RpcClient() as client:
            await consumer.commit(queue, 41)
            assert await consumer.committed(queue) == 41
            query = QueryConsumerOffsetRequestHeader(
                consumer_group="G", topic="Offsets", queue_id=0
            )
            deadline = time.monotonic() + 10
            while True:  # the slave has the position too: it answers direct queries (RocketMQ's)
                response = await client.call(
                    slave.addr, command(RequestCode.QUERY_CONSUMER_OFFSET, query), 5
                )
                if response.ext_fields.get("offset") == "41":
                    break
                assert time.monotonic() < deadline, "the offset never reached the slave"
                await asyncio.sleep(0.1)
            master.kill()
            deadline = time.monotonic() + 20
            while True:
                consumer.routes.invalidate("Offsets")
                route = await consumer.routes.get("Offsets")
                if 0 not in route.brokers.get("broker-a", {}):
                    break
                assert time.monotonic() < deadline, "the dead master never left the route"
                await asyncio.sleep(0.2)
            assert 1 in route.brokers["broker-a"]  # the slave is still routed
            with pytest.raises(ConnectError, match="no master"):
                await consumer.committed(queue)
    finally:
        for server in (slave, master):
            server.stop()
        namesrv.stop()
