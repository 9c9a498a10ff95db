"""Topic decisions: topics as controller state (issue 20 section 3; seed 003 section 2).

In controller mode a topic's create, change and delete is the controller's decision: decided
here, replicated by Raft as `PutTopicEvent` / `DeleteTopicEvent`, applied by
`ControllerState`. Each topic records its placement (broker group -> queue counts); brokers
reconcile their topic tables toward it (`broker.topicsync`), so a group without a master when
the topic was created gets it once a master returns, and a deleted topic is dropped by a broker
back from any downtime.

Rules:
1. Pure: the state in, events and an answer out (`TopicOutcome`, wrapped by `decide.py`).
2. Every group a change names is one the controller knows (a group is known once a broker of it
   applied for an id); it need not have a master.
3. Broker-local topics (`wire.topics.is_broker_local_topic`: system, retry and dead-letter
   topics) are refused: every broker makes them for itself.
4. A fenced topic (`+ferry.fenced=true`) has one queue on exactly one group, for ever
   (`wire.topics.check_fenced`); a change that would place it on a second group is refused.
5. A delete leaves a tombstone for ever. Deleting a topic the controller never knew writes one
   too (a broker may hold it from before controller mode); deleting a deleted one changes
   nothing. `deleteTopicEnable=false` refuses deletes (Kafka's `delete.topic.enable`).
6. An auto-create (a broker asking for a topic a producer sends to) places the topic on that
   group only if it is not there yet and never changes its config; like RocketMQ's and Kafka's
   auto-create it also re-creates a deleted topic.
7. A change that changes nothing writes no event (an idempotent retry).
8. Moving queues (issue 20 section 4, `wire.queuemap`): `plan_reassign` starts moves (one queue,
   or every open segment of a group being drained), gives one up, or forgets a leaving group's
   closed segments; `plan_finish` closes a move with the offset its source sealed the queue at.
   A fenced topic never moves, nor does a topic with unequal read and write counts on a group
   (a moved queue's group offers every physical queue for reading and writing). Queue counts of
   a topic with moved queues may not shrink over a moved queue, nor grow over a physical queue
   a move placed there; a group whose queues moved or that holds moved queues leaves the topic
   by a drain and a forget, not a delete; a topic with a queue moving is not deleted. Asking
   for what is already so (a queue already on the group, or already moving there) changes
   nothing and succeeds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ferrymq.controller.state import ControllerState, TopicState, leading_kept
from ferrymq.errors import InvalidNameError
from ferrymq.model import validate_topic
from ferrymq.wire.broker import parse_attribute_changes
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller_log import (
    CancelQueueMoveEvent,
    DeleteTopicEvent,
    Event,
    FinishQueueMoveEvent,
    ForgetSegmentsEvent,
    PutTopicEvent,
    QueueNumsRecord,
    StartQueueMoveEvent,
)
from ferrymq.wire.queuemap import LogicalQueue
from ferrymq.wire.topics import (
    FENCED_ATTRIBUTE,
    ControllerDeleteTopicRequestHeader,
    ControllerReassignRequestHeader,
    ControllerTopicsBody,
    ControllerUpdateTopicRequestHeader,
    GroupTopicsBody,
    QueueMoveBody,
    QueueNums,
    ReassignAction,
    ReassignBody,
    TopicPlacement,
    alter_attributes,
    check_fenced,
    is_broker_local_topic,
)

__all__ = [
    "MAX_QUEUE_NUMS",
    "DeleteTopic",
    "FinishMove",
    "GetGroupTopics",
    "GetTopics",
    "ReassignQueues",
    "TopicOutcome",
    "UpdateTopic",
    "group_topics",
    "moving_queues",
    "placement_body",
    "plan_delete",
    "plan_finish",
    "plan_reassign",
    "plan_update",
    "topics_body",
]

MAX_QUEUE_NUMS = 1024
"""Most queues of a topic on one group (the broker's own UPDATE_AND_CREATE_TOPIC limit)."""


@dataclass(frozen=True, slots=True)
class UpdateTopic:
    """CONTROLLER_UPDATE_TOPIC."""

    header: ControllerUpdateTopicRequestHeader


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """CONTROLLER_DELETE_TOPIC."""

    header: ControllerDeleteTopicRequestHeader


@dataclass(frozen=True, slots=True)
class GetGroupTopics:
    """CONTROLLER_GET_GROUP_TOPICS: the group and the topics its broker holds."""

    broker_name: str
    held: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GetTopics:
    """CONTROLLER_GET_TOPICS: one topic, or (None) every live one."""

    topic: str | None


@dataclass(frozen=True, slots=True)
class ReassignQueues:
    """CONTROLLER_REASSIGN_QUEUES."""

    header: ControllerReassignRequestHeader


@dataclass(frozen=True, slots=True)
class FinishMove:
    """The leader's own request once a source master sealed a moving queue (rule 8)."""

    topic: str
    broker_name: str
    queue_id: int
    since_version: int
    end_queue_offset: int


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    """A topic decision: a refusal (`code`, `remark`), or events and the answer's body."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    events: tuple[Event, ...] = ()
    topic_version: int = 0
    """The controller's topic version once the events are applied."""
    body: ControllerTopicsBody | ReassignBody | None = None


def _refuse(code: int, remark: str) -> TopicOutcome:
    return TopicOutcome(code=code, remark=remark)


def placement_body(topic: TopicState) -> TopicPlacement:
    """A topic as answers carry it."""
    return TopicPlacement(
        topic=topic.topic,
        version=topic.version,
        placement={
            name: QueueNums(read_queue_nums=read, write_queue_nums=write)
            for name, (read, write) in sorted(topic.placement.items())
        },
        perm=topic.perm,
        topic_filter_type=topic.topic_filter_type,
        topic_sys_flag=topic.topic_sys_flag,
        order=topic.order,
        attributes=dict(topic.attributes),
        queues=[queue for _, queue in sorted(topic.queues.items())],
    )


def _check_name(topic: str) -> TopicOutcome | None:
    try:
        validate_topic(topic)
    except InvalidNameError as exc:
        return _refuse(ResponseCode.INVALID_PARAMETER, str(exc))
    if is_broker_local_topic(topic):
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"topic {topic} is broker-local (a system, retry or dead-letter topic): every broker "
            "makes it for itself, the controller does not keep it",
        )
    return None


