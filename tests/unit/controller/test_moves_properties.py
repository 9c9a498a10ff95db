"""Moving queues (issue 20 section 4), as a property: any sequence of moves, finishes, cancels,
drains, forgets and writes, decided and applied as the controller does, keeps the queue map's
rules (`wire/queuemap.py`):
- a logical queue's segments are contiguous, only the last one open;
- no physical queue belongs to two logical queues, and each group's TopicConfig offers every
  physical queue the map puts there;
- a physical queue is sealed exactly when its segment is closed or its queue is moving;
- every message written (at the offset the map's open segment would give it) is found in the
  segment `segment_at` names for its offset, and offsets of a logical queue never repeat;
- a snapshot restores the same topics.
(Offsets below a logical queue's first segment were forgotten with their group's segments.)
"""

import itertools

from hypothesis import event, given, settings
from hypothesis import strategies as st

from ferrymq.controller.state import ControllerState
from ferrymq.controller.topics import FinishMove, group_topics
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.queuemap import QueueMap

from .test_moves import TOPIC, A, B, C, _apply, _create, _decide, _groups, _reassign

GROUPS = (A, B, C)

_op = st.one_of(
    st.tuples(st.just("move"), st.sampled_from(GROUPS), st.integers(0, 1), st.sampled_from(GROUPS)),
    st.tuples(st.just("finish"), st.sampled_from(GROUPS), st.integers(0, 1)),
    st.tuples(st.just("cancel"), st.sampled_from(GROUPS), st.integers(0, 1)),
    st.tuples(st.just("drain"), st.sampled_from(GROUPS)),
    st.tuples(st.just("forget"), st.sampled_from(GROUPS)),
    st.tuples(st.just("write"), st.sampled_from(GROUPS), st.integers(0, 1), st.integers(1, 5)),
)


def _check(
    queue_map: QueueMap, state: ControllerState, written: dict[tuple[str, int], int]
) -> None:
    owners: dict[tuple[str, int], tuple[str, int]] = {}
    for queue in queue_map.logical_queues():
        segments = queue.segments
        assert all(s.is_open == (i == len(segments) - 1) for i, s in enumerate(segments))
        assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(segments))
        for segment in segments:
            assert owners.setdefault(segment.physical, queue.name) == queue.name
            sealed = not segment.is_open or queue.moving is not None
            assert queue_map.is_sealed(*segment.physical) == sealed
        # every offset written so far (and not forgotten) lies in a segment that holds it
        count = written.get(queue.name, 0)
        assert queue.current.start_offset <= count
        for offset in range(segments[0].start_offset, count):
            segment = queue.segment_at(offset)
            assert segment.start_offset <= offset
            assert segment.is_open or offset < segment.end_offset
    for group in GROUPS:
        configs = [c for c in group_topics(state, group, ()).topics if c.topic_name == TOPIC]
        ids = queue_map.physical_ids(group)
        if ids:
            (config,) = configs
            assert config.read_queue_nums > max(ids)
        else:
            assert not configs


@settings(max_examples=100, deadline=None)
@given(st.lists(_op, max_size=20))
def test_any_sequence_of_moves_keeps_the_map_rules(ops: list[tuple[object, ...]]) -> None:
    state = _groups(B, C)
    _create(state, queues=2)
    written: dict[tuple[str, int], int] = {}  # logical queue -> messages (next offset)
    for op in ops:
        topic = state.topics[TOPIC]
        request: object
        match op:
            case ("move", str(group), int(queue_id), str(to)):
                request = _reassign(
                    "move", topic=TOPIC, broker_name=group, queue_id=queue_id, to_broker_name=to
                )
            case ("cancel", str(group), int(queue_id)):
                request = _reassign("cancel", topic=TOPIC, broker_name=group, queue_id=queue_id)
            case ("drain", str(group)):
                request = _reassign("drain", broker_name=group)
            case ("forget", str(group)):
                request = _reassign("forget", broker_name=group)
            case ("finish", str(group), int(queue_id)):
                # the leader's driver: each moving queue (this one first) sealed at what was
                # written to it (every write below committed)
                moving = [q for q in topic.queue_map.logical_queues() if q.moving is not None]
                moving.sort(key=lambda q: q.name != (group, queue_id))
                for queue in moving:
                    assert queue.moving is not None
                    finish = FinishMove(
                        TOPIC, *queue.name, queue.moving.since_version, written.get(queue.name, 0)
                    )
                    _apply(state, _decide(state, finish))
                    event("finish: 1 event(s)")
                _check(state.topics[TOPIC].queue_map, state, written)
                continue
            case ("write", str(group), int(queue_id), int(count)):
                target = topic.queue_map.logical(group, queue_id)
                if target is not None and target.moving is None:
                    assert not topic.queue_map.is_sealed(*target.current.physical)
                    written[target.name] = written.get(target.name, 0) + count
                continue
            case _:
                raise AssertionError(op)
        decision = _decide(state, request)
        if decision.code == ResponseCode.SUCCESS:
            _apply(state, decision)
            event(f"{op[0]}: {len(decision.events)} event(s)")
        _check(state.topics[TOPIC].queue_map, state, written)
    restored = ControllerState()
    restored.restore(state.snapshot())
    assert restored.topics == state.topics
