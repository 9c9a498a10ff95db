"""Topics kept by the controller: request headers, bodies and the rules both sides share.

Issue 20 section 3 (seed 003 section 2: topic create/delete is the controller's decision). In
controller mode a topic's desired shape (its config and its placement: which broker groups hold
how many queues) is controller state, replicated by Raft; brokers reconcile their topic tables
toward it. These are ferrymq's own requests (RocketMQ has no controller-kept topics):

| code | name | from -> to (ctrl: controller) |
|---|---|---|
| 9240 | CONTROLLER_UPDATE_TOPIC (`ControllerUpdateTopicRequestHeader`) | admin, broker -> ctrl |
| 9241 | CONTROLLER_DELETE_TOPIC (`ControllerDeleteTopicRequestHeader`) | admin, broker -> ctrl |
| 9242 | CONTROLLER_GET_GROUP_TOPICS (header + `GroupTopicsRequestBody`) | broker -> ctrl |
| 9243 | CONTROLLER_GET_TOPICS (`GetControllerTopicsRequestHeader`) | admin -> ctrl |
| 9244 | NOTIFY_TOPICS_CHANGED (`NotifyTopicsChangedRequestHeader`, oneway) | ctrl -> broker |
| 9245 | CONTROLLER_REASSIGN_QUEUES (`ControllerReassignRequestHeader` -> `ReassignBody`) | admin |
| 9246 | SEAL_QUEUE (`SealQueueRequestHeader` -> `SealQueueResponseHeader`) | ctrl -> broker |

Moving queues between groups (issue 20 section 4, `wire.queuemap`): CONTROLLER_REASSIGN_QUEUES
starts moves (one queue, or every queue of a group being drained), gives one up, or forgets a
leaving group's read-only segments; the controller's leader then asks the source group's master
to seal each moving queue (SEAL_QUEUE: the end offset, once every message below it is
committed) and finishes the move with it.

Every answer carries `topicVersion`: the controller's topic version, bumped by every applied
topic change. A broker acts on an answer only if its version is not older than what its topic
table was last reconciled to, so changes apply in order and stale answers are ignored.

Rules kept here because the controller and the broker both apply them:
- broker-local topics (`is_broker_local_topic`): system topics, the auto-create template,
  retry and dead-letter topics. Each broker creates them for itself, as RocketMQ does; the
  controller refuses to keep them.
- topic attributes in RocketMQ 5's syntax (`alter_attributes`) and the fenced-topic rules
  (`check_fenced`: one queue on one group, never unfenced, an existing topic never fenced).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

from ferrymq.wire.bodies import Perm, TopicConfig
from ferrymq.wire.headers import I32, I64, CommandHeader
from ferrymq.wire.queuemap import QUEUE_MAP_ATTRIBUTE, LogicalQueue, QueueMap, encode_queue_map

__all__ = [
    "BROKER_LOCAL_TOPICS",
    "FENCED_ATTRIBUTE",
    "ControllerDeleteTopicRequestHeader",
    "ControllerReassignRequestHeader",
    "ControllerTopicsBody",
    "ControllerUpdateTopicRequestHeader",
    "GetControllerTopicsRequestHeader",
    "GetGroupTopicsRequestHeader",
    "GroupTopicsBody",
    "GroupTopicsRequestBody",
    "NotifyTopicsChangedRequestHeader",
    "QueueMoveBody",
    "QueueNums",
    "ReassignAction",
    "ReassignBody",
    "SealQueueRequestHeader",
    "SealQueueResponseHeader",
    "TopicPlacement",
    "TopicVersionResponseHeader",
    "alter_attributes",
    "check_fenced",
    "is_broker_local_topic",
]

FENCED_ATTRIBUTE: Final = "ferry.fenced"
"""The attribute of a fenced topic (`broker.fence.FENCED_ATTRIBUTE`; a test keeps them equal)."""

BROKER_LOCAL_TOPICS: Final = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    }
)
"""System topics every broker makes for itself (besides the prefixes below)."""

_BROKER_LOCAL_PREFIXES: Final = ("rmq_sys_", "RMQ_SYS_", "%RETRY%", "%DLQ%")
"""RocketMQ's system-topic prefixes, and the retry and dead-letter topics of consumer groups."""


def is_broker_local_topic(topic: str) -> bool:
    """Whether each broker keeps `topic` for itself (never controller state).

    >>> is_broker_local_topic("%RETRY%orders"), is_broker_local_topic("orders")
    (True, False)
    """
    return topic in BROKER_LOCAL_TOPICS or topic.startswith(_BROKER_LOCAL_PREFIXES)


# ---------------------------------------------------------------------- attributes


