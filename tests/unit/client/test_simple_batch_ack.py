"""`batch_acks`: a batch of received messages grouped into BATCH_ACK_MESSAGE entries per broker."""

import base64

import pytest

from ferrymq.client.message import Message
from ferrymq.client.simple import ReceivedMessage, batch_acks
from ferrymq.wire.pop import BatchAck, ReceiptHandle, encode_bit_set


def _received(topic: str, handle: ReceiptHandle) -> ReceivedMessage:
    return ReceivedMessage(Message(topic, b""), str(handle), 1, topic)


def test_bit_sets_are_rocketmqs_bitset_bytes_and_decode_back() -> None:
    # java.util.BitSet with bits 0, 3, 9 set: toByteArray() == {0x09, 0x02}
    assert base64.b64decode(encode_bit_set([9, 0, 3])) == b"\x09\x02"
    assert encode_bit_set([]) == ""
    ack = BatchAck("G", "T", "0", 100, 0, 0, 1, 1, encode_bit_set([0, 7, 8, 200]))
    assert ack.offsets == [100, 107, 108, 300]
    with pytest.raises(ValueError, match="no bit -1"):
        encode_bit_set([-1])


def test_messages_are_grouped_by_broker_and_checkpoint() -> None:
    pop, later = 1_700_000_000_000, 1_700_000_005_000
    messages = [
        _received("T", ReceiptHandle(10, pop, 30_000, 0, False, "a", 0, 12)),
        _received("T", ReceiptHandle(10, pop, 30_000, 0, False, "a", 0, 10)),
        _received("T", ReceiptHandle(3, pop, 30_000, 0, False, "a", 1, 4)),  # another queue
        _received("T", ReceiptHandle(0, pop, 30_000, 0, True, "a", 0, 0)),  # the retry topic
        _received("T", ReceiptHandle(10, later, 60_000, 0, False, "a", 0, 11)),  # changed
        _received("U", ReceiptHandle(10, pop, 30_000, 0, False, "a", 0, 10)),  # another topic
        _received("T", ReceiptHandle(7, pop, 30_000, 999, False, "b", 0, 9)),  # another broker
    ]
    acks = batch_acks("G", messages)
    assert sorted(acks) == ["a", "b"]
    found = {(a.t, a.r, a.q, a.so, a.rq, a.pt, a.it): a.offsets for a in acks["a"]}
    assert found == {
        ("T", "0", 0, 10, 0, pop, 30_000): [10, 12],
        ("T", "0", 1, 3, 0, pop, 30_000): [4],
        ("T", "1", 0, 0, 0, pop, 30_000): [0],
        ("T", "0", 0, 10, 0, later, 60_000): [11],
        ("U", "0", 0, 10, 0, pop, 30_000): [10],
    }
    assert {a.c for a in acks["a"]} == {"G"}
    [b] = acks["b"]
    assert (b.so, b.rq, b.offsets) == (7, 999, [9])
    assert batch_acks("G", []) == {}
