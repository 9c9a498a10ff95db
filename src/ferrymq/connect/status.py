"""Task states: written by the worker that runs each task, read by every worker.

Kafka Connect keeps them in a compacted status topic with a generation guard (`putSafe`); the
status topic here (`connectStatusTopic`, one queue) is not compacted, so each worker writes its
tasks' states when they change and again every `statusRepublishMs`, and a starting worker reads
from two periods back. `StatusTable` (pure) keeps the latest state per task with the guard: a
report replaces another only when it comes from a newer generation, or from the same worker and
generation and is newer; so a zombie owner (a worker that lost its task to a newer generation)
never overwrites the new owner's state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ferrymq.connect.state import TaskKey

__all__ = ["StatusTable", "TaskState", "TaskStatus", "decode_status", "encode_status"]


class TaskState(enum.StrEnum):
    """Kafka Connect's task and connector states."""

    UNASSIGNED = "UNASSIGNED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    RESTARTING = "RESTARTING"


class TaskStatus(msgspec.Struct, frozen=True, omit_defaults=True):
    """One task's state as its worker reports it."""

    connector: str
    incarnation: str
    task: int
    state: TaskState
    worker_id: str
    generation: int
    """The task's fencing generation on that worker (its assignment `since`)."""
    updated_ms: int
    run_id: str = ""
    """The current run (a Spark query's runId): a restart of the task changes it."""
    starts: int = 0
    """How many times this worker has started the task in this generation."""
    trace: str | None = None
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    """From the query's progress: batch id, rows/s, lag."""

    @property
    def key(self) -> TaskKey:
        """The task it describes."""
        return (self.connector, self.incarnation, self.task)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(TaskStatus).decode


def encode_status(status: TaskStatus) -> bytes:
    """A status record's body."""
    return _encode(status)


def decode_status(body: bytes) -> TaskStatus:
    """A status record.

    Raises:
        msgspec.DecodeError: not a status record.
    """
    return _decode(body)


@dataclass(slots=True)
class StatusTable:
    """The latest trustworthy state of each task."""

    tasks: dict[TaskKey, TaskStatus] = field(default_factory=dict)

    def put(self, status: TaskStatus) -> bool:
        """Take a report; False when the guard keeps the one already held."""
        held = self.tasks.get(status.key)
        if held is not None:
            newer_generation = status.generation > held.generation
            same_owner = (
                status.generation == held.generation
                and status.worker_id == held.worker_id
                and status.updated_ms >= held.updated_ms
            )
            if not (newer_generation or same_owner):
                return False
        self.tasks[status.key] = status
        return True

    def get(self, key: TaskKey) -> TaskStatus | None:
        """A task's latest report."""
        return self.tasks.get(key)

    def forget(self, keep: set[TaskKey]) -> None:
        """Drop reports of tasks that no longer exist."""
        for key in [k for k in self.tasks if k not in keep]:
            del self.tasks[key]
