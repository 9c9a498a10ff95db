"""A controller node: the asyncio shell around the pure core, on top of a Raft driver.

Spec: reference/rocketmq-controller-spec.md sections 1.3 (request pattern), 1.7 (liveness and
election triggers, notifications); ARCHITECTURE.md section 6 items 4 and 6.

How a request flows on the leader:
```
handler -> job queue (one worker) -> decide(request, view, now) -> propose(events) -> applied
        <- response <------------------------------------------------ (every node applied them)
```
Rules:
1. Decisions are serialized through one bounded queue and one worker, so each is made against
   the state every earlier decision left. The worker takes what is queued (up to `_MAX_BATCH`),
   decides it in order against an overlay of the state with the batch's earlier events applied,
   and replicates the batch's events as one log entry: one Raft round trip and one fsync for
   many requests. A full queue answers SYSTEM_BUSY.
2. A node serves only as a leader that has applied a barrier entry of its own term (so its state
   holds every committed entry). Anything else answers CONTROLLER_NOT_LEADER (2007) naming the
   leader, in the remark and in `controllerLeaderId`/`controllerLeaderAddress` ext fields.
   GET_METADATA_INFO, GET_CONTROLLER_CONFIG and BROKER_HEARTBEAT are answered by every node
   (heartbeats are recorded everywhere, so a new leader starts with a warm table, but only the
   leader's answer renews a master's lease).
3. Reads go through the queue after a ReadIndex, so they are linearizable.
4. If an event's compare-and-set fails at apply (possible only across a leader change), that
   request answers SYSTEM_BUSY and nothing of it was applied; its sender retries.
5. Liveness is acted on only by the serving leader: a scan every `scanNotActiveBrokerInterval`,
   at once when a broker's connection closes, and again when a closed master's lease runs out.
6. After a successful election the leader pushes NOTIFY_BROKER_ROLE_CHANGED (oneway, best effort;
   a newer notification to an address replaces an unsent older one) to the group's live brokers.
   A node that starts serving as leader pushes every group's master to all of the group's
   registered brokers (it has not heard them yet): an election its predecessor committed but did
   not announce before it died reaches them now, not at their next poll; brokers already acting
   on it ignore it (the epoch is not newer).
7. Topics are controller state (issue 20 section 3, `controller.topics`). After an entry with a
   topic change is applied, the leader pushes NOTIFY_TOPICS_CHANGED (oneway, best effort) with
   the new topic version to every live broker; heartbeat answers carry the version too, so a
   broker that missed the push learns of the change at its next heartbeat.
8. Moving queues (issue 20 section 4, `wire.queuemap`): the serving leader drives every move
   the state holds to its end, from the state alone (so a new leader resumes what its
   predecessor started): SEAL_QUEUE to the source group's master until it answers the end
   offset (it answers only once its table seals the queue and everything below is committed),
   then FinishMove (compare-and-set on the move's start version). Retried every
   `_MOVE_RETRY_S` while the source has no master or answers not yet.

9. ACL 2.0 users and ACLs are controller state (issue 23, `controller.auth`): the admin codes
   3001-3010 are decided like topic requests; heartbeat answers carry the auth version, and a
   broker behind it reads the whole state (CONTROLLER_GET_AUTH). A node that starts serving
   creates its `initAuthenticationUser` (a Super user) when the state has no user of its name.

Crash points for tests (`FERRYMQ_TEST_CRASH_AT=<point>`, honoured only with
`FERRYMQ_TEST_HOOKS=1`; see `MOVE_CRASH_POINTS`): `move_started_before_reply` (a reassign's
start is applied, the admin not answered), `move_started_before_seal` (the leader is about to
ask the source to seal), `move_sealed_before_finish` (the leader has the end offset and has not
proposed FinishMove), `move_finished_before_reply` (FinishMove applied, not yet acted on).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from ferrymq import clock as process_clock
from ferrymq.config import ConfigError, parse_properties
from ferrymq.controller.auth import AuthCommand, GetAuth
from ferrymq.controller.config import (
    INT32_MAX,
    ControllerConfig,
    apply_overrides,
    config_properties,
)
from ferrymq.controller.decide import (
    AlterSyncStateSet,
    ControllerRequest,
    Decision,
    GetSyncStateData,
    UpdateControllerConfig,
    View,
    decide,
    groups_to_elect,
)
from ferrymq.controller.liveness import BrokerKey, BrokerLiveInfo, Liveness
from ferrymq.controller.state import ControllerState
from ferrymq.controller.topics import (
    DeleteTopic,
    FinishMove,
    GetGroupTopics,
    GetTopics,
    ReassignQueues,
    UpdateTopic,
    moving_queues,
)
from ferrymq.errors import FerryError, ProtocolError, RequestError
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.deadline import wait_future
from ferrymq.rpc.server import Router
from ferrymq.security.acl2 import User, user_info
from ferrymq.security.acl2admin import ADMIN_CODES, CHANGE_CODES
from ferrymq.wire.bodies import decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    BrokerHeartbeatResponseHeader,
    CleanControllerBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetReplicaInfoRequestHeader,
    NotifyBrokerRoleChangedRequestHeader,
    NotLeaderResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    SyncStateSet,
    decode_broker_names,
    decode_sync_state_set,
)
from ferrymq.wire.controller_log import (
    AuthChangeEvent,
    CancelQueueMoveEvent,
    CleanBrokerDataEvent,
    DeleteTopicEvent,
    ElectMasterEvent,
    Event,
    FinishQueueMoveEvent,
    ForgetSegmentsEvent,
    PutTopicEvent,
    StartQueueMoveEvent,
    decode_entry,
    encode_entry,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields, to_ext_fields
from ferrymq.wire.topics import (
    ControllerDeleteTopicRequestHeader,
    ControllerReassignRequestHeader,
    ControllerUpdateTopicRequestHeader,
    GetControllerTopicsRequestHeader,
    GetGroupTopicsRequestHeader,
    GroupTopicsRequestBody,
    NotifyTopicsChangedRequestHeader,
    SealQueueRequestHeader,
    SealQueueResponseHeader,
)

__all__ = [
    "DEFAULT_CONTROLLER_GROUP",
    "MOVE_CRASH_POINTS",
    "ControllerNode",
    "ControllerNodeConfig",
    "ControllerStateMachine",
    "RaftHandle",
]

log = logging.getLogger(__name__)

H = TypeVar("H", bound=CommandHeader)

DEFAULT_CONTROLLER_GROUP: Final = "ferrymq-controller"
_BROKER_KEYS: Final = "controller.broker_keys"
_MAX_BATCH: Final = 256
"""Requests decided together and replicated as one log entry."""
_BARRIER_RETRY_DELAY: Final = 0.05
_MOVE_RETRY_S: Final = 0.2
"""How often a move's driver asks a source that could not answer yet (rule 8)."""
_MOVE_EVENTS: Final = (
    PutTopicEvent,
    DeleteTopicEvent,
    StartQueueMoveEvent,
    FinishQueueMoveEvent,
    CancelQueueMoveEvent,
    ForgetSegmentsEvent,
)
MOVE_CRASH_POINTS: Final = (
    "move_started_before_reply",
    "move_started_before_seal",
    "move_sealed_before_finish",
    "move_finished_before_reply",
)
_HOOKS: Final = os.environ.get("FERRYMQ_TEST_HOOKS") == "1"
_CRASH_AT: Final = os.environ.get("FERRYMQ_TEST_CRASH_AT", "")


