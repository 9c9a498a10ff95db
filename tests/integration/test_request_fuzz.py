"""Mutated requests against a real broker: every one gets a typed answer and nothing is harmed.

Each request starts valid (a header and body the broker accepts) and gets one or two header
fields, or its body, replaced by an edge value: separators, huge and negative numbers, reserved
and illegal names, bytes that are not UTF-8, truncated or doubled batches. The broker must answer
each with a response code (never an exception escaping a handler, which the connection logs as
"request ... failed"), keep indexing, create no topic or group under an illegal name, and go on
serving sends and pulls. Seeded: a failure names the seed to replay.
"""

from __future__ import annotations

import logging
import random
import time

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.errors import InvalidNameError
from ferrymq.model import validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire import broker as headers
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import FLAG_ONEWAY, RemotingCommand
from ferrymq.wire.headers import CommandHeader, to_ext_fields
from ferrymq.wire.records import BatchItem, encode_batch
from ferrymq.wire.sink import SinkBatchHeader, SinkPrepareRequestHeader

from .remoting import pull

EDGES = [
    *("", "0", "-1", "2147483648", "-2147483649", "9223372036854775808", "1" * 30, "1.5"),
    *("true", "x" * 300, "a\x01b\x02", "\x01\x02", "é", "../x", "*", "a || b", "TAG", "SQL92"),
    *("%RETRY%G", "%DLQ%G", "TBW102", "SCHEDULE_TOPIC_XXXX", "rmq_sys_ferry_sink"),
    *("UNIQ_KEY\x01u\x02", "DELAY\x01-5\x02", "DELAY\x0199999999999\x02", "TRAN_MSG\x01true\x02"),
    *("TIMER_DELIVER_MS\x01999999999999999\x02", "TIMER_DELAY_SEC\x01-1\x02", "KEYS\x01k\x02"),
    "7F00000100002A9F0000000000000000",
]
BODIES = [
    b"",
    b"\xff" * 17,
    b'{"transactions": {"t": {"broker-a": -1}}}',
    b'{"transactions": {"t": 0}}',
    b'{"transactions": {"t": 9223372036854775808}}',
    b"null",
    encode_batch([BatchItem(b"x", b"A\x01\xff\x02")]),
    encode_batch([BatchItem(b"", b"DELAY\x013\x02"), BatchItem(b"y", b"UNIQ_KEY\x01\x02", -7)]),
]


