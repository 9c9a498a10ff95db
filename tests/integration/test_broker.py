"""A broker and a NameServer in process, over real sockets: every request family, and bad input."""

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from ferrymq.broker.metadata import GroupConfig, GroupFile
from ferrymq.client.admin import AdminClient
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.testing import LocalCluster
from ferrymq.wire.bodies import (
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    ProducerData,
    SubscriptionData,
    TopicConfigSerializeWrapper,
    TopicRouteData,
    decode_body,
    decode_consume_stats,
    decode_topic_stats,
    encode_body,
)
from ferrymq.wire.broker import (
    ConsumerSendMsgBackRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    EndTransactionRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetConsumeStatsRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    BatchItem,
    MessageRecord,
    decode_record,
    encode_batch,
)

from .remoting import command, create_topic, pull, send, send_batch

FAST_DELAYS = {"message_delay_level": "1s 1s 1s 1s 1s"}


T = TypeVar("T")


async def wait_for(predicate: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Poll an async predicate until it returns a truthy value (bounded)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_send_then_pull_returns_the_stored_message(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T")
    sent = await send(client, addr, "T", b"hello", 2, {"TAGS": "a", "KEYS": "k1", "custom": "v"})
    assert sent.code == ResponseCode.SUCCESS
    assert sent.ext_fields["queueId"] == "2"
    assert sent.ext_fields["queueOffset"] == "0"
    response, records = await pull(client, addr, "T", 2, 0)
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["nextBeginOffset"] == "1"
    assert response.ext_fields["maxOffset"] == "1"
    (record,) = records
    assert (record.body, record.topic, record.queue_id) == (b"hello", "T", 2)
    assert record.properties["custom"] == "v"
    assert record.keys == ["k1"]
    store_host, log_offset = decode_offset_msg_id(sent.ext_fields["msgId"])
    assert log_offset == record.log_offset
    assert store_host == record.store_host


async def test_pull_filters_by_tag_expression(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    for tag in ["a", "b", "c", "a"]:
        await send(client, addr, "T", tag.encode(), 0, {"TAGS": tag})
    _, records = await pull(client, addr, "T", 0, 0, expression="a || c")
    assert [r.body for r in records] == [b"a", b"c", b"a"]
    response, records = await pull(client, addr, "T", 0, 0, expression="zzz")
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert response.ext_fields["nextBeginOffset"] == "4"


async def test_a_long_poll_wakes_when_the_queue_grows(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    waiting = asyncio.create_task(pull(client, addr, "T", 0, 0, suspend_ms=15_000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    async with RpcClient() as producer:
        await send(producer, addr, "T", b"late")
    response, records = await asyncio.wait_for(waiting, 5)
    assert response.code == ResponseCode.SUCCESS
    assert [r.body for r in records] == [b"late"]
    timed_out, _ = await pull(client, addr, "T", 0, 1, suspend_ms=200)
    assert timed_out.code == ResponseCode.PULL_NOT_FOUND


async def test_pulls_at_and_past_the_end(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    await send(client, addr, "T", b"one")
    at_end, _ = await pull(client, addr, "T", 0, 1)
    assert at_end.code == ResponseCode.PULL_NOT_FOUND
    beyond, _ = await pull(client, addr, "T", 0, 99)
    assert beyond.code == ResponseCode.PULL_OFFSET_MOVED
    assert beyond.ext_fields["nextBeginOffset"] == "0"  # RocketMQ: back to min when min is 0
    empty, _ = await pull(client, addr, "T", 0, 5, group="never-seen")
    assert empty.code == ResponseCode.PULL_OFFSET_MOVED


async def test_batches_take_consecutive_queue_offsets(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    body = encode_batch([BatchItem.of(f"m{i}".encode(), {"KEYS": f"k{i}"}) for i in range(3)])
    response = await send_batch(client, addr, "T", body)
    assert response.code == ResponseCode.SUCCESS
    assert len(response.ext_fields["msgId"].split(",")) == 3
    _, records = await pull(client, addr, "T", 0, 0)
    assert [(r.body, r.queue_offset) for r in records] == [(b"m0", 0), (b"m1", 1), (b"m2", 2)]


@pytest.mark.parametrize(
    ("topic", "queue_id", "body", "code", "remark"),
    [
        ("Missing", 0, b"x", ResponseCode.TOPIC_NOT_EXIST, "not exist"),
        ("bad topic!", 0, b"x", ResponseCode.SYSTEM_ERROR, "invalid topic name"),
        ("T", 9, b"x", ResponseCode.SYSTEM_ERROR, "queueId[9] is illegal"),
        ("T", 0, b"x" * 2000, ResponseCode.MESSAGE_ILLEGAL, "over the limit"),
        ("SCHEDULE_TOPIC_XXXX", 0, b"x", ResponseCode.NO_PERMISSION, "forbidden"),
        ("rmq_sys_ferry_metadata", 0, b"x", ResponseCode.NO_PERMISSION, "forbidden"),
        ("rmq_sys_ferry_sink", 0, b"x", ResponseCode.NO_PERMISSION, "forbidden"),
    ],
)
@pytest.mark.parametrize("cluster", [{"max_message_size": 1024}], indirect=True)
async def test_bad_sends_get_typed_errors_and_store_nothing(
    cluster: LocalCluster,
    client: RpcClient,
    topic: str,
    queue_id: int,
    body: bytes,
    code: int,
    remark: str,
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 4)
    before = cluster.broker.store.max_log_offset
    response = await send(client, addr, topic, body, queue_id)
    assert response.code == code
    assert remark in (response.remark or "")
    assert cluster.broker.store.max_log_offset == before
    assert (await send(client, addr, "T", b"ok")).code == ResponseCode.SUCCESS


async def test_a_batch_with_properties_that_are_not_utf8_is_refused_and_indexing_goes_on(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    before = cluster.broker.store.max_log_offset
    body = encode_batch(
        [BatchItem(b"fine", b"A\x01b\x02"), BatchItem(b"bad", b"A\x01\xff\xfe\x02")]
    )
    response = await send_batch(client, addr, "T", body)
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "not UTF-8" in (response.remark or "")
    assert cluster.broker.store.max_log_offset == before
    assert (await send(client, addr, "T", b"after")).code == ResponseCode.SUCCESS
    _, records = await pull(client, addr, "T", 0, 0)
    assert [r.body for r in records] == [b"after"]


async def test_malformed_requests_answer_errors_and_garbage_closes_only_its_connection(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    missing = await client.call(addr, command(RequestCode.PULL_MESSAGE), 5)
    assert missing.code == ResponseCode.SYSTEM_ERROR
    assert "consumerGroup" in (missing.remark or "")
    unknown = await client.call(addr, RemotingCommand(code=29999), 5)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    broken_batch = await send_batch(client, addr, "T", b"\x00\x00\x00\x30garbage")
    assert broken_batch.code == ResponseCode.MESSAGE_ILLEGAL
    assert "batch item at 0" in (broken_batch.remark or "")
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">ii", 40, 36) + b"\xff" * 36)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert (await send(client, addr, "T", b"still fine")).code == ResponseCode.SUCCESS


async def test_consumer_offsets_commit_query_and_survive_a_restart(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 2)
    await send(client, addr, "T", b"x", 1)
    update = UpdateConsumerOffsetRequestHeader(
        consumer_group="G", topic="T", queue_id=1, commit_offset=1
    )
    assert (
        await client.call(addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, update), 5)
    ).code == 0

    async def query(group: str, set_zero: bool | None = None) -> RemotingCommand:
        header = QueryConsumerOffsetRequestHeader(
            consumer_group=group, topic="T", queue_id=1, set_zero_if_not_found=set_zero
        )
        return await client.call(
            cluster.broker.address, command(RequestCode.QUERY_CONSUMER_OFFSET, header), 5
        )

    assert (await query("G")).ext_fields["offset"] == "1"
    assert (await query("new-group")).ext_fields["offset"] == "0"
    assert (await query("new-group", set_zero=False)).code == ResponseCode.QUERY_NOT_FOUND
    await cluster.restart_broker()
    assert (await query("G")).ext_fields["offset"] == "1"


async def test_heartbeats_make_a_group_and_members_are_told_of_changes(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    notified = asyncio.Event()

    async def on_push(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            notified.set()
        return None

    def heartbeat(client_id: str) -> RemotingCommand:
        data = HeartbeatData(
            client_id=client_id,
            consumer_data_set=[
                ConsumerData(group_name="G", subscription_data_set=[SubscriptionData(topic="T")])
            ],
        )
        return RemotingCommand(code=RequestCode.HEART_BEAT, body=encode_body(data))

    async def members() -> list[str]:
        header = GetConsumerListByGroupRequestHeader(consumer_group="G")
        response = await client.call(
            addr, command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header), 5
        )
        return (
            decode_body(response.body, ConsumerIdList).consumer_id_list
            if response.code == 0
            else []
        )

    first = RpcClient(on_push)
    second = RpcClient()
    try:
        assert (await first.call(addr, heartbeat("c1"), 5)).code == 0
        assert await members() == ["c1"]
        assert (await second.call(addr, heartbeat("c2"), 5)).code == 0
        await asyncio.wait_for(notified.wait(), 5)
        assert await members() == ["c1", "c2"]
        notified.clear()
        await second.close()
        await asyncio.wait_for(notified.wait(), 5)

        async def only_first() -> bool:
            return await members() == ["c1"]

        assert await wait_for(only_first)
    finally:
        await first.close()
        await second.close()


async def test_queue_locks_belong_to_one_client(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    queues = [MessageQueueBody(topic="T", broker_name="broker-a", queue_id=i) for i in range(2)]

    async def lock(client_id: str) -> list[int]:
        body = LockBatchRequestBody(consumer_group="G", client_id=client_id, mq_set=queues)
        response = await client.call(
            addr, RemotingCommand(code=RequestCode.LOCK_BATCH_MQ, body=encode_body(body)), 5
        )
        return sorted(
            q.queue_id for q in decode_body(response.body, LockBatchResponseBody).lock_o_k_m_q_set
        )

    assert await lock("a") == [0, 1]
    assert await lock("b") == []
    assert await lock("a") == [0, 1]
    unlock = LockBatchRequestBody(consumer_group="G", client_id="a", mq_set=queues[:1])
    await client.call(
        addr, RemotingCommand(code=RequestCode.UNLOCK_BATCH_MQ, body=encode_body(unlock)), 5
    )
    assert await lock("b") == [0]


@pytest.mark.parametrize("cluster", [FAST_DELAYS], indirect=True)
async def test_delayed_messages_arrive_after_their_level(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    sent = await send(client, addr, "T", b"later", 0, {"DELAY": "2"})
    assert sent.code == ResponseCode.SUCCESS
    response, _ = await pull(client, addr, "T", 0, 0)
    assert response.code == ResponseCode.PULL_NOT_FOUND

    async def delivered() -> list[bytes]:
        _, records = await pull(client, cluster.broker.address, "T", 0, 0)
        return [r.body for r in records]

    assert await wait_for(delivered, 10) == [b"later"]
    _, (record,) = await pull(client, addr, "T", 0, 0)
    assert "DELAY" not in record.properties
    assert "REAL_TOPIC" not in record.properties


@pytest.mark.parametrize("cluster", [FAST_DELAYS], indirect=True)
async def test_sent_back_messages_are_retried_then_dead_lettered(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    await send(client, addr, "T", b"poison", 0, {"KEYS": "p"})
    _, (record,) = await pull(client, addr, "T", 0, 0)

    async def send_back(offset: int, max_times: int) -> int:
        header = ConsumerSendMsgBackRequestHeader(
            offset=offset, group="G", delay_level=0, max_reconsume_times=max_times
        )
        return (
            await client.call(addr, command(RequestCode.CONSUMER_SEND_MSG_BACK, header), 5)
        ).code

    assert await send_back(record.log_offset, 1) == ResponseCode.SUCCESS

    async def retried() -> list[MessageRecord]:
        _, records = await pull(client, addr, "%RETRY%G", 0, 0)
        return records

    (retry,) = await wait_for(retried, 10)
    assert (retry.body, retry.reconsume_times) == (b"poison", 1)
    assert retry.properties["RETRY_TOPIC"] == "T"
    assert await send_back(retry.log_offset, 1) == ResponseCode.SUCCESS
    _, (dead,) = await pull(client, addr, "%DLQ%G", 0, 0)
    assert (dead.body, dead.reconsume_times) == (b"poison", 2)


async def test_illegal_names_create_no_group_topic_or_property(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    state = cluster.broker.state
    await create_topic(client, addr, "T", 1)
    await send(client, addr, "T", b"m")
    _, (record,) = await pull(client, addr, "T", 0, 0)

    async def send_back(group: str, origin: str) -> RemotingCommand:
        header = ConsumerSendMsgBackRequestHeader(
            offset=record.log_offset, group=group, delay_level=0, origin_msg_id=origin
        )
        return await client.call(addr, command(RequestCode.CONSUMER_SEND_MSG_BACK, header), 5)

    for group, origin, said in [
        ("../G", "id", "invalid group name"),
        ("G\x01", "id", "invalid group name"),
        ("G", "id\x02", "originMsgId"),
    ]:
        response = await send_back(group, origin)
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert said in (response.remark or "")
    assert set(state.groups.configs) == {"G"}  # the pull's group only
    assert not any(t.startswith(("%RETRY%", "%DLQ%")) for t in state.topics.configs)
    assert (await send(client, addr, "%RETRY%../x", b"m")).code == ResponseCode.SYSTEM_ERROR
    assert (await send_back("G", "id")).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    "cluster", [{"transaction_timeout": 100, "transaction_check_interval": 200}], indirect=True
)
async def test_transactions_commit_roll_back_and_get_checked(cluster: LocalCluster) -> None:
    addr = cluster.broker.address
    checked: list[RemotingCommand] = []

    async def on_push(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if request.code == RequestCode.CHECK_TRANSACTION_STATE:
            checked.append(request)
        return None

    async with RpcClient(on_push) as producer:
        await create_topic(producer, addr, "T", 1)
        heartbeat = HeartbeatData(client_id="p1", producer_data_set=[ProducerData("TXG")])
        await producer.call(
            addr, RemotingCommand(code=RequestCode.HEART_BEAT, body=encode_body(heartbeat)), 5
        )
        halves = []
        for body in (b"commit-me", b"roll-me-back", b"forgotten"):
            response = await send(
                producer,
                addr,
                "T",
                body,
                0,
                {"UNIQ_KEY": body.decode()},
                sys_flag=SYSFLAG_TRANSACTION_PREPARED,
                producer_group="TXG",
            )
            assert response.code == 0
            assert response.ext_fields["transactionId"] == body.decode()
            halves.append(response)
        invisible, _ = await pull(producer, addr, "T", 0, 0)
        assert invisible.code == ResponseCode.PULL_NOT_FOUND
        for response, decision in zip(
            halves, (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK), strict=False
        ):
            _, log_offset = decode_offset_msg_id(response.ext_fields["msgId"])
            end = EndTransactionRequestHeader(
                producer_group="TXG",
                tran_state_table_offset=int(response.ext_fields["queueOffset"]),
                commit_log_offset=log_offset,
                commit_or_rollback=decision,
            )
            assert (
                await producer.call(addr, command(RequestCode.END_TRANSACTION, end), 5)
            ).code == 0
        _, records = await pull(producer, addr, "T", 0, 0)
        assert [r.body for r in records] == [b"commit-me"]

        async def checks() -> list[RemotingCommand]:
            return checked

        (check, *_) = await wait_for(checks, 10)
        assert decode_record(check.body).body == b"forgotten"
        assert check.ext_fields["transactionId"] == "forgotten"


async def test_queries_by_key_id_offset_and_admin_views(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 2)
    sent = await send(client, addr, "T", b"findme", 1, {"KEYS": "order-7"})
    found = await client.call(
        addr,
        command(
            RequestCode.QUERY_MESSAGE,
            QueryMessageRequestHeader(
                topic="T", key="order-7", max_num=10, begin_timestamp=0, end_timestamp=2**62
            ),
        ),
        5,
    )
    assert decode_record(found.body).body == b"findme"
    _, log_offset = decode_offset_msg_id(sent.ext_fields["msgId"])
    viewed = await client.call(
        addr,
        command(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=log_offset)),
        5,
    )
    assert decode_record(viewed.body).body == b"findme"
    bad_view = await client.call(
        addr, command(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=12345)), 5
    )
    assert bad_view.code == ResponseCode.SYSTEM_ERROR
    maximum = await client.call(
        addr,
        command(RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic="T", queue_id=1)),
        5,
    )
    assert maximum.ext_fields["offset"] == "1"
    stats = await client.call(
        addr,
        command(RequestCode.GET_TOPIC_STATS_INFO, GetTopicStatsInfoRequestHeader(topic="T")),
        5,
    )
    table = decode_topic_stats(stats.body)
    assert [(e.queue_id, e.max_offset) for e in table.offset_table] == [(0, 0), (1, 1)]
    assert table.topic_put_tps > 0  # one message put within the last minute
    await client.call(
        addr,
        command(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            UpdateConsumerOffsetRequestHeader(
                consumer_group="G", topic="T", queue_id=1, commit_offset=1
            ),
        ),
        5,
    )
    consume = await client.call(
        addr,
        command(RequestCode.GET_CONSUME_STATS, GetConsumeStatsRequestHeader(consumer_group="G")),
        5,
    )
    entries = decode_consume_stats(consume.body).offset_table
    assert [(e.queue_id, e.broker_offset, e.consumer_offset) for e in entries] == [
        (0, 0, 0),
        (1, 1, 1),
    ]
    runtime = await client.call(addr, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 5)
    assert decode_body(runtime.body, KVTable).table["brokerRole"] == "ASYNC_MASTER"
    topics = await client.call(addr, RemotingCommand(code=RequestCode.GET_ALL_TOPIC_CONFIG), 5)
    assert "T" in decode_body(topics.body, TopicConfigSerializeWrapper).topic_config_table


async def test_broker_config_updates_only_hot_keys(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    cold = await client.call(
        addr, RemotingCommand(code=RequestCode.UPDATE_BROKER_CONFIG, body=b"listenPort=1\n"), 5
    )
    assert cold.code == ResponseCode.SYSTEM_ERROR
    assert "listenPort" in (cold.remark or "")
    bad = await client.call(
        addr,
        RemotingCommand(code=RequestCode.UPDATE_BROKER_CONFIG, body=b"maxMessageSize=big\n"),
        5,
    )
    assert "maxMessageSize" in (bad.remark or "")
    ok = await client.call(
        addr, RemotingCommand(code=RequestCode.UPDATE_BROKER_CONFIG, body=b"maxMessageSize=10\n"), 5
    )
    assert ok.code == ResponseCode.SUCCESS
    config = await client.call(addr, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG), 5)
    assert "maxMessageSize=10\n" in config.body.decode()
    await create_topic(client, addr, "T", 1)
    assert (await send(client, addr, "T", b"x" * 11)).code == ResponseCode.MESSAGE_ILLEGAL


async def test_topics_reach_the_nameserver_and_auto_create_is_off_by_default(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Routed", 3)

    async def route() -> TopicRouteData | None:
        response = await client.call(
            cluster.namesrv_addr,
            RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "Routed"}
            ),
            5,
        )
        return decode_body(response.body, TopicRouteData) if response.code == 0 else None

    found = await wait_for(route, 5)
    assert found is not None
    assert found.queue_datas[0].write_queue_nums == 3
    assert found.broker_datas[0].broker_addrs == {0: addr}
    assert (await send(client, addr, "NotCreated", b"x")).code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.parametrize("cluster", [{"auto_create_topic_enable": True}], indirect=True)
async def test_auto_create_makes_topics_from_the_default_topic(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    response = await send(client, addr, "Fresh", b"x")
    assert response.code == ResponseCode.SUCCESS
    config = cluster.broker.state.topics.get("Fresh")
    assert config is not None
    assert config.write_queue_nums == 4


async def test_oversized_frames_close_the_connection_and_the_broker_serves_on(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">i", 1 << 30))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert (await send(client, addr, "T", b"fine")).code == 0


@pytest.mark.parametrize("cluster", [{"auto_create_subscription_group": False}], indirect=True)
async def test_subscription_groups_are_created_updated_deleted_and_survive_a_restart(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "T", 1)
    assert (await send(client, addr, "T", b"x")).code == ResponseCode.SUCCESS

    async def upsert(config: GroupConfig) -> RemotingCommand:
        request = RemotingCommand(
            code=RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=encode_body(config)
        )
        return await client.call(cluster.broker.address, request, 5)

    async def groups() -> dict[str, GroupConfig]:
        response = await client.call(
            cluster.broker.address,
            RemotingCommand(code=RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
            5,
        )
        assert response.code == ResponseCode.SUCCESS
        return decode_body(response.body, GroupFile).subscription_group_table

    async def pull_code(group: str) -> int:
        response, _ = await pull(client, cluster.broker.address, "T", 0, 0, group=group)
        return response.code

    # autoCreateSubscriptionGroup off: an unknown group is refused by name
    assert await pull_code("Strict") == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert (await upsert(GroupConfig(group_name="Strict", consume_enable=False))).code == 0
    assert (await groups())["Strict"].consume_enable is False
    assert await pull_code("Strict") == ResponseCode.NO_PERMISSION

    # an update replaces the config; the group now consumes
    updated = GroupConfig(group_name="Strict", consume_enable=True, retry_max_times=3)
    assert (await upsert(updated)).code == 0
    assert await pull_code("Strict") == ResponseCode.SUCCESS
    commit = UpdateConsumerOffsetRequestHeader(
        consumer_group="Strict", topic="T", queue_id=0, commit_offset=1
    )
    assert (
        await client.call(addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, commit), 5)
    ).code == 0

    # a bad name is refused and stores nothing
    bad = await upsert(GroupConfig(group_name="bad group!"))
    assert bad.code == ResponseCode.SYSTEM_ERROR
    assert set(await groups()) >= {"Strict"}
    assert "bad group!" not in await groups()

    await cluster.restart_broker()
    assert (await groups())["Strict"] == updated

    # delete with cleanOffset: the group and its committed offsets are gone
    delete = DeleteSubscriptionGroupRequestHeader(group_name="Strict", clean_offset=True)
    deleted = await client.call(
        cluster.broker.address, command(RequestCode.DELETE_SUBSCRIPTIONGROUP, delete), 5
    )
    assert deleted.code == ResponseCode.SUCCESS
    assert "Strict" not in await groups()
    assert await pull_code("Strict") == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert (await upsert(GroupConfig(group_name="Strict"))).code == 0
    query = QueryConsumerOffsetRequestHeader(
        consumer_group="Strict", topic="T", queue_id=0, set_zero_if_not_found=False
    )
    found = await client.call(
        cluster.broker.address, command(RequestCode.QUERY_CONSUMER_OFFSET, query), 5
    )
    assert found.code == ResponseCode.QUERY_NOT_FOUND


async def test_offset_lookups_by_position_and_time(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Timed", 2)
    for i in range(3):
        assert (await send(client, addr, "Timed", f"m{i}".encode())).code == 0
        await asyncio.sleep(0.02)  # distinct store timestamps
    _, records = await pull(client, addr, "Timed", 0, 0)
    stamps = [r.store_timestamp_ms for r in records]
    assert len(stamps) == 3
    assert stamps[0] < stamps[1] < stamps[2]

    async def ask(code: int, header: CommandHeader) -> RemotingCommand:
        return await client.call(addr, command(code, header), 5)

    low = await ask(
        RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic="Timed", queue_id=0)
    )
    high = await ask(
        RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic="Timed", queue_id=0)
    )
    assert (low.ext_fields["offset"], high.ext_fields["offset"]) == ("0", "3")
    for timestamp, expected in ((0, "0"), (stamps[1], "1"), (stamps[1] + 1, "2")):
        found = await ask(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            SearchOffsetRequestHeader(topic="Timed", queue_id=0, timestamp=timestamp),
        )
        assert (found.code, found.ext_fields["offset"]) == (0, expected), timestamp
    earliest = await ask(
        RequestCode.GET_EARLIEST_MSG_STORETIME,
        GetEarliestMsgStoretimeRequestHeader(topic="Timed", queue_id=0),
    )
    assert earliest.ext_fields["timestamp"] == str(stamps[0])
    empty = await ask(
        RequestCode.GET_EARLIEST_MSG_STORETIME,
        GetEarliestMsgStoretimeRequestHeader(topic="Timed", queue_id=1),
    )
    assert empty.code == ResponseCode.SYSTEM_ERROR
    assert "holds no message" in (empty.remark or "")


async def test_a_deleted_topic_leaves_the_broker_and_the_nameserver(cluster: LocalCluster) -> None:
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Doomed", queues=2)
        await admin.create_topic("Kept", queues=1)
        async with RpcClient() as client:
            addr = cluster.broker.address
            assert (await send(client, addr, "Doomed", b"x")).code == 0
            await admin.delete_topic("Doomed")
            assert await admin.route("Doomed") is None
            assert "Doomed" not in await admin.topics()
            configs = await client.call(
                addr, RemotingCommand(code=RequestCode.GET_ALL_TOPIC_CONFIG), 5
            )
            table = decode_body(configs.body, TopicConfigSerializeWrapper).topic_config_table
            assert "Doomed" not in table
            assert "Kept" in table
            assert (await send(client, addr, "Doomed", b"y")).code == ResponseCode.TOPIC_NOT_EXIST
            assert (await send(client, addr, "Kept", b"z")).code == ResponseCode.SUCCESS
            assert await admin.route("Kept") is not None
