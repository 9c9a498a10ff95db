"""The producer's SEND_MESSAGE_V2 request: its hand-written extFields are exactly what the header
type flattens to, and the broker's header parsing reads them back."""

import time

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
