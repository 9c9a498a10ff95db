"""The endpoint's pure translations: error codes, transaction ids, FIFO queues, properties."""

from __future__ import annotations

import pytest

from ferrymq.errors import (
    ConnectError,
    InvalidMessageError,
    InvalidNameError,
    NotCommittedError,
    RemoteError,
    SendFailedError,
    SendOutcomeUnknownError,
    TopicNotFoundError,
)
from ferrymq.model import MessageQueue
from ferrymq.proxy.convert import TxHandle, error_code, fifo_queue, message_properties
from ferrymq.proxy.stubs import load
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TopicNotFoundError("T"), "TOPIC_NOT_FOUND"),
        (InvalidNameError("topic", "a b", "bad"), "ILLEGAL_TOPIC"),
        (NotCommittedError("x", "id", "FLUSH_SLAVE_TIMEOUT"), "MASTER_PERSISTENCE_TIMEOUT"),
        (SendOutcomeUnknownError("x", "id"), "PROXY_TIMEOUT"),
        (RemoteError(ResponseCode.SYSTEM_BUSY, "busy"), "TOO_MANY_REQUESTS"),
        (RemoteError(ResponseCode.NO_PERMISSION, "no"), "FORBIDDEN"),
        (
            SendFailedError("send to T failed: broker group broker-a has no master"),
            "HA_NOT_AVAILABLE",
        ),
        (ConnectError("127.0.0.1:1", "refused"), "HA_NOT_AVAILABLE"),
        (InvalidMessageError("bad"), "BAD_REQUEST"),
        (RuntimeError("bug"), "INTERNAL_ERROR"),
    ],
)
def test_error_codes(error: BaseException, code: str) -> None:
    assert error_code(error) == code
    load().code(code)  # a name the v2 schema has


def test_transaction_id_round_trip_and_garbage() -> None:
    handle = TxHandle("broker:a", 12345, 7, "0102FC00")
    assert TxHandle.decode(handle.encode()) == handle
    for bad in ("", "1:2:3", "x:2:id:b", "1:2::b"):
        with pytest.raises(ValueError, match=r"unpack|invalid literal|not a transaction id"):
            TxHandle.decode(bad)


def test_a_message_group_keeps_its_queue() -> None:
    queues = [MessageQueue("T", "broker-a", i) for i in range(8)]
    chosen = {fifo_queue(queues, f"group-{i}") for i in range(100)}
    assert len(chosen) > 1  # groups spread over the queues
    assert fifo_queue(queues, "group-1") == fifo_queue(list(queues), "group-1")


def test_system_properties_and_reserved_names() -> None:
    v2 = load()
    message = v2.Message()
    message.topic.name = "T"
    message.system_properties.tag = "TagA"
    message.system_properties.keys.extend(["k1", "k2"])
    message.system_properties.message_id = "id-1"
    message.system_properties.message_group = "g"
    message.user_properties["color"] = "red"
    found = message_properties(message, transactional=False)
    assert found == {
        "color": "red",
        props.TAGS: "TagA",
        props.KEYS: "k1 k2",
        props.UNIQ_KEY: "id-1",
        props.SHARDING_KEY: "g",
    }
    with pytest.raises(InvalidMessageError):
        message_properties(message, transactional=True)  # a group on a transactional message
    message.user_properties[props.UNIQ_KEY] = "forged"
    with pytest.raises(InvalidMessageError):
        message_properties(message, transactional=False)
