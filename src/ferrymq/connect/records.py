"""The Connect config log's records: what the leader writes to the fenced config topic (seed 002).

One record per change, its body a msgspec JSON object tagged by kind; the broker checks the
fence properties (`FERRY_FENCE_OP`, `_EPOCH`, `_WRITER`, `_URL`) on append and never reads the
body. Kinds:

| kind | fence op | what it does when applied |
|---|---|---|
| claim | claim | a worker leads from this epoch on (its id and advertised URL) |
| snapshot | snapshot | the whole state; replay may start here (the live tail of retention) |
| connector | write | creates (new incarnation, target state, task configs) or updates a connector |
| tasks | write | replaces a connector's task configs at once (one record, never a partial set) |
| target | write | RUNNING / PAUSED / STOPPED (STOPPED drops the task configs) |
| delete | write | a tombstone for one incarnation |
| restart | write | bumps the restart counts of the connector and the tasks named |
| assignment | write | which worker runs which task from this generation on |
| offsets | write | an offsets change (alter or reset) for a STOPPED connector's next start |

Every record that concerns a connector names its incarnation (a random id given at creation); a
record of another incarnation than the connector's current one is ignored, so a deleted and
re-created connector never receives anything of the old one (KAFKA-16838, KAFKA-17719).

Logical offsets: a broker copies a fenced topic's live tail forward before retention deletes it
(the copies carry `FERRY_FENCE_COPY` = the original's logical offset); a record's logical offset
is that value, else its own queue offset, and a reader applies a record only when its logical
offset is above the last one it applied (`logical_offset`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import msgspec

__all__ = [
    "COPY",
    "EPOCH",
    "OP",
    "URL",
    "WRITER",
    "AssignedTask",
    "Assignment",
    "Claim",
    "ConnectorDelete",
    "ConnectorImage",
    "ConnectorPut",
    "OffsetEntry",
    "OffsetsPut",
    "Record",
    "RestartRequest",
    "Snapshot",
    "StateImage",
    "TargetPut",
    "TargetState",
    "TaskConfigs",
    "decode_record",
    "encode_record",
    "fence_op",
    "logical_offset",
]

OP: Final = "FERRY_FENCE_OP"
EPOCH: Final = "FERRY_FENCE_EPOCH"
WRITER: Final = "FERRY_FENCE_WRITER"
URL: Final = "FERRY_FENCE_URL"
COPY: Final = "FERRY_FENCE_COPY"
"""Fence properties every config record carries (the broker's fenced-topic contract)."""


class TargetState(enum.StrEnum):
    """What the cluster is asked to do with a connector (Kafka's target states, KIP-875)."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"


class Claim(msgspec.Struct, tag="claim", frozen=True):
    """A worker claims leadership for `epoch` (the broker accepted it as current + 1)."""

    epoch: int
    worker_id: str
    url: str


class ConnectorImage(msgspec.Struct, frozen=True):
    """One connector as a snapshot holds it."""

    name: str
    incarnation: str
    config: dict[str, str]
    target: TargetState
    tasks: list[dict[str, str]]
    task_generation: int
    restarts: dict[int, int]
    """Restart counts: task index -> count; -1 is the connector itself."""
    offsets: OffsetsPut | None
    """An offsets change waiting for the connector's next start."""
    created_offset: int
    updated_offset: int


class AssignedTask(msgspec.Struct, frozen=True, array_like=True):
    """A task and the worker process that runs it, owned since generation `since`.

    Encoded as an array; `run` is its last element and has a default, so records of older
    versions (five elements) still decode.
    """

    connector: str
    incarnation: str
    task: int
    worker_id: str
    since: int
    """The assignment generation that gave the task to this worker: the task's fencing
    generation (a later owner always has a higher one)."""
    run: str = ""
    """The worker process (its run id, new at every start) the task was given to: a restarted
    worker runs the task only once it is given again, under a new generation. Empty in records
    written before runs existed (such a task is given again once to its worker's current run)."""


class Assignment(msgspec.Struct, tag="assignment", frozen=True):
    """Which worker runs which task, from `generation` on (tasks not listed run nowhere)."""

    generation: int
    epoch: int
    tasks: list[AssignedTask]
    revoking: list[AssignedTask] = msgspec.field(default_factory=list)
    """Tasks taken from a live worker in this generation, to be given to another once that
    worker has applied it (two steps, so a task never runs on two workers at once)."""


class StateImage(msgspec.Struct, frozen=True):
    """The whole config state (what a snapshot record carries)."""

    epoch: int
    leader_id: str
    leader_url: str
    connectors: list[ConnectorImage]
    assignment: Assignment


class Snapshot(msgspec.Struct, tag="snapshot", frozen=True):
    """The whole state, written by the leader after its claim and periodically."""

    state: StateImage


class ConnectorPut(msgspec.Struct, tag="connector", frozen=True):
    """A connector created (`target` set: a new incarnation) or its config updated."""

    name: str
    incarnation: str
    config: dict[str, str]
    tasks: list[dict[str, str]]
    target: TargetState | None = None


class TaskConfigs(msgspec.Struct, tag="tasks", frozen=True):
    """A connector's task configs, replaced at once."""

    name: str
    incarnation: str
    tasks: list[dict[str, str]]


class TargetPut(msgspec.Struct, tag="target", frozen=True):
    """A connector's target state; `tasks` (when set) replace its task configs too."""

    name: str
    incarnation: str
    state: TargetState
    tasks: list[dict[str, str]] | None = None


class ConnectorDelete(msgspec.Struct, tag="delete", frozen=True):
    """A connector incarnation is gone."""

    name: str
    incarnation: str


class RestartRequest(msgspec.Struct, tag="restart", frozen=True):
    """Restart the connector (when `connector`) and the tasks listed.

    A connector restart splits its work again: `task_configs`, when set, replace its tasks.
    """

    name: str
    incarnation: str
    request_id: str
    connector: bool
    tasks: list[int]
    task_configs: list[dict[str, str]] | None = None


class OffsetEntry(msgspec.Struct, frozen=True):
    """One partition's offset (Kafka's KIP-875 shape); a null offset resets it."""

    partition: dict[str, str | int]
    offset: dict[str, str | int] | None


class OffsetsPut(msgspec.Struct, tag="offsets", frozen=True):
    """Alter (entries) or reset (None) a STOPPED connector's offsets, applied at its next start."""

    name: str
    incarnation: str
    request_id: str
    offsets: list[OffsetEntry] | None


Record = (
    Claim
    | Snapshot
    | ConnectorPut
    | TaskConfigs
    | TargetPut
    | ConnectorDelete
    | RestartRequest
    | Assignment
    | OffsetsPut
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Record).decode


def encode_record(record: Record) -> bytes:
    """A record's body."""
    return _encode(record)


def decode_record(body: bytes) -> Record:
    """A record from its body.

    Raises:
        msgspec.DecodeError: the body is not a config record.
    """
    record: Record = _decode(body)
    return record


def fence_op(record: Record) -> str:
    """The fence operation the broker checks the record under."""
    if isinstance(record, Claim):
        return "claim"
    if isinstance(record, Snapshot):
        return "snapshot"
    return "write"


def logical_offset(queue_offset: int, properties: Mapping[str, str]) -> int:
    """A record's place in the log's history: a copy's original offset, else its own."""
    copy = properties.get(COPY)
    if copy is not None and copy.isdigit():
        return int(copy)
    return queue_offset
