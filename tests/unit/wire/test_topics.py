"""Rules the controller and the brokers share about topics (wire/topics.py)."""

import pytest

from ferrymq.broker import fence, metadata
from ferrymq.wire.topics import (
    FENCED_ATTRIBUTE,
    QueueNums,
    TopicPlacement,
    alter_attributes,
    check_fenced,
    is_broker_local_topic,
)


def test_every_topic_a_broker_makes_for_itself_is_broker_local() -> None:
    for topic in (
        metadata.DEFAULT_TOPIC,
        metadata.SCHEDULE_TOPIC,
        metadata.TIMER_TOPIC,
        metadata.TRANS_HALF_TOPIC,
        metadata.TRANS_OP_HALF_TOPIC,
        metadata.METADATA_TOPIC,
        metadata.SINK_TOPIC,
        metadata.retry_topic("g"),
        metadata.dlq_topic("g"),
    ):
        assert is_broker_local_topic(topic), topic
    for topic in ("Orders", "rmq_user", "RETRY", "TBW1020"):
        assert not is_broker_local_topic(topic), topic


def test_the_fenced_attribute_is_the_brokers() -> None:
    assert FENCED_ATTRIBUTE == fence.FENCED_ATTRIBUTE


def test_a_placement_gives_each_placed_group_its_topic_config() -> None:
    placement = TopicPlacement(
        topic="T",
        version=3,
        placement={"a": QueueNums(read_queue_nums=2, write_queue_nums=4)},
        perm=4,
        order=True,
        attributes={"k": "v"},
    )
    config = placement.config_on("a")
    assert config is not None
    assert (config.read_queue_nums, config.write_queue_nums, config.perm, config.order) == (
        2,
        4,
        4,
        True,
    )
    assert config.attributes == {"k": "v"}
    assert placement.config_on("b") is None


def test_attribute_changes_and_fenced_rules() -> None:
    assert alter_attributes(None, {"+a": "1"}) == {"a": "1"}
    assert alter_attributes({"a": "1", "b": "2"}, {"-a": "", "+c": "3"}) == {"b": "2", "c": "3"}
    with pytest.raises(ValueError, match="only additions"):
        alter_attributes(None, {"-a": ""})
    assert check_fenced(None, {FENCED_ATTRIBUTE: "true"}, 1, 1)
    assert not check_fenced(None, {}, 8, 8)
    with pytest.raises(ValueError, match="takes only the value true"):
        check_fenced(None, {FENCED_ATTRIBUTE: "yes"}, 1, 1)