def _targets(
    state: ControllerState, broker_name: str | None, cluster_name: str | None
) -> list[str] | TopicOutcome:
    """The groups a change names (rule 2), or the refusal."""
    if broker_name:
        group = state.groups.get(broker_name)
        if group is None:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"broker group {broker_name} is not known to the controller (a group is known "
                "once one of its brokers started in controller mode)",
            )
        if cluster_name and group.cluster_name != cluster_name:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"broker group {broker_name} belongs to cluster {group.cluster_name}, "
                f"not {cluster_name}",
            )
        return [broker_name]
    names = sorted(
        name
        for name, group in state.groups.items()
        if not cluster_name or group.cluster_name == cluster_name
    )
    if not names:
        where = f"of cluster {cluster_name} " if cluster_name else ""
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"no broker group {where}is known to the controller yet",
        )
    return names


def _answer(state: ControllerState, topic: TopicState) -> TopicOutcome:
    return TopicOutcome(
        topic_version=state.topic_version,
        body=ControllerTopicsBody(
            topic_version=state.topic_version, topics=[placement_body(topic)]
        ),
    )


def _put(state: ControllerState, new: TopicState) -> TopicOutcome:
    """The event that makes `new` the topic, and the answer it will have."""
    version = state.topic_version + 1
    event = PutTopicEvent(
        topic=new.topic,
        placement={
            name: QueueNumsRecord(read_queue_nums=read, write_queue_nums=write)
            for name, (read, write) in sorted(new.placement.items())
        },
        perm=new.perm,
        topic_filter_type=new.topic_filter_type,
        topic_sys_flag=new.topic_sys_flag,
        order=new.order,
        attributes=dict(sorted(new.attributes.items())),
        expected_version=state.topic_version_of(new.topic),
    )
    applied = TopicState.of(event, version)
    return TopicOutcome(
        events=(event,),
        topic_version=version,
        body=ControllerTopicsBody(topic_version=version, topics=[placement_body(applied)]),
    )


