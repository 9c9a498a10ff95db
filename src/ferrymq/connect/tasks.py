"""A worker's tasks: the assignment applied to the task runtime, and their states reported.

`TaskManager.reconcile` makes what runs here match the replayed state: the tasks the current
assignment gives this worker process (its worker id and its `run`, new at each start) run
(RUNNING connectors) or are held paused (PAUSED: the runtime stops the query and keeps its
checkpoint); everything else stops. A task restarts only when
something of its own changed: a new fencing generation (it moved here again), new task configs
(the connector was reconfigured: `task_generation`), or a restart request (`restarts`). So a
rebalance that moves other tasks, or a change to another connector, leaves it running. A task
given to an earlier process of this worker (another run) waits until the leader gives it to this
one under a new generation: the earlier process's orphans (a Spark driver JVM outliving its
Python) may still write under the old one, and the fence must tell them apart. A task given to no
run (a record from a leader of a version before runs, as in a rolling upgrade) runs on whichever
process of its worker reads it; a leader that knows runs gives it again once under a new
generation and this run.

Once a reconcile has stopped what the assignment took away, the manager's `applied_generation`
moves to that assignment's generation; the worker's heartbeat publishes it, and the leader gives
revoked tasks to their new worker only after that (`assignment.rebalance`).

A task that fails stays FAILED (with its trace) until a restart request, as in Kafka Connect.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferrymq.connect.records import OffsetsPut, TargetState
from ferrymq.connect.state import CONNECTOR_RESTART, ConfigState, TaskKey
from ferrymq.connect.status import TaskState, TaskStatus

__all__ = ["TaskManager", "TaskRunner", "TaskSpec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a task's run depends on; a change of any field restarts the task."""

    key: TaskKey
    generation: int
    """The fencing generation (the assignment that gave the task to this worker)."""
    task_generation: int
    restarts: int
    connector_config: dict[str, str]
    task_config: dict[str, str]
    offsets: OffsetsPut | None


class TaskRunner(Protocol):
    """Runs tasks (the data path: one Spark streaming query per task)."""

    async def start(self, spec: TaskSpec) -> str:
        """Start a task; returns its run id.

        Raises:
            Exception: it could not start (the task is reported FAILED with the trace).
        """

    async def stop(self, key: TaskKey) -> None:
        """Stop a task (its checkpoint stays)."""

    async def refresh(self) -> None:
        """Read every run's state and progress now (what `failure` and `metrics` return)."""

    def failure(self, key: TaskKey) -> str | None:
        """The trace of a task whose run ended by itself; None while it runs."""

    def metrics(self, key: TaskKey) -> dict[str, Any]:
        """The run's progress figures (batch id, rows/s, lag)."""


@dataclass(slots=True)
class _Run:
    spec: TaskSpec
    state: TaskState
    run_id: str = ""
    trace: str | None = None
    starts: int = 0


