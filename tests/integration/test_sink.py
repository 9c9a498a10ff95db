"""Exactly-once sink batches (broker/sink.py) against two real in-process broker groups."""

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.metadata import SINK_TOPIC
from ferrymq.broker.sink import Begin
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.sink import SinkClient
from ferrymq.errors import RemoteError, RpcError
from ferrymq.model import MessageQueue
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props
from ferrymq.wire.records import BatchItem, pack_host


def rows(prefix: str, count: int) -> list[BatchItem]:
    return [
        BatchItem.of(f"{prefix}-{i}".encode(), {props.UNIQ_KEY: f"{prefix}-{i}"})
        for i in range(count)
    ]


async def visible(cluster: LocalCluster, topic: str) -> list[bytes]:
    async with PullConsumer(cluster.namesrv_addr, "checker") as consumer:
        bodies: list[bytes] = []
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            bodies += [m.body for m in await consumer.fetch_range(queue, 0, end)]
        return sorted(bodies)


async def two_groups(tmp_path: Path, **config: object) -> LocalCluster:
    cluster = LocalCluster(tmp_path, brokers=2, **config)
    await cluster.start()
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Out", queues=2)
    for broker in cluster.brokers:
        await broker.register()
    return cluster


async def test_a_batch_is_invisible_until_committed_and_commits_once(tmp_path: Path) -> None:
    cluster = await two_groups(tmp_path)
    try:
        async with SinkClient(cluster.namesrv_addr) as sink:
            queues = await sink.queues("Out")
            assert {q.broker_name for q in queues} == {"broker-a", "broker-b"}
            a0 = MessageQueue("Out", "broker-a", 0)
            b1 = MessageQueue("Out", "broker-b", 1)
            await sink.prepare(a0, "s1", 0, "t1", rows("t1", 3))
            await sink.prepare(b1, "s1", 0, "t1", rows("t1b", 2))
            await sink.prepare(b1, "s1", 0, "t2", rows("t2", 4))
            assert await visible(cluster, "Out") == []

            proposal = {"t1": {"broker-a": 3, "broker-b": 2}, "t2": {"broker-b": 4}}
            coordinator = await sink.coordinator("Out")
            assert coordinator == "broker-a"
            winner = await sink.decide(coordinator, "s1", 0, proposal)
            assert winner == proposal
            assert await sink.commit("broker-a", "s1", 0, {"t1": 3}) == (3, False)
            # the driver dies here; the replay prepares the batch again under new transactions
            await sink.prepare(a0, "s1", 0, "t9", rows("t9", 3))
            replay = {"t9": {"broker-a": 3}}
            assert await sink.decide(coordinator, "s1", 0, replay) == proposal
            assert await sink.commit("broker-a", "s1", 0, {"t1": 3}) == (3, True)
            assert await sink.commit("broker-b", "s1", 0, {"t1": 2, "t2": 4}) == (6, False)
            assert await sink.commit("broker-b", "s1", 0, {"t1": 2, "t2": 4}) == (6, True)

            expected = sorted(
                [f"t1-{i}".encode() for i in range(3)]
                + [f"t1b-{i}".encode() for i in range(2)]
                + [f"t2-{i}".encode() for i in range(4)]
            )
            assert await visible(cluster, "Out") == expected
            await sink.prepare(a0, "s1", 0, "late", rows("late", 1))  # accepted, dropped

        # a restarted broker rebuilds the table from its log: the batch stays committed
        await cluster.restart_broker(0)
        async with SinkClient(cluster.namesrv_addr) as sink:
            assert await sink.commit("broker-a", "s1", 0, {"t1": 3}) == (3, True)
            assert await sink.decide("broker-a", "s1", 0, {"x": {"broker-a": 1}}) == proposal
        assert await visible(cluster, "Out") == expected
    finally:
        await cluster.close()


async def test_a_commit_cut_short_is_finished_without_duplicates(tmp_path: Path) -> None:
    cluster = await two_groups(tmp_path)
    try:
        async with SinkClient(cluster.namesrv_addr) as sink:
            a0 = MessageQueue("Out", "broker-a", 0)
            await sink.prepare(a0, "s2", 7, "t", rows("r", 5))
            # what a crash after BEGIN and two of the rows leaves in the log
            service = cluster.broker.sink
            assert service is not None
            await service._append_op(Begin("s2", 7, ["t"]), wait=False)
            await sink.prepare(a0, "other", 0, "x", rows("r", 2))
            await sink.commit("broker-a", "other", 0, {"x": 2})
            assert await visible(cluster, "Out") == [b"r-0", b"r-1"]
            assert await sink.commit("broker-a", "s2", 7, {"t": 5}) == (3, False)
        assert await visible(cluster, "Out") == [b"r-0", b"r-1", b"r-2", b"r-3", b"r-4"]
    finally:
        await cluster.close()


async def committed(cluster: LocalCluster, topic: str) -> list[Message]:
    async with PullConsumer(cluster.namesrv_addr, "checker") as consumer:
        queue = (await consumer.queues(topic))[0]
        return await consumer.fetch_range(queue, 0, await consumer.max_offset(queue))


