"""Moving queues between groups (issue 20 section 4): the pure decide/apply of a move.

Every step (start, finish, cancel, drain, forget) as decide -> events -> apply, each idempotent;
a crash at every step (the decision lost before Raft, the event applied but not answered, a new
leader from a snapshot) followed by the same driver resumes to the same end state; the refusals;
and what each group is told to hold (physical queues, the map, sealed groups read-only).
"""

import dataclasses
from collections.abc import Callable

import msgspec
import pytest

from ferrymq.controller.decide import Decision, decide
from ferrymq.controller.state import ControllerState
from ferrymq.controller.topics import (
    DeleteTopic,
    FinishMove,
    ReassignQueues,
    UpdateTopic,
    group_topics,
    moving_queues,
)
from ferrymq.wire.bodies import Perm, decode_body
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller_log import (
    ApplyBrokerIdEvent,
    CancelQueueMoveEvent,
    FinishQueueMoveEvent,
    ForgetSegmentsEvent,
    StartQueueMoveEvent,
    decode_entry,
    decode_snapshot,
    encode_entry,
)
from ferrymq.wire.queuemap import QUEUE_MAP_ATTRIBUTE, QueueSegment, decode_queue_map
from ferrymq.wire.topics import (
    FENCED_ATTRIBUTE,
    ControllerDeleteTopicRequestHeader,
    ControllerReassignRequestHeader,
    ControllerUpdateTopicRequestHeader,
    ReassignBody,
)

from .helpers import CLUSTER, CONFIG, NAME, address, check_code, group_state, view

A, B, C = NAME, "broker-b", "broker-c"
TOPIC = "Orders"


def _groups(*names: str) -> ControllerState:
    state = group_state(replicas=1)
    for name in names:
        assert state.apply_event(
            ApplyBrokerIdEvent(
                cluster_name=CLUSTER,
                broker_name=name,
                broker_address=address(1),
                new_broker_id=1,
                register_check_code=check_code(1),
            )
        )
    return state


def _decide(state: ControllerState, request: object) -> Decision:
    before = state.snapshot()
    decision = decide(request, view(state, config=CONFIG), 0.0)  # type: ignore[arg-type]
    assert state.snapshot() == before, "decide must not mutate the state"
    return decision


def _apply(state: ControllerState, decision: Decision) -> None:
    assert decision.code == ResponseCode.SUCCESS, decision.remark
    assert all(state.apply(state.applied_index + 1, encode_entry(decision.events)))


def _create(state: ControllerState, queues: int = 2, **fields: object) -> None:
    header = ControllerUpdateTopicRequestHeader(
        topic=TOPIC, read_queue_nums=queues, write_queue_nums=queues
    )
    _apply(state, _decide(state, UpdateTopic(msgspec.structs.replace(header, **fields))))


def _reassign(action: str, **fields: object) -> ReassignQueues:
    return ReassignQueues(ControllerReassignRequestHeader(action=action, **fields))  # type: ignore[arg-type]


def _move(broker: str = A, queue_id: int = 1, to: str = B) -> ReassignQueues:
    return _reassign("move", topic=TOPIC, broker_name=broker, queue_id=queue_id, to_broker_name=to)


def _finish(state: ControllerState, end: int, broker: str = A, queue_id: int = 1) -> FinishMove:
    queue = state.topics[TOPIC].queue_map.logical(broker, queue_id)
    assert queue is not None
    assert queue.moving is not None
    return FinishMove(TOPIC, broker, queue_id, queue.moving.since_version, end)


def _two_groups_topic() -> ControllerState:
    state = _groups(B)
    _create(state)
    return state


def _config(state: ControllerState, group: str) -> dict[str, object] | None:
    found = [c for c in group_topics(state, group, ()).topics if c.topic_name == TOPIC]
    if not found:
        return None
    config = found[0]
    return {
        "queues": (config.read_queue_nums, config.write_queue_nums),
        "writable": bool(config.perm & Perm.WRITE),
        "map": QUEUE_MAP_ATTRIBUTE in config.attributes,
    }


