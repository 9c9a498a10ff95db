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
"""

from __future__ import annotations

from dataclasses import dataclass

from ferrymq.controller.state import ControllerState, TopicState
from ferrymq.errors import InvalidNameError
from ferrymq.model import validate_topic
from ferrymq.wire.broker import parse_attribute_changes
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller_log import DeleteTopicEvent, Event, PutTopicEvent, QueueNumsRecord
from ferrymq.wire.topics import (
    FENCED_ATTRIBUTE,
    ControllerDeleteTopicRequestHeader,
    ControllerTopicsBody,
    ControllerUpdateTopicRequestHeader,
    GroupTopicsBody,
    QueueNums,
    TopicPlacement,
    alter_attributes,
    check_fenced,
    is_broker_local_topic,
)

__all__ = [
    "MAX_QUEUE_NUMS",
    "DeleteTopic",
    "GetGroupTopics",
    "GetTopics",
    "TopicOutcome",
    "UpdateTopic",
    "group_topics",
    "placement_body",
    "plan_delete",
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
class TopicOutcome:
    """A topic decision: a refusal (`code`, `remark`), or events and the answer's body."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    events: tuple[Event, ...] = ()
    topic_version: int = 0
    """The controller's topic version once the events are applied."""
    body: ControllerTopicsBody | None = None


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
