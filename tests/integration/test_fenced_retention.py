"""Retention cannot eat a fenced topic (issue 18, broker/retention.py): forced deletion of every
segment it can take, through the store, through the broker and through the admin request with
fileReservedTime lowered to 0, with a restart in between. The live tail stays readable, the
fence stays the same, and a reader starting at the live start sees every logical record once."""

import asyncio
from pathlib import Path

import pytest

from ferrymq.broker import retention
from ferrymq.broker.broker import Broker
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedTopicWriter, FenceHolder
from ferrymq.client.producer import Producer
from ferrymq.errors import FencedError
from ferrymq.model import MessageQueue
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props

TOPIC = "ConnectConfigs"
SEGMENT = 64 * 1024
FILLER = b"f" * 4000


async def _cluster(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path, mapped_file_size_commit_log=SEGMENT)
    await cluster.start()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
            await admin.create_topic("Filler", 1)
    except BaseException:
        await cluster.close()
        raise
    return cluster


async def _fill(cluster: LocalCluster, segments: int) -> None:
    """Send enough filler to roll `segments` segments, then flush them."""
    async with Producer(cluster.namesrv_addr) as producer:
        for _ in range(segments * SEGMENT // len(FILLER) + 1):
            await producer.send("Filler", FILLER)
    cluster.broker.store.flush()


async def _replay(cluster: LocalCluster, start: int) -> list[tuple[int, bytes]]:
    """The reader rule from `start`: apply a record iff its logical offset is new."""
    async with PullConsumer(cluster.namesrv_addr, "ConfigReader") as consumer:
        queue = MessageQueue(TOPIC, "broker-a", 0)
        messages = await consumer.fetch_range(queue, start, await consumer.max_offset(queue))
    applied: list[tuple[int, bytes]] = []
    for message in messages:
        logical = int(message.properties.get(props.FENCE_COPY, message.queue_offset))
        if not applied or logical > applied[-1][0]:
            applied.append((logical, message.body))
    return applied


async def _write_config(log: FencedTopicWriter) -> list[tuple[int, bytes]]:
    """claim, write, snapshot, writes: the live tail is [snapshot, end)."""
    await log.append(b"claim-1", op="claim", epoch=1, writer="w1", url="http://w1")
    await log.append(b"old", op="write", epoch=1, writer="w1")
    tail = []
    snap = await log.append(b"snapshot", op="snapshot", epoch=1, writer="w1", url="http://w1")
    tail.append((snap.queue_offset, b"snapshot"))
    for i in range(3):
        body = f"config-{i}".encode()
        tail.append(((await log.append(body, op="write", epoch=1, writer="w1")).queue_offset, body))
    return tail


async def _expire_all(broker: Broker) -> int:
    deleted = 0
    for _ in range(100):
        step = await retention.delete_expired(broker.state, force=True)
        if not step:
            return deleted
        deleted += step
    raise AssertionError("retention kept deleting")


async def test_the_store_never_deletes_a_fenced_live_tail_even_when_forced(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            tail = await _write_config(log)
        await _fill(cluster, 4)
        store = cluster.broker.store
        assert len(store.commitlog.chain.segments) >= 4
        assert store.delete_expired(force=True) == 0  # the first segment holds the live tail
        assert store.min_log_offset == 0
        assert (await _replay(cluster, tail[0][0])) == tail
    finally:
        await cluster.close()


async def test_forced_retention_copies_the_live_tail_forward_and_deletes_the_rest(
    tmp_path: Path,
) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            tail = await _write_config(log)
            for rounds in range(3):
                await _fill(cluster, 3)
                assert await _expire_all(cluster.broker) >= 2
                store = cluster.broker.store
                assert store.min_log_offset > 0
                holder = await log.holder()
                assert (holder.epoch, holder.writer, holder.url) == (1, "w1", "http://w1")
                assert holder.live_start_offset > tail[0][0] + rounds  # moved to the copies
                assert await _replay(cluster, holder.live_start_offset) == tail
                assert store.min_queue_offset(TOPIC, 0) <= holder.live_start_offset
            # the writer goes on; a stale one is still refused
            more = await log.append(b"config-3", op="write", epoch=1, writer="w1")
            tail.append((more.queue_offset, b"config-3"))
            claim = await log.append(b"claim-2", op="claim", epoch=2, writer="w2", url="http://w2")
            tail.append((claim.queue_offset, b"claim-2"))
            with pytest.raises(FencedError) as stale:
                await log.append(b"stale", op="write", epoch=1, writer="w1")
            assert (stale.value.epoch, stale.value.writer) == (2, "w2")
            holder = await log.holder()
        await cluster.restart_broker(0)  # the rebuild reads copies and originals alike
        async with AdminClient(cluster.namesrv_addr) as admin:
            assert await admin.fence(TOPIC) == FenceHolder(
                2, "w2", "http://w2", holder.live_start_offset
            )
        assert await _replay(cluster, holder.live_start_offset) == tail
    finally:
        await cluster.close()


async def test_the_admin_delete_with_retention_lowered_to_zero_keeps_the_config(
    tmp_path: Path,
) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            tail = await _write_config(log)
        for round_ in range(2):
            await _fill(cluster, 3)
            async with AdminClient(cluster.namesrv_addr) as admin:
                address = cluster.broker.address
                await admin.update_broker_config(address, {"fileReservedTime": "0"})
                deleted = await admin.delete_expired_commit_log(address)
                assert deleted >= 2, deleted
                # what the copies left behind goes on the next pass
                await asyncio.sleep(0.6)
                cluster.broker.store.flush()
                await admin.delete_expired_commit_log(address)
                holder = await admin.fence(TOPIC)
            store = cluster.broker.store
            assert len(store.commitlog.chain.segments) <= 2, store.commitlog.chain.segments
            assert (holder.epoch, holder.writer) == (1, "w1")
            assert await _replay(cluster, holder.live_start_offset) == tail
            if round_ == 0:
                await cluster.restart_broker(0)
    finally:
        await cluster.close()