def test_a_move_starts_seals_the_source_and_finishes_at_the_sealed_offset() -> None:
    state = _two_groups_topic()
    start = _decide(state, _move())
    (event,) = start.events
    assert event == StartQueueMoveEvent(
        topic=TOPIC,
        broker_name=A,
        queue_id=1,
        source_broker_name=A,
        source_queue_id=1,
        target_broker_name=B,
        target_queue_id=2,  # above broker-b's own queues 0..1
        expected_version=1,
    )
    body = decode_body(start.body, ReassignBody)
    assert [(m.from_broker_name, m.to_broker_name, m.to_queue_id) for m in body.moves] == [
        (A, B, 2)
    ]
    _apply(state, start)
    queue_map = state.topics[TOPIC].queue_map
    assert queue_map.is_sealed(A, 1)
    assert not queue_map.is_sealed(A, 0)
    assert not queue_map.is_sealed(B, 2)
    assert next(m for _, m in moving_queues(state)).moving.since_version == 2  # type: ignore[union-attr]
    # the target's physical queue opens only when the move finishes
    assert _config(state, B) == {"queues": (2, 2), "writable": True, "map": True}
    assert _config(state, A) == {"queues": (2, 2), "writable": True, "map": True}

    finish = _decide(state, _finish(state, 7))
    assert finish.events == (
        FinishQueueMoveEvent(
            topic=TOPIC, broker_name=A, queue_id=1, end_queue_offset=7, expected_version=2
        ),
    )
    _apply(state, finish)
    queue = state.topics[TOPIC].queue_map.logical(A, 1)
    assert queue is not None
    assert queue.moving is None
    assert queue.segments == (QueueSegment(A, 1, 0, 7), QueueSegment(B, 2, 7))
    assert _config(state, B) == {"queues": (3, 3), "writable": True, "map": True}
    queue_map = state.topics[TOPIC].queue_map
    assert queue_map.hosted_starts(B) == {2: 7}
    assert queue_map.is_sealed(A, 1)
    assert moving_queues(state) == []


def test_every_step_is_idempotent() -> None:
    state = _two_groups_topic()
    start = _decide(state, _move())
    _apply(state, start)
    again = _decide(state, _move())
    assert again.events == ()  # already moving there: the same answer, nothing new
    assert len(decode_body(again.body, ReassignBody).moves) == 1
    assert state.apply_event(start.events[0]) is False  # a replayed event changes nothing
    finish = _decide(state, _finish(state, 3))
    stale = FinishMove(TOPIC, A, 1, finish.events[0].expected_version, 3)  # type: ignore[union-attr]
    _apply(state, finish)
    assert state.apply_event(finish.events[0]) is False
    assert _decide(state, stale).events == ()  # the move is over: a late finish does nothing
    assert _decide(state, _move()).events == ()  # already on broker-b


Step = Callable[[ControllerState], Decision]


def _driver_steps() -> list[tuple[str, Step]]:
    """What the leader does for one move, step by step (the source seals at offset 5)."""
    return [
        ("start", lambda s: _decide(s, _move())),
        ("finish", lambda s: _decide(s, _finish(s, 5))),
    ]


def _drive(state: ControllerState) -> None:
    """Run the driver to the end from wherever the state is (as a new leader would)."""
    for _ in range(4):
        queue = state.topics[TOPIC].queue_map.logical(A, 1)
        assert queue is not None
        if queue.moving is not None:
            _apply(state, _decide(state, _finish(state, 5)))
        elif queue.current.broker_name != B:
            _apply(state, _decide(state, _move()))
        else:
            return
    raise AssertionError("the move did not finish")


