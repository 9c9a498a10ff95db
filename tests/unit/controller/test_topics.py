"""Topics as controller state (issue 20 section 3): decide and apply topic events.

Versions, tombstones, the deleteTopicEnable gate, placement validation (groups, fenced topics,
broker-local names), what a group is told to hold and drop, and snapshots.
"""

import dataclasses

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.controller.decide import Decision, decide
from ferrymq.controller.state import ControllerState
from ferrymq.controller.topics import (
    DeleteTopic,
    GetGroupTopics,
    GetTopics,
    UpdateTopic,
    group_topics,
    plan_delete,
    plan_update,
)
from ferrymq.wire.bodies import decode_body
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller_log import (
    ApplyBrokerIdEvent,
    DeleteTopicEvent,
    PutTopicEvent,
    decode_entry,
    encode_entry,
)
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.topics import (
    ControllerDeleteTopicRequestHeader,
    ControllerTopicsBody,
    ControllerUpdateTopicRequestHeader,
    GroupTopicsBody,
    TopicVersionResponseHeader,
)

from .helpers import CLUSTER, CONFIG, NAME, address, check_code, group_state, view

OTHER = "broker-b"
FAR = "broker-x"
"""A group of another cluster."""


def _two_groups() -> ControllerState:
    """broker-a (with a master) and broker-b (no master) of CLUSTER, broker-x of another."""
    state = group_state(replicas=1)
    for name, cluster in ((OTHER, CLUSTER), (FAR, "FarCluster")):
        assert state.apply_event(
            ApplyBrokerIdEvent(
                cluster_name=cluster,
                broker_name=name,
                broker_address=address(1),
                new_broker_id=1,
                register_check_code=check_code(1),
            )
        )
    return state


def _update(topic: str = "Orders", queues: int = 4, **fields: object) -> UpdateTopic:
    header = ControllerUpdateTopicRequestHeader(
        topic=topic, read_queue_nums=queues, write_queue_nums=queues
    )
    return UpdateTopic(msgspec.structs.replace(header, **fields))


def _delete(topic: str = "Orders", **fields: object) -> DeleteTopic:
    return DeleteTopic(msgspec.structs.replace(ControllerDeleteTopicRequestHeader(topic), **fields))


def _decide(
    state: ControllerState, request: UpdateTopic | DeleteTopic, *, delete_topic_enable: bool = True
) -> Decision:
    before = state.snapshot()
    config = dataclasses.replace(CONFIG, delete_topic_enable=delete_topic_enable)
    decision = decide(request, view(state, config=config), 0.0)
    assert state.snapshot() == before, "decide must not mutate the state"
    return decision


def _apply(state: ControllerState, decision: Decision) -> None:
    assert decision.code == ResponseCode.SUCCESS, decision.remark
    index = state.applied_index + 1
    assert all(state.apply(index, encode_entry(decision.events)))


def _placement(state: ControllerState, topic: str = "Orders") -> dict[str, tuple[int, int]]:
    return state.topics[topic].placement


def test_a_create_places_the_topic_on_every_group_and_versions_it() -> None:
    state = _two_groups()
    decision = _decide(state, _update())
    (event,) = decision.events
    assert isinstance(event, PutTopicEvent)
    assert event.expected_version == 0
    header = from_ext_fields(TopicVersionResponseHeader, to_ext_fields(decision.header))  # type: ignore[arg-type]
    assert header.topic_version == 1
    body = decode_body(decision.body, ControllerTopicsBody)
    assert body.topics[0].version == 1
    _apply(state, decision)
    assert _placement(state) == {NAME: (4, 4), OTHER: (4, 4), FAR: (4, 4)}
    assert (state.topic_version, state.topics["Orders"].version) == (1, 1)


def test_a_create_on_one_group_or_cluster_and_a_later_one_merge() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update(broker_name=OTHER)))
    assert _placement(state) == {OTHER: (4, 4)}
    _apply(state, _decide(state, _update(queues=2, cluster_name=CLUSTER, perm=4)))
    assert _placement(state) == {NAME: (2, 2), OTHER: (2, 2)}
    assert state.topics["Orders"].perm == 4
    assert state.topics["Orders"].version == 2