def crash_point(name: str) -> None:
    """Die here (exit 137, as kill -9) when the test hooks ask for this point."""
    if _HOOKS and name == _CRASH_AT:
        log.warning("test crash point %s reached: exiting", name)
        os._exit(137)


class RaftHandle(Protocol):
    """What the controller uses of `ferrymq.raft.driver.RaftDriver`."""

    @property
    def is_leader(self) -> bool:
        """Whether this node is the Raft leader."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The leader's node id, when known."""
        ...

    @property
    def leader_addr(self) -> str | None:
        """The leader's controller address, when known."""
        ...

    @property
    def term(self) -> int:
        """The current Raft term."""
        ...

    async def propose(self, command: bytes, timeout: float) -> object:
        """Replicate `command`; return the state machine's `apply` result on this node."""
        ...

    async def read_index(self, timeout: float) -> None:
        """Return once this node has applied everything committed when it was called."""
        ...

    def on_role_change(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(is_leader)` whenever this node becomes or stops being leader."""
        ...


class ControllerStateMachine:
    """The Raft state machine: applies committed entries to `ControllerState`.

    A committed entry that does not decode is logged and skipped, identically on every node, so
    no entry can stop the controller.
    """

    def __init__(self, state: ControllerState) -> None:
        self.state = state
        self.listeners: list[Callable[[list[Event], tuple[bool, ...]], None]] = []

    def apply(self, index: int, command: bytes) -> object:
        """Apply entry `index`; returns per-event outcomes (`ControllerState.apply_events`)."""
        try:
            events = decode_entry(command)
        except ProtocolError as exc:
            log.error("controller log entry %d skipped: %s", index, exc)
            events = []
        outcomes = self.state.apply_events(index, events)
        for listener in self.listeners:
            listener(events, outcomes)
        return outcomes

    def snapshot(self) -> bytes:
        """The whole state."""
        return self.state.snapshot()

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's."""
        self.state.restore(data)


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerNodeConfig:
    """One controller node's identity and request handling."""

    controller_id: str
    peers: Mapping[str, str]
    """Every controller node, id -> address (this node included)."""
    group: str = DEFAULT_CONTROLLER_GROUP
    request_timeout: float = 5.0
    """Seconds a request may wait for its decision to be replicated (RocketMQ: 5 s)."""
    max_pending_requests: int = 1024
    """Decisions queued on the leader before new requests answer SYSTEM_BUSY."""
    notify_timeout: float = 3.0
    """Seconds one NOTIFY_BROKER_ROLE_CHANGED may take to send."""
    init_user: User | None = None
    """`initAuthenticationUser` (ACL 2.0): created by a serving leader when missing (rule 9)."""


@dataclass(slots=True)
class _Job:
    request: ControllerRequest
    is_read: bool
    future: asyncio.Future[Decision]


class ControllerNode:
    """Controller requests on one node; routes are added to a `Router` the caller owns."""

    def __init__(
        self,
        config: ControllerNodeConfig,
        policy: ControllerConfig,
        state_machine: ControllerStateMachine,
        raft: RaftHandle,
        client: RpcClient,
        clock: Callable[[], float] = process_clock.mono,
    ) -> None:
        self.config = config
        self.base_policy = policy
        self.state = state_machine.state
        self.liveness = Liveness()
        self._raft = raft
        self._client = client
        self._clock = clock
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(config.max_pending_requests)
        self._serving = False
        self._serving_term = -1
        self._leader_since = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._leader_tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._heartbeat_conn: dict[BrokerKey, Connection] = {}
        self._electing: set[str] = set()
        self._notifying: dict[str, asyncio.Task[None]] = {}
        self._topic_notifying: dict[str, asyncio.Task[None]] = {}
        self._moving: dict[tuple[str, str, int], asyncio.Task[None]] = {}
        self._policy_key: tuple[tuple[str, str], ...] = ()
        self._policy = policy
        self._closed = False
        state_machine.listeners.append(self._applied)
        raft.on_role_change(self._role_changed)

    # ------------------------------------------------------------------ wiring

    def register(self, router: Router, *, heartbeat: bool = True) -> None:
        """Route the controller request codes on `router` (shared with Raft, maybe a NameServer).

        With `heartbeat` false, BROKER_HEARTBEAT is left to the caller, who composes
        `broker_heartbeat` with another server's handler of the same code.
        """
        add = router.add
        add(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, self._get_next_broker_id)
        add(RequestCode.CONTROLLER_APPLY_BROKER_ID, self._apply_broker_id)
        add(RequestCode.CONTROLLER_REGISTER_BROKER, self._register_broker)
        add(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, self._alter_sync_state_set)
        add(RequestCode.CONTROLLER_ELECT_MASTER, self._elect_master)
        add(RequestCode.CONTROLLER_GET_REPLICA_INFO, self._get_replica_info)
        add(RequestCode.CONTROLLER_GET_METADATA_INFO, self._get_metadata_info)
        add(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, self._get_sync_state_data)
        add(RequestCode.CLEAN_BROKER_DATA, self._clean_broker_data)
        add(RequestCode.GET_CONTROLLER_CONFIG, self._get_controller_config)
        add(RequestCode.UPDATE_CONTROLLER_CONFIG, self._update_controller_config)
        add(RequestCode.CONTROLLER_UPDATE_TOPIC, self._update_topic)
        add(RequestCode.CONTROLLER_DELETE_TOPIC, self._delete_topic)
        add(RequestCode.CONTROLLER_GET_GROUP_TOPICS, self._get_group_topics)
        add(RequestCode.CONTROLLER_GET_TOPICS, self._get_topics)
        add(RequestCode.CONTROLLER_REASSIGN_QUEUES, self._reassign_queues)
        for code in sorted(ADMIN_CODES):
            add(code, self._auth_admin)
        add(RequestCode.CONTROLLER_GET_AUTH, self._get_auth)
        if heartbeat:
            add(RequestCode.BROKER_HEARTBEAT, self.broker_heartbeat)

    def connection_closed(self, conn: Connection) -> None:
        """A connection to this node closed: brokers that heartbeated on it are dead now."""
        keys = conn.attributes.get(_BROKER_KEYS)
        if not isinstance(keys, set):
            return
        mine = [key for key in keys if self._heartbeat_conn.get(key) is conn]
        for key in mine:
            del self._heartbeat_conn[key]
        closed = self.liveness.close_channel(mine)
        if not closed:
            return
        log.info(
            "broker connection closed: %s",
            ", ".join(f"{i.broker_name}/{i.broker_id}" for i in closed),
        )
        if self._serving:
            self._wake.set()
            delay = self.policy.master_replace_wait
            for info in closed:
                wait = info.last_heartbeat + delay - self._clock()
                asyncio.get_running_loop().call_later(max(0.0, wait) + 0.01, self._wake.set)

    @property
    def policy(self) -> ControllerConfig:
        """The policy in force: the base config with replicated overrides applied."""
        key = tuple(sorted(self.state.config_overrides.items()))
        if key != self._policy_key:
            try:
                self._policy = apply_overrides(self.base_policy, self.state.config_overrides)
            except ConfigError as exc:
                log.error("replicated controller config ignored: %s", exc)
                self._policy = self.base_policy
            self._policy_key = key
        return self._policy

    @property
    def is_serving(self) -> bool:
        """Whether this node is the leader and serves requests."""
        return self._serving

    async def start(self) -> None:
        """Nothing runs until this node becomes leader; present for symmetry with `close`."""
        if self._raft.is_leader:
            self._role_changed(True)

    async def close(self) -> None:
        """Stop serving and cancel every task this node started."""
        self._closed = True
        self._stop_serving()
        tasks = [
            *self._tasks,
            *self._leader_tasks,
            *self._notifying.values(),
            *self._topic_notifying.values(),
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ leadership

    def _role_changed(self, is_leader: bool) -> None:
        if self._closed:
            return
        if not is_leader:
            self._stop_serving()
            return
        if self._serving or any(not t.done() for t in self._leader_tasks):
            return
        self._spawn(self._become_leader(), leader=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], *, leader: bool) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks = self._leader_tasks if leader else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _become_leader(self) -> None:
        """Commit a barrier of this term, then serve (spec 1.3 "Becoming leader")."""
        term = self._raft.term
        while self._raft.is_leader and self._raft.term == term and not self._closed:
            try:
                await self._raft.propose(b"", self.config.request_timeout)
                break
            except (FerryError, TimeoutError) as exc:
                log.info("leader barrier of term %d not applied yet: %s", term, exc)
                await asyncio.sleep(_BARRIER_RETRY_DELAY)
        if not self._raft.is_leader or self._raft.term != term or self._closed:
            return
        self._serving = True
        self._serving_term = term
        self._leader_since = self._clock()
        log.info(
            "controller %s serves as leader (term %d); elections after a %.2g s grace period",
            self.config.controller_id,
            term,
            self.policy.election_grace,
        )
        self._spawn(self._work(), leader=True)
        self._spawn(self._scan_loop(), leader=True)
        self._drive_moves()
        if self.policy.notify_broker_role_changed:
            for name in sorted(self.state.groups):
                self._notify_role_change(name, live_only=False)
        init = self.config.init_user
        if init is not None and init.username not in self.state.auth.users:
            self._spawn(self._create_init_user(init), leader=True)

    async def _create_init_user(self, user: User) -> None:
        """Rule 9: the init user joins the replicated users (an existing one is kept)."""
        body = json.dumps(user_info(user, with_password=True)).encode()
        command = AuthCommand(RequestCode.AUTH_CREATE_USER, {}, body)
        try:
            decision = await self._submit(command)
        except RequestError as exc:
            log.warning("initAuthenticationUser %s not created: %s", user.username, exc.remark)
            return
        if decision.code == ResponseCode.SUCCESS:
            log.info("initAuthenticationUser: Super user %s created", user.username)

    def _stop_serving(self) -> None:
        if self._serving:
            log.info("controller %s stops serving as leader", self.config.controller_id)
        self._serving = False
        for task in list(self._leader_tasks):
            task.cancel()
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(self._not_leader())
        self._electing.clear()
        self._moving.clear()  # their tasks were leader tasks, cancelled above

    def _not_leader(self) -> RequestError:
        leader = self._raft.leader_id
        if leader == self.config.controller_id and not self._serving:
            return RequestError(
                ResponseCode.CONTROLLER_NOT_LEADER,
                f"controller {leader} is becoming leader; retry shortly",
            )
        where = f"the leader is {leader} at {self._raft.leader_addr}" if leader else "no leader"
        return RequestError(
            ResponseCode.CONTROLLER_NOT_LEADER,
            f"controller {self.config.controller_id} is not the leader; {where}",
        )

    def _view(self) -> View:
        return View(self.state, self.liveness, self.policy, self._leader_since)

    # ------------------------------------------------------------------ the decision queue

    async def _submit(self, request: ControllerRequest, *, is_read: bool = False) -> Decision:
        if not self._serving:
            raise self._not_leader()
        job = _Job(request, is_read, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise RequestError(
                ResponseCode.SYSTEM_BUSY,
                f"{self._queue.maxsize} controller requests are waiting; retry later",
            ) from None
        try:
            return await wait_future(job.future, self.config.request_timeout)
        except TimeoutError:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"no decision within {self.config.request_timeout:g} s; it may still be applied",
            ) from None

    async def _work(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [job for job in batch if not job.future.done()]
            if not batch:
                continue
            try:
                await self._run(batch)
            except RequestError as exc:
                self._fail(batch, RequestError(exc.code, exc.remark))
            except (FerryError, TimeoutError) as exc:
                self._fail(batch, RequestError(ResponseCode.SYSTEM_ERROR, f"not replicated: {exc}"))

    @staticmethod
    def _fail(batch: list[_Job], error: RequestError) -> None:
        for job in batch:
            if not job.future.done():
                job.future.set_exception(RequestError(error.code, error.remark))

    async def _run(self, batch: list[_Job]) -> None:
        """Decide a batch against an overlay, replicate its events, answer once applied (rule 1)."""
        timeout = self.config.request_timeout
        if any(job.is_read for job in batch):
            await self._raft.read_index(timeout)
        if not self._serving:
            raise self._not_leader()
        now = self._now()
        overlay = self.state.overlay()
        view = View(overlay, self.liveness, self.policy, self._leader_since)
        events: list[Event] = []
        decided: list[tuple[_Job, Decision, int]] = []
        for job in batch:
            decision = decide(job.request, view, now)
            if decision.warning:
                log.warning("%s", decision.warning)
            for event in decision.events:
                overlay.apply_event(event)
            events.extend(decision.events)
            decided.append((job, decision, len(events)))
        first_failed = len(events)
        if events:
            outcomes = await self._raft.propose(encode_entry(events), timeout)
            if not isinstance(outcomes, tuple):
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"unexpected apply result {outcomes}")
            first_failed = next((i for i, ok in enumerate(outcomes) if not ok), len(events))
        for job, decision, end in decided:
            if job.future.done():
                continue
            if end <= first_failed:
                job.future.set_result(decision)
                continue
            # Decided after an event that did not apply: it may rest on that event.
            log.info("state moved between decision and apply: %s", job.request)
            job.future.set_exception(
                RequestError(ResponseCode.SYSTEM_BUSY, "the controller state changed; retry")
            )

    def _applied(self, events: list[Event], outcomes: tuple[bool, ...]) -> None:
        """After every applied entry, on every node."""
        topics_changed = False
        for event, applied in zip(events, outcomes, strict=True):
            if not applied:
                continue
            if isinstance(event, AuthChangeEvent):
                log.info(
                    "users and ACLs: %s (auth version %d)",
                    next(iter(event.change), "?"),
                    self.state.auth_version,
                )
            if isinstance(event, _MOVE_EVENTS):
                topics_changed = True
                log.info(
                    "topic %s: %s (topic version %d)",
                    event.topic,
                    type(event).__name__.removesuffix("Event"),
                    self.state.topic_version,
                )
            if isinstance(event, CleanBrokerDataEvent):
                ids = event.broker_id_set_to_clean
                self.liveness.forget(event.broker_name, None if ids is None else list(ids))
            elif isinstance(event, ElectMasterEvent) and self._serving:
                group = self.state.groups.get(event.broker_name)
                log.info(
                    "broker group %s: %s (master epoch %s)",
                    event.broker_name,
                    f"broker {event.new_master_broker_id} is master"
                    if event.new_master_elected
                    else "no master",
                    group.master_epoch if group else "?",
                )
                if event.new_master_elected and self.policy.notify_broker_role_changed:
                    self._notify_role_change(event.broker_name)
        if topics_changed and self._serving:
            self._notify_topics()
            self._drive_moves()

    # ------------------------------------------------------------------ moving queues (rule 8)

    def _drive_moves(self) -> None:
        """Start a driver for every move the state holds that has none."""
        for topic, queue in moving_queues(self.state):
            key = (topic, queue.broker_name, queue.queue_id)
            if key not in self._moving or self._moving[key].done():
                task = asyncio.get_running_loop().create_task(self._drive_move(key))
                self._moving[key] = task
                self._leader_tasks.add(task)
                task.add_done_callback(self._leader_tasks.discard)

    async def _drive_move(self, key: tuple[str, str, int]) -> None:
        """Seal the move's source and finish the move, until it is no longer on (rule 8)."""
        topic_name, broker_name, queue_id = key
        crash_point("move_started_before_seal")
        while self._serving:
            topic = self.state.topics.get(topic_name)
            queue = topic.queue_map.logical(broker_name, queue_id) if topic else None
            if queue is None or queue.moving is None:
                return
            since = queue.moving.since_version
            source = queue.current
            group = self.state.groups.get(source.broker_name)
            address = group.master_address if group is not None else None
            if address is None:
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            request = RemotingCommand(
                code=RequestCode.SEAL_QUEUE,
                ext_fields=to_ext_fields(
                    SealQueueRequestHeader(
                        topic=topic_name, queue_id=source.queue_id, topic_version=since
                    )
                ),
            )
            try:
                response = await self._client.call(address, request, self.config.request_timeout)
            except (FerryError, TimeoutError) as exc:
                log.info("seal of %s queue %d at %s: %s", topic_name, queue_id, address, exc)
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            if response.code != ResponseCode.SUCCESS:
                log.info(
                    "seal of %s queue %d of %s: %s",
                    topic_name,
                    queue_id,
                    broker_name,
                    response.remark,
                )
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            try:
                header = from_ext_fields(SealQueueResponseHeader, response.ext_fields)
            except ProtocolError as exc:  # a malformed answer must not end this move's driver
                log.warning("seal of %s queue %d at %s: %s", topic_name, queue_id, address, exc)
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            end = header.end_queue_offset
            crash_point("move_sealed_before_finish")
            try:
                decision = await self._submit(
                    FinishMove(topic_name, broker_name, queue_id, since, end)
                )
            except RequestError as exc:
                log.info("finishing the move of %s queue %d: %s", topic_name, queue_id, exc)
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            if decision.code != ResponseCode.SUCCESS:
                log.warning("move of %s queue %d: %s", topic_name, queue_id, decision.remark)
                await asyncio.sleep(_MOVE_RETRY_S)
                continue
            crash_point("move_finished_before_reply")
            log.info(
                "queue %d of %s of topic %s moved: %s queue %d ends at %d",
                queue_id,
                broker_name,
                topic_name,
                source.broker_name,
                source.queue_id,
                end,
            )

    # ------------------------------------------------------------------ liveness and elections

    async def _scan_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.policy.scan_interval):
                    await self._wake.wait()
            self._wake.clear()
            self._scan()

    def _now(self) -> float:
        """The clock, with every time this node noted (heartbeats, leadership) no later than it."""
        now = self._clock()
        self.liveness.step_back(now)
        self._leader_since = min(self._leader_since, now)
        return now

    def _scan(self) -> None:
        now = self._now()
        policy = self.policy
        self.liveness.expire(now, keep_for=policy.master_replace_wait + policy.heartbeat_timeout)
        for name in groups_to_elect(self._view(), now):
            if name not in self._electing:
                self._electing.add(name)
                self._spawn(self._elect(name), leader=True)

    async def _elect(self, broker_name: str) -> None:
        """A controller-triggered election, retried up to `electMasterMaxRetryCount` times."""
        try:
            for attempt in range(1, self.policy.elect_master_max_retry_count + 1):
                request = ElectMasterRequestHeader(broker_name=broker_name)
                try:
                    decision = await self._submit(request)
                except RequestError as exc:
                    log.info("election of %s, attempt %d: %s", broker_name, attempt, exc.remark)
                    if not self._serving:
                        return
                    continue
                if decision.code != ResponseCode.SUCCESS:
                    log.info("election of %s: %s", broker_name, decision.remark)
                return
        finally:
            self._electing.discard(broker_name)

    def _notify_role_change(self, broker_name: str, *, live_only: bool = True) -> None:
        """Push the group's master to its brokers (`live_only`: the ones this node hears)."""
        group = self.state.groups.get(broker_name)
        if group is None or group.master_broker_id is None:
            return
        header = NotifyBrokerRoleChangedRequestHeader(
            master_address=group.master_address,
            master_epoch=group.master_epoch,
            sync_state_set_epoch=group.sync_state_set_epoch,
            master_broker_id=group.master_broker_id,
        )
        body = encode_body(
            SyncStateSet(
                sync_state_set=sorted(group.sync_state_set),
                sync_state_set_epoch=group.sync_state_set_epoch,
            )
        )
        now = self._clock()
        for broker_id, replica in sorted(group.replicas.items()):
            if live_only and not self.liveness.is_alive(broker_name, broker_id, now):
                continue
            address = replica.broker_address
            previous = self._notifying.pop(address, None)
            if previous is not None:
                previous.cancel()
            command = RemotingCommand(
                code=RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                ext_fields=to_ext_fields(header),
                body=body,
            )
            task = asyncio.get_running_loop().create_task(self._send_notify(address, command))
            self._notifying[address] = task
            task.add_done_callback(functools.partial(self._notify_done, address))

    def _notify_done(self, address: str, task: asyncio.Task[None]) -> None:
        if self._notifying.get(address) is task:
            del self._notifying[address]

    async def _send_notify(self, address: str, command: RemotingCommand) -> None:
        try:
            async with asyncio.timeout(self.config.notify_timeout):
                await self._client.oneway(address, command)
        except (FerryError, TimeoutError) as exc:
            log.info("%s to %s not sent: %s", _code_name(command.code), address, exc)

    def _notify_topics(self) -> None:
        """Push the topic version to every live broker (rule 7), replacing an unsent push."""
        header = to_ext_fields(
            NotifyTopicsChangedRequestHeader(topic_version=self.state.topic_version)
        )
        now = self._clock()
        for name, group in sorted(self.state.groups.items()):
            for broker_id, replica in sorted(group.replicas.items()):
                if not self.liveness.is_alive(name, broker_id, now):
                    continue
                address = replica.broker_address
                previous = self._topic_notifying.pop(address, None)
                if previous is not None:
                    previous.cancel()
                command = RemotingCommand(
                    code=RequestCode.NOTIFY_TOPICS_CHANGED, ext_fields=dict(header)
                )
                task = asyncio.get_running_loop().create_task(self._send_notify(address, command))
                self._topic_notifying[address] = task
                task.add_done_callback(functools.partial(self._topic_notify_done, address))

    def _topic_notify_done(self, address: str, task: asyncio.Task[None]) -> None:
        if self._topic_notifying.get(address) is task:
            del self._topic_notifying[address]

    # ------------------------------------------------------------------ handlers

    def _respond(self, request: RemotingCommand, decision: Decision) -> RemotingCommand:
        return request.make_response(
            decision.code,
            remark=decision.remark,
            ext_fields=to_ext_fields(decision.header) if decision.header else None,
            body=decision.body,
        )

    def _not_leader_response(self, request: RemotingCommand, remark: str) -> RemotingCommand:
        closed = self._closed
        header = NotLeaderResponseHeader(
            controller_leader_id=None if closed else self._raft.leader_id,
            controller_leader_address=None if closed else self._raft.leader_addr,
        )
        return request.make_response(
            ResponseCode.CONTROLLER_NOT_LEADER, remark=remark, ext_fields=to_ext_fields(header)
        )

    async def _serve(
        self, request: RemotingCommand, item: ControllerRequest, *, is_read: bool = False
    ) -> RemotingCommand:
        try:
            decision = await self._submit(item, is_read=is_read)
        except RequestError as exc:
            if exc.code == ResponseCode.CONTROLLER_NOT_LEADER:
                return self._not_leader_response(request, exc.remark)
            raise
        return self._respond(request, decision)

    @staticmethod
    def _header(header_type: type[H], request: RemotingCommand) -> H:
        try:
            return from_ext_fields(header_type, request.ext_fields)
        except ProtocolError as exc:
            raise RequestError(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc)) from None

    async def _get_next_broker_id(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_GET_NEXT_BROKER_ID (1012): seed 000 step 1."""
        header = self._header(GetNextBrokerIdRequestHeader, request)
        return await self._serve(request, header, is_read=True)

    async def _apply_broker_id(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_APPLY_BROKER_ID (1013): seed 000 step 3, CAS with the register check code."""
        return await self._serve(request, self._header(ApplyBrokerIdRequestHeader, request))

    async def _register_broker(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_REGISTER_BROKER (1003): seed 000 step 5, address update, master info."""
        header = self._header(RegisterBrokerToControllerRequestHeader, request)
        return await self._serve(request, header)

    async def _alter_sync_state_set(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_ALTER_SYNC_STATE_SET (1001): fenced by master epoch and set epoch."""
        header = self._header(AlterSyncStateSetRequestHeader, request)
        try:
            body = decode_sync_state_set(request.body)
        except ProtocolError as exc:
            raise RequestError(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc)) from None
        return await self._serve(request, AlterSyncStateSet(header, body))

    async def _elect_master(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_ELECT_MASTER (1002): broker- or admin-triggered."""
        return await self._serve(request, self._header(ElectMasterRequestHeader, request))

    async def _get_replica_info(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_GET_REPLICA_INFO (1004): a group's master and SyncStateSet."""
        header = self._header(GetReplicaInfoRequestHeader, request)
        return await self._serve(request, header, is_read=True)

    async def _get_sync_state_data(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_GET_SYNC_STATE_DATA (1006): replicas of the groups named in the body."""
        try:
            names = decode_broker_names(request.body)
        except ProtocolError as exc:
            raise RequestError(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc)) from None
        return await self._serve(request, GetSyncStateData(tuple(names)), is_read=True)

    async def _clean_broker_data(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CLEAN_BROKER_DATA (1011): forget dead brokers of a group."""
        header = self._header(CleanControllerBrokerDataRequestHeader, request)
        return await self._serve(request, header)

    async def _update_controller_config(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """UPDATE_CONTROLLER_CONFIG (1009): properties text, replicated to every node."""
        try:
            properties = parse_properties(request.body.decode(), "UPDATE_CONTROLLER_CONFIG")
        except (UnicodeDecodeError, ConfigError) as exc:
            raise RequestError(ResponseCode.INVALID_PARAMETER, f"bad properties: {exc}") from None
        return await self._serve(request, UpdateControllerConfig(properties))

    async def _update_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_UPDATE_TOPIC (9240, ferrymq's own): create or change a topic's placement."""
        header = self._header(ControllerUpdateTopicRequestHeader, request)
        return await self._serve(request, UpdateTopic(header))

    async def _delete_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_DELETE_TOPIC (9241, ferrymq's own): delete a topic, leaving a tombstone."""
        header = self._header(ControllerDeleteTopicRequestHeader, request)
        return await self._serve(request, DeleteTopic(header))

    async def _get_group_topics(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_GET_GROUP_TOPICS (9242, ferrymq's own): what a broker group should hold."""
        header = self._header(GetGroupTopicsRequestHeader, request)
        try:
            body = (
                decode_body(request.body, GroupTopicsRequestBody)
                if request.body
                else GroupTopicsRequestBody()
            )
        except ProtocolError as exc:
            raise RequestError(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc)) from None
        item = GetGroupTopics(header.broker_name, tuple(body.held))
        return await self._serve(request, item, is_read=True)

    async def _reassign_queues(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_REASSIGN_QUEUES (9245, ferrymq's own): move queues between groups."""
        header = self._header(ControllerReassignRequestHeader, request)
        response = await self._serve(request, ReassignQueues(header))
        if response.code == ResponseCode.SUCCESS:
            crash_point("move_started_before_reply")
        return response

    async def _get_topics(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_GET_TOPICS (9243, ferrymq's own): a topic's record, or every live topic."""
        header = self._header(GetControllerTopicsRequestHeader, request)
        return await self._serve(request, GetTopics(header.topic or None), is_read=True)

    async def _auth_admin(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """AUTH_CREATE_USER .. AUTH_LIST_ACL (3001-3010): users and ACLs kept here (rule 9)."""
        item = AuthCommand(request.code, dict(request.ext_fields), request.body)
        is_read = request.code not in CHANGE_CODES
        return await self._serve(request, item, is_read=is_read)

    async def _get_auth(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_GET_AUTH (9247, ferrymq's own): every user and ACL, for a broker."""
        return await self._serve(request, GetAuth(), is_read=True)

    async def _get_controller_config(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """GET_CONTROLLER_CONFIG (1010): the policy in force on this node, as properties text."""
        return request.make_response(
            ResponseCode.SUCCESS, body=config_properties(self.policy).encode()
        )

    async def _get_metadata_info(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """CONTROLLER_GET_METADATA_INFO (1005): who leads, answered by every node."""
        header = GetMetaDataResponseHeader(
            group=self.config.group,
            controller_leader_id=self._raft.leader_id,
            controller_leader_address=self._raft.leader_addr,
            is_leader=self._serving,
            peers="".join(f"{i}:{a};" for i, a in sorted(self.config.peers.items())),
            controller_id=self.config.controller_id,
            term=self._raft.term,
            applied_index=self.state.applied_index,
        )
        return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(header))

    async def broker_heartbeat(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        """BROKER_HEARTBEAT (904): recorded on every node; the leader's answer renews a lease."""
        header = self._header(BrokerHeartbeatRequestHeader, request)
        if header.broker_id is None:
            raise RequestError(ResponseCode.CONTROLLER_INVALID_REQUEST, "brokerId is missing")
        policy = self.policy
        timeout = (
            header.heartbeat_timeout_mills / 1000
            if header.heartbeat_timeout_mills
            else policy.heartbeat_timeout
        )
        self.liveness.heartbeat(
            BrokerLiveInfo(
                cluster_name=header.cluster_name,
                broker_name=header.broker_name,
                broker_id=header.broker_id,
                broker_addr=header.broker_addr,
                last_heartbeat=self._clock(),
                heartbeat_timeout=timeout,
                epoch=-1 if header.epoch is None else header.epoch,
                max_log_offset=-1 if header.max_offset is None else header.max_offset,
                confirm_log_offset=-1 if header.confirm_offset is None else header.confirm_offset,
                election_priority=(
                    INT32_MAX if header.election_priority is None else header.election_priority
                ),
            )
        )
        key = (header.broker_name, header.broker_id)
        keys = conn.attributes.setdefault(_BROKER_KEYS, set())
        if isinstance(keys, set):
            keys.add(key)
        self._heartbeat_conn[key] = conn
        if request.is_oneway:
            return None
        if not self._serving:
            return self._not_leader_response(request, self._not_leader().remark)
        group = self.state.groups.get(header.broker_name)
        answer: CommandHeader = BrokerHeartbeatResponseHeader(
            master_lease_mills=policy.master_lease_millis,
            master_epoch=group.master_epoch if group else None,
            master_broker_id=group.master_broker_id if group else None,
            topic_version=self.state.topic_version,
            auth_version=self.state.auth_version,
        )
        return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(answer))


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)
