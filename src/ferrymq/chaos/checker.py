"""The history checker: every safety anomaly a chaos run can show, counted from its history.

Modelled on Jepsen's `jepsen.tests.kafka` queue analysis (reference/reliability-harness.md §3.4),
with the checks this system adds (replicas, epochs, masters, group commits). Pure: events in,
`Results` out, O(n log n).

Promised semantics it checks against (ARCHITECTURE.md §6-7):
- an acknowledged send (`ok`) is never lost: the final drain reads every acked value (a value
  consumers read during the run and the drain does not find was lost afterwards);
- a send that surely failed (`fail`) is never read; a send of unknown outcome (`info`) may be;
- the SDK never retries a send whose outcome is unknown and producers pin their queues, so one
  value stored at two offsets is a duplicate, and an anomaly;
- queue offsets are dense and each holds one value, forever (no two values at one offset);
- a consumer reads a queue in offset order without gaps within one assignment generation;
- replicas agree below their confirm offsets, and hold every record below them;
- epochs only grow; one master per group and epoch; committed group offsets never go back.

Several broker groups (topology controller-2groups) need nothing else: queues are named by their
group (`broker-b/0`), so loss, order and offsets are checked per queue whichever group holds it;
replicas are compared only within their group, masters and epochs are per group, and acks of
different groups never count as two masters. `stats` then also counts the acks of each group
(`acked@broker-a`, ...).

With a Connect workload (`connect_check`), the Connect workers' config writes are checked like
sends: every worker's final state must be one the acknowledged and unknown writes allow, the
workers must end on one config offset and state, and the raw config log must hold one claim per
epoch with every other record written under the latest claim. `stats` then counts the Connect
writes too (`connect_acked`, ...).

Anomaly names (results list every one, 0 when absent): see `ANOMALIES`.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from ferrymq.chaos.connect_check import CONNECT_ANOMALIES, check_connect
from ferrymq.chaos.history import CORRUPT_VALUE, NEMESIS, Event

__all__ = ["ANOMALIES", "Results", "check"]

ANOMALIES: Final = (
    "lost",
    "unexpected",
    "duplicated",
    "aborted-read",
    "inconsistent-offsets",
    "nonmonotonic-send",
    "nonmonotonic-poll",
    "poll-skip",
    "int-nonmonotonic-poll",
    "int-poll-skip",
    "replica-divergence",
    "lost-on-replica",
    "epoch-regression",
    "dual-master",
    "commit-regression",
    *CONNECT_ANOMALIES,
)
"""Every anomaly the checker knows; each is a hard failure."""

_MAX_EXAMPLES: Final = 5

_READ_KINDS: Final = frozenset({"poll", "drain"})


class Results(msgspec.Struct):
    """What `check` found; written as results.json."""

    valid: bool
    anomalies: dict[str, int]
    """Every name of `ANOMALIES` -> how many (0 when none)."""
    examples: dict[str, list[str]]
    """Up to five descriptions of each anomaly found."""
    operations: dict[str, dict[str, int]]
    """Client operation kind -> completion type -> count."""
    faults: dict[str, int]
    """Nemesis operation -> how many times it ran."""
    stats: dict[str, int]
    """acked, failed, unknown, recovered (unknown sends later read), read, redelivered,
    drain_complete (1 when the final drain reached every queue's acked high water mark); with
    several groups also acked@<group> for each; with a Connect workload connect_acked,
    connect_failed, connect_unknown (its writes), connect_connectors, connect_claims,
    connect_log_records and connect_converged."""


@dataclass(slots=True)
class _Send:
    proc: str
    q: str
    v: str
    invoke_ns: int
    complete_ns: int = 0
    off: int | None = None
    node: str | None = None
    epoch: int | None = None


@dataclass(slots=True)
class _Report:
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, anomaly: str, example: str) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < _MAX_EXAMPLES:
            self.examples[anomaly].append(example)


@dataclass(slots=True)
class _Index:
    """Pass 0: the history indexed by value, queue and process."""

    attempts: dict[str, _Send] = field(default_factory=dict)
    acked: dict[str, _Send] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    log: dict[str, dict[int, set[str]]] = field(default_factory=lambda: defaultdict(dict))
    reads: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    drained: set[str] = field(default_factory=set)
    """Values the final drain read."""
    read_positions: Counter[tuple[str, int]] = field(default_factory=Counter)
    dumps: list[Event] = field(default_factory=list)
    roles: list[Event] = field(default_factory=list)
    operations: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    faults: Counter[str] = field(default_factory=Counter)
    drain_complete: bool = False


def _index(events: Iterable[Event], report: _Report) -> _Index:
    index = _Index()
    pending: dict[str, Event] = {}
    last_poll: dict[tuple[str, str, int | None], int] = {}
    sends_by_writer: dict[tuple[str, str], int] = {}
    commits_done: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    committed_reads: list[tuple[Event, int]] = []
    for event in events:
        if event.proc == NEMESIS:
            if event.type == "info":  # a fault starts; its end is an `ok`
                index.faults[event.f] += 1
            continue
        if event.type == "invoke":
            pending[event.proc] = event
            if event.f == "send" and event.v is not None and event.q is not None:
                index.attempts[event.v] = _Send(event.proc, event.q, event.v, event.t_ns)
            continue
        index.operations[event.f][event.type] += 1
        invoke = pending.pop(event.proc, None)
        invoke_ns = invoke.t_ns if invoke is not None else event.t_ns
        if event.f == "send":
            _index_send(index, event, invoke_ns, sends_by_writer, report)
        elif event.f in _READ_KINDS and event.type == "ok" and event.reads:
            _index_reads(index, event, last_poll, report)
        elif event.f == "commit" and event.type == "ok" and event.offsets and event.group:
            for q, offset in event.offsets.items():
                commits_done[event.group, q].append((event.t_ns, offset))
        elif event.f == "committed" and event.type == "ok" and event.offsets:
            committed_reads.append((event, invoke_ns))
        elif event.f == "dump" and event.type == "ok":
            index.dumps.append(event)
        elif event.f == "role" and event.type == "ok":
            index.roles.append(event)
        elif event.f == "drained" and event.type == "ok":
            index.drain_complete = True
    _check_commits(commits_done, committed_reads, report)
    return index


def _index_send(
    index: _Index,
    event: Event,
    invoke_ns: int,
    sends_by_writer: dict[tuple[str, str], int],
    report: _Report,
) -> None:
    v = event.v
    if v is None:
        return
    if event.type == "fail":
        index.failed.add(v)
        return
    if event.type == "info":
        index.unknown.add(v)
        return
    if event.type != "ok" or event.q is None:
        return
    send = _Send(event.proc, event.q, v, invoke_ns, event.t_ns, event.off, event.node, event.epoch)
    index.acked[v] = send
    if event.off is None:
        return
    index.log[event.q].setdefault(event.off, set()).add(v)
    key = (event.proc, event.q)
    previous = sends_by_writer.get(key)
    if previous is not None and event.off <= previous:
        report.add(
            "nonmonotonic-send",
            f"{event.proc} acked {v} at {event.q}@{event.off} after an ack at @{previous}",
        )
    sends_by_writer[key] = event.off


def _index_reads(
    index: _Index,
    event: Event,
    last_poll: dict[tuple[str, str, int | None], int],
    report: _Report,
) -> None:
    assert event.reads is not None
    for q, messages in event.reads.items():
        previous: int | None = last_poll.get((event.proc, q, event.gen))
        first = True
        if event.f == "drain":
            index.drained.update(v for _, v in messages)
        for off, v in messages:
            index.log[q].setdefault(off, set()).add(v)
            index.reads[q].add(v)
            index.read_positions[q, off] += 1
            if previous is not None:
                where = f"{event.proc} gen {event.gen} read {q}@{off} after @{previous}"
                if off <= previous:
                    report.add("nonmonotonic-poll" if first else "int-nonmonotonic-poll", where)
                elif off > previous + 1:
                    report.add("poll-skip" if first else "int-poll-skip", where)
            previous = off
            first = False
        if previous is not None:
            last_poll[event.proc, q, event.gen] = previous


def _check_commits(
    commits_done: dict[tuple[str, str], list[tuple[int, int]]],
    committed_reads: list[tuple[Event, int]],
    report: _Report,
) -> None:
    """A group's stored position never goes below a commit acknowledged before it was read."""
    for key, commits in commits_done.items():
        highest = -1
        for _, offset in commits:
            if offset < highest:
                report.add("commit-regression", f"{key[0]} {key[1]}: commit {offset} < {highest}")
            highest = max(highest, offset)
    for event, invoke_ns in committed_reads:
        assert event.offsets is not None
        for q, offset in event.offsets.items():
            acked_before = [
                o for t, o in commits_done.get((event.group or "", q), []) if t < invoke_ns
            ]
            if acked_before and offset < max(acked_before):
                report.add(
                    "commit-regression",
                    f"{event.group} {q}: stored position {offset} after commit "
                    f"{max(acked_before)} was acknowledged",
                )


def _check_version_order(index: _Index, report: _Report) -> None:
    positions: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for q, offsets in index.log.items():
        for off in sorted(offsets):
            values = offsets[off]
            if len(values) > 1:
                report.add("inconsistent-offsets", f"{q}@{off} holds {sorted(values)}")
            for v in values:
                positions[v].append((q, off))
    for v, where in positions.items():
        if len(where) > 1:
            report.add("duplicated", f"{v} at {', '.join(f'{q}@{o}' for q, o in where)}")


def _check_reads(index: _Index, report: _Report) -> int:
    read_values: set[str] = set().union(*index.reads.values()) if index.reads else set()
    for v in sorted(read_values):
        if v not in index.attempts:
            report.add("unexpected", f"{v} was read but never sent")
        elif v in index.failed:
            report.add("aborted-read", f"{v} was read but its send failed")
    # with a complete final drain, what it did not find is gone, even if a consumer read it
    # before a failover truncated it away; without one, only what nobody ever read
    final = index.drained if index.drain_complete else read_values
    for v, send in sorted(index.acked.items()):
        if v not in final:
            where = f"{send.q}@{send.off}" if send.off is not None else send.q
            seen = (
                "read during the run, not by the final drain" if v in read_values else "never read"
            )
            report.add("lost", f"{v} acked by {send.node} at {where} was {seen}")
    return len(index.unknown & read_values)


def _check_replicas(index: _Index, report: _Report) -> None:
    by_group: dict[str, list[Event]] = defaultdict(list)
    for dump in index.dumps:
        by_group[dump.group or ""].append(dump)
        _check_epoch_list(dump, report)
    for group, dumps in by_group.items():
        tables = {
            dump.node or "?": {
                (q, off): (v, log_off)
                for q, entries in (dump.entries or {}).items()
                for off, v, log_off in entries
            }
            for dump in dumps
        }
        confirms = {dump.node or "?": dump.confirm or 0 for dump in dumps}
        diverged: set[tuple[str, int]] = set()
        missing: set[tuple[str, str, int]] = set()
        for a, b in itertools.permutations(tables, 2):
            bound = min(confirms[a], confirms[b])
            for position, (value, log_off) in tables[a].items():
                if log_off >= bound:
                    continue
                other = tables[b].get(position)
                if other is None:
                    if value != CORRUPT_VALUE and (b, *position) not in missing:
                        missing.add((b, *position))
                        report.add(
                            "lost-on-replica",
                            f"{group}: {b} lacks {position[0]}@{position[1]} ({value}, log "
                            f"offset {log_off} < confirm {confirms[b]}) that {a} holds",
                        )
                elif (other[0] != value or value == CORRUPT_VALUE) and position not in diverged:
                    diverged.add(position)
                    report.add(
                        "replica-divergence",
                        f"{group}: {position[0]}@{position[1]} is {value} on {a} and "
                        f"{other[0]} on {b} (below confirm {bound})",
                    )


def _check_epoch_list(dump: Event, report: _Report) -> None:
    epochs = dump.epochs or []
    for (epoch_a, start_a), (epoch_b, start_b) in itertools.pairwise(epochs):
        if epoch_b <= epoch_a or start_b < start_a:
            report.add(
                "epoch-regression",
                f"{dump.node}: epoch file has {epoch_a}@{start_a} then {epoch_b}@{start_b}",
            )


def _check_masters(index: _Index, report: _Report) -> None:
    last_epoch: dict[tuple[str, str], int] = {}  # (who observed, node) -> epoch
    masters: dict[tuple[str, int], set[str]] = defaultdict(set)
    for role in index.roles:
        if role.node is None or role.epoch is None:
            continue
        previous = last_epoch.get((role.proc, role.node))
        if previous is not None and role.epoch < previous:
            report.add(
                "epoch-regression",
                f"{role.node}: epoch {role.epoch} after {previous} ({role.proc})",
            )
        last_epoch[role.proc, role.node] = max(role.epoch, previous or role.epoch)
        if role.role == "master":
            masters[role.group or "", role.epoch].add(role.node)
    for (group, epoch), nodes in masters.items():
        if len(nodes) > 1:
            report.add("dual-master", f"{group}: {sorted(nodes)} all master at epoch {epoch}")
    _check_ack_interleaving(index, report)


_OBSERVE_LAG_NS: Final = 1_500_000_000
"""How late an observer may see a role change (it polls every second)."""


def _master_epochs(index: _Index) -> dict[str, list[tuple[int, int]]]:
    """Node -> [(time, epoch)] of every observation of it as master, in time order."""
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for role in index.roles:
        if role.role == "master" and role.node is not None and role.epoch is not None:
            seen[role.node].append((role.t_ns, role.epoch))
    for observations in seen.values():
        observations.sort()
    return seen


def _epoch_at(observations: list[tuple[int, int]], t_ns: int) -> int | None:
    """The newest master epoch seen for a node by `t_ns` plus the observers' lag."""
    epochs = [epoch for t, epoch in observations if t <= t_ns + _OBSERVE_LAG_NS]
    return max(epochs) if epochs else None


def _check_ack_interleaving(index: _Index, report: _Report) -> None:
    """A deposed master must not acknowledge after its successor did (same or older epoch).

    Acks of node A, then (strictly later) node B, then (strictly later) A again mean two
    masters took writes at once unless A came back with a newer epoch: the master epoch an
    observer saw for A by its second ack (allowing the observers' polling lag) is above the one
    seen for B by B's ack. Sends whose route moved while they ran name no node and are skipped.
    """
    epochs = _master_epochs(index)
    by_group: dict[str, list[_Send]] = defaultdict(list)
    for send in index.acked.values():
        if send.node is not None:
            by_group[send.q.split("/", 1)[0]].append(send)
    for group, sends in by_group.items():
        sends.sort(key=lambda s: s.complete_ns)
        current: _Send | None = None
        deposed: dict[str, tuple[int, _Send]] = {}  # node -> (time it was replaced, successor ack)
        for send in sends:
            assert send.node is not None
            if (
                current is not None
                and current.node is not None
                and send.node != current.node
                and send.invoke_ns > current.complete_ns
            ):
                deposed[current.node] = (send.complete_ns, send)
            replaced = deposed.get(send.node)
            if replaced is not None and send.invoke_ns > replaced[0]:
                successor = replaced[1]
                assert successor.node is not None
                mine = send.epoch or _epoch_at(epochs.get(send.node, []), send.complete_ns)
                theirs = successor.epoch or _epoch_at(
                    epochs.get(successor.node, []), successor.complete_ns
                )
                if mine is None or theirs is None or mine <= theirs:
                    report.add(
                        "dual-master",
                        f"{group}: {send.node} (epoch {mine}) acked {send.v} after "
                        f"{successor.node} (epoch {theirs}) acked {successor.v} as master",
                    )
                del deposed[send.node]
            current = send


def check(events: Iterable[Event]) -> Results:
    """Check a whole history; `valid` is False when any anomaly was found."""
    report = _Report()
    events = list(events)
    index = _index(events, report)
    _check_version_order(index, report)
    recovered = _check_reads(index, report)
    _check_replicas(index, report)
    _check_masters(index, report)
    connect_stats = check_connect(events, report.add)
    anomalies = {name: report.counts.get(name, 0) for name in ANOMALIES}
    reads_total = sum(index.read_positions.values())
    by_group = Counter(send.q.split("/", 1)[0] for send in index.acked.values())
    per_group = {f"acked@{g}": n for g, n in sorted(by_group.items())} if len(by_group) > 1 else {}
    return Results(
        valid=not any(anomalies.values()),
        anomalies=anomalies,
        examples={k: v for k, v in report.examples.items() if v},
        operations={f: dict(types) for f, types in sorted(index.operations.items())},
        faults=dict(sorted(index.faults.items())),
        stats={
            "acked": len(index.acked),
            "failed": len(index.failed),
            "unknown": len(index.unknown),
            "recovered": recovered,
            "read": reads_total,
            "redelivered": reads_total - len(index.read_positions),
            "drain_complete": int(index.drain_complete),
            **per_group,
            **connect_stats,
        },
    )
