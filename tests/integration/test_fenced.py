"""Fenced topics (issue 18) on an in-process broker: claims race, stale writers are refused with
the holder named, every other way of writing the topic is refused with nothing stored, the fence
survives a restart, and the topic's admin rules hold."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerRole
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedAppend, FencedTopicWriter, FenceHolder, fence_holder
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.sink import SinkClient
from ferrymq.errors import (
    FencedError,
    FencedTopicError,
    InvalidMessageError,
    RemoteError,
    SendFailedError,
)
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props
from ferrymq.wire.broker import ConsumerSendMsgBackRequestHeader, CreateTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_PREPARED,
    BatchItem,
    decode_record,
    encode_batch,
)
from ferrymq.wire.sink import SinkPrepareRequestHeader

from .remoting import command, send, send_batch

TOPIC = "ConnectConfigs"
ROLES = [{"broker_role": BrokerRole.ASYNC_MASTER}, {"broker_role": BrokerRole.SYNC_MASTER}]


def _props(op: str, epoch: int, writer: str, url: str | None = None) -> dict[str, str]:
    found = {props.FENCE_OP: op, props.FENCE_EPOCH: str(epoch), props.FENCE_WRITER: writer}
    if url is not None:
        found[props.FENCE_URL] = url
    return found


async def _fenced_cluster(tmp_path: Path, **config: Any) -> LocalCluster:
    cluster = LocalCluster(tmp_path, **config)
    await cluster.start()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
    except BaseException:
        await cluster.close()
        raise
    return cluster


async def _stored(cluster: LocalCluster, topic: str = TOPIC) -> list[Message]:
    async with PullConsumer(cluster.namesrv_addr, "FenceReader") as consumer:
        queue = MessageQueue(topic, "broker-a", 0)
        return await consumer.fetch_range(queue, 0, await consumer.max_offset(queue))


@pytest.mark.parametrize("config", ROLES, ids=["async", "sync"])
async def test_racing_claims_one_wins_and_the_losers_learn_the_holder(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    cluster = await _fenced_cluster(tmp_path, **config)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            assert await log.holder() == FenceHolder(0, "", "", 0)
            writers = [f"w{i}" for i in range(6)]
            results = await asyncio.gather(
                *(
                    log.append(b"claim", op="claim", epoch=1, writer=w, url=f"http://{w}:8083")
                    for w in writers
                ),
                return_exceptions=True,
            )
            won = [w for w, r in zip(writers, results, strict=True) if isinstance(r, FencedAppend)]
            assert len(won) == 1, results
            winner = won[0]
            for result in results:
                if isinstance(result, FencedAppend):
                    assert result.queue_offset == 0
                    continue
                assert isinstance(result, FencedError), result
                assert (result.epoch, result.writer, result.url) == (
                    1,
                    winner,
                    f"http://{winner}:8083",
                )
                assert "must name 2" in result.reason
            assert await log.holder() == FenceHolder(1, winner, f"http://{winner}:8083", 0)
        assert [m.body for m in await _stored(cluster)] == [b"claim"]
    finally:
        await cluster.close()


@pytest.mark.parametrize("config", ROLES, ids=["async", "sync"])
async def test_a_stale_writer_is_refused_with_the_holder_named(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    cluster = await _fenced_cluster(tmp_path, **config)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            first = await log.append(b"c1", op="claim", epoch=1, writer="w1", url="http://w1")
            second = await log.append(b"x1", op="write", epoch=1, writer="w1")
            assert (first.queue_offset, second.queue_offset) == (0, 1)
            assert second.log_offset > first.log_offset
            await log.append(b"c2", op="claim", epoch=2, writer="w2", url="http://w2")
            with pytest.raises(FencedError) as stale:
                await log.append(b"x-stale", op="write", epoch=1, writer="w1")
            assert (stale.value.topic, stale.value.epoch, stale.value.writer) == (TOPIC, 2, "w2")
            assert stale.value.url == "http://w2"
            # the epoch alone is not enough: the writer must hold it
            with pytest.raises(FencedError, match="held by 'w2'"):
                await log.append(b"x-thief", op="write", epoch=2, writer="w1")
            with pytest.raises(FencedError):
                await log.append(b"s-thief", op="snapshot", epoch=2, writer="w1", url="http://w1")
            with pytest.raises(FencedError, match="must name 3"):
                await log.append(b"c-old", op="claim", epoch=2, writer="w1", url="http://w1")
            snap = await log.append(b"s2", op="snapshot", epoch=2, writer="w2", url="http://w2b")
            assert await log.holder() == FenceHolder(2, "w2", "http://w2b", snap.queue_offset)
            with pytest.raises(InvalidMessageError):
                await log.append(b"no-url", op="claim", epoch=3, writer="w3")
            with pytest.raises(InvalidMessageError):
                await log.append(b"bad", op="write", epoch=0, writer="w2")
        assert [m.body for m in await _stored(cluster)] == [b"c1", b"x1", b"c2", b"s2"]
        stored = await _stored(cluster)
        assert stored[1].properties[props.FENCE_WRITER] == "w1"
        assert stored[3].properties[props.FENCE_URL] == "http://w2b"
    finally:
        await cluster.close()


async def test_every_other_way_to_write_a_fenced_topic_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    cluster = await _fenced_cluster(tmp_path)
    addr = cluster.broker.address
    try:
        async with (
            FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log,
            RpcClient() as client,
        ):
            await log.append(b"c1", op="claim", epoch=1, writer="w1", url="http://w1")
            fenced = _props("write", 1, "w1")
            attempts = {
                "plain send": send(client, addr, TOPIC, b"plain"),
                "plain send with keys": send(
                    client, addr, TOPIC, b"keyed", properties={"KEYS": "k"}
                ),
                "batch": send_batch(
                    client, addr, TOPIC, encode_batch([BatchItem.of(b"b1", fenced)])
                ),
                "delay level": send(
                    client, addr, TOPIC, b"d", properties={**fenced, props.DELAY_TIME_LEVEL: "2"}
                ),
                "timer": send(
                    client, addr, TOPIC, b"t", properties={**fenced, props.TIMER_DELAY_MS: "50"}
                ),
                "half message": send(
                    client,
                    addr,
                    TOPIC,
                    b"h",
                    properties={**fenced, props.TRANSACTION_PREPARED: "true"},
                    sys_flag=SYSFLAG_TRANSACTION_PREPARED,
                ),
                "a forged copy": send(
                    client, addr, TOPIC, b"f", properties={**fenced, props.FENCE_COPY: "0"}
                ),
                "a bad epoch": send(
                    client, addr, TOPIC, b"e", properties=_props("write", -1, "w1")
                ),
                "sink prepare": client.call(
                    addr,
                    command(
                        RequestCode.SINK_PREPARE,
                        SinkPrepareRequestHeader(
                            sink_id="s", batch_id=0, transaction_id="t", topic=TOPIC, queue_id=0
                        ),
                        encode_batch([BatchItem.of(b"r", {props.UNIQ_KEY: "r1", **fenced})]),
                    ),
                    5,
                ),
            }
            for what, attempt in attempts.items():
                response = await attempt
                assert response.code == ResponseCode.FENCED, (what, response.remark)
                remark = json.loads(response.remark or "")
                assert remark["topic"] == TOPIC, what
                assert (remark["epoch"], remark["writer"], remark["url"]) == (1, "w1", "http://w1")
                assert remark["reason"], what
            async with Producer(cluster.namesrv_addr) as producer:
                with pytest.raises(SendFailedError, match="fenced"):
                    await producer.send(TOPIC, b"sdk send")
            await asyncio.sleep(0.3)  # a wrongly accepted delayed or timer message would land
            assert [m.body for m in await _stored(cluster)] == [b"c1"]
            assert await log.holder() == FenceHolder(1, "w1", "http://w1", 0)
            assert cluster.broker.store.max_queue_offset("SCHEDULE_TOPIC_XXXX", 1) == 0
    finally:
        await cluster.close()


async def test_send_back_and_sink_commit_into_a_fenced_topic_are_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    await cluster.start()
    addr = cluster.broker.address
    retry = "%RETRY%FencedGroup"
    try:
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as client:
            await admin.create_topic("Plain", 1)
            await admin.create_topic(retry, 1, broker_name="broker-a", fenced=True)
            sent = await send(client, addr, "Plain", b"failed once")
            assert sent.code == ResponseCode.SUCCESS
            stored = cluster.broker.store.get("Plain", 0, int(sent.ext_fields["queueOffset"]), 1)
            header = ConsumerSendMsgBackRequestHeader(
                offset=decode_record(stored.records[0]).log_offset,
                group="FencedGroup",
                delay_level=0,
                origin_msg_id="x",
                origin_topic="Plain",
            )
            back = await client.call(addr, command(RequestCode.CONSUMER_SEND_MSG_BACK, header), 5)
            assert back.code == ResponseCode.FENCED, back.remark
            assert cluster.broker.store.max_queue_offset(retry, 0) == 0

            # rows prepared for a topic that is fenced by the time they are committed
            await admin.create_topic("Rows", 1)
            async with SinkClient(cluster.namesrv_addr, retry_for=1.0) as sink:
                queue = MessageQueue("Rows", "broker-a", 0)
                await sink.prepare(queue, "s1", 0, "t1", [BatchItem.of(b"r", {"UNIQ_KEY": "r"})])
                await admin.delete_topic("Rows")
                await admin.create_topic("Rows", 1, broker_name="broker-a", fenced=True)
                await sink.decide("broker-a", "s1", 0, {"t1": {"broker-a": 1}})
                with pytest.raises(RemoteError) as refused:
                    await sink.commit("broker-a", "s1", 0, {"t1": 1})
                assert refused.value.code == ResponseCode.FENCED
            assert cluster.broker.store.max_queue_offset("Rows", 0) == 0
    finally:
        await cluster.close()


async def test_the_fence_is_rebuilt_from_the_log_after_a_restart(tmp_path: Path) -> None:
    cluster = await _fenced_cluster(tmp_path, broker_role=BrokerRole.SYNC_MASTER)
    try:
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            await log.append(b"c1", op="claim", epoch=1, writer="w1", url="http://w1")
            await log.append(b"c2", op="claim", epoch=2, writer="w2", url="http://w2")
            await log.append(b"s", op="snapshot", epoch=2, writer="w2", url="http://w2")
            await log.append(b"x", op="write", epoch=2, writer="w2")
        before = await _holder(cluster)
        await cluster.restart_broker(0)
        await cluster.restart_broker(0, broker_role=BrokerRole.ASYNC_MASTER)  # the other role
        assert await _holder(cluster) == before == FenceHolder(2, "w2", "http://w2", 2)
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as log:
            with pytest.raises(FencedError, match="held by 'w2'"):
                await log.append(b"stale", op="write", epoch=1, writer="w1")
            with pytest.raises(FencedError, match="must name 3"):
                await log.append(b"stale", op="claim", epoch=2, writer="w1", url="http://w1")
            after = await log.append(b"y", op="write", epoch=2, writer="w2")
            assert after.queue_offset == 4
    finally:
        await cluster.close()


async def _holder(cluster: LocalCluster) -> FenceHolder:
    async with AdminClient(cluster.namesrv_addr) as admin:
        return await admin.fence(TOPIC)


async def test_get_fence_answers_only_for_fenced_topics(tmp_path: Path) -> None:
    cluster = await _fenced_cluster(tmp_path)
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic("Plain", 2)
            assert await admin.fence(TOPIC) == FenceHolder(0, "", "", 0)
            with pytest.raises(FencedTopicError, match="2 write"):
                await admin.fence("Plain")
            async with FencedTopicWriter(cluster.namesrv_addr, "Plain") as log:
                with pytest.raises(FencedTopicError):
                    await log.append(b"x", op="write", epoch=1, writer="w")
            async with RpcClient() as client:
                with pytest.raises(RemoteError) as plain:
                    await fence_holder(client, cluster.broker.address, "Plain", 5)
                assert plain.value.code == ResponseCode.INVALID_PARAMETER
                with pytest.raises(RemoteError) as unknown:
                    await fence_holder(client, cluster.broker.address, "Nowhere", 5)
                assert unknown.value.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        await cluster.close()


async def _create(client: RpcClient, broker: Broker, **fields: object) -> tuple[int, str]:
    header = CreateTopicRequestHeader(**fields)  # type: ignore[arg-type]
    response = await client.call(
        broker.address, command(RequestCode.UPDATE_AND_CREATE_TOPIC, header), 5
    )
    return response.code, response.remark or ""


async def test_a_fenced_topic_stays_fenced_with_one_queue(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    await cluster.start()
    broker = cluster.broker
    fenced = "+ferry.fenced=true"
    try:
        async with RpcClient() as client:
            code, remark = await _create(
                client, broker, topic="F", read_queue_nums=2, write_queue_nums=2, attributes=fenced
            )
            assert (code, "exactly one read and one write queue" in remark) == (29, True)
            ok = {"topic": "F", "read_queue_nums": 1, "write_queue_nums": 1}
            assert (await _create(client, broker, **ok, attributes=fenced))[0] == 0
            assert (await _create(client, broker, **ok, attributes=fenced))[0] == 0  # again: same
            assert (await _create(client, broker, **ok))[0] == 0  # no attributes: stays fenced
            assert broker.state.topics.get("F").attributes == {"ferry.fenced": "true"}  # type: ignore[union-attr]
            for attributes, reason in (
                ("-ferry.fenced", "stays fenced"),
                ("+ferry.fenced=false", "only the value true"),
                ("+ferry.fenced", "+key=value"),
                ("+a=1,+a=2", "twice"),
            ):
                code, remark = await _create(client, broker, **ok, attributes=attributes)
                assert (code, reason in remark) == (29, True), remark
            code, remark = await _create(
                client, broker, topic="F", read_queue_nums=1, write_queue_nums=4
            )
            assert (code, "exactly one read" in remark) == (29, True)
            assert (await _create(client, broker, **{**ok, "topic": "P"}))[0] == 0
            code, remark = await _create(client, broker, **{**ok, "topic": "P"}, attributes=fenced)
            assert (code, "cannot become fenced" in remark) == (29, True)
            code, remark = await _create(client, broker, **{**ok, "topic": "Q"}, attributes="-x")
            assert (code, "only additions" in remark) == (29, True)
            assert broker.state.topics.get("F").read_queue_nums == 1  # type: ignore[union-attr]
        async with AdminClient(cluster.namesrv_addr) as admin:
            with pytest.raises(ValueError, match="name it"):
                await admin.create_topic("G", 1, fenced=True)
            with pytest.raises(ValueError, match="exactly one queue"):
                await admin.create_topic("G", 2, broker_name="broker-a", fenced=True)
            await admin.delete_topic("F")  # deleting stays an admin action
            assert broker.state.topics.get("F") is None
    finally:
        await cluster.close()
