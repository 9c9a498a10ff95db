r"""The controller's replicated log entries (event batches) and state snapshots, as bytes.

Spec: reference/rocketmq-controller-spec.md section 1.5 (event types and their fields). RocketMQ
writes `int16 type | FastJSON`; ferrymq chooses its own encoding, as the spec allows:

```
entry    = b"\\x01" + JSON list of events, each {"type": "<EventName>", ...fields}
           b"" (an empty entry) is a barrier that changes nothing
snapshot = b"\\x01" + JSON {"appliedIndex", "groups": [...], "config": {...}, "topics": [...],
                          "deletedTopics": {...}, "topicVersion", "auth": [...], "authVersion"}
```

ferrymq additions to RocketMQ's events, which make `apply` a compare-and-set: AlterSyncStateSet
and ElectMaster carry the epochs their decision was made against, and apply ignores them when the
state has moved on (possible only across a controller leader change). UpdateControllerConfig
replicates `UPDATE_CONTROLLER_CONFIG` so every controller node uses the same election policy.
PutTopicEvent and DeleteTopicEvent keep topics as controller state (issue 20 section 3,
`wire.topics`): each carries the version of the topic (live or deleted) it was decided against,
and applying one bumps the state's topic version, which becomes the topic's version.
StartQueueMoveEvent, FinishQueueMoveEvent, CancelQueueMoveEvent and ForgetSegmentsEvent move
queues between groups (issue 20 section 4, `wire.queuemap`), compare-and-set on the topic's
version too; a PutTopicEvent keeps the topic's logical queues as they are.
AuthChangeEvent keeps ACL 2.0's users and ACLs as controller state (`controller/auth.py`): its
`change` is one `security.acl2` event in that module's JSON form, applied only at the state's
`expected_version` (each applied one bumps the auth version).

Rules: encoding is deterministic (sets are written sorted); decoding is strict (unknown event
types, unknown fields, wrong types and a wrong version byte raise `ProtocolError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.wire.queuemap import LogicalQueue

__all__ = [
    "ENTRY_VERSION",
    "SNAPSHOT_VERSION",
    "AlterSyncStateSetEvent",
    "ApplyBrokerIdEvent",
    "AuthChangeEvent",
    "CancelQueueMoveEvent",
    "CleanBrokerDataEvent",
    "DeleteTopicEvent",
    "ElectMasterEvent",
    "Event",
    "FinishQueueMoveEvent",
    "ForgetSegmentsEvent",
    "GroupRecord",
    "PutTopicEvent",
    "QueueNumsRecord",
    "ReplicaRecord",
    "SnapshotRecord",
    "StartQueueMoveEvent",
    "TopicRecord",
    "UpdateBrokerAddressEvent",
    "UpdateControllerConfigEvent",
    "decode_entry",
    "decode_snapshot",
    "encode_entry",
    "encode_snapshot",
]

ENTRY_VERSION: Final = 1
SNAPSHOT_VERSION: Final = 1


class _Event(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    tag_field="type",
    forbid_unknown_fields=True,
):
    """Base of controller events: immutable, tagged by class name on the wire."""


class ApplyBrokerIdEvent(_Event, tag="ApplyBrokerIdEvent", frozen=True, kw_only=True):
    """Assign `new_broker_id` in a group (creating the group), bound to its check code."""

    cluster_name: str
    broker_name: str
    broker_address: str
    new_broker_id: int
    register_check_code: str


class UpdateBrokerAddressEvent(_Event, tag="UpdateBrokerAddressEvent", frozen=True, kw_only=True):
    """A registered broker now listens on `broker_address`."""

    cluster_name: str
    broker_name: str
    broker_id: int
    broker_address: str


class AlterSyncStateSetEvent(_Event, tag="AlterSyncStateSetEvent", frozen=True, kw_only=True):
    """Replace a group's SyncStateSet (bumps its epoch), if the epochs are still as expected."""

    broker_name: str
    new_sync_state_set: tuple[int, ...]
    expected_master_epoch: int
    expected_sync_state_set_epoch: int


class ElectMasterEvent(_Event, tag="ElectMasterEvent", frozen=True, kw_only=True):
    """An election's outcome: a new master or none; the epoch bumps.

    The new SyncStateSet is `new_sync_state_set` (the master and the live members of the old
    set); empty, as in entries written before it existed, means just the master.
    """

    broker_name: str
    new_master_elected: bool
    new_master_broker_id: int | None = None
    expected_master_epoch: int
    new_sync_state_set: tuple[int, ...] = ()


class CleanBrokerDataEvent(_Event, tag="CleanBrokerDataEvent", frozen=True, kw_only=True):
    """Forget some broker ids of a group, or (`None`) the whole group."""

    broker_name: str
    broker_id_set_to_clean: tuple[int, ...] | None = None


class UpdateControllerConfigEvent(
    _Event, tag="UpdateControllerConfigEvent", frozen=True, kw_only=True
):
    """Set controller config keys (RocketMQ names, string values) on every node."""

    properties: dict[str, str]