def alter_attributes(current: dict[str, str] | None, changes: dict[str, str]) -> dict[str, str]:
    """The attributes after RocketMQ 5's changes (`+key` sets, `-key` deletes).

    `current` is None for a topic being created: only additions are allowed then.

    Raises:
        ValueError: a deletion on create, or of an attribute the topic does not have.
    """
    attributes = dict(current) if current is not None else {}
    for key, value in changes.items():
        name = key[1:]
        if name == QUEUE_MAP_ATTRIBUTE:
            raise ValueError(
                f"{QUEUE_MAP_ATTRIBUTE} is the controller's (moved queues): it cannot be set"
            )
        if key.startswith("+"):
            attributes[name] = value
        elif current is None:
            raise ValueError(f"only additions are allowed when creating a topic, not {key!r}")
        elif attributes.pop(name, None) is None:
            raise ValueError(f"cannot delete attribute {name!r}: the topic does not have it")
    return attributes


def check_fenced(
    current: dict[str, str] | None, attributes: dict[str, str], read_queues: int, write_queues: int
) -> bool:
    """Refuse what would make a fenced topic unsafe; returns whether the topic is fenced.

    `current` is the topic's attributes before the change (None: a new topic).

    Raises:
        ValueError: naming what is refused.
    """
    was_fenced = current is not None and current.get(FENCED_ATTRIBUTE) == "true"
    value = attributes.get(FENCED_ATTRIBUTE)
    if value is not None and value != "true":
        raise ValueError(f"{FENCED_ATTRIBUTE} takes only the value true, not {value!r}")
    if was_fenced and value is None:
        raise ValueError(f"a fenced topic stays fenced: {FENCED_ATTRIBUTE} cannot be removed")
    if value is None:
        return False
    if current is not None and not was_fenced:
        raise ValueError(
            "an existing topic cannot become fenced (its records carry no fence): delete it "
            "first, or create another"
        )
    if read_queues != 1 or write_queues != 1:
        raise ValueError(
            f"a fenced topic has exactly one read and one write queue, not {read_queues} read "
            f"and {write_queues} write queues"
        )
    return True


# ---------------------------------------------------------------------- headers


class ControllerUpdateTopicRequestHeader(CommandHeader):
    """CONTROLLER_UPDATE_TOPIC (9240): create a topic or change it, on some broker groups.

    The groups: `broker_name` (one), else every group of `cluster_name`, else every group the
    controller knows. They get the queue counts given; the topic's other groups keep theirs
    (RocketMQ's `updateTopic -b/-c` on each master). Config fields apply to the whole topic.
    `auto_create`: a broker asks for a topic a producer sends to (autoCreateTopicEnable); it
    changes nothing when the group already holds the topic.
    """

    topic: str
    read_queue_nums: I32 = 8
    write_queue_nums: I32 = 8
    perm: I32 = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: I32 | None = None
    order: bool = False
    attributes: str | None = None
    """RocketMQ 5 attribute changes (`+key=value,-key`)."""
    cluster_name: str | None = None
    broker_name: str | None = None
    auto_create: bool = False


class ControllerDeleteTopicRequestHeader(CommandHeader):
    """CONTROLLER_DELETE_TOPIC (9241): delete a topic, or take it off some groups.

    Neither field: the whole topic (a tombstone stays, so no broker brings it back). With
    `broker_name` or `cluster_name`: only those groups lose it; the last group's removal deletes
    it. Refused with NO_PERMISSION while the controller runs with `deleteTopicEnable=false`.
    """

    topic: str
    cluster_name: str | None = None
    broker_name: str | None = None


class ReassignAction(StrEnum):
    """What CONTROLLER_REASSIGN_QUEUES does (`ControllerReassignRequestHeader.action`)."""

    MOVE = "move"
    """Move logical queue (broker_name, queue_id) of `topic` to group `to_broker_name`."""
    DRAIN = "drain"
    """Move every queue whose open segment is on group `broker_name` (of every topic, or of
    `topic`) to other groups (`to_broker_name`, or the topic's other groups in turn)."""
    CANCEL = "cancel"
    """Give up the move of (broker_name, queue_id) of `topic` (before it finished)."""
    FORGET = "forget"
    """Drop the read-only segments on group `broker_name` (of every topic, or of `topic`)."""


class ControllerReassignRequestHeader(CommandHeader):
    """CONTROLLER_REASSIGN_QUEUES (9245): move queues between broker groups (`ReassignAction`)."""

    action: str
    topic: str | None = None
    broker_name: str | None = None
    queue_id: I32 | None = None
    to_broker_name: str | None = None


class SealQueueRequestHeader(CommandHeader):
    """SEAL_QUEUE (9246): the controller asks a source master where a moving queue ends.

    The master answers once its topic table reflects `topic_version` (the move's start: it
    takes no more messages for the queue) and every message below the end is committed.
    """

    topic: str
    queue_id: I32
    topic_version: I64


class SealQueueResponseHeader(CommandHeader):
    """The queue offset the sealed queue ends at (the next segment's start)."""

    end_queue_offset: I64