async def test_committed_rows_keep_their_own_properties_and_none_of_the_sinks(
    tmp_path: Path,
) -> None:
    cluster = await two_groups(tmp_path)
    try:
        own = [
            {props.UNIQ_KEY: "u0", props.KEYS: "k1 k2", props.TAGS: "t", "a": "b"},
            {props.UNIQ_KEY: "u1", props.REAL_TOPIC: "Elsewhere", "FERRY_SINK": "forged"},
            {props.UNIQ_KEY: "u2", "XFERRY_SINK": "odd name"},
        ]
        async with SinkClient(cluster.namesrv_addr) as sink:
            a0 = MessageQueue("Out", "broker-a", 0)
            items = [BatchItem.of(f"b{i}".encode(), p, flag=i) for i, p in enumerate(own)]
            await sink.prepare(a0, "s", 0, "t", items)
            assert await sink.decide("broker-a", "s", 0, {"t": {"broker-a": 3}})
            assert await sink.commit("broker-a", "s", 0, {"t": 3}) == (3, False)
        got = await committed(cluster, "Out")
        assert [m.body for m in got] == [b"b0", b"b1", b"b2"]
        assert [m.properties for m in got] == [
            own[0],
            {props.UNIQ_KEY: "u1"},  # the sink's own names are never a row's
            own[2],
        ]
        assert got[0].keys == ["k1", "k2"]
        assert got[0].tags == "t"
        assert [m.msg_id for m in got] == ["u0", "u1", "u2"]
        broker = cluster.broker
        assert [broker.store.query_by_key("Out", "k2")[0].body] == [b"b0"]
    finally:
        await cluster.close()


async def test_rows_prepared_in_the_older_layout_commit_the_same(tmp_path: Path) -> None:
    """Rows an earlier broker prepared: the tags merged into the row's properties."""
    cluster = await two_groups(tmp_path)
    try:
        broker = cluster.broker
        tags = {
            "FERRY_SINK": "s",
            "FERRY_SINK_BATCH": "4",
            "FERRY_SINK_TXN": "old",
            props.REAL_TOPIC: "Out",
            props.REAL_QUEUE_ID: "0",
        }
        rows_before = [  # a tag overrode the row's own REAL_TOPIC in place, as dict merges do
            {props.REAL_TOPIC: "mine", props.UNIQ_KEY: f"o{i}", "a": "b"} for i in range(3)
        ]
        items = [BatchItem.of(f"o{i}".encode(), {**p, **tags}) for i, p in enumerate(rows_before)]
        broker.store.put(
            SINK_TOPIC, 0, items, born_host=pack_host("127.0.0.1", 7), born_timestamp_ms=5
        )
        broker.state.schedule_dispatch()
        async with SinkClient(cluster.namesrv_addr) as sink:
            assert await sink.decide("broker-a", "s", 4, {"old": {"broker-a": 3}})
            assert await sink.commit("broker-a", "s", 4, {"old": 3}) == (3, False)
        got = await committed(cluster, "Out")
        assert [(m.body, m.properties) for m in got] == [
            (f"o{i}".encode(), {props.UNIQ_KEY: f"o{i}", "a": "b"}) for i in range(3)
        ]
        assert {m.born_timestamp_ms for m in got} == {5}
    finally:
        await cluster.close()


async def test_prepared_rows_expire_and_a_late_commit_says_why(tmp_path: Path) -> None:
    cluster = await two_groups(tmp_path, sink_prepared_timeout=300)
    try:
        async with SinkClient(cluster.namesrv_addr) as sink:
            a0 = MessageQueue("Out", "broker-a", 0)
            await sink.prepare(a0, "s3", 1, "t", rows("old", 2))
            service = cluster.broker.sink
            assert service is not None
            for _ in range(100):
                batch = service.table.batches.get(("s3", 1))
                if batch is not None and not batch.staged:
                    break
                await asyncio.sleep(0.1)
            with pytest.raises(RemoteError, match=r"has 0 of its 2 prepared rows"):
                await sink.commit("broker-a", "s3", 1, {"t": 2})
        assert await visible(cluster, "Out") == []
    finally:
        await cluster.close()


async def test_rows_prepared_again_count_once(tmp_path: Path) -> None:
    # a client whose prepare got no answer (a failover) sends the same rows again
    cluster = await two_groups(tmp_path)
    try:
        async with SinkClient(cluster.namesrv_addr) as sink:
            a0 = MessageQueue("Out", "broker-a", 0)
            first, rest = rows("p", 5)[:3], rows("p", 5)[3:]
            await sink.prepare(a0, "s4", 0, "t", first)
            await sink.prepare(a0, "s4", 0, "t", first)
            await sink.prepare(a0, "s4", 0, "t", rest)
            with pytest.raises(RemoteError, match=r"has 5 of its 8 prepared rows"):
                await sink.commit("broker-a", "s4", 0, {"t": 8})
            assert await sink.commit("broker-a", "s4", 0, {"t": 5}) == (5, False)
        assert await visible(cluster, "Out") == [f"p-{i}".encode() for i in range(5)]
    finally:
        await cluster.close()


async def test_the_client_retries_until_the_group_has_a_master_again(tmp_path: Path) -> None:
    cluster = await two_groups(tmp_path)
    try:
        async with SinkClient(cluster.namesrv_addr, retry_for=30.0) as sink:
            a0 = MessageQueue("Out", "broker-a", 0)
            await sink.prepare(a0, "s5", 0, "t", rows("m", 3))
            old = cluster.brokers[0]
            await old.close()  # broker-a has no master until it comes back, on another port

            async def come_back() -> None:
                await asyncio.sleep(1.0)
                broker = Broker(dataclasses.replace(old.config))
                await broker.start()
                await broker.register()
                cluster.brokers[0] = broker

            returning = asyncio.create_task(come_back())
            assert await sink.commit("broker-a", "s5", 0, {"t": 3}) == (3, False)
            await returning
        assert await visible(cluster, "Out") == [b"m-0", b"m-1", b"m-2"]

        async with SinkClient(cluster.namesrv_addr, retry_for=1.0) as sink:
            await cluster.brokers[0].close()
            with pytest.raises(RpcError):
                await sink.commit("broker-a", "s5", 1, {"t": 1})
    finally:
        await cluster.close()