def _same(a: TopicState, b: TopicState) -> bool:
    return (a.placement, a.perm, a.topic_filter_type, a.topic_sys_flag, a.order, a.attributes) == (
        b.placement,
        b.perm,
        b.topic_filter_type,
        b.topic_sys_flag,
        b.order,
        b.attributes,
    )


def plan_update(state: ControllerState, header: ControllerUpdateTopicRequestHeader) -> TopicOutcome:
    """CONTROLLER_UPDATE_TOPIC: create or change a topic on some groups (rules 2-4, 6, 7)."""
    refused = _check_name(header.topic)
    if refused is not None:
        return refused
    read, write = header.read_queue_nums, header.write_queue_nums
    if not (0 < read <= MAX_QUEUE_NUMS and 0 < write <= MAX_QUEUE_NUMS):
        return _refuse(
            ResponseCode.INVALID_PARAMETER, f"queue numbers must be in 1..{MAX_QUEUE_NUMS}"
        )
    targets = _targets(state, header.broker_name, header.cluster_name)
    if isinstance(targets, TopicOutcome):
        return targets
    current = state.topics.get(header.topic)
    if header.auto_create and current is not None:
        missing = [name for name in targets if name not in current.placement]
        if not missing:
            return _answer(state, current)
        if current.attributes.get(FENCED_ATTRIBUTE) == "true":
            return _refuse(
                ResponseCode.TOPIC_NOT_EXIST,
                f"fenced topic {header.topic} is on {', '.join(sorted(current.placement))} only",
            )
        placement = dict(current.placement)
        placement.update(dict.fromkeys(missing, (read, write)))
        clash = _placement_clash(current, placement) if current.queues else None
        if clash is not None:
            return _refuse(ResponseCode.INVALID_PARAMETER, f"topic {header.topic}: {clash}")
        new = TopicState(
            topic=current.topic,
            version=current.version,
            placement=placement,
            perm=current.perm,
            topic_filter_type=current.topic_filter_type,
            topic_sys_flag=current.topic_sys_flag,
            order=current.order,
            attributes=dict(current.attributes),
        )
        return _put(state, new)
    before = dict(current.attributes) if current is not None else None
    try:
        attributes = alter_attributes(before, parse_attribute_changes(header.attributes))
        fenced = check_fenced(before, attributes, read, write)
    except ValueError as exc:
        return _refuse(ResponseCode.INVALID_PARAMETER, f"topic {header.topic}: {exc}")
    placement = dict(current.placement) if current is not None else {}
    placement.update(dict.fromkeys(targets, (read, write)))
    if current is not None and current.queues:
        clash = _placement_clash(current, placement)
        if clash is not None:
            return _refuse(ResponseCode.INVALID_PARAMETER, f"topic {header.topic}: {clash}")
    if fenced and len(placement) != 1:
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"fenced topic {header.topic} is on exactly one broker group, not "
            f"{', '.join(sorted(placement))}: name one with its broker name",
        )
    new = TopicState(
        topic=header.topic,
        version=0,
        placement=placement,
        perm=header.perm,
        topic_filter_type=header.topic_filter_type,
        topic_sys_flag=header.topic_sys_flag or 0,
        order=header.order,
        attributes=attributes,
    )
    if current is not None and _same(current, new):
        return _answer(state, current)
    return _put(state, new)