def test_the_same_change_again_writes_nothing() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update(broker_name=NAME, attributes="+a=1")))
    again = _decide(state, _update(broker_name=NAME))
    assert again.code == ResponseCode.SUCCESS
    assert again.events == ()
    assert decode_body(again.body, ControllerTopicsBody).topics[0].attributes == {"a": "1"}


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (_update(broker_name="broker-z"), "broker-z is not known"),
        (_update(broker_name=NAME, cluster_name="FarCluster"), "belongs to cluster"),
        (_update(cluster_name="Nowhere"), "no broker group of cluster Nowhere"),
        (_update(topic="%RETRY%g"), "broker-local"),
        (_update(topic="SCHEDULE_TOPIC_XXXX"), "broker-local"),
        (_update(topic="rmq_sys_ferry_metadata"), "broker-local"),
        (_update(topic="bad topic"), "topic"),
        (_update(queues=0), "1..1024"),
        (_update(queues=1025), "1..1024"),
        (_update(attributes="-a"), "only additions"),
        (_update(attributes="nonsense"), "starts with +"),
    ],
)
def test_bad_placements_and_names_are_refused(request_: UpdateTopic, words: str) -> None:
    decision = _decide(_two_groups(), request_)
    assert decision.code == ResponseCode.INVALID_PARAMETER
    assert words in (decision.remark or "")
    assert decision.events == ()


def test_a_controller_without_groups_refuses_creates() -> None:
    decision = _decide(ControllerState(), _update())
    assert decision.code == ResponseCode.INVALID_PARAMETER
    assert "no broker group" in (decision.remark or "")


def test_a_delete_leaves_a_tombstone_and_a_recreate_gets_a_newer_version() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update()))
    decision = _decide(state, _delete())
    (event,) = decision.events
    assert event == DeleteTopicEvent(topic="Orders", expected_version=1)
    assert decode_body(decision.body, ControllerTopicsBody).deleted == {"Orders": 2}
    _apply(state, decision)
    assert "Orders" not in state.topics
    assert (state.deleted_topics, state.topic_version) == ({"Orders": 2}, 2)
    again = _decide(state, _delete())
    assert (again.code, again.events) == (ResponseCode.SUCCESS, ())
    recreate = _decide(state, _update(broker_name=NAME))
    assert recreate.events[0].expected_version == 2  # type: ignore[union-attr]
    _apply(state, recreate)
    assert (state.topics["Orders"].version, state.deleted_topics) == (3, {})


def test_deleting_a_topic_the_controller_never_knew_still_writes_a_tombstone() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _delete("Legacy")))
    assert state.deleted_topics == {"Legacy": 1}


def test_delete_topic_enable_false_refuses_every_delete() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update()))
    for request in (_delete(), _delete(broker_name=NAME), _delete("Unknown")):
        decision = _decide(state, request, delete_topic_enable=False)
        assert decision.code == ResponseCode.NO_PERMISSION
        assert "deleteTopicEnable=false" in (decision.remark or "")
        assert decision.events == ()
    assert "Orders" in state.topics


def test_a_scoped_delete_takes_groups_off_and_the_last_one_deletes() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update()))
    _apply(state, _decide(state, _delete(broker_name=OTHER)))
    assert _placement(state) == {NAME: (4, 4), FAR: (4, 4)}
    nothing = _decide(state, _delete(broker_name=OTHER))
    assert nothing.events == ()
    _apply(state, _decide(state, _delete(cluster_name=CLUSTER)))
    assert _placement(state) == {FAR: (4, 4)}
    _apply(state, _decide(state, _delete(cluster_name="FarCluster")))
    assert "Orders" not in state.topics
    assert state.deleted_topics["Orders"] == state.topic_version == 4


