"""The controller's replicated state machine: broker groups, their ids, masters and SyncStateSets.

Spec: reference/rocketmq-controller-spec.md sections 1.2 (data model) and 1.5 (apply semantics);
ARCHITECTURE.md section 6 item 6 (snapshots); issue 20 section 3 (topics as controller state).

Rules:
1. `apply` and `apply_event` are the only mutators, and they are deterministic: no clock, no
   randomness, no I/O. Every controller node applies the same committed entries in the same order
   and so holds the same state.
2. Events are compare-and-set (`wire.controller_log`): an event whose expected epochs no longer
   match, or that would assign a taken broker id, changes nothing and reports False.
3. Invariants after every event: a group's master, when it has one, is a registered replica and a
   member of its SyncStateSet; the SyncStateSet holds registered replicas only; `next_broker_id`
   is above every assigned id; a group's epochs never decrease, even across its removal: a
   group whose last replica is cleaned leaves its epochs behind (`retired_epochs`), and one
   registered again under that name continues from them (its brokers' epoch files still hold
   the old epochs, and a broker follows only a higher master epoch).
4. Topics: `topic_version` bumps on every applied topic event and becomes that topic's version,
   so versions only grow and every live topic's and tombstone's version is at most
   `topic_version`. A name is live or deleted, never both. A live topic is placed on at least
   one group. Tombstones (`deleted_topics`, name -> version) are kept for ever: a name and an
   int each, and what tells a broker back from any downtime that its copy was deleted.
5. Moved queues (issue 20 section 4, `wire.queuemap`): a topic's `queues` lists its logical
   queues that moved or are moving, their segments contiguous, the last one open. A move starts
   (`StartQueueMoveEvent`), finishes with the offset the source sealed the queue at
   (`FinishQueueMoveEvent`: the open segment closes there, the target opens from it) or is given
   up (`CancelQueueMoveEvent`); closed segments of a leaving group can be forgotten
   (`ForgetSegmentsEvent`). Each bumps the topic version; a PutTopicEvent keeps `queues`.
6. ACL 2.0 users and ACLs (`auth`, an immutable `security.acl2.AuthState`): an
   `AuthChangeEvent` applies one acl2 event at the expected `auth_version` and bumps it; one
   that does not decode changes nothing (`controller/auth.py` decides them).

Where ferrymq differs from RocketMQ (each keeps an invariant above):
- `next_broker_id` becomes `max(next, id + 1)`, not `next + 1`, so an id applied out of order is
  never handed out again.
- CleanBrokerData that removes the master also clears it and bumps the master epoch.
- A group is dropped when its last replica is cleaned (RocketMQ keeps two tables that can disagree).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ferrymq.errors import ProtocolError
from ferrymq.security.acl2 import (
    Acl2Error,
    AuthState,
    auth_events,
    event_from_json,
    event_to_json,
    replay,
)
from ferrymq.security.acl2 import apply as apply_auth
from ferrymq.wire.controller_log import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    AuthChangeEvent,
    CancelQueueMoveEvent,
    CleanBrokerDataEvent,
    DeleteTopicEvent,
    ElectMasterEvent,
    Event,
    FinishQueueMoveEvent,
    ForgetSegmentsEvent,
    GroupRecord,
    PutTopicEvent,
    QueueNumsRecord,
    ReplicaRecord,
    SnapshotRecord,
    StartQueueMoveEvent,
    TopicRecord,
    UpdateBrokerAddressEvent,
    UpdateControllerConfigEvent,
    decode_entry,
    decode_snapshot,
    encode_snapshot,
)
from ferrymq.wire.queuemap import LogicalQueue, QueueMap, QueueMove, QueueSegment

__all__ = ["BrokerGroup", "ControllerState", "Replica", "TopicState", "leading_kept"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Replica:
    """One assigned broker id: where the broker listens and the code that proves its identity."""

    broker_address: str
    register_check_code: str


@dataclass(slots=True)
class BrokerGroup:
    """One broker group (RocketMQ `BrokerReplicaInfo` and `SyncStateInfo` together)."""

    cluster_name: str
    broker_name: str
    next_broker_id: int = 1
    replicas: dict[int, Replica] = field(default_factory=dict)
    master_broker_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0

    @property
    def master_address(self) -> str | None:
        """The master's address, when there is a master."""
        if self.master_broker_id is None:
            return None
        replica = self.replicas.get(self.master_broker_id)
        return replica.broker_address if replica else None

    def copy(self) -> BrokerGroup:
        """An independent copy (for deciding against events not yet applied)."""
        return BrokerGroup(
            cluster_name=self.cluster_name,
            broker_name=self.broker_name,
            next_broker_id=self.next_broker_id,
            replicas={
                i: Replica(r.broker_address, r.register_check_code)
                for i, r in self.replicas.items()
            },
            master_broker_id=self.master_broker_id,
            master_epoch=self.master_epoch,
            sync_state_set=set(self.sync_state_set),
            sync_state_set_epoch=self.sync_state_set_epoch,
        )

    def address_of(self, broker_id: int) -> str | None:
        """A replica's address, if the id is assigned."""
        replica = self.replicas.get(broker_id)
        return replica.broker_address if replica else None