def plan_delete(
    state: ControllerState, header: ControllerDeleteTopicRequestHeader, *, enabled: bool
) -> TopicOutcome:
    """CONTROLLER_DELETE_TOPIC: delete a topic or take it off some groups (rules 5, 7)."""
    if not enabled:
        return _refuse(
            ResponseCode.NO_PERMISSION,
            f"topic {header.topic} not deleted: topic deletion is disabled on the controller "
            "(deleteTopicEnable=false)",
        )
    refused = _check_name(header.topic)
    if refused is not None:
        return refused
    topic = header.topic
    current = state.topics.get(topic)
    if current is None:
        deleted_at = state.deleted_topics.get(topic)
        if deleted_at is not None:
            return TopicOutcome(
                topic_version=state.topic_version,
                body=ControllerTopicsBody(
                    topic_version=state.topic_version, deleted={topic: deleted_at}
                ),
            )
        return _tombstone(state, topic)
    for queue in current.queues.values():
        if queue.moving is not None:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"topic {topic}: queue {queue.queue_id} of {queue.broker_name} is moving to "
                f"{queue.moving.broker_name}: wait for the move to finish, or cancel it, "
                "before deleting the topic",
            )
    if header.broker_name or header.cluster_name:
        removed = {
            name
            for name in current.placement
            if name == header.broker_name
            or (
                not header.broker_name
                and (group := state.groups.get(name)) is not None
                and group.cluster_name == header.cluster_name
            )
        }
        if not removed:
            return _answer(state, current)
        held = sorted(removed & _groups_with_moves(current))
        if held:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"topic {topic}: queues of {', '.join(held)} moved, or {', '.join(held)} holds "
                "moved queues: take a group off a topic with moved queues by draining it "
                "(ferry admin broker drain) and forgetting its read-only queues, not by a delete",
            )
        remaining = {n: q for n, q in current.placement.items() if n not in removed}
        if remaining:
            return _put(
                state,
                TopicState(
                    topic=topic,
                    version=current.version,
                    placement=remaining,
                    perm=current.perm,
                    topic_filter_type=current.topic_filter_type,
                    topic_sys_flag=current.topic_sys_flag,
                    order=current.order,
                    attributes=dict(current.attributes),
                ),
            )
    return _tombstone(state, topic)


def _groups_with_moves(topic: TopicState) -> set[str]:
    """Groups whose logical queues moved, or that hold a moved queue's segment or move."""
    groups: set[str] = set()
    for queue in topic.queues.values():
        groups.add(queue.broker_name)
        groups.update(s.broker_name for s in queue.segments)
        if queue.moving is not None:
            groups.add(queue.moving.broker_name)
    return groups


def _placement_clash(current: TopicState, placement: dict[str, tuple[int, int]]) -> str | None:
    """Why a new placement of a topic with moved queues is refused (rule 8), if it is."""
    queue_map = current.queue_map
    for name in sorted(set(current.placement) | set(placement)):
        old_read = current.placement.get(name, (0, 0))[0]
        new_read = placement.get(name, (0, 0))[0]
        gone = [q for q in range(new_read, old_read) if (name, q) in current.queues]
        if gone:
            return (
                f"queue {gone[0]} of {name} moved: {name}'s queue count cannot go below "
                f"{gone[-1] + 1}"
            )
        taken = queue_map.physical_ids(name, moving_targets=True) - set(range(old_read))
        over = sorted(q for q in taken if q < new_read)
        if over:
            return (
                f"{name} holds moved queues from queue id {over[0]} on: its own queue count "
                f"cannot grow past {over[0]}"
            )
    return None


def _tombstone(state: ControllerState, topic: str) -> TopicOutcome:
    version = state.topic_version + 1
    return TopicOutcome(
        events=(DeleteTopicEvent(topic=topic, expected_version=state.topic_version_of(topic)),),
        topic_version=version,
        body=ControllerTopicsBody(topic_version=version, deleted={topic: version}),
    )