class QueueNumsRecord(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """A topic's queue counts on one broker group."""

    read_queue_nums: int
    write_queue_nums: int


class PutTopicEvent(_Event, tag="PutTopicEvent", frozen=True, kw_only=True):
    """Create or replace a topic: its config and placement (broker group -> queue counts).

    Applies only while the topic's version (live or deleted, 0 when never seen) is
    `expected_version`.
    """

    topic: str
    placement: dict[str, QueueNumsRecord]
    perm: int
    topic_filter_type: str
    topic_sys_flag: int
    order: bool
    attributes: dict[str, str]
    expected_version: int


class DeleteTopicEvent(_Event, tag="DeleteTopicEvent", frozen=True, kw_only=True):
    """Delete a topic, leaving a tombstone; applies only at `expected_version` (as above)."""

    topic: str
    expected_version: int


class StartQueueMoveEvent(_Event, tag="StartQueueMoveEvent", frozen=True, kw_only=True):
    """Start moving a topic's logical queue (broker_name, queue_id) to another group.

    The source's master stops writing to it (issue 20 section 4).

    Applies only at the topic's `expected_version`, while the queue is not moving and its open
    segment is still (`source_broker_name`, `source_queue_id`).
    """

    topic: str
    broker_name: str
    queue_id: int
    source_broker_name: str
    source_queue_id: int
    target_broker_name: str
    target_queue_id: int
    expected_version: int


class FinishQueueMoveEvent(_Event, tag="FinishQueueMoveEvent", frozen=True, kw_only=True):
    """The source sealed the queue at `end_queue_offset`: its open segment closes there.

    The move's target opens from it (compare-and-set on `expected_version`, the move still on).
    """

    topic: str
    broker_name: str
    queue_id: int
    end_queue_offset: int
    expected_version: int


class CancelQueueMoveEvent(_Event, tag="CancelQueueMoveEvent", frozen=True, kw_only=True):
    """Give a move in progress up: the queue's open segment takes writes again."""

    topic: str
    broker_name: str
    queue_id: int
    expected_version: int


class ForgetSegmentsEvent(_Event, tag="ForgetSegmentsEvent", frozen=True, kw_only=True):
    """Drop a topic's closed segments on one group (read to their end, the group leaving)."""

    topic: str
    broker_name: str
    expected_version: int


class AuthChangeEvent(_Event, tag="AuthChangeEvent", frozen=True, kw_only=True):
    """An ACL 2.0 user or ACL put or deleted (`security.acl2.event_to_json`'s form).

    Applies only while the state's auth version is `expected_version`.
    """

    change: dict[str, Any]
    expected_version: int


Event = (
    ApplyBrokerIdEvent
    | UpdateBrokerAddressEvent
    | AlterSyncStateSetEvent
    | ElectMasterEvent
    | CleanBrokerDataEvent
    | UpdateControllerConfigEvent
    | PutTopicEvent
    | DeleteTopicEvent
    | StartQueueMoveEvent
    | FinishQueueMoveEvent
    | CancelQueueMoveEvent
    | ForgetSegmentsEvent
    | AuthChangeEvent
)
"""Every replicated controller event."""


class ReplicaRecord(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """One assigned broker id in a snapshot."""

    broker_id: int
    broker_address: str
    register_check_code: str


class GroupRecord(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """One broker group in a snapshot."""

    cluster_name: str
    broker_name: str
    next_broker_id: int
    replicas: list[ReplicaRecord]
    master_broker_id: int | None
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int


class TopicRecord(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, omit_defaults=True
):
    """One live topic in a snapshot (`queues`: its moved queues, written only when there are)."""

    topic: str
    version: int
    placement: dict[str, QueueNumsRecord]
    perm: int
    topic_filter_type: str
    topic_sys_flag: int
    order: bool
    attributes: dict[str, str]
    queues: list[LogicalQueue] = msgspec.field(default_factory=list)


class SnapshotRecord(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The whole controller state machine."""

    applied_index: int
    groups: list[GroupRecord]
    config: dict[str, str]
    retired_epochs: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Broker name -> [master epoch, SyncStateSet epoch] of groups whose last replica was
    cleaned (absent from older snapshots: none)."""
    topics: list[TopicRecord] = msgspec.field(default_factory=list)
    deleted_topics: dict[str, int] = msgspec.field(default_factory=dict)
    """Tombstones: topic -> the version that deleted it."""
    topic_version: int = 0
    """The last topic version applied (absent from older snapshots: 0, no topics)."""
    auth: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """ACL 2.0 users, then ACLs, as put events (`security.acl2.event_to_json`)."""
    auth_version: int = 0
    """The last auth version applied (absent from older snapshots: 0, no users)."""


_encoder: Final = msgspec.json.Encoder(order="deterministic")
_entry_decoder: Final = msgspec.json.Decoder(list[Event])
_snapshot_decoder: Final = msgspec.json.Decoder(SnapshotRecord)


def encode_entry(events: Sequence[Event]) -> bytes:
    """The log entry for one request's events (an empty sequence gives the barrier entry)."""
    if not events:
        return b""
    return bytes([ENTRY_VERSION]) + _encoder.encode(list(events))


def decode_entry(data: bytes) -> list[Event]:
    """The events of a log entry.

    Raises:
        ProtocolError: the entry is not one ferrymq wrote.
    """
    if not data:
        return []
    if data[0] != ENTRY_VERSION:
        raise ProtocolError(f"controller log entry: unknown version {data[0]}")
    try:
        return _entry_decoder.decode(data[1:])
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"controller log entry: {exc}") from None


def encode_snapshot(record: SnapshotRecord) -> bytes:
    """Snapshot bytes of the whole state."""
    return bytes([SNAPSHOT_VERSION]) + _encoder.encode(record)


def decode_snapshot(data: bytes) -> SnapshotRecord:
    """Parse snapshot bytes.

    Raises:
        ProtocolError: the snapshot is not one ferrymq wrote.
    """
    if not data or data[0] != SNAPSHOT_VERSION:
        raise ProtocolError(f"controller snapshot: unknown version {data[:1]!r}")
    try:
        return _snapshot_decoder.decode(data[1:])
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"controller snapshot: {exc}") from None
