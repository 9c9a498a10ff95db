"""The chaos history: one JSON object per line, every client operation and every fault.

Rules:
1. An operation is an `invoke` event followed by exactly one completion from the same `proc`:
   `ok` (it happened), `fail` (it surely did not happen: the broker guarantees nothing was
   appended) or `info` (unknown: a timeout, a lost connection, a not-committed answer).
2. Values are unique per send: `"<proc>-<counter>"`, so each value names its writer.
3. Queues are named `"<broker group>/<queue id>"` (one topic per run); offsets are queue offsets.
4. `t_ns` is monotonic nanoseconds since the run began; `i` numbers the events in write order.

Event kinds (`f`):
- `send`: `q`, `v`; an `ok` carries `off` (the queue offset) and `node` (the broker that acked).
- `poll` / `drain`: `ok` carries `reads` = queue -> [[queue_offset, value], ...], `node` and `gen`
  (the assignment generation: a restarted consumer or a seek starts a new one).
- `commit`: `offsets` = queue -> next queue offset to read; `group`.
- `committed`: a read of the group's stored position; `ok` carries `offsets`.
- `role`: an observer saw `node` in `group` as `role` at `epoch` (`proc` "observer": the broker's
  own runtime info; "controller-view": the controllers' GET_REPLICA_INFO master).
- `dump`: one replica's store after the run: `node`, `group`, `confirm` (confirm log offset),
  `epochs` ([[epoch, start log offset], ...]) and `entries` = queue -> [[queue_offset, value,
  log_offset], ...]; an unreadable record has the value `"!corrupt"`.
- anything from `proc == "nemesis"`: a fault (`f` names it, `targets` says where).

Connect (the config-write workload; `proc` "k<i>" for its clients):
- `cwrite`: one REST write; `conn` (the connector), `op` (create, create-stopped, patch, pause,
  stop, delete), `v` (the value a create or patch sets as the config key `x`), `node` (the
  worker it was sent to); the completion carries `status` (HTTP status, absent when no answer
  came) and `error` (the answer's message or the client's error). `ok` = 2xx (committed and
  applied), `fail` = nothing written (400, 404, 409, or the request never left the client),
  `info` = unknown (504, no answer, anything else).
- `cleader`: the Connect leader changed: `node` (the leader), `epoch` (its claim) as a worker
  reported it (`proc` "connect-observer").
- `cview`: one worker's final state: `node`, `off` (its config offset), `view` = connector ->
  `ConnectorView` (`fail`: the worker did not answer).
- `cconverged`: whether every worker reached the same config offset and state (`fail` with why).
- `clog`: the raw config log as stored: `records`, one `LogEntry` each.

Pure: no asyncio, no sockets; the writer appends to a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final, Literal, Self

import msgspec

__all__ = [
    "CORRUPT_VALUE",
    "NEMESIS",
    "ConnectorView",
    "Event",
    "EventType",
    "HistoryWriter",
    "LogEntry",
    "decode_event",
    "read_history",
]

EventType = Literal["invoke", "ok", "fail", "info"]

NEMESIS: Final = "nemesis"
"""The `proc` of fault events."""

CORRUPT_VALUE: Final = "!corrupt"
"""The value a dump records for a record that fails its checks."""


class ConnectorView(msgspec.Struct, frozen=True, omit_defaults=True):
    """One connector as a worker shows it (`GET /connectors?expand=info&expand=status`)."""

    state: str
    """The connector's state (its target: PAUSED, STOPPED, RUNNING)."""
    config: dict[str, str]
    tasks: int = 0


class LogEntry(msgspec.Struct, frozen=True, array_like=True):
    """One config-log record as stored (`GET /log`)."""

    offset: int
    logical_offset: int
    """Its original's offset (differs for a broker's copy-forward of an older record)."""
    kind: str
    """The record's type (Claim, ConnectorPut, ...; `unreadable` when its body is not one)."""
    epoch: int | None
    """The fence epoch the record carries."""
    writer: str
    """The fence writer the record carries."""
    claimed: int | None = None
    """A claim's own epoch field (the body's, next to the property)."""


class Event(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One line of the history."""

    proc: str
    type: EventType
    f: str
    i: int = 0
    t_ns: int = 0
    q: str | None = None
    v: str | None = None
    off: int | None = None
    node: str | None = None
    gen: int | None = None
    group: str | None = None
    reads: dict[str, list[tuple[int, str]]] | None = None
    offsets: dict[str, int] | None = None
    role: str | None = None
    epoch: int | None = None
    confirm: int | None = None
    epochs: list[tuple[int, int]] | None = None
    entries: dict[str, list[tuple[int, str, int]]] | None = None
    targets: list[str] | None = None
    error: str | None = None
    conn: str | None = None
    op: str | None = None
    status: int | None = None
    view: dict[str, ConnectorView] | None = None
    records: list[LogEntry] | None = None


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Event)


def decode_event(line: bytes | str) -> Event:
    """One event from its JSON line.

    Raises:
        msgspec.ValidationError, msgspec.DecodeError: the line is not an event.
    """
    return _DECODER.decode(line)


def read_history(path: Path) -> list[Event]:
    """Every event of a history file, in file order (blank lines skipped)."""
    with path.open("rb") as file:
        return [decode_event(line) for line in file if line.strip()]


class HistoryWriter:
    """Appends events to a JSONL file, numbering and flushing each (a crash keeps them all)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] = path.open("ab")
        self._next_i = 0
        self.events: list[Event] = []

    def write(self, event: Event, t_ns: int) -> Event:
        """Stamp `event` with its number and time, append it, and return it."""
        stamped = msgspec.structs.replace(event, i=self._next_i, t_ns=t_ns)
        self._next_i += 1
        self._file.write(_ENCODER.encode(stamped) + b"\n")
        self._file.flush()
        self.events.append(stamped)
        return stamped

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)