class GetGroupTopicsRequestHeader(CommandHeader):
    """CONTROLLER_GET_GROUP_TOPICS (9242): what one broker group should hold."""

    broker_name: str


class GetControllerTopicsRequestHeader(CommandHeader):
    """CONTROLLER_GET_TOPICS (9243): one topic's record (or tombstone), or every live topic."""

    topic: str | None = None


class TopicVersionResponseHeader(CommandHeader):
    """The controller's topic version after the request (every topic answer carries it)."""

    topic_version: I64 | None = None


class NotifyTopicsChangedRequestHeader(CommandHeader):
    """NOTIFY_TOPICS_CHANGED (9244, oneway): the controller's topics moved to `topic_version`."""

    topic_version: I64


# ---------------------------------------------------------------------- bodies


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=False, kw_only=True):
    """Base of the JSON bodies: snake_case fields, camelCase on the wire, unknown keys ignored."""


class QueueNums(_Body):
    """A topic's queue counts on one broker group."""

    read_queue_nums: int
    write_queue_nums: int


class TopicPlacement(_Body):
    """A topic as the controller keeps it: config, placement and the version that set them.

    `queues`: its moved or moving logical queues (issue 20 section 4, `wire.queuemap`); older
    readers ignore the key.
    """

    topic: str
    version: int
    placement: dict[str, QueueNums]
    """Broker group -> queue counts."""
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    queues: list[LogicalQueue] = msgspec.field(default_factory=list)

    @property
    def queue_map(self) -> QueueMap:
        """The topic's logical queues."""
        return QueueMap(
            version=self.version,
            placement={
                name: (q.read_queue_nums, q.write_queue_nums)
                for name, q in sorted(self.placement.items())
            },
            queues=tuple(self.queues),
        )

    def config_on(self, broker_name: str) -> TopicConfig | None:
        """The TopicConfig the group's brokers hold (None when the topic is not placed there).

        A topic with moved queues: the group's physical queues (`QueueMap.physical_count`),
        read-only when every one of them is sealed, and the map in `ferry.queueMap`.
        """
        if self.queues:
            return self._mapped_config_on(broker_name)
        queues = self.placement.get(broker_name)
        if queues is None:
            return None
        return TopicConfig(
            topic_name=self.topic,
            read_queue_nums=queues.read_queue_nums,
            write_queue_nums=queues.write_queue_nums,
            perm=self.perm,
            topic_filter_type=self.topic_filter_type,
            topic_sys_flag=self.topic_sys_flag,
            order=self.order,
            attributes=dict(self.attributes),
        )

    def _mapped_config_on(self, broker_name: str) -> TopicConfig | None:
        queue_map = self.queue_map
        count = queue_map.physical_count(broker_name)
        if count == 0:
            return None
        perm = self.perm
        if all(queue_map.is_sealed(broker_name, q) for q in queue_map.physical_ids(broker_name)):
            perm &= ~Perm.WRITE
        return TopicConfig(
            topic_name=self.topic,
            read_queue_nums=count,
            write_queue_nums=count,
            perm=perm,
            topic_filter_type=self.topic_filter_type,
            topic_sys_flag=self.topic_sys_flag,
            order=self.order,
            attributes={**self.attributes, QUEUE_MAP_ATTRIBUTE: encode_queue_map(queue_map)},
        )


class ControllerTopicsBody(_Body):
    """Answer of CONTROLLER_GET_TOPICS and of the update and delete requests."""

    topic_version: int
    topics: list[TopicPlacement] = msgspec.field(default_factory=list)
    deleted: dict[str, int] = msgspec.field(default_factory=dict)
    """Tombstones asked for: topic -> the version that deleted it."""


class QueueMoveBody(_Body):
    """One move a CONTROLLER_REASSIGN_QUEUES started (or found already under way)."""

    topic: str
    broker_name: str
    queue_id: int
    from_broker_name: str
    from_queue_id: int
    to_broker_name: str
    to_queue_id: int


class ReassignBody(_Body):
    """Answer of CONTROLLER_REASSIGN_QUEUES: the moves, and the topics as they are now."""

    topic_version: int
    moves: list[QueueMoveBody] = msgspec.field(default_factory=list)
    topics: list[TopicPlacement] = msgspec.field(default_factory=list)


class GroupTopicsRequestBody(_Body):
    """Body of CONTROLLER_GET_GROUP_TOPICS: the topics the broker holds (not broker-local ones)."""

    held: list[str] = msgspec.field(default_factory=list)


class GroupTopicsBody(_Body):
    """What a group should hold at `topic_version`: its topics, and held ones it must drop.

    `drop` names topics of the request's `held` that the controller knows and has not placed on
    the group (deleted, or on other groups only). Held topics it never heard of are in neither
    list: the broker keeps them (made before controller mode; docs/operations.md).
    """

    topic_version: int
    topics: list[TopicConfig] = msgspec.field(default_factory=list)
    drop: list[str] = msgspec.field(default_factory=list)
