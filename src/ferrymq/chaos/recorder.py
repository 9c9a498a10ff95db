"""The history recorder: stamps events with the run's monotonic clock and writes them.

One recorder per run, shared by every worker of the harness's event loop (one owner, no locks).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from ferrymq.chaos.history import NEMESIS, Event, EventType, HistoryWriter

__all__ = ["Recorder"]


class Recorder:
    """Appends events to `history.jsonl` with `t_ns` since the recorder was made."""

    def __init__(self, path: Path) -> None:
        self._writer = HistoryWriter(path)
        self._start_ns = time.monotonic_ns()

    @property
    def events(self) -> list[Event]:
        """Everything recorded so far."""
        return self._writer.events

    @property
    def elapsed(self) -> float:
        """Seconds since the run began."""
        return (time.monotonic_ns() - self._start_ns) / 1e9

    def record(self, proc: str, type_: EventType, f: str, **fields: object) -> Event:
        """Append one event."""
        fields.update(proc=proc, type=type_, f=f)
        event = msgspec.convert(fields, Event)
        return self._writer.write(event, time.monotonic_ns() - self._start_ns)

    def fault(self, f: str, targets: list[str], detail: str = "", *, end: bool = False) -> None:
        """A nemesis event: the start of a fault (`info`) or its end (`ok`)."""
        self.record(NEMESIS, "ok" if end else "info", f, targets=targets, error=detail or None)

    def close(self) -> None:
        """Close the file."""
        self._writer.close()
