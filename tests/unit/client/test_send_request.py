"""The producer's SEND_MESSAGE_V2 request: its hand-written extFields are exactly what the header
type flattens to, and the broker's header parsing reads them back."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.client.producer import Producer
from ferrymq.model import MessageQueue
from ferrymq.wire.broker import SendMessageRequestHeaderV2
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.properties import encode_properties

_PROPERTY_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12)


@given(
    topic=st.from_regex(r"[A-Za-z0-9_%-]{1,40}", fullmatch=True),
    queue_id=st.integers(0, 1023),
    sys_flag=st.integers(0, 2**31 - 1),
    properties=st.dictionaries(_PROPERTY_TEXT.filter(bool), _PROPERTY_TEXT, max_size=4),
)
def test_the_v2_fields_equal_the_header_types_flattening(
    topic: str, queue_id: int, sys_flag: int, properties: dict[str, str]
) -> None:
    producer = Producer("127.0.0.1:1", "PG")
    encoded = encode_properties(properties)
    before = time.time_ns() // 1_000_000
    request = producer._request(
        topic,
        RequestCode.SEND_MESSAGE_V2,
        MessageQueue(topic, "broker-a", queue_id),
        b"body",
        encoded,
        False,
        sys_flag,
    )
    born = int(request.ext_fields["g"])
    assert before <= born <= time.time_ns() // 1_000_000
    expected = SendMessageRequestHeaderV2(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=born,
        flag=0,
        properties=encoded.decode() if encoded else None,
    )
    assert request.ext_fields == to_ext_fields(expected)
    assert from_ext_fields(SendMessageRequestHeaderV2, request.ext_fields) == expected
    assert request.code == RequestCode.SEND_MESSAGE_V2
    assert request.body == b"body"


async def test_a_plain_messages_properties_equal_the_general_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer("127.0.0.1:1", "PG")
    monkeypatch.setattr(producer, "new_msg_id", lambda: "AC110001000031A8B7E3F2C100000001")
    sent: list[tuple[bytes, str]] = []

    async def capture(
        topic: str, code: int, body: bytes, properties: bytes, msg_id: str, *args: object
    ) -> None:
        sent.append((properties, msg_id))

    monkeypatch.setattr(producer, "_send", capture)
    await producer.send("T", b"body")  # the fast path
    await producer.send("T", b"body", properties={})  # the general one, same message
    assert sent[0] == sent[1]
    assert sent[0][0] == encode_properties(producer._properties(None, None, None, 0))
    assert sent[0][1] == "AC110001000031A8B7E3F2C100000001"


def test_queues_are_taken_in_turn_and_a_failed_group_is_avoided_for_its_pause() -> None:
    producer = Producer("127.0.0.1:1", "PG")
    queues = [MessageQueue("T", broker, i) for broker in ("a", "b") for i in range(2)]
    assert [producer._choose(queues, None) for _ in range(4)] == queues
    routes = producer.routes

    def all_healthy() -> bool:  # a call, not an attribute mypy would narrow
        return routes.all_healthy

    routes.mark_failed("a")
    assert not all_healthy()
    assert {producer._choose(queues, None).broker_name for _ in range(4)} == {"b"}
    routes._faults["a"] = time.monotonic() - 1  # the pause is over
    assert all_healthy()
    assert routes._faults == {}
    assert {producer._choose(queues, "b").broker_name for _ in range(4)} == {"a"}
