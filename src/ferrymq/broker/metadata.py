"""The broker's small metadata tables, each kept in one JSON file under `<store root>/config/`.

- `TopicTable` (`topics.json`): topic configs and their data version (RocketMQ
  `TopicConfigManager`), with the system topics the broker needs.
- `GroupTable` (`subscriptionGroup.json`): subscription group configs.
- `OffsetTable` (`consumerOffset.json`): committed queue offsets per `topic@group`.
- `DelayOffsetTable` (`delayOffset.json`): how far each delay level has been delivered, and the
  timer (delivery-time) messages' progress.

Every change also goes to `listener` when one is set: a master's `metalog.MetadataLog` writes it
into the replicated commit log, so slaves hold the same tables (ARCHITECTURE.md section 6
item 5).

The JSON shapes are RocketMQ's. Every save replaces the file atomically (temp file, fsync,
rename, directory fsync): a crash leaves the old or the new table, never a torn one. Tables are
saved when changed (topics, groups) or at most every flush interval (offsets).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.store.atomic import read_file, write_atomic
from ferrymq.wire.bodies import (
    DataVersion,
    Perm,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_body,
    encode_body,
)

__all__ = [
    "DEFAULT_TOPIC",
    "DLQ_GROUP_PREFIX",
    "METADATA_TOPIC",
    "RETRY_GROUP_PREFIX",
    "SCHEDULE_TOPIC",
    "TIMER_TOPIC",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "DelayOffsetTable",
    "GroupConfig",
    "GroupFile",
    "GroupTable",
    "OffsetTable",
    "TimerProgress",
    "TopicTable",
    "dlq_topic",
    "retry_topic",
]

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = "TBW102"
"""The template topic auto-created topics copy (`AUTO_CREATE_TOPIC_KEY_TOPIC`)."""
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC: Final = "rmq_sys_wheel_timer"
"""Where timer messages wait for their delivery time (RocketMQ 5's timer topic, one queue)."""
TRANS_HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
METADATA_TOPIC: Final = "rmq_sys_ferry_metadata"
"""Topic, group and offset changes, replicated through the commit log (one queue)."""
SINK_TOPIC: Final = "rmq_sys_ferry_sink"
"""Exactly-once sink batches: prepared rows and decisions (`sink.py`)."""
RETRY_GROUP_PREFIX: Final = "%RETRY%"
DLQ_GROUP_PREFIX: Final = "%DLQ%"


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group."""
    return RETRY_GROUP_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group."""
    return DLQ_GROUP_PREFIX + group


def _load(path: Path, body_type: type[msgspec.Struct]) -> msgspec.Struct | None:
    data = read_file(path)
    if data is None:
        return None
    try:
        return decode_body(data, body_type)
    except ProtocolError as exc:
        # Saves are atomic, so this is damage from outside: keep the bytes, start empty.
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.rename(aside)
        log.error("%s is unreadable (%s); moved to %s and starting empty", path, exc, aside.name)
        return None


class _TopicFile(TopicConfigSerializeWrapper):
    """`topics.json`: RocketMQ's shape, plus the controller's topic version (controller mode)."""

    controller_topic_version: int = 0


class TopicTable:
    """Topic configs of this broker group."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.configs: dict[str, TopicConfig] = {}
        self.data_version = DataVersion(timestamp=int(time.time() * 1000))
        self.controller_version = 0
        """Controller mode: the controller's topic version this table was last reconciled to
        (`topicsync.py`; 0: never). Replicated with the table, so a new master never applies an
        older answer than the one its predecessor applied."""
        self.listener: Callable[[str, TopicConfig | None], None] | None = None
        """Hears (topic, config) on every put and (topic, None) on every delete."""
        self.version_listener: Callable[[int], None] | None = None
        """Hears every change of `controller_version`."""
        self.observers: list[Callable[[TopicConfig], None]] = []
        """Hear every config put or replaced (a slave's whole table too), after the change."""

    def load(self, *, default_topic_queue_nums: int, auto_create: bool, delay_levels: int) -> None:
        """Read the file and make sure the system topics exist."""
        loaded = _load(self.path, _TopicFile)
        if isinstance(loaded, _TopicFile):
            self.configs = dict(loaded.topic_config_table)
            self.data_version = loaded.data_version
            self.controller_version = loaded.controller_topic_version
        system = [
            TopicConfig(
                topic_name=SCHEDULE_TOPIC,
                read_queue_nums=delay_levels,
                write_queue_nums=delay_levels,
            ),
            TopicConfig(topic_name=TIMER_TOPIC, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(topic_name=TRANS_HALF_TOPIC, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(topic_name=TRANS_OP_HALF_TOPIC, read_queue_nums=1, write_queue_nums=1),
            TopicConfig(topic_name=METADATA_TOPIC, read_queue_nums=1, write_queue_nums=1),
        ]
        if auto_create:
            system.append(
                TopicConfig(
                    topic_name=DEFAULT_TOPIC,
                    read_queue_nums=default_topic_queue_nums,
                    write_queue_nums=default_topic_queue_nums,
                    perm=Perm.INHERIT | Perm.READ | Perm.WRITE,
                )
            )
        elif DEFAULT_TOPIC in self.configs:
            del self.configs[DEFAULT_TOPIC]
        changed = False
        for config in system:
            if config.topic_name not in self.configs:
                self.configs[config.topic_name] = config
                changed = True
        if changed:
            self._bump()

    def get(self, topic: str) -> TopicConfig | None:
        """A topic's config."""
        return self.configs.get(topic)

    def put(self, config: TopicConfig) -> bool:
        """Create or replace a topic; returns whether anything changed."""
        if self.configs.get(config.topic_name) == config:
            return False
        self.configs[config.topic_name] = config
        self._bump()
        if self.listener is not None:
            self.listener(config.topic_name, config)
        for observer in self.observers:
            observer(config)
        return True

    def delete(self, topic: str) -> bool:
        """Forget a topic; returns whether it existed."""
        if self.configs.pop(topic, None) is None:
            return False
        self._bump()
        if self.listener is not None:
            self.listener(topic, None)
        return True

    def replace_all(self, configs: dict[str, TopicConfig]) -> None:
        """Adopt a replicated snapshot of the whole table (a slave)."""
        if configs != self.configs:
            changed = [c for n, c in configs.items() if self.configs.get(n) != c]
            self.configs = dict(configs)
            self._bump()
            for config in changed:
                for observer in self.observers:
                    observer(config)

    def set_controller_version(self, version: int) -> None:
        """Record the controller's topic version this table now reflects."""
        if version != self.controller_version:
            self.controller_version = version
            self.save()
            if self.version_listener is not None:
                self.version_listener(version)

    def set_state_version(self, state_version: int) -> None:
        """Carry the master epoch in registrations (controller mode fences stale masters)."""
        self.data_version = DataVersion(
            state_version, self.data_version.timestamp, self.data_version.counter
        )

    def _bump(self) -> None:
        version = self.data_version
        self.data_version = DataVersion(
            version.state_version, int(time.time() * 1000), version.counter + 1
        )
        self.save()

    def wrapper(self) -> TopicConfigSerializeWrapper:
        """Every topic config with the data version, as REGISTER_BROKER carries them."""
        return TopicConfigSerializeWrapper(dict(self.configs), self.data_version)

    def save(self) -> None:
        """Replace the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        wrapper = self.wrapper()
        data = _TopicFile(wrapper.topic_config_table, wrapper.data_version, self.controller_version)
        write_atomic(self.path, encode_body(data))


class GroupConfig(msgspec.Struct, rename="camel", forbid_unknown_fields=False, kw_only=True):
    """A subscription group (`SubscriptionGroupConfig`)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False
    """A FIFO group (RocketMQ 5): the gRPC endpoint pops it orderly."""


class GroupFile(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    """The subscription group file and GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""

    subscription_group_table: dict[str, GroupConfig] = msgspec.field(default_factory=dict)
    data_version: DataVersion = msgspec.field(default_factory=DataVersion)


class GroupTable:
    """Subscription groups."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.configs: dict[str, GroupConfig] = {}
        self.listener: Callable[[str, GroupConfig | None], None] | None = None
        """Hears (group, config) on every put and (group, None) on every delete."""

    def load(self) -> None:
        """Read the file."""
        loaded = _load(self.path, GroupFile)
        if isinstance(loaded, GroupFile):
            self.configs = dict(loaded.subscription_group_table)

    def get(self, group: str) -> GroupConfig | None:
        """A group's config."""
        return self.configs.get(group)

    def put(self, config: GroupConfig) -> None:
        """Create or replace a group."""
        self.configs[config.group_name] = config
        self.save()
        if self.listener is not None:
            self.listener(config.group_name, config)

    def delete(self, group: str) -> bool:
        """Forget a group."""
        if self.configs.pop(group, None) is None:
            return False
        self.save()
        if self.listener is not None:
            self.listener(group, None)
        return True

    def replace_all(self, configs: dict[str, GroupConfig]) -> None:
        """Adopt a replicated snapshot of the whole table (a slave)."""
        if configs != self.configs:
            self.configs = dict(configs)
            self.save()

    def save(self) -> None:
        """Replace the file atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, encode_body(GroupFile(self.configs)))


class _OffsetFile(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    offset_table: dict[str, dict[int, int]] = msgspec.field(default_factory=dict)


class OffsetTable:
    """Committed queue offsets: `topic@group` -> queue id -> queue offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: dict[str, dict[int, int]] = {}
        self.dirty = False
        self.listener: Callable[[str, int, int], None] | None = None
        """Hears (`topic@group` key, queue id, offset) on every change; offset -1: deleted."""

    def load(self) -> None:
        """Read the file."""
        loaded = _load(self.path, _OffsetFile)
        if isinstance(loaded, _OffsetFile):
            self.offsets = dict(loaded.offset_table)

    @staticmethod
    def key(topic: str, group: str) -> str:
        """RocketMQ's table key."""
        return f"{topic}@{group}"

    def commit(self, topic: str, group: str, queue_id: int, queue_offset: int) -> None:
        """Record a group's position in a queue."""
        key = self.key(topic, group)
        queues = self.offsets.setdefault(key, {})
        if queues.get(queue_id) != queue_offset:
            queues[queue_id] = queue_offset
            self.dirty = True
            if self.listener is not None:
                self.listener(key, queue_id, queue_offset)

    def query(self, topic: str, group: str, queue_id: int) -> int | None:
        """A group's committed position, or None."""
        return self.offsets.get(self.key(topic, group), {}).get(queue_id)

    def of_group(self, group: str) -> dict[str, dict[int, int]]:
        """Topic -> queue id -> offset, for one group."""
        suffix = "@" + group
        return {k[: -len(suffix)]: dict(v) for k, v in self.offsets.items() if k.endswith(suffix)}

    def groups_of(self, topic: str) -> list[str]:
        """Groups that committed offsets in a topic."""
        prefix = topic + "@"
        return sorted(k[len(prefix) :] for k in self.offsets if k.startswith(prefix))

    def delete_topic(self, topic: str) -> None:
        """Forget every group's offsets in a topic."""
        for key in [k for k in self.offsets if k.startswith(topic + "@")]:
            for queue_id in self.offsets.pop(key):
                if self.listener is not None:
                    self.listener(key, queue_id, -1)
            self.dirty = True

    def delete_group(self, group: str) -> None:
        """Forget a group's offsets in every topic."""
        for key in [k for k in self.offsets if k.endswith("@" + group)]:
            for queue_id in self.offsets.pop(key):
                if self.listener is not None:
                    self.listener(key, queue_id, -1)
            self.dirty = True

    def apply(self, key: str, queue_id: int, queue_offset: int) -> None:
        """Adopt one replicated change (offset -1 deletes)."""
        if queue_offset < 0:
            queues = self.offsets.get(key)
            if queues is not None and queues.pop(queue_id, None) is not None:
                if not queues:
                    del self.offsets[key]
                self.dirty = True
        elif self.offsets.setdefault(key, {}).get(queue_id) != queue_offset:
            self.offsets[key][queue_id] = queue_offset
            self.dirty = True

    def replace_all(self, offsets: dict[str, dict[int, int]]) -> None:
        """Adopt a replicated snapshot of the whole table (a slave)."""
        if offsets != self.offsets:
            self.offsets = {key: dict(queues) for key, queues in offsets.items()}
            self.dirty = True

    def snapshot(self) -> bytes | None:
        """The file content if anything changed since the last snapshot (then clean)."""
        if not self.dirty:
            return None
        self.dirty = False
        return encode_body(_OffsetFile(self.offsets))

    def save_if_dirty(self) -> None:
        """Replace the file atomically if anything changed since the last save."""
        data = self.snapshot()
        if data is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data)


class TimerProgress(msgspec.Struct, rename="camel", frozen=True):
    """How far timer messages (queue 0 of `TIMER_TOPIC`) have been delivered.

    Every message below `pending_floor_offset` is delivered; of the messages below
    `scan_queue_offset`, every one due at or before `delivered_ms` is delivered. A master that
    starts on this progress reloads the rest from `pending_floor_offset` (`broker.timer`).
    """

    pending_floor_offset: int = 0
    scan_queue_offset: int = 0
    delivered_ms: int = 0


class _DelayFile(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    offset_table: dict[int, int] = msgspec.field(default_factory=dict)
    timer_progress: TimerProgress | None = None
    """ferrymq's: RocketMQ keeps its timer checkpoint in a file of its own."""


class DelayOffsetTable:
    """How far each delay level of the schedule topic, and the timer topic, have been delivered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: dict[int, int] = {}
        self.timer = TimerProgress()
        self.dirty = False
        self.listener: Callable[[int, int], None] | None = None
        """Hears (level, offset) on every change."""
        self.timer_listener: Callable[[TimerProgress], None] | None = None
        """Hears every change of the timer progress."""

    def load(self) -> None:
        """Read the file."""
        loaded = _load(self.path, _DelayFile)
        if isinstance(loaded, _DelayFile):
            self.offsets = dict(loaded.offset_table)
            self.timer = loaded.timer_progress or TimerProgress()

    def set_timer(self, progress: TimerProgress) -> None:
        """Record the timer messages' progress."""
        if progress != self.timer:
            self.timer = progress
            self.dirty = True
            if self.timer_listener is not None:
                self.timer_listener(progress)

    def set(self, level: int, queue_offset: int) -> None:
        """Record that level `level` is delivered up to `queue_offset`."""
        if self.offsets.get(level) != queue_offset:
            self.offsets[level] = queue_offset
            self.dirty = True
            if self.listener is not None:
                self.listener(level, queue_offset)

    def replace_all(self, offsets: dict[int, int]) -> None:
        """Adopt a replicated snapshot of the whole table (a slave)."""
        if offsets != self.offsets:
            self.offsets = dict(offsets)
            self.dirty = True

    def snapshot(self) -> bytes | None:
        """The file content if anything changed since the last snapshot (then clean)."""
        if not self.dirty:
            return None
        self.dirty = False
        return encode_body(_DelayFile(self.offsets, self.timer))

    def save_if_dirty(self) -> None:
        """Replace the file atomically if anything changed."""
        data = self.snapshot()
        if data is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data)
