"""Sticky task assignment with generations (pure): the leader's rebalance decision.

Kafka Connect's incremental cooperative assignor (KIP-415) in the form of one function over the
replayed state and the live members, so the leader decides and the log applies:

1. A task stays on its worker while that worker is live, or absent for less than the lost-work
   grace (a restarting worker gets its tasks back: nothing moves). Only moved tasks restart.
2. Tasks of a worker absent past the grace, and new tasks, go to the least loaded live worker
   (then the one with fewest tasks of the same connector, then by id).
3. When live workers' loads differ by more than one, tasks move from the most to the least
   loaded, in two generations: the first revokes them (they run nowhere, listed in `revoking`),
   the second gives them to their new worker once the old one has applied the revoking
   generation (it stopped them) or is gone. So a task never runs on two live workers at once.
4. A task's `since` is the generation that gave it to its worker: its fencing generation (a
   later owner's is always higher). The result is None when nothing changes: a burst of config
   changes that moves nothing writes no assignment record.
5. A task also names the worker *process* it was given to (`run`, new at each process start).
   A kept task whose worker is live under another run is given again to that same worker with
   the new generation and run: a worker killed and restarted within the grace gets its tasks
   back (nothing moves) but never under the generation its previous process had, which an
   orphan of that process (a Spark driver JVM outliving its Python) may still write under.
   Tasks of records written before runs existed carry an empty run, which no live worker has
   (every process has one): they are given again once. A worker that reports no run (an older
   version) never causes a re-issue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Final

import msgspec

from ferrymq.connect.records import AssignedTask, Assignment
from ferrymq.connect.state import TaskKey

__all__ = ["rebalance"]

_NO_RUNS: Final[Mapping[str, str]] = MappingProxyType({})


def _key(task: AssignedTask) -> TaskKey:
    return (task.connector, task.incarnation, task.task)


def rebalance(
    current: Assignment,
    wanted: Collection[TaskKey],
    live: Mapping[str, int],
    expired: Collection[str],
    epoch: int,
    *,
    runs: Mapping[str, str] = _NO_RUNS,
) -> Assignment | None:
    """The next assignment, or None when the current one stands.

    Args:
        current: the assignment in force.
        wanted: every task that should run (RUNNING and PAUSED connectors' tasks).
        live: live worker id -> the assignment generation it has applied.
        expired: workers absent for longer than the lost-work grace.
        epoch: the leader's epoch (recorded in the assignment).
        runs: live worker id -> its process's run id (missing or empty: not known).
    """
    wanted_set = set(wanted)
    generation = current.generation + 1
    kept: dict[TaskKey, AssignedTask] = {}
    for task in current.tasks:
        key = _key(task)
        if key in wanted_set and task.worker_id not in expired:
            run = runs.get(task.worker_id, "") if task.worker_id in live else ""
            if run and run != task.run:  # its worker restarted: same worker, a new generation
                kept[key] = msgspec.structs.replace(task, since=generation, run=run)
            else:
                kept[key] = task
    # revocations of the current generation wait for their old worker to stop them
    waiting: list[AssignedTask] = [
        task
        for task in current.revoking
        if _key(task) in wanted_set
        and _key(task) not in kept
        and task.worker_id in live
        and live[task.worker_id] < current.generation
    ]
    blocked = {_key(t) for t in waiting}
    pool = sorted(k for k in wanted_set if k not in kept and k not in blocked)
    if not live:
        tasks = sorted(kept.values(), key=_key)
        return _changed(current, generation, epoch, tasks, waiting)
    load: Counter[str] = Counter(dict.fromkeys(live, 0))
    per_connector: Counter[tuple[str, str]] = Counter()
    for task in kept.values():
        if task.worker_id in load:
            load[task.worker_id] += 1
        per_connector[(task.worker_id, task.connector)] += 1
    for key in pool:
        worker = min(live, key=lambda w: (load[w], per_connector[(w, key[0])], w))
        kept[key] = AssignedTask(key[0], key[1], key[2], worker, generation, runs.get(worker, ""))
        load[worker] += 1
        per_connector[(worker, key[0])] += 1
    revoking = list(waiting)
    if not revoking:
        revoking = _revocations(kept, load)
        for task in revoking:
            del kept[_key(task)]
    tasks = sorted(kept.values(), key=_key)
    return _changed(current, generation, epoch, tasks, revoking)


def _revocations(kept: Mapping[TaskKey, AssignedTask], load: Counter[str]) -> list[AssignedTask]:
    """Tasks to take from overloaded live workers so loads end within one of each other."""
    loads = dict(load)
    by_worker: dict[str, list[AssignedTask]] = {}
    for task in sorted(kept.values(), key=_key, reverse=True):
        if task.worker_id in loads:
            by_worker.setdefault(task.worker_id, []).append(task)
    revoked: list[AssignedTask] = []
    while True:
        most = max(loads, key=lambda w: (loads[w], w))
        least = min(loads, key=lambda w: (loads[w], w))
        if loads[most] - loads[least] <= 1 or not by_worker.get(most):
            return revoked
        revoked.append(by_worker[most].pop(0))
        loads[most] -= 1
        loads[least] += 1  # it will get one once the revocation is applied


def _changed(
    current: Assignment,
    generation: int,
    epoch: int,
    tasks: list[AssignedTask],
    revoking: list[AssignedTask],
) -> Assignment | None:
    if tasks == sorted(current.tasks, key=_key) and sorted(revoking, key=_key) == sorted(
        current.revoking, key=_key
    ):
        return None
    return Assignment(
        generation=generation, epoch=epoch, tasks=tasks, revoking=sorted(revoking, key=_key)
    )
