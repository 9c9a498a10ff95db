"""POP wire pieces: RocketMQ's receipt handle string, the pop info strings, BatchAck bit sets."""

import base64

import msgspec
import pytest

from ferrymq.errors import ProtocolError
from ferrymq.wire.pop import (
    MAX_BATCH_ACK_BITS,
    BatchAck,
    BatchAckMessageRequestBody,
    ReceiptHandle,
    format_msg_offset_info,
    format_order_count_info,
    format_start_offset_info,
    parse_info,
    pop_retry_topic,
)


def test_receipt_handle_is_rocketmqs_extra_info() -> None:
    # ExtraInfoUtil.buildExtraInfo(ckQueueOffset, popTime, invisibleTime, reviveQid, topic flag,
    # brokerName, queueId, msgQueueOffset), space separated
    text = "5 1700000000000 30000 0 1 broker-a 3 7"
    handle = ReceiptHandle.parse(text)
    assert handle == ReceiptHandle(5, 1_700_000_000_000, 30_000, 0, True, "broker-a", 3, 7)
    assert str(handle) == text
    assert not handle.is_orderly
    assert ReceiptHandle.parse("0 1 2 999 0 b 0 0").is_orderly


@pytest.mark.parametrize("text", ["", "1 2 3", "a 1 2 0 0 b 0 0", "1 2 3 0 0 b 0 0 9"])
def test_a_bad_receipt_handle_is_a_protocol_error(text: str) -> None:
    with pytest.raises(ProtocolError):
        ReceiptHandle.parse(text)


def test_info_strings_round_trip() -> None:
    starts = format_start_offset_info([(False, 0, 4), (True, 0, 9)])
    assert starts == "0 0 4;1 0 9"
    assert parse_info(starts) == {"0@0": "4", "1@0": "9"}
    assert format_msg_offset_info([(False, 2, [4, 5])]) == "0 2 4,5"
    orders = format_order_count_info([(False, 2, 5, 1)])
    assert parse_info(orders) == {"0@qo2%5": "1"}
    assert parse_info(None) == {}
    with pytest.raises(ProtocolError):
        parse_info("0 1")


def test_batch_ack_bit_set_as_java_writes_it_or_as_a_list() -> None:
    # java.util.BitSet{0, 2, 9}.toByteArray() = [0b101, 0b10] (little-endian), base64 in JSON
    bits = base64.b64encode(bytes([0b101, 0b10])).decode()
    body = msgspec.json.encode(
        {
            "brokerName": "broker-a",
            "acks": [
                {
                    "c": "G",
                    "t": "T",
                    "r": "0",
                    "so": 10,
                    "q": 1,
                    "rq": 0,
                    "pt": 1,
                    "it": 2,
                    "b": bits,
                },
                {
                    "c": "G",
                    "t": "T",
                    "r": "1",
                    "so": 3,
                    "q": 0,
                    "rq": 0,
                    "pt": 1,
                    "it": 2,
                    "b": [1],
                },
            ],
        }
    )
    decoded = msgspec.json.decode(body, type=BatchAckMessageRequestBody)
    assert [a.offsets for a in decoded.acks] == [[10, 12, 19], [4]]
    assert pop_retry_topic("G", "T") == "%RETRY%G_T"


def test_a_batch_ack_bit_set_is_bounded() -> None:
    """A huge bit set is refused at once (it used to take quadratic time: one request of a few
    MB held the broker's loop for hours)."""
    full = BatchAck(c="G", t="T", r="0", so=5, q=0, rq=0, pt=1, it=1, b="")
    biggest = base64.b64encode(b"\xff" * (MAX_BATCH_ACK_BITS // 8)).decode()
    assert msgspec.structs.replace(full, b=biggest).offsets == [
        5 + bit for bit in range(MAX_BATCH_ACK_BITS)
    ]
    too_big = base64.b64encode(b"\xff" * (MAX_BATCH_ACK_BITS // 8 + 3)).decode()
    with pytest.raises(ProtocolError, match="too long"):
        msgspec.structs.replace(full, b=too_big).offsets  # noqa: B018
    with pytest.raises(ProtocolError, match="offsets"):
        msgspec.structs.replace(full, b=list(range(MAX_BATCH_ACK_BITS + 1))).offsets  # noqa: B018
