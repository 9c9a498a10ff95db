"""The Connect cluster's config state: a pure fold of the config log's records.

Every worker (leader and followers alike) replays the fenced config topic into a `ConfigState`;
the leader decides on it before it writes (decide-then-apply: the leader's own writes reach its
state only by being read back from the log). Replay rules:

1. A record is applied only when its logical offset (`records.logical_offset`) is above the last
   one applied, so the broker's copy-forward of the live tail changes nothing for a worker that
   read the originals, and gives one that starts after them the same state.
2. A snapshot replaces everything; replaying snapshot + the records after it equals replaying
   the whole log (the model test holds this).
3. A record that names a connector incarnation other than the current one is ignored: a deleted
   connector's records never touch a re-created one of the same name.
4. A claim moves the epoch only forward; an assignment only to a higher generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.connect.records import (
    AssignedTask,
    Assignment,
    Claim,
    ConnectorDelete,
    ConnectorImage,
    ConnectorPut,
    OffsetsPut,
    Record,
    RestartRequest,
    Snapshot,
    StateImage,
    TargetPut,
    TargetState,
    TaskConfigs,
)

__all__ = ["CONNECTOR_RESTART", "ConfigState", "Connector", "TaskKey"]

CONNECTOR_RESTART = -1
"""The key of the connector instance itself in `Connector.restarts`."""

TaskKey = tuple[str, str, int]
"""(connector, incarnation, task index)."""


@dataclass(slots=True)
class Connector:
    """One connector incarnation."""

    name: str
    incarnation: str
    config: dict[str, str]
    target: TargetState
    tasks: list[dict[str, str]]
    task_generation: int = 1
    """Bumped at every change of the task configs."""
    restarts: dict[int, int] = field(default_factory=dict)
    offsets: OffsetsPut | None = None
    """The last offsets change (alter or reset); a task applies it once, at its first start
    after the change (the runtime remembers which request it applied)."""
    created_offset: int = 0
    updated_offset: int = 0

    def image(self) -> ConnectorImage:
        """The snapshot form."""
        return ConnectorImage(
            name=self.name,
            incarnation=self.incarnation,
            config=dict(self.config),
            target=self.target,
            tasks=[dict(t) for t in self.tasks],
            task_generation=self.task_generation,
            restarts=dict(self.restarts),
            offsets=self.offsets,
            created_offset=self.created_offset,
            updated_offset=self.updated_offset,
        )

    @classmethod
    def from_image(cls, image: ConnectorImage) -> Connector:
        """From the snapshot form."""
        return cls(
            name=image.name,
            incarnation=image.incarnation,
            config=dict(image.config),
            target=image.target,
            tasks=[dict(t) for t in image.tasks],
            task_generation=image.task_generation,
            restarts=dict(image.restarts),
            offsets=image.offsets,
            created_offset=image.created_offset,
            updated_offset=image.updated_offset,
        )

    def task_keys(self) -> list[TaskKey]:
        """The keys of its tasks."""
        return [(self.name, self.incarnation, i) for i in range(len(self.tasks))]


_NO_ASSIGNMENT = Assignment(generation=0, epoch=0, tasks=[])


@dataclass(slots=True)
class ConfigState:
    """What the config log says, as of `last_logical`."""

    epoch: int = 0
    leader_id: str = ""
    leader_url: str = ""
    connectors: dict[str, Connector] = field(default_factory=dict)
    assignment: Assignment = _NO_ASSIGNMENT
    last_logical: int = -1
    """The logical offset of the last record applied (-1: none)."""

    # ------------------------------------------------------------------ apply

    def apply(self, record: Record, logical: int) -> bool:
        """Apply one record at logical offset `logical`; False when replay rule 1 skips it."""
        if logical <= self.last_logical:
            return False
        self.last_logical = logical
        if isinstance(record, Claim):
            if record.epoch > self.epoch:
                self.epoch, self.leader_id, self.leader_url = (
                    record.epoch,
                    record.worker_id,
                    record.url,
                )
        elif isinstance(record, Snapshot):
            self._restore(record.state)
        elif isinstance(record, ConnectorPut):
            self._put(record, logical)
        elif isinstance(record, Assignment):
            if record.generation > self.assignment.generation:
                self.assignment = record
        else:
            self._change(record, logical)
        return True

    def _put(self, record: ConnectorPut, logical: int) -> None:
        current = self.connectors.get(record.name)
        if record.target is not None:  # a creation: a new incarnation replaces any old one
            self.connectors[record.name] = Connector(
                name=record.name,
                incarnation=record.incarnation,
                config=dict(record.config),
                target=record.target,
                tasks=[dict(t) for t in record.tasks],
                created_offset=logical,
                updated_offset=logical,
            )
            return
        if current is None or current.incarnation != record.incarnation:
            return
        current.config = dict(record.config)
        current.tasks = [dict(t) for t in record.tasks]
        current.task_generation += 1
        current.updated_offset = logical

    def _change(
        self,
        record: TaskConfigs | TargetPut | ConnectorDelete | RestartRequest | OffsetsPut,
        logical: int,
    ) -> None:
        current = self.connectors.get(record.name)
        if current is None or current.incarnation != record.incarnation:
            return
        if isinstance(record, ConnectorDelete):
            del self.connectors[record.name]
            return
        current.updated_offset = logical
        if isinstance(record, TaskConfigs):
            current.tasks = [dict(t) for t in record.tasks]
            current.task_generation += 1
        elif isinstance(record, TargetPut):
            current.target = record.state
            if record.state is TargetState.STOPPED:
                if current.tasks:
                    current.tasks = []
                    current.task_generation += 1
            elif record.tasks is not None:
                current.tasks = [dict(t) for t in record.tasks]
                current.task_generation += 1
        elif isinstance(record, RestartRequest):
            if record.task_configs is not None and record.task_configs != current.tasks:
                current.tasks = [dict(t) for t in record.task_configs]
                current.task_generation += 1
            keys = ([-1] if record.connector else []) + [
                t for t in record.tasks if 0 <= t < len(current.tasks)
            ]
            for key in keys:
                current.restarts[key] = current.restarts.get(key, 0) + 1
        else:
            current.offsets = record

    def replace(self, other: ConfigState) -> None:
        """Become `other` in place (a replay done aside replaces the state others hold)."""
        self._restore(other.image())
        self.last_logical = other.last_logical

    # ------------------------------------------------------------------ snapshots

    def image(self) -> StateImage:
        """The whole state, for a snapshot record."""
        return StateImage(
            epoch=self.epoch,
            leader_id=self.leader_id,
            leader_url=self.leader_url,
            connectors=[c.image() for _, c in sorted(self.connectors.items())],
            assignment=self.assignment,
        )

    def _restore(self, image: StateImage) -> None:
        self.epoch = image.epoch
        self.leader_id = image.leader_id
        self.leader_url = image.leader_url
        self.connectors = {c.name: Connector.from_image(c) for c in image.connectors}
        self.assignment = image.assignment

    @classmethod
    def from_image(cls, image: StateImage, last_logical: int) -> ConfigState:
        """A state restored from a snapshot taken after `last_logical`."""
        state = cls(last_logical=last_logical)
        state._restore(image)
        return state

    # ------------------------------------------------------------------ queries

    def wanted_tasks(self) -> list[TaskKey]:
        """Tasks that should be assigned: those of RUNNING and PAUSED connectors."""
        return [
            key
            for connector in sorted(self.connectors.values(), key=lambda c: c.name)
            if connector.target is not TargetState.STOPPED
            for key in connector.task_keys()
        ]

    def owner_of(self, key: TaskKey) -> AssignedTask | None:
        """The assignment entry of a task, if assigned."""
        for task in self.assignment.tasks:
            if (task.connector, task.incarnation, task.task) == key:
                return task
        return None

    def tasks_of(self, worker_id: str) -> list[AssignedTask]:
        """The tasks the current assignment gives a worker."""
        return [t for t in self.assignment.tasks if t.worker_id == worker_id]