def templates(now_ms: int) -> list[tuple[int, CommandHeader, bytes]]:
    """Valid requests, one per request family."""
    send = headers.SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=now_ms,
        flag=0,
        properties="KEYS\x01k\x02TAGS\x01t\x02UNIQ_KEY\x01U1\x02",
    )
    batch = encode_batch([BatchItem(b"a", b"KEYS\x01k\x02"), BatchItem(b"b", b"")])
    return [
        (RequestCode.SEND_MESSAGE, send, b"hello"),
        (RequestCode.SEND_MESSAGE_V2, headers.SendMessageRequestHeaderV2.from_v1(send), b"hi"),
        (RequestCode.SEND_BATCH_MESSAGE, send, batch),
        (
            RequestCode.PULL_MESSAGE,
            headers.PullMessageRequestHeader(
                consumer_group="G",
                topic="T",
                queue_id=0,
                queue_offset=0,
                max_msg_nums=32,
                sys_flag=4,
                commit_offset=0,
                suspend_timeout_millis=0,
                subscription="*",
            ),
            b"",
        ),
        (
            RequestCode.UPDATE_CONSUMER_OFFSET,
            headers.UpdateConsumerOffsetRequestHeader(
                consumer_group="G", topic="T", queue_id=0, commit_offset=1
            ),
            b"",
        ),
        (
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            headers.SearchOffsetRequestHeader(topic="T", queue_id=0, timestamp=now_ms),
            b"",
        ),
        (RequestCode.VIEW_MESSAGE_BY_ID, headers.ViewMessageRequestHeader(offset=0), b""),
        (
            RequestCode.QUERY_MESSAGE,
            headers.QueryMessageRequestHeader(
                topic="T", key="k", max_num=32, begin_timestamp=0, end_timestamp=now_ms + 10**6
            ),
            b"",
        ),
        (
            RequestCode.CONSUMER_SEND_MSG_BACK,
            headers.ConsumerSendMsgBackRequestHeader(
                offset=0,
                group="G",
                delay_level=0,
                origin_msg_id="x",
                origin_topic="T",
                unit_mode=False,
                max_reconsume_times=3,
            ),
            b"",
        ),
        (
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            headers.CreateTopicRequestHeader(topic="T2", read_queue_nums=4, write_queue_nums=4),
            b"",
        ),
        (
            RequestCode.GET_CONSUME_STATS,
            headers.GetConsumeStatsRequestHeader(consumer_group="G", topic="T"),
            b"",
        ),
        (
            RequestCode.END_TRANSACTION,
            headers.EndTransactionRequestHeader(
                producer_group="PG",
                tran_state_table_offset=0,
                commit_log_offset=0,
                commit_or_rollback=8,
                from_transaction_check=False,
                msg_id="x",
                transaction_id="x",
            ),
            b"",
        ),
        (
            RequestCode.SINK_PREPARE,
            SinkPrepareRequestHeader(
                sink_id="s", batch_id=0, transaction_id="t", topic="T", queue_id=0
            ),
            encode_batch([BatchItem(b"a", b"UNIQ_KEY\x01u\x02")]),
        ),
        (
            RequestCode.SINK_DECIDE,
            SinkBatchHeader(sink_id="s", batch_id=0),
            b'{"transactions": {"t": {"broker-a": 1}}}',
        ),
        (
            RequestCode.SINK_COMMIT,
            SinkBatchHeader(sink_id="s", batch_id=0),
            b'{"transactions": {"t": 1}}',
        ),
    ]


def mutated(rng: random.Random, code: int, header: CommandHeader, body: bytes) -> RemotingCommand:
    fields = dict(to_ext_fields(header))
    for _ in range(rng.randrange(3)):
        fields[rng.choice(sorted(fields))] = rng.choice(EDGES)
    if rng.random() < 0.3:
        body = rng.choice(BODIES)
    elif rng.random() < 0.2:
        body = body[: rng.randrange(len(body) + 1)] + body
    # END_TRANSACTION is oneway for clients, and a TRANSACTION_NOT_TYPE one gets no answer
    flag = FLAG_ONEWAY if code == RequestCode.END_TRANSACTION else 0
    return RemotingCommand(code=code, ext_fields=fields, body=body, flag=flag)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_mutated_requests_get_typed_answers_and_harm_nothing(
    cluster: LocalCluster, client: RpcClient, caplog: pytest.LogCaptureFixture, seed: int
) -> None:
    broker = cluster.broker
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("T", queues=4)
    async with Producer(cluster.namesrv_addr, "PG") as producer:
        for i in range(10):
            await producer.send("T", b"seed-%d" % i, keys=["k"], tags="t")
    rng = random.Random(seed)
    caplog.set_level(logging.ERROR, logger="ferrymq")
    known = templates(time.time_ns() // 1_000_000)
    for _ in range(1500):
        request = mutated(rng, *rng.choice(known))
        if request.is_oneway:
            await client.oneway(broker.address, request)
        else:
            response = await client.call(broker.address, request, 10)
            assert response.code is not None
    escaped = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert escaped == [], f"seed {seed}: handlers raised untyped errors: {escaped[:5]}"
    assert broker.store.dispatch_error is None
    for name in broker.state.groups.configs:
        validate_group(name)
    for name in broker.state.topics.configs:
        try:
            validate_topic(name)
        except InvalidNameError:
            pytest.fail(f"seed {seed}: a topic config was made for {name!r}")
    async with Producer(cluster.namesrv_addr, "PG") as producer:
        sent = await producer.send("T", b"after")
    _, records = await pull(client, broker.address, "T", sent.queue.queue_id, sent.queue_offset)
    assert [r.body for r in records] == [b"after"]