def test_an_event_decided_against_an_older_version_changes_nothing() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update()))
    first = _decide(state, _update(queues=2))
    second = _decide(state, _delete())
    _apply(state, first)
    version = state.topic_version
    assert state.apply(99, encode_entry(second.events)) == (False,)
    assert "Orders" in state.topics
    assert state.topic_version == version
    assert not state.apply_event(
        PutTopicEvent(
            topic="Orders",
            placement={},
            perm=6,
            topic_filter_type="SINGLE_TAG",
            topic_sys_flag=0,
            order=False,
            attributes={},
            expected_version=version,
        )
    ), "a live topic is on at least one group"


def test_fenced_topics_have_one_queue_on_one_group_for_ever() -> None:
    state = _two_groups()
    assert "exactly one broker group" in (
        _decide(state, _update(queues=1, attributes="+ferry.fenced=true")).remark or ""
    )
    assert "exactly one read and one write queue" in (
        _decide(state, _update(queues=2, broker_name=NAME, attributes="+ferry.fenced=true")).remark
        or ""
    )
    _apply(
        state, _decide(state, _update(queues=1, broker_name=NAME, attributes="+ferry.fenced=true"))
    )
    assert _placement(state) == {NAME: (1, 1)}
    assert state.topics["Orders"].attributes == {"ferry.fenced": "true"}
    for request, words in (
        (_update(queues=1, broker_name=OTHER), "exactly one broker group"),
        (_update(queues=1, broker_name=NAME, attributes="-ferry.fenced"), "stays fenced"),
        (_update(queues=2, broker_name=NAME), "exactly one read and one write queue"),
        (_update(queues=1, broker_name=OTHER, auto_create=True), "fenced topic"),
    ):
        decision = _decide(state, request)
        assert decision.code != ResponseCode.SUCCESS
        assert words in (decision.remark or ""), decision.remark
    assert _decide(state, _update(queues=1, broker_name=NAME)).events == ()
    _apply(state, _decide(state, _update("Plain", broker_name=NAME)))
    refused = _decide(
        state, _update("Plain", queues=1, broker_name=NAME, attributes="+ferry.fenced=true")
    )
    assert "cannot become fenced" in (refused.remark or "")


def test_an_auto_create_places_the_topic_on_its_group_without_changing_it() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update(queues=2, broker_name=NAME, auto_create=True)))
    assert _placement(state) == {NAME: (2, 2)}
    assert _decide(state, _update(queues=8, broker_name=NAME, auto_create=True)).events == ()
    _apply(state, _decide(state, _update(queues=8, broker_name=OTHER, perm=2, auto_create=True)))
    assert _placement(state) == {NAME: (2, 2), OTHER: (8, 8)}
    assert state.topics["Orders"].perm == 6
    _apply(state, _decide(state, _delete()))
    _apply(state, _decide(state, _update(queues=3, broker_name=OTHER, auto_create=True)))
    assert _placement(state) == {OTHER: (3, 3)}


def test_a_group_is_told_what_to_hold_and_which_held_topics_to_drop() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update("Both", cluster_name=CLUSTER)))
    _apply(state, _decide(state, _update("OnlyA", queues=2, broker_name=NAME, order=True)))
    _apply(state, _decide(state, _update("Gone", broker_name=OTHER)))
    _apply(state, _decide(state, _delete("Gone")))
    held = ("Both", "OnlyA", "Gone", "Legacy", "%RETRY%g")
    body = group_topics(state, OTHER, held)
    assert body.topic_version == state.topic_version
    assert [(c.topic_name, c.write_queue_nums) for c in body.topics] == [("Both", 4)]
    assert body.drop == ["Gone", "OnlyA"]  # Legacy: never known, kept; retry: broker-local
    body_a = group_topics(state, NAME, held)
    assert {c.topic_name: c.order for c in body_a.topics} == {"Both": False, "OnlyA": True}
    assert body_a.drop == ["Gone"]
    decision = decide(GetGroupTopics(OTHER, held), view(state), 0.0)
    assert decode_body(decision.body, GroupTopicsBody) == body
    listed = decode_body(decide(GetTopics(None), view(state), 0.0).body, ControllerTopicsBody)
    assert [t.topic for t in listed.topics] == ["Both", "OnlyA"]
    one = decode_body(decide(GetTopics("Gone"), view(state), 0.0).body, ControllerTopicsBody)
    assert (one.topics, one.deleted) == ([], {"Gone": 4})