@pytest.mark.parametrize("crash_after", range(2))
@pytest.mark.parametrize("lost", ["decision", "answer", "leader"])
def test_a_crash_at_any_step_resumes_to_the_same_end(crash_after: int, lost: str) -> None:
    """decision: decided, never replicated; answer: applied, never answered; leader: a new
    leader restored from a snapshot taken right after the step."""
    expected = _two_groups_topic()
    _drive(expected)
    state = _two_groups_topic()
    for index, (_, step) in enumerate(_driver_steps()):
        decision = step(state)
        if index < crash_after:
            _apply(state, decision)
            continue
        if lost == "decision":
            break
        _apply(state, decision)
        if lost == "leader":
            restored = ControllerState()
            restored.restore(state.snapshot())
            state = restored
        break
    _drive(state)
    assert state.topics[TOPIC].queues == expected.topics[TOPIC].queues
    assert state.topics[TOPIC].queue_map.physical_ids(B) == {0, 1, 2}


def test_a_cancel_before_the_finish_gives_the_queue_back() -> None:
    state = _two_groups_topic()
    before = _config(state, A)
    _apply(state, _decide(state, _move()))
    cancel = _decide(state, _reassign("cancel", topic=TOPIC, broker_name=A, queue_id=1))
    assert cancel.events == (
        CancelQueueMoveEvent(topic=TOPIC, broker_name=A, queue_id=1, expected_version=2),
    )
    _apply(state, cancel)
    assert state.topics[TOPIC].queues == {}
    assert _config(state, A) == before  # no map any more: exactly what it held before
    nothing = _decide(state, _reassign("cancel", topic=TOPIC, broker_name=A, queue_id=1))
    assert nothing.events == ()


def test_a_drain_moves_every_open_segment_off_the_group_then_forget_drops_it() -> None:
    state = _groups(B, C)
    _create(state, queues=2)
    drain = _decide(state, _reassign("drain", broker_name=A))
    starts = [e for e in drain.events if isinstance(e, StartQueueMoveEvent)]
    assert [(e.queue_id, e.target_broker_name, e.target_queue_id) for e in starts] == [
        (0, B, 2),
        (1, C, 2),  # the fewest open segments of the topic, in turn
    ]
    assert [e.expected_version for e in starts] == [1, 2]
    _apply(state, drain)
    assert _config(state, A) == {"queues": (2, 2), "writable": False, "map": True}
    for queue_id, end in ((0, 4), (1, 9)):
        _apply(state, _decide(state, _finish(state, end, queue_id=queue_id)))
    assert _decide(state, _reassign("drain", broker_name=A)).events == ()  # nothing left
    assert _config(state, A) == {"queues": (2, 2), "writable": False, "map": True}
    forget = _decide(state, _reassign("forget", broker_name=A))
    assert forget.events == (ForgetSegmentsEvent(topic=TOPIC, broker_name=A, expected_version=5),)
    _apply(state, forget)
    assert _config(state, A) is None
    assert group_topics(state, A, (TOPIC,)).drop == [TOPIC]
    queue = state.topics[TOPIC].queue_map.logical(A, 0)
    assert queue is not None
    assert queue.segments == (QueueSegment(B, 2, 4),)
    owner = state.topics[TOPIC].queue_map.owner(A, 0)
    assert owner is not None
    assert owner[1] == QueueSegment(A, 0, 4, 4)


def test_a_drain_into_one_named_group_and_of_one_topic() -> None:
    state = _groups(B, C)
    _create(state, queues=2)
    drain = _decide(state, _reassign("drain", broker_name=A, topic=TOPIC, to_broker_name=C))
    assert {e.target_broker_name for e in drain.events} == {C}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (_move(queue_id=7), ResponseCode.INVALID_PARAMETER, "has no queue 7"),
        (_move(to="broker-z"), ResponseCode.INVALID_PARAMETER, "broker-z is not known"),
        (
            _reassign("move", topic="Nope", broker_name=A, queue_id=0, to_broker_name=B),
            ResponseCode.TOPIC_NOT_EXIST,
            "does not exist",
        ),
        (_reassign("move", topic=TOPIC), ResponseCode.INVALID_PARAMETER, "names a topic"),
        (_reassign("jump"), ResponseCode.INVALID_PARAMETER, "unknown reassign action"),
        (_reassign("drain"), ResponseCode.INVALID_PARAMETER, "names a broker group"),
        (
            _reassign("drain", broker_name=A, to_broker_name=A),
            ResponseCode.INVALID_PARAMETER,
            "into itself",
        ),
    ],
)
def test_bad_reassigns_are_refused(request_: ReassignQueues, code: int, words: str) -> None:
    decision = _decide(_two_groups_topic(), request_)
    assert decision.code == code
    assert words in (decision.remark or "")
    assert decision.events == ()