def group_topics(
    state: ControllerState, broker_name: str, held: tuple[str, ...]
) -> GroupTopicsBody:
    """CONTROLLER_GET_GROUP_TOPICS: what `broker_name` should hold, and which held topics go."""
    topics = []
    for _, topic in sorted(state.topics.items()):
        config = placement_body(topic).config_on(broker_name)
        if config is not None:
            topics.append(config)
    placed = {config.topic_name for config in topics}
    drop = sorted(
        name
        for name in set(held)
        if name not in placed
        and (name in state.topics or name in state.deleted_topics)
        and not is_broker_local_topic(name)
    )
    return GroupTopicsBody(topic_version=state.topic_version, topics=topics, drop=drop)


def topics_body(state: ControllerState, topic: str | None) -> ControllerTopicsBody:
    """CONTROLLER_GET_TOPICS: one topic (live or its tombstone), or every live topic."""
    if topic is None:
        return ControllerTopicsBody(
            topic_version=state.topic_version,
            topics=[placement_body(t) for _, t in sorted(state.topics.items())],
        )
    live = state.topics.get(topic)
    deleted = state.deleted_topics.get(topic)
    return ControllerTopicsBody(
        topic_version=state.topic_version,
        topics=[placement_body(live)] if live is not None else [],
        deleted={topic: deleted} if deleted is not None else {},
    )


# ---------------------------------------------------------------------- moving queues (rule 8)


def moving_queues(state: ControllerState) -> list[tuple[str, LogicalQueue]]:
    """Every logical queue being moved, by topic and name (what the leader drives)."""
    return [
        (name, queue)
        for name, topic in sorted(state.topics.items())
        for _, queue in sorted(topic.queues.items())
        if queue.moving is not None
    ]


def _move_body(topic: str, queue: LogicalQueue) -> QueueMoveBody:
    assert queue.moving is not None
    return QueueMoveBody(
        topic=topic,
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
        from_broker_name=queue.current.broker_name,
        from_queue_id=queue.current.queue_id,
        to_broker_name=queue.moving.broker_name,
        to_queue_id=queue.moving.queue_id,
    )


def _unmovable(state: ControllerState, topic: TopicState, target: str | None) -> str | None:
    """Why the topic's queues cannot move (to `target`), if they cannot."""
    if topic.attributes.get(FENCED_ATTRIBUTE) == "true":
        return f"topic {topic.topic} is fenced: its one queue stays on its group for ever"
    uneven = sorted(name for name, (read, write) in topic.placement.items() if read != write)
    if uneven:
        read, write = topic.placement[uneven[0]]
        return (
            f"topic {topic.topic} has {read} read and {write} write queues on {uneven[0]}: "
            "make them equal before moving its queues"
        )
    if target is not None:
        group = state.groups.get(target)
        if group is None:
            return f"broker group {target} is not known to the controller"
        if topic.queue_map.next_physical_id(target) >= MAX_QUEUE_NUMS:
            return f"broker group {target} holds {MAX_QUEUE_NUMS} queues of {topic.topic} already"
    return None


class _Plan:
    """Events decided one after another against an overlay (each at the version before it)."""

    def __init__(self, state: ControllerState) -> None:
        self.work = state.overlay()
        self.events: list[Event] = []
        self.moves: list[QueueMoveBody] = []
        self.touched: set[str] = set()

    def add(self, event: Event, topic: str) -> None:
        applied = self.work.apply_event(event)
        assert applied, event
        self.events.append(event)
        self.touched.add(topic)

    def start(self, topic: TopicState, queue: LogicalQueue, target: str) -> None:
        target_id = topic.queue_map.next_physical_id(target)
        self.add(
            StartQueueMoveEvent(
                topic=topic.topic,
                broker_name=queue.broker_name,
                queue_id=queue.queue_id,
                source_broker_name=queue.current.broker_name,
                source_queue_id=queue.current.queue_id,
                target_broker_name=target,
                target_queue_id=target_id,
                expected_version=topic.version,
            ),
            topic.topic,
        )
        moved = self.work.topics[topic.topic].queue_map.logical(*queue.name)
        assert moved is not None
        self.moves.append(_move_body(topic.topic, moved))

    def outcome(self, extra: Iterable[str] = ()) -> TopicOutcome:
        topics = sorted(self.touched | set(extra))
        body = ReassignBody(
            topic_version=self.work.topic_version,
            moves=self.moves,
            topics=[placement_body(self.work.topics[t]) for t in topics if t in self.work.topics],
        )
        return TopicOutcome(
            events=tuple(self.events), topic_version=self.work.topic_version, body=body
        )


