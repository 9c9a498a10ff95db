"""Fenced topics on real processes (issue 18).

1. Controller mode, one group of 3 replicas: kill -9 the fenced topic's master during a stream of
   fenced writes. Every acknowledged record and the fence survive on the new master, which holds
   nothing that was not sent, a stale writer is still refused, and the new master's fence is what
   the old one had committed; the old master comes back as a slave with the same fence.
2. Classic SYNC_MASTER with two slaves and 64 KiB segments: retention forced on every segment it
   would delete (fileReservedTime=0, DELETE_EXPIRED_COMMITLOG), slaves first, with a kill -9 and
   restart of every broker in between. Slaves keep the live tail until the master's copies reach
   them; afterwards the tail is still readable from its live start and the fence is unchanged.
"""

import asyncio
import time
from pathlib import Path

import pytest

from ferrymq.broker.fence import FenceLog, parse_record, rebuild
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedTopicWriter, FenceHolder, fence_holder
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FencedError, SendFailedError, SendOutcomeUnknownError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from .procs import Server, start

pytestmark = pytest.mark.system

TOPIC = "ConnectConfigs"
URL = "http://w1:8083"


async def _runtime(client: RpcClient, address: str) -> dict[str, str]:
    response = await client.call(
        address, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 5
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    return decode_body(response.body, KVTable).table


async def _until_in_sync(client: RpcClient, master: str, members: int) -> None:
    deadline = time.monotonic() + 30
    while (await _runtime(client, master)).get("syncStateSet", "").count(",") < members - 1:
        assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
        await asyncio.sleep(0.1)


async def _master(admin: AdminClient, *, not_addr: str = "", timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(TOPIC)
        if route is not None:
            for broker in route.broker_datas:
                address = broker.broker_addrs.get(0)
                if address and address != not_addr:
                    return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(0.1)


async def _log(namesrv: str) -> list[Message]:
    async with PullConsumer(namesrv, "FenceChecker") as consumer:
        queue = MessageQueue(TOPIC, "broker-a", 0)
        return await consumer.fetch_range(queue, 0, await consumer.max_offset(queue))


def _fold(messages: list[Message]) -> FenceLog:
    return rebuild([(m.queue_offset, parse_record(m.properties)) for m in messages])


async def test_kill_the_fenced_masters_process_during_fenced_writes(tmp_path: Path) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, replicas=3, controllers=3))
    await cluster.start()
    acked: dict[int, bytes] = {}
    unknown: set[bytes] = set()
    refused = 0
    try:
        async with (
            AdminClient(cluster.namesrv_addr) as admin,
            RpcClient() as client,
            FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log,
        ):
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
            old_master = await _master(admin)
            await _until_in_sync(client, old_master, 3)
            claim = await log.append(b"claim-1", op="claim", epoch=1, writer="w1", url=URL)
            acked[claim.queue_offset] = b"claim-1"
            victim = next(name for name, c in cluster.brokers.items() if c.addr == old_master)

            async def write(count: int, tag: str, kill_at: int = -1) -> None:
                nonlocal refused
                for i in range(count):
                    if i == kill_at:  # while write i is in flight
                        asyncio.get_running_loop().call_soon(cluster.brokers[victim].kill)
                    body = f"{tag}-{i:04d}".encode()
                    try:
                        result = await log.append(
                            body, op="write", epoch=1, writer="w1", timeout_s=15.0
                        )
                    except SendOutcomeUnknownError:  # NotCommittedError included
                        unknown.add(body)
                    except FencedError:
                        raise  # never: w1 holds the epoch throughout
                    except SendFailedError:
                        refused += 1
                    else:
                        acked[result.queue_offset] = body

            await write(150, "before")
            committed_before = await fence_holder(client, old_master, TOPIC, 5)
            assert committed_before == FenceHolder(1, "w1", URL, 0)
            await write(300, "during", kill_at=60)
            new_master = await _master(admin, not_addr=old_master)
            await write(100, "after")
            assert any(body.startswith(b"after") for body in acked.values())

            # the fence survived: the new master's is what the old one had committed
            assert await fence_holder(client, new_master, TOPIC, 5) == committed_before
            stored = await _log(cluster.namesrv_addr)
            by_offset = {m.queue_offset: m.body for m in stored}
            lost = {q: b for q, b in acked.items() if by_offset.get(q) != b}
            assert not lost, f"{len(lost)} acknowledged records lost, e.g. {list(lost.items())[:3]}"
            sent = set(acked.values()) | unknown
            assert all(m.body in sent for m in stored), "a record nobody sent"
            assert len({m.body for m in stored}) == len(stored), "a record stored twice"
            assert [m.queue_offset for m in stored] == list(range(len(stored)))
            fold = _fold(stored)
            assert (fold.fence.epoch, fold.fence.writer, fold.fence.url) == (1, "w1", URL)

            # a stale writer is refused after the failover, with the holder named
            await log.append(b"claim-2", op="claim", epoch=2, writer="w2", url="http://w2")
            with pytest.raises(FencedError) as stale:
                await log.append(b"stale", op="write", epoch=1, writer="w1")
            assert (stale.value.epoch, stale.value.writer, stale.value.url) == (
                2,
                "w2",
                "http://w2",
            )

            # the old master rejoins as a slave and holds the same fence, committed
            await cluster.brokers[victim].process.wait()
            restarted = await cluster.restart(victim)
            deadline = time.monotonic() + 60
            while True:
                info = await _runtime(client, restarted.addr)
                if info.get("brokerRole") == "SLAVE" and await fence_holder(
                    client, restarted.addr, TOPIC, 5
                ) == await fence_holder(client, new_master, TOPIC, 5):
                    break
                assert time.monotonic() < deadline, f"the old master did not catch up: {info}"
                await asyncio.sleep(0.2)
            holder = await fence_holder(client, restarted.addr, TOPIC, 5)
            assert (holder.epoch, holder.writer) == (2, "w2")
    finally:
        await cluster.stop()


