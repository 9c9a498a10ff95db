"""Admin codes the Dashboard and rocketmq-exporter call (203, 204, 300, 305, 307, 309, 315,
328), on sockets, with RocketMQ's body shapes (FastJSON's field order, checked against recorded
Java bodies)."""

import asyncio
import json
import re
import time

import pytest

from ferrymq.broker import admin as admin_codes
from ferrymq.broker.cloneoffset import CloneGroupOffsetRequestHeader
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, PushConsumer
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire import fastjson
from ferrymq.wire.bodies import (
    BrokerStatsData,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    GroupList,
    HeartbeatData,
    KVTable,
    ProducerConnection,
    ProducerData,
    ProducerTableInfo,
    TopicList,
    decode_body,
    decode_consume_stats,
    encode_body,
)
from ferrymq.wire.broker import (
    ConsumeMessageDirectlyResultRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
    GetTopicConfigRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from ..unit.broker.test_runtime import exporter_parse
from ..unit.wire.rocketmq_recorded import HEARTBEAT_SUBSCRIPTION_4X
from .remoting import command, create_topic
from .test_admin_cli import Ferry


async def _ignore(message: Message) -> None:
    pass


async def test_connections_producers_and_consumers_of_a_topic(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Watched", queues=2)
    beat = HeartbeatData(client_id="prod-1@127.0.0.1", producer_data_set=[ProducerData("PG1")])
    answer = await client.call(addr, command(RequestCode.HEART_BEAT, body=encode_body(beat)), 5)
    assert answer.code == ResponseCode.SUCCESS
    consumer = PushConsumer(cluster.namesrv_addr, "CG1", _ignore, client_id="cons-1@127.0.0.1")
    consumer.subscribe("Watched")
    async with consumer:
        get = GetConsumerConnectionListRequestHeader(consumer_group="CG1")
        deadline = time.monotonic() + 10
        while True:  # the consumer heartbeats as it starts
            found = await client.call(
                addr, command(RequestCode.GET_CONSUMER_CONNECTION_LIST, get), 5
            )
            if found.code == ResponseCode.SUCCESS:
                break
            assert found.code == ResponseCode.CONSUMER_NOT_ONLINE, found.remark
            assert time.monotonic() < deadline, "the consumer never heartbeated"
            await asyncio.sleep(0.05)
        raw = json.loads(found.body)
        assert list(raw) == sorted(raw)  # FastJSON writes a bean's fields by name
        assert list(raw["connectionSet"][0]) == ["clientAddr", "clientId", "language", "version"]
        assert list(raw["subscriptionTable"]["Watched"]) == list(
            json.loads(HEARTBEAT_SUBSCRIPTION_4X)
        )
        connection = decode_body(found.body, ConsumerConnection)
        assert [(c.client_id, c.language) for c in connection.connection_set] == [
            ("cons-1@127.0.0.1", "PYTHON")
        ]
        assert connection.connection_set[0].client_addr.startswith("127.0.0.1:")
        assert (connection.consume_type, connection.message_model) == (
            "CONSUME_PASSIVELY",
            "CLUSTERING",
        )
        assert list(connection.subscription_table) == ["%RETRY%CG1", "Watched"]  # as RocketMQ

        running = GetConsumerRunningInfoRequestHeader(
            consumer_group="CG1", client_id="cons-1@127.0.0.1"
        )
        relayed = await client.call(
            addr, command(RequestCode.GET_CONSUMER_RUNNING_INFO, running), 5
        )
        assert relayed.code == ResponseCode.SUCCESS, relayed.remark
        # mqTable is keyed by MessageQueue objects, as FastJSON writes them
        assert b'"mqTable":{{"brokerName":"broker-a","queueId":0,"topic":"' in relayed.body
        info = fastjson.loads(relayed.body)
        assert list(info) == ["mqTable", "properties", "statusTable", "subscriptionSet"]
        assert int(info["properties"]["PROP_CONSUMER_START_TIMESTAMP"]) > 0
        gone = GetConsumerRunningInfoRequestHeader(consumer_group="CG1", client_id="gone")
        absent_client = await client.call(
            addr, command(RequestCode.GET_CONSUMER_RUNNING_INFO, gone), 5
        )
        assert absent_client.remark == "The Consumer <CG1> <gone> not online"

        who = QueryTopicConsumeByWhoRequestHeader(topic="Watched")
        groups = await client.call(addr, command(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, who), 5)
        assert decode_body(groups.body, GroupList).group_list == ["CG1"]

    offline = await client.call(addr, command(RequestCode.GET_CONSUMER_CONNECTION_LIST, get), 5)
    assert (offline.code, offline.remark) == (
        ResponseCode.CONSUMER_NOT_ONLINE,
        "the consumer group[CG1] not online",
    )
    producers = GetProducerConnectionListRequestHeader(producer_group="PG1")
    listed = await client.call(
        addr, command(RequestCode.GET_PRODUCER_CONNECTION_LIST, producers), 5
    )
    connections = decode_body(listed.body, ProducerConnection).connection_set
    assert [(c.client_id, c.language) for c in connections] == [("prod-1@127.0.0.1", "PYTHON")]
    missing = GetProducerConnectionListRequestHeader(producer_group="Nobody")
    absent = await client.call(addr, command(RequestCode.GET_PRODUCER_CONNECTION_LIST, missing), 5)
    assert (absent.code, absent.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the producer group[Nobody] not exist",
    )
    table = await client.call(addr, command(RequestCode.GET_ALL_PRODUCER_INFO), 5)
    raw_table = json.loads(table.body)
    assert list(raw_table["data"]["PG1"][0]) == [
        "clientId",
        "language",
        "lastUpdateTimestamp",
        "remoteIP",
        "version",
    ]
    info = decode_body(table.body, ProducerTableInfo).data["PG1"][0]
    assert info.client_id == "prod-1@127.0.0.1"
    assert abs(info.last_update_timestamp - time.time() * 1000) < 60_000


async def test_broker_stats_data_and_stats_all(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Counted", queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(5):
            await producer.send("Counted", f"m{i}".encode())
    async with PullConsumer(cluster.namesrv_addr, "Counter") as consumer:
        (queue,) = await consumer.queues("Counted")
        pulled = (await consumer.pull(queue, 0, max_messages=32)).messages
        assert len(pulled) == 5
        await consumer.commit(queue, 3)
    progress = await client.call(
        addr,
        command(
            RequestCode.GET_CONSUME_STATS,
            GetConsumeStatsRequestHeader(consumer_group="Counter", topic="Counted"),
        ),
        5,
    )
    (entry,) = decode_consume_stats(progress.body).offset_table
    # lastTimestamp: when the group's last consumed message (offset 2) was stored
    assert entry.last_timestamp == pulled[2].store_timestamp_ms

    async def view(name: str, key: str) -> RemotingCommand:
        header = ViewBrokerStatsDataRequestHeader(stats_name=name, stats_key=key)
        return await client.call(addr, command(RequestCode.VIEW_BROKER_STATS_DATA, header), 5)

    put = await view("TOPIC_PUT_NUMS", "Counted")
    raw = json.loads(put.body)
    assert list(raw) == ["statsDay", "statsHour", "statsMinute"]
    assert list(raw["statsMinute"]) == ["avgpt", "sum", "tps"]
    stats = decode_body(put.body, BrokerStatsData)
    # the broker is younger than a minute: every period holds everything since it started
    assert (stats.stats_minute.sum, stats.stats_hour.sum, stats.stats_day.sum) == (5, 5, 5)
    got = decode_body((await view("GROUP_GET_NUMS", "Counted@Counter")).body, BrokerStatsData)
    assert got.stats_day.sum == 5
    cluster_name = cluster.broker.state.config.broker_cluster_name
    for name, expected in (("BROKER_PUT_NUMS", 5), ("BROKER_GET_NUMS", 5)):
        broker_wide = decode_body((await view(name, cluster_name)).body, BrokerStatsData)
        assert (broker_wide.stats_minute.sum, broker_wide.stats_day.sum) == (expected, expected)
    assert (await view("SNDBCK_PUT_NUMS", "Counted@Counter")).code == ResponseCode.SYSTEM_ERROR
    back = ConsumerSendMsgBackRequestHeader(
        offset=pulled[1].log_offset, group="Counter", delay_level=0
    )
    sent_back = await client.call(addr, command(RequestCode.CONSUMER_SEND_MSG_BACK, back), 5)
    assert sent_back.code == ResponseCode.SUCCESS, sent_back.remark
    resent = decode_body((await view("SNDBCK_PUT_NUMS", "Counted@Counter")).body, BrokerStatsData)
    assert (resent.stats_minute.sum, resent.stats_day.sum) == (1, 1)
    missing = await view("GROUP_GET_NUMS", "Counted@Nobody")
    assert (missing.code, missing.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "The stats <GROUP_GET_NUMS> <Counted@Nobody> not exist",
    )
    rows = await Ferry(cluster.namesrv_addr)("stats-all", "--topic", "Counted", "--json")
    assert [(r["group"], r["accumulation"], r["msg24Hour"]) for r in rows] == [
        (None, 0, 5),
        ("Counter", 2, 5),
    ]
    assert rows == await Ferry(cluster.namesrv_addr)("statsAll", "-t", "Counted", "--json")


async def test_one_topic_and_one_group_config(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Configured", queues=3)
    topic = await client.call(
        addr,
        command(RequestCode.GET_TOPIC_CONFIG, GetTopicConfigRequestHeader(topic="Configured")),
        5,
    )
    raw = json.loads(topic.body)
    assert list(raw) == sorted(raw)
    assert (raw["topicName"], raw["readQueueNums"], raw["perm"]) == ("Configured", 3, 6)
    await Ferry(cluster.namesrv_addr)("group", "update", "Billing", "--retry-max-times", "4")
    group = await client.call(
        addr,
        command(
            RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,
            GetSubscriptionGroupConfigRequestHeader(group="Billing"),
        ),
        5,
    )
    found = json.loads(group.body)
    assert list(found) == sorted(found)
    assert (found["groupName"], found["retryMaxTimes"]) == ("Billing", 4)
    missing = await client.call(
        addr,
        command(
            RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,
            GetSubscriptionGroupConfigRequestHeader(group="Nobody"),
        ),
        5,
    )
    assert missing.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


async def test_runtime_info_parses_as_rocketmq_exporter_parses_it(
    cluster: LocalCluster, client: RpcClient
) -> None:
    addr = cluster.broker.address
    state = cluster.broker.state

    async def runtime() -> dict[str, object]:
        answer = await client.call(addr, command(RequestCode.GET_BROKER_RUNTIME_INFO), 5)
        table = decode_body(answer.body, KVTable).table
        assert table["getTransferredTps"] == table["getTransferedTps"]
        return exporter_parse(table)  # raises where the exporter's constructor would throw

    await create_topic(client, addr, "Timed", queues=1)
    before = await runtime()
    boot = before["bootTimestamp"]
    assert isinstance(boot, int)
    assert 0 < boot <= time.time() * 1000
    assert re.fullmatch(r"\[ 0 days, 0 hours, \d+ minutes, \d+ seconds \]", str(before["runtime"]))
    capacity = before["commitLogDirCapacity"]
    assert isinstance(capacity, tuple)
    assert 0 < capacity[1] <= capacity[0]  # free, total
    morning = before["msgPutTotalTodayMorning"]  # the totals at start (system records too)
    assert isinstance(morning, int)
    assert morning <= before["msgPutTotalTodayNow"]  # type: ignore[operator]
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(16):  # one send in 8 is timed: 2 in the distribution
            await producer.send("Timed", b"x" * 100 + str(i).encode().rjust(4, b"0"))
    after = await runtime()
    assert after["putMessageTimesTotal"] == 16
    assert after["msgPutTotalTodayNow"] >= before["msgPutTotalTodayNow"] + 16  # type: ignore[operator]
    assert after["putMessageSizeTotal"] == 16 * 104
    assert after["putMessageAverageSize"] == 104.0
    assert after["msgPutTotalTodayMorning"] == after["msgPutTotalYesterdayMorning"] == morning
    assert sum(after["putMessageDistributeTime"].values()) == 2  # type: ignore[attr-defined]
    slowest = state.stats.send_latency.max_s  # of the 2 timed sends
    assert slowest > 0
    assert after["putMessageEntireTimeMax"] == int(slowest * 1000)
    assert 0 < int(after["earliestMessageTimeStamp"]) <= time.time() * 1000  # type: ignore[call-overload]
    assert after["commitLogMaxOffset"] > before["commitLogMaxOffset"]  # type: ignore[operator]
    real = state.wall_ms
    state.wall_ms = lambda: real() + 86_400_000  # a midnight passes (no other way in a test)
    try:
        tomorrow = await runtime()
    finally:
        state.wall_ms = real
    assert tomorrow["msgPutTotalTodayMorning"] == tomorrow["msgPutTotalTodayNow"]
    assert tomorrow["msgPutTotalYesterdayMorning"] == morning
    async with Producer(cluster.namesrv_addr) as producer:
        await producer.send("Timed", b"later", delay_level=1)  # 1 s
    deadline = time.monotonic() + 20
    while (await runtime()).get("scheduleMessageOffset_1") != (1, 1):  # delivered, stored
        assert time.monotonic() < deadline, "the delayed message was never delivered"
        await asyncio.sleep(0.1)


async def test_system_topic_list_from_the_name_server(
    cluster: LocalCluster, client: RpcClient
) -> None:
    answer = await client.call(
        cluster.namesrv_addr, command(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS), 5
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    found = decode_body(answer.body, TopicList)
    assert found.topic_list == [cluster.broker.state.config.broker_cluster_name, "broker-a"]
    assert found.broker_addr == cluster.broker.address


async def test_clone_group_offset(cluster: LocalCluster, client: RpcClient) -> None:
    addr = cluster.broker.address
    offsets = cluster.broker.state.offsets
    await create_topic(client, addr, "Cloned", queues=2)
    for queue_id, offset in ((0, 3), (1, 7)):
        header = UpdateConsumerOffsetRequestHeader(
            consumer_group="Src", topic="Cloned", queue_id=queue_id, commit_offset=offset
        )
        done = await client.call(addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, header), 5)
        assert done.code == ResponseCode.SUCCESS, done.remark

    async def clone(dest: str, topic: str | None) -> None:
        header = CloneGroupOffsetRequestHeader(src_group="Src", dest_group=dest, topic=topic)
        done = await client.call(addr, command(RequestCode.CLONE_GROUP_OFFSET, header), 5)
        assert done.code == ResponseCode.SUCCESS, done.remark

    await clone("Dest", "Cloned")  # as mqadmin cloneGroupOffset -t sends it
    await clone("AllTopics", None)
    await clone("Missing", "NoSuchTopic")
    for group in ("Dest", "AllTopics"):
        assert offsets.of_group(group) == {"Cloned": {0: 3, 1: 7}}
    assert offsets.of_group("Missing") == {}


async def test_consume_message_directly_runs_the_listener_and_commits_nothing(
    cluster: LocalCluster, client: RpcClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    addr = cluster.broker.address
    await create_topic(client, addr, "Resent", queues=1)
    seen: list[bytes] = []
    hold = asyncio.Event()

    async def listener(message: Message) -> None:
        seen.append(message.body)
        if hold.is_set():  # longer than the broker waits
            await asyncio.sleep(0.5)
        if len(seen) > 2:  # a direct consume: takes a measurable time; the second one fails
            await asyncio.sleep(0.06)  # asyncio may wake a tick early: 50 ms is sure
            if len(seen) == 4:
                raise RuntimeError("not today")

    consumer = PushConsumer(
        cluster.namesrv_addr,
        "CGD",
        listener,
        client_id="direct-1@127.0.0.1",
        consume_from=ConsumeFrom.FIRST_OFFSET,
        commit_interval=0.1,
    )
    consumer.subscribe("Resent")
    async with Producer(cluster.namesrv_addr) as producer:
        first = await producer.send("Resent", b"m0")
        await producer.send("Resent", b"m1")
    async with asyncio.timeout(60), consumer:
        while cluster.broker.state.offsets.query("Resent", "CGD", 0) != 2:
            await asyncio.sleep(0.05)  # both consumed and committed
        assert seen == [b"m0", b"m1"]

        async def directly(client_id: str) -> RemotingCommand:
            header = ConsumeMessageDirectlyResultRequestHeader(
                consumer_group="CGD", client_id=client_id, msg_id=first.offset_msg_id
            )
            return await client.call(
                addr, command(RequestCode.CONSUME_MESSAGE_DIRECTLY, header), 10
            )

        answer = await directly("direct-1@127.0.0.1")
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert list(json.loads(answer.body)) == [  # ConsumeMessageDirectlyResult, by name
            "autoCommit",
            "consumeResult",
            "order",
            "spentTimeMills",
        ]
        result = decode_body(answer.body, ConsumeMessageDirectlyResult)
        assert (result.consume_result, result.order, result.auto_commit) == (
            "CR_SUCCESS",
            False,
            True,
        )
        assert result.spent_time_mills >= 50
        assert seen == [b"m0", b"m1", b"m0"]  # the listener saw it once more
        failed = decode_body(
            (await directly("direct-1@127.0.0.1")).body, ConsumeMessageDirectlyResult
        )
        assert (failed.consume_result, failed.remark) == (
            "CR_THROW_EXCEPTION",
            "RuntimeError: not today",
        )
        await asyncio.sleep(0.5)  # five commit intervals
        assert cluster.broker.state.offsets.query("Resent", "CGD", 0) == 2  # not moved
        assert consumer.consumed == 2

        unknown = await directly("nobody")
        assert (unknown.code, unknown.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "The Consumer <CGD> <nobody> not online",
        )

        ns, msg_id, me = cluster.namesrv_addr, first.offset_msg_id, "direct-1@127.0.0.1"
        printed = await Ferry(ns)(
            "message", "consume-directly", msg_id, "--group", "CGD", "--client-id", me, "--json"
        )
        assert (printed["consumeResult"], printed["clientId"]) == ("CR_SUCCESS", me)
        assert printed["spentTimeMills"] >= 50
        # mqadmin queryMsgById -g -d sends CONSUME_MESSAGE_DIRECTLY; -n wins over --namesrv
        aliased = await Ferry("127.0.0.1:1")(
            "queryMsgById", "-n", ns, "-i", msg_id, "-g", "CGD", "-d", me
        )
        assert "CR_SUCCESS" in aliased
        gone = await Ferry(ns)(
            "message", "consume-directly", msg_id, "--group", "CGD", "--client-id", "x", code=1
        )
        assert "The Consumer <CGD> <x> not online" in gone
        alone = await Ferry(ns)("message", "by-id", msg_id, "--group", "CGD", code=2)
        assert "--group and --client-id go together" in alone
        await Ferry(ns)("message", "consume-directly", msg_id, "--group", "CGD", code=2)

        monkeypatch.setattr(admin_codes, "RUNNING_INFO_TIMEOUT_S", 0.1)  # not 5 s in a test
        hold.set()
        late = await directly(me)
        assert late.code == ResponseCode.SYSTEM_ERROR
        assert (late.remark or "").startswith(f"The Consumer <CGD> <{me}> did not answer: "), (
            late.remark
        )
        assert "no response to request code 309 within 0.1 s" in (late.remark or "")
    # never redelivered, never sent back: only the five direct consumes came again
    assert seen == [b"m0", b"m1", b"m0", b"m0", b"m0", b"m0", b"m0"]


async def test_system_topic_list_from_the_broker(cluster: LocalCluster, client: RpcClient) -> None:
    answer = await client.call(
        cluster.broker.address, command(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER), 5
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert list(json.loads(answer.body)) == ["topicList"]
    topics = decode_body(answer.body, TopicList).topic_list
    config = cluster.broker.state.config
    assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "BenchmarkTest"} <= set(
        topics
    )
    assert {config.broker_cluster_name, config.broker_name} <= set(topics)
    assert topics == sorted(topics)
    assert not [t for t in topics if t.startswith(("%RETRY%", "%DLQ%"))]