@dataclass(frozen=True, slots=True)
class TopicState:
    """A live topic: config, placement (broker group -> (read, write) queue counts), version."""

    topic: str
    version: int
    placement: dict[str, tuple[int, int]]
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)
    queues: dict[tuple[str, int], LogicalQueue] = field(default_factory=dict)
    """Logical queues that moved or are moving, by name (rule 5); the others never moved."""

    @property
    def queue_map(self) -> QueueMap:
        """The topic's logical queues as brokers and clients get them (`wire.queuemap`)."""
        return QueueMap(
            version=self.version,
            placement=dict(sorted(self.placement.items())),
            queues=tuple(queue for _, queue in sorted(self.queues.items())),
        )

    def with_queue(self, queue: LogicalQueue, version: int) -> TopicState:
        """This topic at `version` with one logical queue replaced."""
        queues = dict(self.queues)
        queues[queue.name] = queue
        return dataclasses.replace(self, version=version, queues=queues)

    def record(self) -> TopicRecord:
        """This topic as a snapshot holds it."""
        return TopicRecord(
            topic=self.topic,
            version=self.version,
            placement={
                name: QueueNumsRecord(read_queue_nums=read, write_queue_nums=write)
                for name, (read, write) in sorted(self.placement.items())
            },
            perm=self.perm,
            topic_filter_type=self.topic_filter_type,
            topic_sys_flag=self.topic_sys_flag,
            order=self.order,
            attributes=dict(sorted(self.attributes.items())),
            queues=[queue for _, queue in sorted(self.queues.items())],
        )

    @classmethod
    def of(cls, record: TopicRecord | PutTopicEvent, version: int) -> TopicState:
        """The topic a snapshot record or an event describes, at `version`."""
        return cls(
            topic=record.topic,
            version=version,
            placement={
                name: (queues.read_queue_nums, queues.write_queue_nums)
                for name, queues in record.placement.items()
            },
            perm=record.perm,
            topic_filter_type=record.topic_filter_type,
            topic_sys_flag=record.topic_sys_flag,
            order=record.order,
            attributes=dict(record.attributes),
            queues={q.name: q for q in record.queues} if isinstance(record, TopicRecord) else {},
        )