def plan_reassign(state: ControllerState, header: ControllerReassignRequestHeader) -> TopicOutcome:
    """CONTROLLER_REASSIGN_QUEUES: start, give up or clean up moves (rule 8)."""
    try:
        action = ReassignAction(header.action)
    except ValueError:
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"unknown reassign action {header.action!r}: one of "
            f"{', '.join(a.value for a in ReassignAction)}",
        )
    if action in (ReassignAction.MOVE, ReassignAction.CANCEL):
        return _plan_one(state, header, action)
    group = header.broker_name
    if not group:
        return _refuse(ResponseCode.INVALID_PARAMETER, f"{action.value} names a broker group")
    if header.topic is not None and header.topic not in state.topics:
        return _refuse(ResponseCode.TOPIC_NOT_EXIST, f"topic {header.topic} does not exist")
    topics = [header.topic] if header.topic is not None else sorted(state.topics)
    if action is ReassignAction.DRAIN:
        return _plan_drain(state, group, topics, header.to_broker_name)
    return _plan_forget(state, group, topics)


def _plan_one(
    state: ControllerState, header: ControllerReassignRequestHeader, action: ReassignAction
) -> TopicOutcome:
    if header.topic is None or header.broker_name is None or header.queue_id is None:
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"{action.value} names a topic, the queue's broker group and its queue id",
        )
    topic = state.topics.get(header.topic)
    if topic is None:
        return _refuse(ResponseCode.TOPIC_NOT_EXIST, f"topic {header.topic} does not exist")
    queue = topic.queue_map.logical(header.broker_name, header.queue_id)
    if queue is None:
        return _refuse(
            ResponseCode.INVALID_PARAMETER,
            f"topic {topic.topic} has no queue {header.queue_id} of {header.broker_name}",
        )
    plan = _Plan(state)
    if action is ReassignAction.CANCEL:
        if queue.moving is not None:
            plan.add(
                CancelQueueMoveEvent(
                    topic=topic.topic,
                    broker_name=queue.broker_name,
                    queue_id=queue.queue_id,
                    expected_version=topic.version,
                ),
                topic.topic,
            )
        return plan.outcome({topic.topic})
    target = header.to_broker_name
    if not target:
        return _refuse(ResponseCode.INVALID_PARAMETER, "move names the group to move to")
    why = _unmovable(state, topic, target)
    if why is not None:
        return _refuse(ResponseCode.INVALID_PARAMETER, why)
    if queue.moving is not None:
        if queue.moving.broker_name != target:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"queue {queue.queue_id} of {queue.broker_name} is moving to "
                f"{queue.moving.broker_name} already: cancel that move first",
            )
        plan.moves.append(_move_body(topic.topic, queue))
    elif queue.current.broker_name != target:
        plan.start(topic, queue, target)
    return plan.outcome({topic.topic})


def _pick_target(state: ControllerState, topic: TopicState, leaving: str) -> str | None:
    """The group a drained queue goes to: the topic's other group with fewest open segments."""
    cluster = state.groups[leaving].cluster_name if leaving in state.groups else None
    candidates = sorted(
        name
        for name, group in state.groups.items()
        if name != leaving and (cluster is None or group.cluster_name == cluster)
    )
    if not candidates:
        return None
    placed = [name for name in candidates if name in topic.placement]
    pool = placed or candidates
    load = dict.fromkeys(pool, 0)
    for queue in topic.queue_map.logical_queues():
        at = queue.moving.broker_name if queue.moving is not None else queue.current.broker_name
        if at in load:
            load[at] += 1
    return min(pool, key=lambda name: (load[name], name))