def test_decisions_in_one_batch_see_each_others_events_through_the_overlay() -> None:
    state = _two_groups()
    overlay = state.overlay()
    for request in (_update(broker_name=NAME), _update(broker_name=OTHER), _delete()):
        decision = decide(request, view(overlay), 0.0)
        for event in decision.events:
            assert overlay.apply_event(event)
    assert state.topics == {}
    assert state.topic_version == 0
    assert overlay.deleted_topics == {"Orders": 3}


def test_topics_and_tombstones_survive_a_snapshot() -> None:
    state = _two_groups()
    _apply(state, _decide(state, _update(attributes="+k=v", order=True)))
    _apply(
        state,
        _decide(
            state, _update("Fenced", queues=1, broker_name=OTHER, attributes="+ferry.fenced=true")
        ),
    )
    _apply(state, _decide(state, _update("Gone", broker_name=NAME)))
    _apply(state, _decide(state, _delete("Gone")))
    restored = ControllerState()
    restored.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert restored.topics == state.topics
    assert (restored.deleted_topics, restored.topic_version) == ({"Gone": 4}, 4)
    # and an older snapshot, written before topics existed, restores with none
    record = msgspec.json.decode(state.snapshot()[1:])
    for key in ("topics", "deletedTopics", "topicVersion"):
        del record[key]
    older = ControllerState()
    older.restore(state.snapshot()[:1] + msgspec.json.encode(record))
    assert (older.topics, older.deleted_topics, older.topic_version) == ({}, {}, 0)


def test_topic_events_round_trip_through_the_log_encoding() -> None:
    state = _two_groups()
    decision = _decide(state, _update(attributes="+b=2,+a=1"))
    assert decode_entry(encode_entry(decision.events)) == list(decision.events)
    assert encode_entry(decision.events) == encode_entry(
        decode_entry(encode_entry(decision.events))
    )


_NAMES = st.sampled_from(["T1", "T2", "T3"])
_GROUPS = st.sampled_from([NAME, OTHER, FAR, None])
_REQUESTS = st.one_of(
    st.builds(
        lambda t, g, q, auto: _update(t, q, broker_name=g, auto_create=auto),
        _NAMES,
        _GROUPS,
        st.integers(1, 3),
        st.booleans(),
    ),
    st.builds(lambda t, g: _delete(t, broker_name=g), _NAMES, _GROUPS),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_REQUESTS, max_size=25))
def test_any_sequence_keeps_the_topic_invariants_and_replays_identically(
    requests: list[UpdateTopic | DeleteTopic],
) -> None:
    state = _two_groups()
    entries = []
    for request in requests:
        decision = decide(request, view(state), 0.0)
        if decision.code != ResponseCode.SUCCESS or not decision.events:
            continue
        entry = encode_entry(decision.events)
        entries.append(entry)
        before = state.topic_version
        assert all(state.apply(len(entries), entry))
        assert state.topic_version == before + len(decision.events)
        assert not state.topics.keys() & state.deleted_topics.keys()
        for topic in state.topics.values():
            assert topic.placement
            assert topic.version <= state.topic_version
        assert all(v <= state.topic_version for v in state.deleted_topics.values())
    replayed = _two_groups()
    for index, entry in enumerate(entries, 1):
        replayed.apply(index, entry)
    assert replayed.snapshot() == state.snapshot()
    restored = ControllerState()
    restored.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()


def test_the_planners_are_reachable_without_decide() -> None:
    state = _two_groups()
    assert plan_update(state, _update().header).topic_version == 1
    assert plan_delete(state, _delete().header, enabled=False).code == ResponseCode.NO_PERMISSION