@dataclass(slots=True)
class ControllerState:
    """Every broker group the controller knows, plus replicated config changes."""

    groups: dict[str, BrokerGroup] = field(default_factory=dict)
    config_overrides: dict[str, str] = field(default_factory=dict)
    applied_index: int = 0
    retired_epochs: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Broker name -> (master epoch, SyncStateSet epoch) of a removed group (rule 3)."""
    topics: dict[str, TopicState] = field(default_factory=dict)
    """Live topics (rule 4); `TopicState` is immutable, so a shallow copy is a copy."""
    deleted_topics: dict[str, int] = field(default_factory=dict)
    """Tombstones: topic -> the version that deleted it (rule 4)."""
    topic_version: int = 0
    """The version of the last applied topic event (0: none yet)."""
    auth: AuthState = field(default_factory=AuthState)
    """ACL 2.0 users and ACLs (rule 6)."""
    auth_version: int = 0
    """The number of auth events applied (0: none yet)."""
    _copied: set[str] | None = field(default=None, repr=False, compare=False)
    """Names of groups an overlay has copied (None: this is not an overlay)."""

    def overlay(self) -> ControllerState:
        """A copy to apply events to speculatively; groups are copied on first write.

        The group table and config are copied now (a table of references); `apply_event` on
        the overlay copies a group before changing it, so this state never changes.
        """
        overlay = ControllerState(
            groups=dict(self.groups),
            config_overrides=dict(self.config_overrides),
            applied_index=self.applied_index,
            retired_epochs=dict(self.retired_epochs),
            topics=dict(self.topics),
            deleted_topics=dict(self.deleted_topics),
            topic_version=self.topic_version,
            auth=self.auth,
            auth_version=self.auth_version,
        )
        overlay._copied = set()
        return overlay

    # ------------------------------------------------------------------ the Raft state machine

    def apply(self, index: int, command: bytes) -> tuple[bool, ...]:
        """Apply one committed log entry; returns, per event, whether it changed the state.

        An empty command is a barrier (a new leader's first entry) and changes nothing.

        Raises:
            ProtocolError: the entry does not decode (a corrupt log; nothing is applied).
        """
        return self.apply_events(index, decode_entry(command))

    def apply_events(self, index: int, events: Sequence[Event]) -> tuple[bool, ...]:
        """Apply the decoded events of log entry `index`, in order."""
        outcomes = tuple(self.apply_event(event) for event in events)
        self.applied_index = index
        return outcomes

    def snapshot(self) -> bytes:
        """The whole state as bytes (deterministic: equal states give equal bytes)."""
        groups = [
            GroupRecord(
                cluster_name=group.cluster_name,
                broker_name=group.broker_name,
                next_broker_id=group.next_broker_id,
                replicas=[
                    ReplicaRecord(
                        broker_id=broker_id,
                        broker_address=replica.broker_address,
                        register_check_code=replica.register_check_code,
                    )
                    for broker_id, replica in sorted(group.replicas.items())
                ],
                master_broker_id=group.master_broker_id,
                master_epoch=group.master_epoch,
                sync_state_set=sorted(group.sync_state_set),
                sync_state_set_epoch=group.sync_state_set_epoch,
            )
            for _, group in sorted(self.groups.items())
        ]
        return encode_snapshot(
            SnapshotRecord(
                applied_index=self.applied_index,
                groups=groups,
                config=dict(sorted(self.config_overrides.items())),
                retired_epochs={
                    name: [master_epoch, set_epoch]
                    for name, (master_epoch, set_epoch) in sorted(self.retired_epochs.items())
                },
                topics=[topic.record() for _, topic in sorted(self.topics.items())],
                deleted_topics=dict(sorted(self.deleted_topics.items())),
                topic_version=self.topic_version,
                auth=[event_to_json(e) for e in auth_events(_sorted(self.auth))],
                auth_version=self.auth_version,
            )
        )

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's.

        Raises:
            ProtocolError: the bytes are not a snapshot.
        """
        record = decode_snapshot(data)
        self.groups = {
            group.broker_name: BrokerGroup(
                cluster_name=group.cluster_name,
                broker_name=group.broker_name,
                next_broker_id=group.next_broker_id,
                replicas={
                    r.broker_id: Replica(r.broker_address, r.register_check_code)
                    for r in group.replicas
                },
                master_broker_id=group.master_broker_id,
                master_epoch=group.master_epoch,
                sync_state_set=set(group.sync_state_set),
                sync_state_set_epoch=group.sync_state_set_epoch,
            )
            for group in record.groups
        }
        self.config_overrides = dict(record.config)
        self.applied_index = record.applied_index
        self.retired_epochs = {}
        for name, epochs in record.retired_epochs.items():
            if len(epochs) != 2:
                raise ProtocolError(f"controller snapshot: retired epochs of {name}: {epochs}")
            self.retired_epochs[name] = (epochs[0], epochs[1])
        self.topics = {t.topic: TopicState.of(t, t.version) for t in record.topics}
        self.deleted_topics = dict(record.deleted_topics)
        self.topic_version = record.topic_version
        try:
            self.auth = replay(event_from_json(e) for e in record.auth)
        except Acl2Error as exc:
            raise ProtocolError(f"controller snapshot: users and ACLs: {exc}") from None
        self.auth_version = record.auth_version

    def topic_version_of(self, topic: str) -> int:
        """The version of a topic, live or deleted; 0 when it was never created nor deleted."""
        live = self.topics.get(topic)
        if live is not None:
            return live.version
        return self.deleted_topics.get(topic, 0)

    # ------------------------------------------------------------------ events

    def apply_event(self, event: Event) -> bool:
        """Apply one event; False when it changed nothing (rule 2)."""
        if self._copied is not None and not isinstance(
            event,
            UpdateControllerConfigEvent
            | PutTopicEvent
            | DeleteTopicEvent
            | StartQueueMoveEvent
            | FinishQueueMoveEvent
            | CancelQueueMoveEvent
            | ForgetSegmentsEvent
            | AuthChangeEvent,
        ):
            name = event.broker_name
            group = self.groups.get(name)
            if group is not None and name not in self._copied:
                self.groups[name] = group.copy()
            self._copied.add(name)
        match event:
            case ApplyBrokerIdEvent():
                return self._apply_broker_id(event)
            case UpdateBrokerAddressEvent():
                return self._update_broker_address(event)
            case AlterSyncStateSetEvent():
                return self._alter_sync_state_set(event)
            case ElectMasterEvent():
                return self._elect_master(event)
            case CleanBrokerDataEvent():
                return self._clean_broker_data(event)
            case UpdateControllerConfigEvent():
                self.config_overrides.update(event.properties)
                return True
            case PutTopicEvent():
                return self._put_topic(event)
            case DeleteTopicEvent():
                return self._delete_topic(event)
            case StartQueueMoveEvent():
                return self._start_queue_move(event)
            case FinishQueueMoveEvent():
                return self._finish_queue_move(event)
            case CancelQueueMoveEvent():
                return self._cancel_queue_move(event)
            case ForgetSegmentsEvent():
                return self._forget_segments(event)
            case AuthChangeEvent():
                return self._change_auth(event)

    def _change_auth(self, event: AuthChangeEvent) -> bool:
        if event.expected_version != self.auth_version:
            return False
        try:
            change = event_from_json(event.change)
        except Acl2Error as exc:
            log.error("auth change skipped: %s", exc)
            return False
        self.auth = apply_auth(self.auth, change)
        self.auth_version += 1
        return True

    def _put_topic(self, event: PutTopicEvent) -> bool:
        if self.topic_version_of(event.topic) != event.expected_version or not event.placement:
            return False
        self.topic_version += 1
        current = self.topics.get(event.topic)
        self.deleted_topics.pop(event.topic, None)
        topic = TopicState.of(event, self.topic_version)
        if current is not None and current.queues:
            topic = dataclasses.replace(topic, queues=current.queues)
        self.topics[event.topic] = topic
        return True

    def _moving_topic(
        self, topic_name: str, expected_version: int, broker_name: str, queue_id: int
    ) -> tuple[TopicState, LogicalQueue] | None:
        topic = self.topics.get(topic_name)
        if topic is None or topic.version != expected_version:
            return None
        queue = topic.queue_map.logical(broker_name, queue_id)
        return None if queue is None else (topic, queue)

    def _start_queue_move(self, event: StartQueueMoveEvent) -> bool:
        found = self._moving_topic(
            event.topic, event.expected_version, event.broker_name, event.queue_id
        )
        if found is None:
            return False
        topic, queue = found
        source = (event.source_broker_name, event.source_queue_id)
        target = (event.target_broker_name, event.target_queue_id)
        if queue.moving is not None or queue.current.physical != source or source == target:
            return False
        self.topic_version += 1
        move = QueueMove(
            broker_name=event.target_broker_name,
            queue_id=event.target_queue_id,
            since_version=self.topic_version,
        )
        moving = LogicalQueue(
            broker_name=queue.broker_name,
            queue_id=queue.queue_id,
            segments=queue.segments,
            moving=move,
        )
        self.topics[event.topic] = topic.with_queue(moving, self.topic_version)
        return True

    def _finish_queue_move(self, event: FinishQueueMoveEvent) -> bool:
        found = self._moving_topic(
            event.topic, event.expected_version, event.broker_name, event.queue_id
        )
        if found is None:
            return False
        topic, queue = found
        move = queue.moving
        end = event.end_queue_offset
        if move is None or end < queue.current.start_offset:
            return False
        closed = queue.current
        segments = (
            *queue.segments[:-1],
            QueueSegment(closed.broker_name, closed.queue_id, closed.start_offset, end),
            QueueSegment(move.broker_name, move.queue_id, end),
        )
        self.topic_version += 1
        moved = LogicalQueue(
            broker_name=queue.broker_name, queue_id=queue.queue_id, segments=segments
        )
        self.topics[event.topic] = topic.with_queue(moved, self.topic_version)
        return True

    def _cancel_queue_move(self, event: CancelQueueMoveEvent) -> bool:
        found = self._moving_topic(
            event.topic, event.expected_version, event.broker_name, event.queue_id
        )
        if found is None or found[1].moving is None:
            return False
        topic, queue = found
        self.topic_version += 1
        if len(queue.segments) == 1 and queue.segments[0] == QueueSegment(*queue.name, 0):
            queues = dict(topic.queues)
            queues.pop(queue.name, None)
            self.topics[event.topic] = dataclasses.replace(
                topic, version=self.topic_version, queues=queues
            )
            return True
        kept = LogicalQueue(
            broker_name=queue.broker_name, queue_id=queue.queue_id, segments=queue.segments
        )
        self.topics[event.topic] = topic.with_queue(kept, self.topic_version)
        return True

    def _forget_segments(self, event: ForgetSegmentsEvent) -> bool:
        topic = self.topics.get(event.topic)
        if topic is None or topic.version != event.expected_version:
            return False
        queues = {
            name: _with_segments(queue, leading_kept(queue, event.broker_name))
            for name, queue in topic.queues.items()
        }
        if queues == topic.queues:
            return False
        self.topic_version += 1
        self.topics[event.topic] = dataclasses.replace(
            topic, version=self.topic_version, queues=queues
        )
        return True

    def _delete_topic(self, event: DeleteTopicEvent) -> bool:
        if self.topic_version_of(event.topic) != event.expected_version:
            return False
        self.topic_version += 1
        self.topics.pop(event.topic, None)
        self.deleted_topics[event.topic] = self.topic_version
        return True

    def _apply_broker_id(self, event: ApplyBrokerIdEvent) -> bool:
        if event.new_broker_id < 1:
            return False
        group = self.groups.get(event.broker_name)
        if group is None:
            master_epoch, set_epoch = self.retired_epochs.pop(event.broker_name, (0, 0))
            group = BrokerGroup(
                cluster_name=event.cluster_name,
                broker_name=event.broker_name,
                master_epoch=master_epoch,
                sync_state_set_epoch=set_epoch,
            )
            self.groups[event.broker_name] = group
        elif event.new_broker_id in group.replicas:
            return False
        group.replicas[event.new_broker_id] = Replica(
            event.broker_address, event.register_check_code
        )
        group.next_broker_id = max(group.next_broker_id, event.new_broker_id + 1)
        return True

    def _update_broker_address(self, event: UpdateBrokerAddressEvent) -> bool:
        group = self.groups.get(event.broker_name)
        replica = group.replicas.get(event.broker_id) if group else None
        if replica is None:
            return False
        replica.broker_address = event.broker_address
        return True

    def _alter_sync_state_set(self, event: AlterSyncStateSetEvent) -> bool:
        group = self.groups.get(event.broker_name)
        if (
            group is None
            or group.master_epoch != event.expected_master_epoch
            or group.sync_state_set_epoch != event.expected_sync_state_set_epoch
        ):
            return False
        new_set = set(event.new_sync_state_set)
        if (
            not new_set <= group.replicas.keys()
            or group.master_broker_id is None
            or group.master_broker_id not in new_set
        ):
            return False
        group.sync_state_set = new_set
        group.sync_state_set_epoch += 1
        return True

    def _elect_master(self, event: ElectMasterEvent) -> bool:
        group = self.groups.get(event.broker_name)
        if group is None:
            log.error("ElectMasterEvent for unknown broker group %s", event.broker_name)
            return False
        if group.master_epoch != event.expected_master_epoch:
            return False
        if event.new_master_elected:
            master = event.new_master_broker_id
            if master is None or master not in group.replicas:
                return False
            group.master_broker_id = master
            group.master_epoch += 1
            kept = {i for i in event.new_sync_state_set if i in group.replicas}
            group.sync_state_set = kept | {master}
            group.sync_state_set_epoch += 1
        else:
            group.master_broker_id = None
            group.master_epoch += 1
        return True

    def _clean_broker_data(self, event: CleanBrokerDataEvent) -> bool:
        group = self.groups.get(event.broker_name)
        if group is None:
            return False
        if event.broker_id_set_to_clean is None:
            self._retire(group)
            return True
        cleaned = set(event.broker_id_set_to_clean)
        for broker_id in cleaned:
            group.replicas.pop(broker_id, None)
        group.sync_state_set -= cleaned
        if group.master_broker_id in cleaned:
            group.master_broker_id = None
            group.master_epoch += 1
        if not group.replicas:
            self._retire(group)
        return True

    def _retire(self, group: BrokerGroup) -> None:
        del self.groups[group.broker_name]
        self.retired_epochs[group.broker_name] = (group.master_epoch, group.sync_state_set_epoch)


def _sorted(state: AuthState) -> AuthState:
    """`state` with users and ACLs in name order (snapshots are deterministic)."""
    return AuthState(
        {name: state.users[name] for name in sorted(state.users)},
        {subject: state.acls[subject] for subject in sorted(state.acls)},
    )


def leading_kept(queue: LogicalQueue, broker_name: str) -> tuple[QueueSegment, ...]:
    """The segments of `queue` after dropping its leading closed segments on `broker_name`.

    Only a leading run can go: a closed segment between two kept ones would leave a hole.
    """
    segments = queue.segments
    while len(segments) > 1 and not segments[0].is_open and segments[0].broker_name == broker_name:
        segments = segments[1:]
    return segments


def _with_segments(queue: LogicalQueue, segments: tuple[QueueSegment, ...]) -> LogicalQueue:
    """`queue` with other segments (unchanged when they are the same)."""
    if segments == queue.segments:
        return queue
    return LogicalQueue(
        broker_name=queue.broker_name,
        queue_id=queue.queue_id,
        segments=segments,
        moving=queue.moving,
    )