def test_fenced_and_uneven_topics_do_not_move() -> None:
    state = _groups(B)
    _create(state, queues=1, attributes=f"+{FENCED_ATTRIBUTE}=true", broker_name=A)
    decision = _decide(state, _move(queue_id=0))
    assert "fenced" in (decision.remark or "")
    uneven = _groups(B)
    _create(uneven, queues=2, read_queue_nums=4)
    decision = _decide(uneven, _move())
    assert "4 read and 2 write" in (decision.remark or "")


def test_a_second_move_elsewhere_waits_for_the_first() -> None:
    state = _groups(B, C)
    _create(state)
    _apply(state, _decide(state, _move()))
    decision = _decide(state, _move(to=C))
    assert "moving to broker-b already" in (decision.remark or "")


def test_queue_counts_and_deletes_respect_moved_queues() -> None:
    state = _two_groups_topic()
    _apply(state, _decide(state, _move()))
    _apply(state, _decide(state, _finish(state, 3)))
    header = ControllerUpdateTopicRequestHeader(topic=TOPIC, read_queue_nums=1, write_queue_nums=1)
    shrink = _decide(state, UpdateTopic(msgspec.structs.replace(header, broker_name=A)))
    assert "cannot go below 2" in (shrink.remark or "")
    grow = _decide(
        state,
        UpdateTopic(
            msgspec.structs.replace(header, broker_name=B, read_queue_nums=4, write_queue_nums=4)
        ),
    )
    assert "cannot grow past 2" in (grow.remark or "")
    off = _decide(state, DeleteTopic(ControllerDeleteTopicRequestHeader(TOPIC, broker_name=B)))
    assert "drain" in (off.remark or "")
    # a config change keeps the moved queues
    _apply(
        state,
        _decide(
            state,
            UpdateTopic(
                msgspec.structs.replace(
                    header, read_queue_nums=2, write_queue_nums=2, perm=6, attributes="+a=1"
                )
            ),
        ),
    )
    assert state.topics[TOPIC].attributes == {"a": "1"}
    assert (A, 1) in state.topics[TOPIC].queues
    # a delete drops the topic with its moves; a new incarnation starts without any
    _apply(state, _decide(state, DeleteTopic(ControllerDeleteTopicRequestHeader(TOPIC))))
    _create(state)
    assert state.topics[TOPIC].queues == {}


def test_snapshots_and_entries_carry_moves_and_older_snapshots_have_none() -> None:
    state = _two_groups_topic()
    plain = state.snapshot()
    assert b'"queues"' not in plain  # topics that never moved are written as before
    _apply(state, _decide(state, _move()))
    restored = ControllerState()
    restored.restore(state.snapshot())
    assert restored.topics == state.topics
    assert decode_snapshot(plain).topics[0].queues == []
    events = list(_decide(state, _finish(state, 2)).events)
    assert decode_entry(encode_entry(events)) == events


def test_group_configs_carry_the_map_brokers_and_clients_read() -> None:
    state = _two_groups_topic()
    _apply(state, _decide(state, _move()))
    _apply(state, _decide(state, _finish(state, 6)))
    (config,) = [c for c in group_topics(state, B, ()).topics if c.topic_name == TOPIC]
    queue_map = decode_queue_map(config.attributes[QUEUE_MAP_ATTRIBUTE])
    assert queue_map == state.topics[TOPIC].queue_map
    assert queue_map.version == state.topics[TOPIC].version
    assert dataclasses.asdict(state.topics[TOPIC])["version"] == 3