def _plan_drain(
    state: ControllerState, group: str, topics: list[str], to: str | None
) -> TopicOutcome:
    if group not in state.groups and not any(
        group in t.placement or group in _groups_with_moves(t) for t in state.topics.values()
    ):
        return _refuse(ResponseCode.INVALID_PARAMETER, f"broker group {group} is not known")
    if to == group:
        return _refuse(ResponseCode.INVALID_PARAMETER, f"cannot drain {group} into itself")
    plan = _Plan(state)
    for name in topics:
        queues = [
            q
            for q in state.topics[name].queue_map.logical_queues()
            if q.current.broker_name == group or (q.moving and q.moving.broker_name == group)
        ]
        if not queues:
            continue
        incoming = [q for q in queues if q.moving is not None and q.moving.broker_name == group]
        if incoming:
            return _refuse(
                ResponseCode.INVALID_PARAMETER,
                f"queue {incoming[0].queue_id} of {incoming[0].broker_name} of topic {name} is "
                f"moving to {group}: wait for it to finish, or cancel it, before draining {group}",
            )
        why = _unmovable(state, state.topics[name], to)
        if why is not None:
            return _refuse(ResponseCode.INVALID_PARAMETER, f"cannot drain {group}: {why}")
        for queue in queues:
            topic = plan.work.topics[name]
            now = topic.queue_map.logical(*queue.name)
            assert now is not None
            if now.moving is not None:
                plan.moves.append(_move_body(name, now))
                continue
            target = to or _pick_target(plan.work, topic, group)
            if target is None:
                return _refuse(
                    ResponseCode.INVALID_PARAMETER,
                    f"cannot drain {group}: no other broker group of its cluster is known",
                )
            plan.start(topic, now, target)
    return plan.outcome()


def _plan_forget(state: ControllerState, group: str, topics: list[str]) -> TopicOutcome:
    plan = _Plan(state)
    for name in topics:
        topic = state.topics[name]
        changed = False
        for queue in topic.queues.values():
            kept = leading_kept(queue, group)
            stuck = [s for s in kept if not s.is_open and s.broker_name == group]
            if stuck:
                return _refuse(
                    ResponseCode.INVALID_PARAMETER,
                    f"topic {name}: queue {queue.queue_id} of {queue.broker_name} has a segment "
                    f"on {group} between segments on other groups; forget those groups first",
                )
            changed |= kept != queue.segments
        if changed:
            plan.add(
                ForgetSegmentsEvent(topic=name, broker_name=group, expected_version=topic.version),
                name,
            )
    return plan.outcome()


def plan_finish(state: ControllerState, request: FinishMove) -> TopicOutcome:
    """The leader's FinishMove: close the move the source sealed, if it is still on (rule 8)."""
    topic = state.topics.get(request.topic)
    queue = topic.queue_map.logical(request.broker_name, request.queue_id) if topic else None
    plan = _Plan(state)
    if (
        topic is not None
        and queue is not None
        and queue.moving is not None
        and queue.moving.since_version == request.since_version
    ):
        if request.end_queue_offset < queue.current.start_offset:
            return _refuse(
                ResponseCode.SYSTEM_ERROR,
                f"topic {topic.topic}: queue {queue.queue_id} of {queue.broker_name} was sealed "
                f"at {request.end_queue_offset}, below its segment's start "
                f"{queue.current.start_offset}",
            )
        plan.add(
            FinishQueueMoveEvent(
                topic=topic.topic,
                broker_name=queue.broker_name,
                queue_id=queue.queue_id,
                end_queue_offset=request.end_queue_offset,
                expected_version=topic.version,
            ),
            topic.topic,
        )
    return plan.outcome()
