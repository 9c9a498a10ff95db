"""The Connect part of the checker: config writes checked like sends (pure: events in, counts out).

The Connect workload's clients each own their connectors, so each connector's writes form one
ordered list (its owner waits for each answer before the next write). A write's outcome is
what its answer promises (docs/connect.md):
- `ok` (2xx): committed on every SyncStateSet member and applied: it took effect, in order;
- `fail` (400, 404, 409, or never sent): nothing was written. A 404, and a 409 "already exists",
  are moreover the leader's decision on its state: at that moment the write could not apply;
- `info` (504, no answer, anything else): it may take effect, at most once, at any moment after
  it was sent (a paused follower may forward it much later), or never.

`possible_states` folds a connector's writes into every state its owner's answers allow (a state
is `(x, target)`, `x` the config key every create and patch sets to a unique value, or None for
absent), and each worker's final state must be one of them. The clients stop writing to a
connector after an unknown outcome (they go on with a fresh one), so an unknown write is the
last of its connector's and the set stays small; the model does not rely on it.

Anomalies (each counted once per connector and worker, or per log record):
- `connect-lost-write`: a worker's final state is one the answers exclude, and that no refused
  write explains either: an acknowledged write is missing (or undone);
- `connect-refused-applied`: the final state is possible only if a write answered 4xx (nothing
  written) took effect;
- `connect-unexplained-state`: a connector, or a value of `x`, that no write of its owner set;
- `connect-inconsistent-answers`: a connector's answers contradict each other whatever the
  timing (a 201 create after an acknowledged create with no delete, a 404 for a connector
  acknowledged as created, ...);
- `connect-divergence`: the running workers did not end on one config offset and one state,
  or one of them did not answer;
- `connect-claim-order`: the raw config log's claims are not one per epoch, each the previous
  plus one;
- `connect-stale-record`: a record whose epoch or writer is not the latest claim's before it (a
  record of an older epoch after a newer claim, or of another worker);
- `connect-corrupt-record`: a config-log record that is not a config record;
- `connect-short-log`: no worker shows the raw config log (`GET /log`) up to the config offset
  the workers reached: records they applied are missing from the log as stored, or from what
  the API shows of it;
- `connect-unexpected-status`: a write answered with a status the API never gives a write
  (500, 502, ...: docs/connect.md promises 2xx, 400, 404, 409 or 504).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ferrymq.chaos.history import ConnectorView, Event, EventType, LogEntry

__all__ = [
    "CONNECT_ANOMALIES",
    "CREATE_OPS",
    "WRITE_OPS",
    "Write",
    "check_connect",
    "possible_states",
    "state_of",
]

CONNECT_ANOMALIES: Final = (
    "connect-lost-write",
    "connect-refused-applied",
    "connect-unexplained-state",
    "connect-inconsistent-answers",
    "connect-divergence",
    "connect-claim-order",
    "connect-stale-record",
    "connect-corrupt-record",
    "connect-short-log",
    "connect-unexpected-status",
)
"""Every Connect anomaly; each is a hard failure."""

CREATE_OPS: Final = {"create": "PAUSED", "create-stopped": "STOPPED"}
"""Creations and the target state each one sets."""
WRITE_OPS: Final = (*CREATE_OPS, "patch", "pause", "stop", "delete")
WRITE_STATUSES: Final = frozenset({200, 201, 202, 204, 400, 404, 409, 504})
"""What docs/connect.md says a write may be answered."""

State = tuple[str | None, str] | None
"""A connector as the model sees it: (its config's `x`, its target state), or None: absent."""

_MAX_PENDING: Final = 12
"""Unknown writes of one connector the model keeps floating (2**n subsets); more is a bug in the
workload, not the system, and the oldest are then taken as never applied."""

Reporter = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class Write:
    """One write to a connector and what its answer said."""

    op: str
    value: str
    outcome: EventType
    status: int | None = None
    message: str = ""

    @property
    def decided(self) -> bool:
        """A refusal by the leader's decision on its state (the write could not apply then)."""
        return self.outcome == "fail" and (
            self.status == 404 or (self.status == 409 and "already exists" in self.message)
        )

    def describe(self) -> str:
        """`op value -> status` for examples."""
        answer = str(self.status) if self.status is not None else self.outcome
        value = f" {self.value}" if self.op in CREATE_OPS or self.op == "patch" else ""
        return f"{self.op}{value}->{answer}"


def apply(op: str, value: str, state: State) -> tuple[bool, State]:
    """Whether `op` succeeds on `state`, and the state after it."""
    if op in CREATE_OPS:
        return (True, (value, CREATE_OPS[op])) if state is None else (False, state)
    if state is None:
        return False, None
    if op == "patch":
        return True, (value, state[1])
    if op == "pause":
        return True, (state[0], "PAUSED")
    if op == "stop":
        return True, (state[0], "STOPPED")
    if op == "delete":
        return True, None
    raise ValueError(f"unknown Connect write {op!r}")


_Point = tuple[State, frozenset[int]]
"""A state and the unknown writes (by index) that have not taken effect (yet)."""


def _closure(points: set[_Point], writes: Sequence[Write]) -> set[_Point]:
    """Every point reachable by letting pending unknown writes take effect, in any order."""
    seen = set(points)
    todo = list(points)
    while todo:
        state, pending = todo.pop()
        for j in pending:
            ok, after = apply(writes[j].op, writes[j].value, state)
            point = (after if ok else state, pending - {j})
            if point not in seen:
                seen.add(point)
                todo.append(point)
    return seen


def possible_states(
    writes: Sequence[Write], *, refused_may_apply: bool = False
) -> tuple[set[State], int | None]:
    """Every state a connector may be in after `writes`, and the first write no state explains.

    The index is None when every answer fits.

    `refused_may_apply`: take refused writes as unknown ones (which final states a refused
    write taking effect would explain).
    """
    points: set[_Point] = {(None, frozenset())}
    for i, write in enumerate(writes):
        points = _closure(points, writes)
        after: set[_Point] = set()
        unknown = write.outcome == "info" or (refused_may_apply and write.outcome == "fail")
        for state, pending in points:
            ok, nxt = apply(write.op, write.value, state)
            if write.outcome == "ok":
                if ok:
                    after.add((nxt, pending))
            elif unknown:
                kept = sorted(pending | {i})[-_MAX_PENDING:]
                after.add((state, frozenset(kept)))
            elif write.decided:
                if not ok:
                    after.add((state, pending))
            else:
                after.add((state, pending))
        if not after:
            return set(), i
        points = after
    return {state for state, _ in _closure(points, writes)}, None


def state_of(view: dict[str, ConnectorView], name: str) -> State:
    """A connector's state in a worker's view."""
    entry = view.get(name)
    return None if entry is None else (entry.config.get("x"), entry.state)


def _show(state: State) -> str:
    return "absent" if state is None else f"x={state[0]} {state[1]}"


@dataclass(slots=True)
class _Connect:
    writes: dict[str, list[Write]]
    views: list[Event]
    unanswered: list[Event]
    converged: list[Event]
    logs: list[Event]
    statuses: Counter[str]
    exits: int = 0


def _collect(events: Sequence[Event], report: Reporter) -> _Connect:
    found = _Connect({}, [], [], [], [], Counter())
    pending: dict[str, Event] = {}
    for event in events:
        if event.f == "cwrite":
            if event.type == "invoke":
                pending[event.proc] = event
                continue
            invoke = pending.pop(event.proc, None)
            conn = event.conn or (invoke.conn if invoke is not None else None)
            op = event.op or (invoke.op if invoke is not None else None)
            if conn is None or op is None:
                continue
            value = event.v or (invoke.v if invoke is not None else None) or ""
            found.statuses[event.type] += 1
            found.writes.setdefault(conn, []).append(
                Write(op, value, event.type, event.status, event.error or "")
            )
            if event.status is not None and event.status not in WRITE_STATUSES:
                report(
                    "connect-unexpected-status",
                    f"{op} of {conn} on {event.node} answered {event.status}: {event.error}",
                )
        elif event.f == "cview":
            (found.views if event.type == "ok" else found.unanswered).append(event)
        elif event.f == "cconverged" and event.type != "invoke":
            found.converged.append(event)
        elif event.f == "clog" and event.type != "invoke":
            found.logs.append(event)
        elif event.f == "cexit":
            found.exits += 1
    return found


def _check_states(found: _Connect, report: Reporter) -> None:
    names = set(found.writes).union(*((e.view or {}).keys() for e in found.views))
    for name in sorted(names):
        writes = found.writes.get(name, [])
        allowed, broken = possible_states(writes)
        history = " ".join(w.describe() for w in writes[-12:])
        if broken is not None:
            upto = " ".join(w.describe() for w in writes[max(0, broken - 11) : broken + 1])
            report(
                "connect-inconsistent-answers",
                f"{name}: no state explains the answer to {writes[broken].describe()} "
                f"(write {broken + 1} of {len(writes)}): {upto}",
            )
            continue
        loose: set[State] | None = None
        for event in found.views:
            observed = state_of(event.view or {}, name)
            if observed in allowed:
                continue
            if loose is None:
                loose, _ = possible_states(writes, refused_may_apply=True)
            values = {w.value for w in writes if w.op in CREATE_OPS or w.op == "patch"}
            where = (
                f"{name} on {event.node} is {_show(observed)}; the answers allow "
                f"{', '.join(sorted(_show(s) for s in allowed))}; writes: {history or 'none'}"
            )
            if observed in loose:
                report("connect-refused-applied", where)
            elif observed is not None and (not writes or observed[0] not in values):
                report("connect-unexplained-state", where)
            else:
                report("connect-lost-write", where)


def _check_convergence(found: _Connect, report: Reporter) -> None:
    for event in found.converged:
        if event.type != "ok":
            report("connect-divergence", f"the workers did not converge: {event.error}")
    for event in found.unanswered:
        report("connect-divergence", f"{event.node} did not show its final state: {event.error}")
    if len(found.views) < 2:
        return
    first = found.views[0]
    for other in found.views[1:]:
        if other.off != first.off:
            report(
                "connect-divergence",
                f"{first.node} ended at config offset {first.off}, {other.node} at {other.off}",
            )
        mine, theirs = first.view or {}, other.view or {}
        differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        if differ:
            report(
                "connect-divergence",
                f"{first.node} and {other.node} differ on {len(differ)} connectors, e.g. "
                f"{differ[0]}: {mine.get(differ[0])} vs {theirs.get(differ[0])}",
            )


def check_log(records: Sequence[LogEntry], report: Reporter) -> int:
    """Check the raw config log; returns how many claims it holds.

    One claim per epoch, each the previous plus one, and every other record written under the
    latest claim (its epoch and writer).
    """
    claims = 0
    latest: LogEntry | None = None
    for record in records:
        if record.kind == "unreadable":
            report("connect-corrupt-record", f"offset {record.offset} is not a config record")
            continue
        if record.logical_offset != record.offset:
            continue  # the broker's copy-forward of an older record
        if record.kind == "Claim":
            claims += 1
            if record.claimed is not None and record.claimed != record.epoch:
                report(
                    "connect-claim-order",
                    f"offset {record.offset}: a claim of epoch {record.claimed} stored under "
                    f"epoch {record.epoch}",
                )
            if latest is not None and (
                record.epoch is None or latest.epoch is None or record.epoch != latest.epoch + 1
            ):
                report(
                    "connect-claim-order",
                    f"offset {record.offset}: {record.writer} claims epoch {record.epoch} after "
                    f"{latest.writer}'s claim of {latest.epoch} (offset {latest.offset})",
                )
            if latest is None or (
                record.epoch is not None and (latest.epoch is None or record.epoch > latest.epoch)
            ):
                latest = record
            continue
        if latest is None:
            if record.offset == 0 or record.epoch is None:
                report(
                    "connect-stale-record",
                    f"offset {record.offset}: {record.kind} of epoch {record.epoch} by "
                    f"{record.writer!r} before any claim",
                )
            continue
        if record.epoch != latest.epoch or record.writer != latest.writer:
            report(
                "connect-stale-record",
                f"offset {record.offset}: {record.kind} of epoch {record.epoch} by "
                f"{record.writer!r} after {latest.writer}'s claim of epoch {latest.epoch} "
                f"(offset {latest.offset})",
            )
    return claims


def check_connect(events: Sequence[Event], report: Reporter) -> dict[str, int]:
    """Report every Connect anomaly of a history; returns its Connect stats.

    The stats are empty without a Connect workload.
    """
    found = _collect(events, report)
    if not found.writes and not found.views and not found.logs and not found.converged:
        return {}
    _check_states(found, report)
    _check_convergence(found, report)
    claims = 0
    for event in found.logs:
        records = event.records or []
        claims = check_log(records, report)
        shown = records[-1].offset + 1 if records else 0
        if event.type != "ok" or (event.off is not None and shown < event.off):
            report(
                "connect-short-log",
                f"the raw config log is shown up to offset {shown}, the workers reached "
                f"{event.off}: {event.error}",
            )
    return {
        "connect_acked": found.statuses["ok"],
        "connect_failed": found.statuses["fail"],
        "connect_unknown": found.statuses["info"],
        "connect_connectors": len(found.writes),
        "connect_claims": claims,
        "connect_log_records": max((len(e.records or []) for e in found.logs), default=0),
        "connect_converged": int(any(e.type == "ok" for e in found.converged)),
        "connect_worker_exits": found.exits,
    }