@dataclass(slots=True)
class TaskManager:
    """The tasks of this worker."""

    worker_id: str
    runner: TaskRunner
    report: Callable[[TaskStatus], None]
    """Called with every state change (and by `republish`)."""
    wall_ms: Callable[[], int]
    run: str
    """This worker process's run id (random at each start; the member data carries it)."""
    runs: dict[TaskKey, _Run] = field(default_factory=dict)
    applied_generation: int = 0
    fenced: bool = False
    """Set while the worker is out of its group: every task is stopped."""

    def _status(self, run: _Run) -> TaskStatus:
        connector, incarnation, task = run.spec.key
        return TaskStatus(
            connector=connector,
            incarnation=incarnation,
            task=task,
            state=run.state,
            worker_id=self.worker_id,
            generation=run.spec.generation,
            updated_ms=self.wall_ms(),
            run_id=run.run_id,
            starts=run.starts,
            trace=run.trace,
            metrics=self.runner.metrics(run.spec.key) if run.state is TaskState.RUNNING else {},
        )

    def _set(self, run: _Run, state: TaskState, trace: str | None = None) -> None:
        run.state = state
        run.trace = trace
        self.report(self._status(run))

    def wanted(self, state: ConfigState) -> dict[TaskKey, tuple[TaskSpec, TargetState]]:
        """The tasks this worker should hold now, with their connector's target state."""
        if self.fenced:
            return {}
        wanted: dict[TaskKey, tuple[TaskSpec, TargetState]] = {}
        for assigned in state.tasks_of(self.worker_id):
            connector = state.connectors.get(assigned.connector)
            if (
                assigned.run not in ("", self.run)
                or connector is None
                or connector.incarnation != assigned.incarnation
                or connector.target is TargetState.STOPPED
                or not 0 <= assigned.task < len(connector.tasks)
            ):
                continue
            key = (assigned.connector, assigned.incarnation, assigned.task)
            restarts = connector.restarts.get(assigned.task, 0) + connector.restarts.get(
                CONNECTOR_RESTART, 0
            )
            spec = TaskSpec(
                key=key,
                generation=assigned.since,
                task_generation=connector.task_generation,
                restarts=restarts,
                connector_config=dict(connector.config),
                task_config=dict(connector.tasks[assigned.task]),
                offsets=connector.offsets,
            )
            wanted[key] = (spec, connector.target)
        return wanted

    async def reconcile(self, state: ConfigState) -> None:
        """Make the runs match `state` (a snapshot taken now: the state may move meanwhile)."""
        generation = state.assignment.generation
        wanted = self.wanted(state)
        for key in [k for k in self.runs if k not in wanted]:
            if self.runs.pop(key).state is TaskState.RUNNING:
                await self._stop(key)
                log.info("task %s/%d stopped: no longer this worker's to run", key[0], key[2])
        for key, (spec, target) in wanted.items():
            if target is TargetState.PAUSED:
                await self._hold_paused(key, spec)
            else:
                await self._keep_running(key, spec)
        self.applied_generation = max(self.applied_generation, generation)

    async def _hold_paused(self, key: TaskKey, spec: TaskSpec) -> None:
        held = self.runs.get(key)
        if held is None:
            held = self.runs[key] = _Run(spec, TaskState.PAUSED)
            self.report(self._status(held))
        elif held.state is not TaskState.PAUSED:
            if held.state is TaskState.RUNNING:
                await self._stop(key)
            held.spec = spec
            self._set(held, TaskState.PAUSED)

    async def _keep_running(self, key: TaskKey, spec: TaskSpec) -> None:
        held = self.runs.get(key)
        if held is not None and held.spec == spec and held.state is not TaskState.PAUSED:
            return  # unchanged: running, or failed until someone restarts it
        if held is not None and held.state is TaskState.RUNNING:
            self._set(held, TaskState.RESTARTING)
            await self._stop(key)
        if held is None or held.spec.generation != spec.generation:
            held = self.runs[key] = _Run(spec, TaskState.UNASSIGNED)
        held.spec = spec
        await self._start(held)

    async def _start(self, run: _Run) -> None:
        run.starts += 1
        try:
            run.run_id = await self.runner.start(run.spec)
        except Exception:
            log.exception("task %s/%d failed to start", run.spec.key[0], run.spec.key[2])
            run.run_id = ""
            self._set(run, TaskState.FAILED, traceback.format_exc())
            return
        self._set(run, TaskState.RUNNING)

    async def _stop(self, key: TaskKey) -> None:
        try:
            await self.runner.stop(key)
        except Exception:
            log.exception("task %s/%d did not stop cleanly", key[0], key[2])

    async def poll(self) -> None:
        """Report runs that ended by themselves (a query that failed) as FAILED."""
        if not self.runs:
            return
        await self.runner.refresh()
        for key, run in self.runs.items():
            if run.state is TaskState.RUNNING:
                trace = self.runner.failure(key)
                if trace is not None:
                    self._set(run, TaskState.FAILED, trace)

    def republish(self) -> None:
        """Report every held task's state again (the status topic is not compacted)."""
        for run in self.runs.values():
            self.report(self._status(run))

    async def stop_all(self) -> None:
        """Stop every task: the worker lost its place in the group (or is shutting down)."""
        for key, run in list(self.runs.items()):
            if run.state is TaskState.RUNNING:
                await self._stop(key)
        self.runs.clear()
