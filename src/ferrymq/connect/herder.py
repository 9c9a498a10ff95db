"""The worker's core: leadership by a fenced claim, the leader's writes, assignment, tasks.

Seed 002 leaves leader election open (a static `isLeader` flag there). Here it is solved where
the write happens (ARCHITECTURE.md section 8, reference/connect-anchors.md section 5):

- **Claim.** When the leader the log names has been absent from the group for
  `leaderFailoverGraceMs` (or the log names none), the first live worker by id appends a claim
  for epoch + 1; the broker accepts a claim only as current + 1 (compare-and-set), so racing
  claims leave exactly one per epoch, and the loser learns the winner from the refusal. A
  worker leads once its own claim, made by this process, is applied from the log; it then
  writes a snapshot (retention's live tail starts there).
- **Fenced writes.** Every record the leader writes carries its (epoch, worker id); the broker
  refuses any other, so a leader that was paused and resumes after another claimed is refused,
  steps down, and its request is forwarded to the new leader (nothing was stored).
- **Writes** are decided on the replayed state under one lock (`decide.py`), appended, and
  answered once the record is committed and applied here (`ConfigLog.wait_for`): a 2xx means
  every SyncStateSet member has it. An append whose outcome is unknown is a 504, never a
  failure.
- **Assignment.** After any change (a write, a member joining or leaving, a revocation done) the
  leader recomputes the sticky assignment (`assignment.rebalance`), coalescing a burst of
  changes into one record. Tasks of a departed worker move after `taskReassignGraceMs`; the
  grace restarts at a leader change and at a broker master change.
- **Tasks.** Every worker applies the assignment to its runtime (`TaskManager`); one that
  cannot heartbeat for `sessionTimeoutMs` stops its tasks until it is back in the group. Its
  heartbeat carries its process's run id; a member whose run changed (a restart, however quick)
  makes the leader rebalance as a join does, and the rebalance gives its tasks to the new run
  under a new generation.

Crash points for tests (`FERRYMQ_TEST_CRASH_AT=<point>`, honoured only with
`FERRYMQ_TEST_HOOKS=1`): `after_append_before_ack` (the record is committed; the worker dies
before it applied it or answered the caller) and `after_ack_before_apply` (the caller has its
answer; the worker dies before it acted on the change: no assignment written, no task touched).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedTopicWriter
from ferrymq.client.membership import GroupMembership
from ferrymq.connect.assignment import rebalance
from ferrymq.connect.config import WorkerConfig
from ferrymq.connect.configlog import ConfigLog
from ferrymq.connect.errors import (
    ConnectRestError,
    NotLeaderError,
    NotWrittenError,
    OutcomeUnknownError,
)
from ferrymq.connect.membership import MemberData, MemberView, encode_member_data
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.records import (
    Assignment,
    Claim,
    ConnectorPut,
    Record,
    Snapshot,
    TargetState,
    encode_record,
    fence_op,
)
from ferrymq.connect.state import ConfigState
from ferrymq.connect.statuslog import StatusLog
from ferrymq.connect.tasks import TaskManager
from ferrymq.errors import FencedError, FerryError, SendFailedError, SendOutcomeUnknownError

__all__ = ["CRASH_POINTS", "Herder", "WriteResult", "crash_point"]

log = logging.getLogger(__name__)

CRASH_POINTS: Final = ("after_append_before_ack", "after_ack_before_apply")
_HOOKS: Final = os.environ.get("FERRYMQ_TEST_HOOKS") == "1"
_CRASH_AT: Final = os.environ.get("FERRYMQ_TEST_CRASH_AT", "")
_COALESCE_S: Final = 0.05
"""How long the leader waits after a change for more before it recomputes the assignment."""
_COALESCE_MAX_S: Final = 1.0
"""The longest a stream of changes may put the assignment off."""
_READ_BARRIER_S: Final = 5.0
"""How long a refused write waits for the config log to be read to its end before saying retry."""


def crash_point(name: str) -> None:
    """Die here (exit 137, as kill -9) when the test hooks ask for this point."""
    if _HOOKS and name == _CRASH_AT:
        log.warning("test crash point %s reached: exiting", name)
        os._exit(137)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """A committed and applied write: its record and the config offset after it."""

    record: Record
    config_offset: int


class Herder:
    """One worker's view of the cluster and, while it leads, the cluster's one writer."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        worker_id: str,
        url: str,
        plugins: Plugins,
        tasks: TaskManager,
        status: StatusLog,
        consumer: PullConsumer,
        writer: FencedTopicWriter,
        membership: GroupMembership,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.url = url
        self.plugins = plugins
        self.tasks = tasks
        self.status = status
        self.state = ConfigState()
        self.log = ConfigLog(
            consumer,
            config.config_store_topic,
            self.state,
            live_start=self._live_start,
            on_applied=self._applied,
        )
        self.view = MemberView()
        self._writer = writer
        self._membership = membership
        self._clock = clock
        self._claims: set[int] = set()
        """Epochs this process claimed (a worker restarted under the same id claims anew)."""
        self._claiming = False
        self._leading_epoch = 0
        """The epoch this process leads, once its claim is applied and its snapshot written."""
        self._refused_at_epoch = 0
        """A refusal named a newer epoch than the log has shown yet: not the leader meanwhile."""
        self._fence_hint: tuple[str, str] = ("", "")
        self._write_lock = asyncio.Lock()
        self._rebalance_wanted = asyncio.Event()
        self._changed = asyncio.Event()
        self._last_snapshot = 0.0
        self.broker_unreachable_since: float | None = None

    # ------------------------------------------------------------------ views

    def now(self) -> float:
        """The herder's clock (monotonic seconds)."""
        return self._clock()

    @property
    def is_leader(self) -> bool:
        """Whether this process leads (its claim is applied and it was not refused since)."""
        return (
            self._leading_epoch != 0
            and self.state.epoch == self._leading_epoch
            and self.state.leader_id == self.worker_id
            and self._refused_at_epoch <= self._leading_epoch
        )

    def leader(self) -> tuple[str, str]:
        """(worker id, URL) of the leader as far as this worker knows; empty when none."""
        if self.is_leader:
            return self.worker_id, self.url
        if self._refused_at_epoch > self.state.epoch:
            return self._fence_hint
        if self.state.leader_id == self.worker_id:
            return "", ""  # a claim of an earlier life of this worker: it leads no more
        return self.state.leader_id, self.state.leader_url

    async def _live_start(self) -> int:
        return (await self._writer.holder()).live_start_offset

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        """Every loop of the worker, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.log.run(), name="config-log")
            group.create_task(self.status.send_forever(), name="status-send")
            group.create_task(self.status.follow_forever(), name="status-follow")
            group.create_task(self._membership_loop(), name="membership")
            group.create_task(self._leader_loop(), name="leader")
            group.create_task(self._task_loop(), name="tasks")

    def _applied(self, record: Record, _logical: int) -> None:
        self._changed.set()
        if not isinstance(record, Assignment):
            self._rebalance_wanted.set()

    # ------------------------------------------------------------------ membership and claims

    async def _membership_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while True:
            await self._membership_round()
            leader_id, _ = self.leader()
            absent = not leader_id or leader_id not in self.view.members
            await asyncio.sleep(min(interval, 0.2) if absent else interval)

    async def _membership_round(self) -> None:
        now = self._clock()
        data = MemberData(
            url=self.url,
            offset=self.log.config_offset,
            gen=self.tasks.applied_generation,
            run=self.tasks.run,
        )
        try:
            await self._membership.heartbeat(
                self.worker_id, encode_member_data(data), self.config.session_timeout_ms
            )
            members = await self._membership.members()
        except (FerryError, OSError) as exc:
            if self.broker_unreachable_since is None:
                self.broker_unreachable_since = now
                log.warning("heartbeat to the config broker failed: %s", exc)
            lost = self.view.heartbeat_lost(now, self.config.session_timeout_ms / 1000)
            if lost and not self.tasks.fenced:
                log.error(
                    "no heartbeat for %d ms: out of the group; stopping this worker's tasks",
                    self.config.session_timeout_ms,
                )
                self.tasks.fenced = True
                self._changed.set()
            return
        self.broker_unreachable_since = None
        self.view.heartbeat_ok(now)
        if self.tasks.fenced:
            log.info("back in the group: tasks follow the assignment again")
            self.tasks.fenced = False
            self._changed.set()
        before = {worker: data.run for worker, data in self.view.members.items()}
        self.view.observe(
            [(m.client_id, m.member_data) for m in members.members],
            members.broker_addr,
            members.master_since_ms / 1000,
            now,
            grace_s=self.config.leader_failover_grace_ms / 1000,
        )
        self.view.expect(
            [self.state.leader_id, *(t.worker_id for t in self.state.assignment.tasks)], now
        )
        after = {worker: data.run for worker, data in self.view.members.items()}
        if after != before or self.state.assignment.revoking:  # a join, a leave or a restart
            self._rebalance_wanted.set()
        if self.is_leader:
            self._rebalance_wanted.set()  # lost work whose grace ran out moves now
        self._maybe_claim(now)

    def _maybe_claim(self, now: float) -> None:
        if self._claiming or not self.log.replayed or self.is_leader:
            return
        state = self.state
        if self._refused_at_epoch > state.epoch:
            return  # a refusal named a newer claim than this worker has read: read it first
        if state.leader_id == self.worker_id and state.epoch in self._claims:
            if self._leading_epoch != state.epoch:  # our claim landed though its answer did not
                self._spawn(self._lead_once(state.epoch))
            return
        leader = state.leader_id
        if leader and leader != self.worker_id:
            if leader in self.view.members:
                return
            if self.view.absent_for(leader, now) < self.config.leader_failover_grace_ms / 1000:
                return
            candidates = sorted({*self.view.members, self.worker_id})
            if candidates[0] != self.worker_id:
                return
        elif not leader:  # an empty log: the first live worker by id claims epoch 1
            candidates = sorted({*self.view.members, self.worker_id})
            if candidates[0] != self.worker_id:
                return
        # else: the log names an earlier life of this worker: it claims at once
        self._spawn(self._claim(max(state.epoch, self._refused_at_epoch) + 1))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(_log_failure)

    async def _claim(self, epoch: int) -> None:
        self._claiming = True
        try:
            self._claims.add(epoch)
            claim = Claim(epoch=epoch, worker_id=self.worker_id, url=self.url)
            try:
                appended = await self._writer.append(
                    encode_record(claim),
                    op="claim",
                    epoch=epoch,
                    writer=self.worker_id,
                    url=self.url,
                )
            except FencedError as exc:
                if exc.writer == self.worker_id and exc.epoch in self._claims:
                    # an earlier try of ours landed (its answer was lost): lead once it is read
                    log.info("claim of epoch %d: ours already holds it", exc.epoch)
                    return
                self._refused(exc)
                log.info("claim of epoch %d refused: %s", epoch, exc)
                return
            except (SendOutcomeUnknownError, FerryError, OSError) as exc:
                log.warning(
                    "claim of epoch %d: outcome unknown (%s); the log will tell", epoch, exc
                )
                return
            log.info("claimed epoch %d (config offset %d)", epoch, appended.queue_offset)
            if await self.log.wait_for(appended.queue_offset + 1, self._timeout_s):
                await self._lead(epoch)
        finally:
            self._claiming = False

    async def _lead_once(self, epoch: int) -> None:
        self._claiming = True
        try:
            await self._lead(epoch)
        finally:
            self._claiming = False

    async def _lead(self, epoch: int) -> None:
        """Our claim of `epoch` is applied: write the snapshot, then serve as the leader."""
        if self.state.epoch != epoch or self.state.leader_id != self.worker_id:
            return
        async with self._write_lock:
            try:
                await self._append(Snapshot(self.state.image()), epoch)
            except (NotLeaderError, NotWrittenError, OutcomeUnknownError) as exc:
                log.warning("epoch %d: the first snapshot was not written (%s)", epoch, exc)
                return
            self._leading_epoch = epoch
            self._last_snapshot = self._clock()
        now = self._clock()
        for task in self.state.assignment.tasks:  # lost-work grace starts at a leader change
            if task.worker_id not in self.view.members:
                self.view.absent_since[task.worker_id] = now
        log.info("leading the cluster at epoch %d", epoch)
        self._rebalance_wanted.set()

    def _refused(self, exc: FencedError) -> None:
        if exc.epoch > self._refused_at_epoch:
            self._refused_at_epoch = exc.epoch
            self._fence_hint = (exc.writer, exc.url)
        if self._leading_epoch and exc.epoch > self._leading_epoch:
            log.warning(
                "fenced: epoch %d of %s (%s) replaces ours (%d); stepping down",
                exc.epoch,
                exc.writer,
                exc.url,
                self._leading_epoch,
            )
            self._leading_epoch = 0
            self._changed.set()

    # ------------------------------------------------------------------ writes

    @property
    def _timeout_s(self) -> float:
        return self.config.rest_request_timeout_ms / 1000

    async def _append(self, record: Record, epoch: int, *, hooked: bool = False) -> int:
        """Append one record as `epoch`'s writer; returns the config offset after it, applied.

        Raises:
            NotLeaderError: the broker refused it (nothing stored).
            OutcomeUnknownError: it may have been stored.
        """
        op = fence_op(record)
        try:
            appended = await asyncio.wait_for(
                self._writer.append(
                    encode_record(record),
                    op=cast(Literal["claim", "snapshot", "write"], op),
                    epoch=epoch,
                    writer=self.worker_id,
                    url=self.url if op != "write" else None,
                ),
                self._timeout_s,
            )
        except FencedError as exc:
            self._refused(exc)
            raise NotLeaderError(exc.writer, exc.url, "this worker's epoch was fenced") from None
        except (TimeoutError, SendOutcomeUnknownError) as exc:
            raise OutcomeUnknownError(
                f"the config record may or may not be stored ({exc}); GET to check"
            ) from None
        except SendFailedError as exc:  # refused before anything was stored
            raise NotWrittenError(f"nothing was written: {exc}; retry") from None
        except (FerryError, OSError) as exc:
            raise OutcomeUnknownError(
                f"the config record may or may not be stored ({exc}); GET to check"
            ) from None
        if hooked:
            crash_point("after_append_before_ack")
        offset = appended.queue_offset + 1
        if not await self.log.wait_for(offset, self._timeout_s):
            raise OutcomeUnknownError(
                f"the config record is committed at offset {appended.queue_offset} but this "
                f"worker has not read it back within {self._timeout_s:g} s; GET to check"
            )
        return offset

    async def write(
        self, decide_record: Callable[[ConfigState], Record | None], *, hooked: bool = False
    ) -> WriteResult | None:
        """Decide on the current state and write the record (None: nothing to write).

        `hooked`: a client's write, where the test crash points apply.

        Raises:
            NotLeaderError: this worker does not lead (nothing written).
            ConnectRestError: the decision refused the request.
            OutcomeUnknownError: the record may or may not be stored.
        """
        async with self._write_lock:
            if not self.is_leader:
                leader_id, leader_url = self.leader()
                raise NotLeaderError(leader_id, leader_url)
            try:
                record = decide_record(self.state)
            except NotLeaderError:
                raise
            except ConnectRestError:
                # A refusal (404, 409) read off this worker's state, which the fenced append
                # never checks: a leader cut off for a while may not have read a newer leader's
                # records (a chaos run saw a healed old leader answer 404 for a connector created
                # meanwhile). Read the log to its end, then decide again, or hand over.
                await self._read_barrier()
                leader_id, leader_url = self.leader()
                if leader_id != self.worker_id:  # a newer leader's claim was among them
                    raise NotLeaderError(leader_id, leader_url) from None
                record = decide_record(self.state)
            if record is None:
                return None
            offset = await self._append(record, self._leading_epoch, hooked=hooked)
            return WriteResult(record, offset)

    async def _read_barrier(self) -> None:
        """Apply every record the config log holds now (a refusal then rests on the latest state).

        Raises:
            NotLeaderError: the log's end cannot be read or reached in time (nothing written).
        """
        try:
            end = await self.log.end_offset()
        except FerryError as exc:
            raise NotLeaderError("", "", f"cannot read the config log's end ({exc})") from None
        if not await self.log.wait_for(end, _READ_BARRIER_S):
            raise NotLeaderError("", "", "the config log is not read to its end yet")

    def after_write(self) -> None:
        """The caller has its answer: act on the change (the second crash point is here)."""
        crash_point("after_ack_before_apply")
        self._rebalance_wanted.set()
        self._changed.set()

    # ------------------------------------------------------------------ leader duties

    async def _leader_loop(self) -> None:
        snapshot_every = self.config.snapshot_interval_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rebalance_wanted.wait(), timeout=1.0)
            if not self.is_leader:
                self._rebalance_wanted.clear()
                continue
            await self._quiet()  # a burst of writes makes one assignment
            self._rebalance_wanted.clear()
            try:
                await self._rebalance()
                if self._clock() - self._last_snapshot >= snapshot_every:
                    await self._snapshot()
            except (NotLeaderError, NotWrittenError, OutcomeUnknownError) as exc:
                log.warning("leader duty not done: %s", exc)

    async def _quiet(self) -> None:
        """Wait until no change came for `_COALESCE_S` (at most `_COALESCE_MAX_S` in all)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _COALESCE_MAX_S
        while True:
            self._rebalance_wanted.clear()
            await asyncio.sleep(_COALESCE_S)
            if not self._rebalance_wanted.is_set() or loop.time() >= give_up:
                return

    async def _rebalance(self) -> None:
        def decide_assignment(state: ConfigState) -> Assignment | None:
            now = self._clock()
            grace = self.config.task_reassign_grace_ms / 1000
            live = {worker: data.gen for worker, data in self.view.members.items()}
            runs = {worker: data.run for worker, data in self.view.members.items()}
            expired = {
                t.worker_id
                for t in state.assignment.tasks
                if t.worker_id not in live and self.view.absent_for(t.worker_id, now) >= grace
            }
            return rebalance(
                state.assignment, state.wanted_tasks(), live, expired, state.epoch, runs=runs
            )

        result = await self.write(decide_assignment)
        if result is not None:
            assert isinstance(result.record, Assignment)
            log.info(
                "assignment generation %d: %d tasks, %d being revoked",
                result.record.generation,
                len(result.record.tasks),
                len(result.record.revoking),
            )

    async def _snapshot(self) -> None:
        await self.write(lambda state: Snapshot(state.image()))
        self._last_snapshot = self._clock()

    # ------------------------------------------------------------------ tasks

    async def _task_loop(self) -> None:
        republish_every = self.config.status_republish_ms / 1000
        last_republish = self._clock()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=1.0)
            self._changed.clear()
            if self.log.replayed:
                await self.tasks.reconcile(self.state)
            await self.tasks.poll()
            if self._clock() - last_republish >= republish_every:
                last_republish = self._clock()
                self.tasks.republish()

    # ------------------------------------------------------------------ reads

    def failed_tasks(self, name: str) -> tuple[set[int], bool]:
        """(task indexes reported FAILED, whether the connector failed) for a restart."""
        connector = self.state.connectors.get(name)
        if connector is None:
            return set(), False
        failed = {
            key[2]
            for key in connector.task_keys()
            if (status := self.status.table.get(key)) is not None and status.state.value == "FAILED"
        }
        return failed, False

    def connector_state(self, name: str) -> str:
        """The connector instance's state: its target state (the leader holds the instance)."""
        connector = self.state.connectors[name]
        return {
            TargetState.RUNNING: "RUNNING",
            TargetState.PAUSED: "PAUSED",
            TargetState.STOPPED: "STOPPED",
        }[connector.target]

    def created(self, result: WriteResult) -> bool:
        """Whether a write created its connector."""
        return isinstance(result.record, ConnectorPut) and result.record.target is not None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background step failed", exc_info=task.exception())
