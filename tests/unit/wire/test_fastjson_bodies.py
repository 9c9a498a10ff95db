"""FastJSON's MessageQueue-keyed maps: ferrymq writes and reads what RocketMQ wrote (recorded)."""

import json

import pytest

from ferrymq.errors import ProtocolError
from ferrymq.wire import fastjson
from ferrymq.wire.bodies import (
    ConsumeStats,
    ConsumeStatsEntry,
    TopicOffsetEntry,
    TopicStatsTable,
    decode_consume_stats,
    decode_topic_stats,
    encode_consume_stats,
    encode_topic_stats,
)

from .rocketmq_recorded import (
    CLUSTER_INFO_4X,
    CONSUME_STATS_4X,
    CONSUME_STATS_5X,
    RESET_OFFSET_BODY_4X,
    TOPIC_STATS_5X,
)


def test_consume_stats_are_written_as_rocketmq_5_writes_them() -> None:
    stats = ConsumeStats(
        [
            ConsumeStatsEntry(
                topic="MyTopic",
                broker_name="broker-a",
                queue_id=3,
                broker_offset=100,
                consumer_offset=90,
                last_timestamp=1700000000000,
                pull_offset=0,
            )
        ],
        consume_tps=1.5,
    )
    assert encode_consume_stats(stats) == CONSUME_STATS_5X
    assert decode_consume_stats(CONSUME_STATS_5X) == stats


def test_topic_stats_are_written_with_messagequeue_keys() -> None:
    table = TopicStatsTable(
        [
            TopicOffsetEntry(
                topic="MyTopic",
                broker_name="broker-a",
                queue_id=3,
                min_offset=0,
                max_offset=500,
                last_update_timestamp=1700000000000,
            )
        ]
    )
    assert encode_topic_stats(table) == TOPIC_STATS_5X
    assert decode_topic_stats(TOPIC_STATS_5X) == table


def test_rocketmq_4_bodies_decode() -> None:
    stats = decode_consume_stats(CONSUME_STATS_4X)
    assert [(e.queue_id, e.broker_offset, e.pull_offset) for e in stats.offset_table] == [
        (7, 0, 0),
        (6, 0, 0),
    ]
    reset = fastjson.loads(RESET_OFFSET_BODY_4X)["offsetTable"]
    assert sorted((*fastjson.parse_mq_key(k), v) for k, v in reset.items()) == [
        ("topicB", "RaftNode00", q, 0) for q in range(4)
    ]
    cluster = fastjson.loads(CLUSTER_INFO_4X)
    assert cluster["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": "127.0.1.111:10911"}


def test_the_list_form_ferrymq_wrote_before_still_decodes() -> None:
    old = json.dumps(
        {
            "offsetTable": [
                {"topic": "T", "brokerName": "b", "queueId": 1, "minOffset": 2, "maxOffset": 9}
            ]
        }
    ).encode()
    assert decode_topic_stats(old).offset_table[0].max_offset == 9


@pytest.mark.parametrize(
    "bad",
    [
        b'{"offsetTable":{{"brokerName":"b"}:{}}}',
        b'{"offsetTable":{',
        b"{" * 100,
        b'{"offsetTable":{"\x80":{}}}',
    ],
)
def test_malformed_bodies_are_protocol_errors(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_topic_stats(bad)
