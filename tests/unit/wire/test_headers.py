"""Typed headers <-> extFields: round trips for every header, and errors naming the field."""

import typing

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import HeaderFieldError
from ferrymq.wire import broker, controller, namesrv
from ferrymq.wire.broker import (
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
)
from ferrymq.wire.headers import CommandHeader, from_ext_fields, to_ext_fields


def _all_header_types() -> list[type[CommandHeader]]:
    types = [
        getattr(module, name) for module in (broker, namesrv, controller) for name in module.__all__
    ]
    found = [t for t in types if isinstance(t, type) and issubclass(t, CommandHeader)]
    return list(dict.fromkeys(found))


HEADER_TYPES = _all_header_types()
_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


def _strategy(annotation: object) -> st.SearchStrategy[object]:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        meta = args[1]
        return st.integers(meta.ge, meta.le)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | _strategy(inner)
    if annotation is bool:
        return st.booleans()
    if annotation is str:
        return _text
    raise AssertionError(f"no strategy for {annotation!r}")


def _headers(header_type: type[CommandHeader]) -> st.SearchStrategy[CommandHeader]:
    hints = typing.get_type_hints(header_type, include_extras=True)
    fields = {f.name: _strategy(hints[f.name]) for f in msgspec.structs.fields(header_type)}
    return st.builds(header_type, **fields)


def test_there_are_header_types_to_check() -> None:
    assert len(HEADER_TYPES) >= 20


@pytest.mark.parametrize("header_type", HEADER_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_every_header_round_trips_through_ext_fields(
    header_type: type[CommandHeader], data: st.DataObject
) -> None:
    header = data.draw(_headers(header_type))
    ext = to_ext_fields(header)
    assert all(isinstance(v, str) for v in ext.values())
    assert from_ext_fields(header_type, ext) == header


def test_ext_fields_use_rocketmq_names_and_java_strings() -> None:
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=2,
        sys_flag=0,
        born_timestamp=1700000000000,
        flag=0,
        unit_mode=False,
    )
    assert to_ext_fields(header) == {
        "producerGroup": "PG",
        "topic": "T",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "2",
        "sysFlag": "0",
        "bornTimestamp": "1700000000000",
        "flag": "0",
        "unitMode": "false",
    }


def test_v2_send_header_uses_single_letters_and_converts_to_v1() -> None:
    v1 = SendMessageRequestHeader(
        producer_group="PG",
        topic="T",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=2,
        sys_flag=1,
        born_timestamp=5,
        flag=3,
        properties="TAGS\x01a\x02",
        max_reconsume_times=16,
    )
    v2 = SendMessageRequestHeaderV2.from_v1(v1)
    ext = to_ext_fields(v2)
    assert ext["a"] == "PG"
    assert ext["b"] == "T"
    assert ext["l"] == "16"
    assert ext["i"] == "TAGS\x01a\x02"
    assert from_ext_fields(SendMessageRequestHeaderV2, ext).to_v1() == v1


@pytest.mark.parametrize(
    ("ext", "field", "reason"),
    [
        ({"topic": "T", "queueId": "1"}, "consumerGroup", "missing required field"),
        (
            {
                "consumerGroup": "G",
                "topic": "T",
                "queueId": "one",
                "queueOffset": "0",
                "maxMsgNums": "1",
                "sysFlag": "0",
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
            },
            "queueId",
            "Expected `int`",
        ),
        (
            {
                "consumerGroup": "G",
                "topic": "T",
                "queueId": "99999999999",
                "queueOffset": "0",
                "maxMsgNums": "1",
                "sysFlag": "0",
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
            },
            "queueId",
            "<= 2147483647",
        ),
    ],
)
def test_bad_fields_raise_an_error_naming_header_and_field(
    ext: dict[str, str], field: str, reason: str
) -> None:
    with pytest.raises(HeaderFieldError) as info:
        from_ext_fields(PullMessageRequestHeader, ext)
    assert info.value.field == field
    assert info.value.header == "PullMessageRequestHeader"
    assert reason in str(info.value)


def test_unknown_ext_fields_such_as_acl_keys_are_ignored() -> None:
    header = from_ext_fields(
        namesrv.GetRouteInfoRequestHeader,
        {"topic": "T", "AccessKey": "", "Signature": "x", "OnsChannel": "ALIYUN"},
    )
    assert header == namesrv.GetRouteInfoRequestHeader(topic="T")