SEGMENT = 64 * 1024


def _broker(tmp_path: Path, namesrv: Server, name: str, role: str, broker_id: int) -> Server:
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
            "--register-name-server-period",
            "1000",
        ],
        tmp_path,
        name,
    )


async def _retention_round(
    namesrv: str, master: Server, slaves: list[Server], tail: list[tuple[int, bytes]]
) -> FenceHolder:
    """Fill four segments, then expire all that retention may take: slaves, master, slaves."""
    async with Producer(namesrv) as producer:
        for _ in range(4 * SEGMENT // 4000 + 1):
            await producer.send("Filler", b"f" * 4000)
    async with AdminClient(namesrv) as admin, RpcClient() as client:
        end = int((await _runtime(client, master.addr))["commitLogMaxOffset"])
        deadline = time.monotonic() + 30
        for slave in slaves:
            while int((await _runtime(client, slave.addr))["commitLogMaxOffset"]) < end:
                assert time.monotonic() < deadline, "the slaves did not catch up"
                await asyncio.sleep(0.1)
        await asyncio.sleep(1.2)  # every segment flushed (flushIntervalCommitLog 500 ms)
        live = await admin.fence(TOPIC)
        live_log_offset = (await _read(namesrv, live.live_start_offset, 1))[0].log_offset
        for broker in (master, *slaves):
            await admin.update_broker_config(broker.addr, {"fileReservedTime": "0"})
        for slave in slaves:  # before the master copied anything: the live tail stays
            await admin.delete_expired_commit_log(slave.addr)
            minimum = int((await _runtime(client, slave.addr))["commitLogMinOffset"])
            assert minimum <= live_log_offset, (slave.addr, minimum, live_log_offset)
        assert await admin.delete_expired_commit_log(master.addr) >= 3
        # the copies reached the slaves (committed): they may now delete what they kept
        await asyncio.sleep(1.2)
        for slave in slaves:
            await admin.delete_expired_commit_log(slave.addr)
        holder = await admin.fence(TOPIC)
        for broker in (master, *slaves):
            info = await _runtime(client, broker.addr)
            assert int(info["commitLogMinOffset"]) >= end - 2 * SEGMENT, (broker.addr, info)
            on_broker = await fence_holder(client, broker.addr, TOPIC, 5)
            assert on_broker == holder, (broker.addr, on_broker, holder)
    assert (holder.epoch, holder.writer, holder.url) == (1, "w1", URL)
    assert holder.live_start_offset > live.live_start_offset  # the copies are the tail now
    assert await _replay(namesrv, holder.live_start_offset) == tail
    return holder


async def _read(namesrv: str, start_offset: int, count: int | None = None) -> list[Message]:
    async with PullConsumer(namesrv, "ConfigReader") as consumer:
        queue = MessageQueue(TOPIC, "broker-a", 0)
        end = await consumer.max_offset(queue) if count is None else start_offset + count
        return await consumer.fetch_range(queue, start_offset, end)


async def _replay(namesrv: str, start_offset: int) -> list[tuple[int, bytes]]:
    messages = await _read(namesrv, start_offset)
    applied: list[tuple[int, bytes]] = []
    for message in messages:
        logical = int(message.properties.get(props.FENCE_COPY, message.queue_offset))
        if not applied or logical > applied[-1][0]:
            applied.append((logical, message.body))
    return applied


async def test_forced_retention_on_every_replica_keeps_the_fenced_live_tail(
    tmp_path: Path,
) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    master = _broker(tmp_path, namesrv, "master", "SYNC_MASTER", 0)
    slaves = [_broker(tmp_path, namesrv, f"slave{i}", "SLAVE", i) for i in (1, 2)]
    try:
        async with AdminClient(namesrv.addr) as admin, RpcClient() as client:
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
            await admin.create_topic("Filler", 1)
            await _until_in_sync(client, master.addr, 3)
        async with FencedTopicWriter(namesrv.addr, TOPIC) as log:
            await log.append(b"claim", op="claim", epoch=1, writer="w1", url=URL)
            await log.append(b"before the snapshot", op="write", epoch=1, writer="w1")
            tail = []
            snap = await log.append(b"snapshot", op="snapshot", epoch=1, writer="w1", url=URL)
            tail.append((snap.queue_offset, b"snapshot"))
            for i in range(5):
                body = f"config-{i}".encode()
                result = await log.append(body, op="write", epoch=1, writer="w1")
                tail.append((result.queue_offset, body))
        before = await _retention_round(namesrv.addr, master, slaves, tail)

        for server in (master, *slaves):
            server.kill()
        master = _broker(tmp_path, namesrv, "master", "SYNC_MASTER", 0)
        slaves = [_broker(tmp_path, namesrv, f"slave{i}", "SLAVE", i) for i in (1, 2)]
        async with RpcClient() as client:
            await _until_in_sync(client, master.addr, 3)
        async with AdminClient(namesrv.addr) as admin:
            assert await admin.fence(TOPIC) == before  # rebuilt from copies after the restart
        async with FencedTopicWriter(namesrv.addr, TOPIC) as log:
            with pytest.raises(FencedError):
                await log.append(b"stale", op="write", epoch=1, writer="w0")
            more = await log.append(b"config-5", op="write", epoch=1, writer="w1")
            tail.append((more.queue_offset, b"config-5"))
        await _retention_round(namesrv.addr, master, slaves, tail)
    finally:
        for server in (master, *slaves):
            server.stop()
        namesrv.stop()
