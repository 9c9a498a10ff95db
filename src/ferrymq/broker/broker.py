"""The broker: routes request codes to handlers, owns the store and the background tasks.

Background tasks (one `TaskGroup`, stopped by `close`):
- registration with every NameServer, every `registerNameServerPeriod` and at once when topics
  change (RocketMQ `registerBrokerAll`);
- consumer offsets saved every `flushConsumerOffsetInterval` when changed;
- silent clients expired (after their session timeout, or `channelExpiredTimeout`), and their
  groups told to rebalance;
- expired commit-log segments deleted at `deleteWhen` hours, or whenever the disk is too full,
  never a fenced topic's live tail (`retention.py`);
- delayed messages delivered on time (`schedule.py` for delay levels, `timer.py` for delivery
  times); unresolved transactions checked (`transactions.py`);
- replication (`replication/`): a master serves its slaves on the HA port and, as SYNC_MASTER,
  acknowledges sends once its SyncStateSet has them; a slave follows the master the NameServer
  names for its broker name (or `haMasterAddress`).

Servers are libraries: `async with Broker(config) as broker:`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec
from prometheus_client import CollectorRegistry

from ferrymq import clock as process_clock
from ferrymq.broker import (
    admin,
    auth_admin,
    cloneoffset,
    consumer,
    metrics,
    pull,
    query,
    queuemap,
    retention,
    runtime,
    send,
    statsdata,
    switchover,
)
from ferrymq.broker.clients import ClientTable, QueueLocks
from ferrymq.broker.config import BrokerConfig, BrokerRole
from ferrymq.broker.fenced import FencedTopics
from ferrymq.broker.forward import Forwarder
from ferrymq.broker.longpoll import LongPoll
from ferrymq.broker.metadata import DelayOffsetTable, GroupTable, OffsetTable, TopicTable
from ferrymq.broker.metalog import MetadataFollower, MetadataLog
from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY, BrokerStats
from ferrymq.broker.popservice import (
    PopReviver,
    ack_message,
    batch_ack_message,
    change_invisible_time,
    notification,
    peek_message,
    polling_info,
    pop_message,
    pop_rollback,
)
from ferrymq.broker.replicas import ReplicasManager
from ferrymq.broker.schedule import ScheduleService
from ferrymq.broker.sink import SINK_CODES, SinkService
from ferrymq.broker.state import NO_LEASE_YET, BrokerState
from ferrymq.broker.timer import TimerService
from ferrymq.broker.transactions import TransactionService, end_transaction
from ferrymq.config import ConfigError
from ferrymq.errors import FerryError, RequestError
from ferrymq.metrics.exporter import FuncCollector, MetricsExporterType, MetricsServer
from ferrymq.model import format_address
from ferrymq.replication.master import HAConfig, ReplicationMaster
from ferrymq.replication.slave import ReplicationSlave, SlaveConfig
from ferrymq.replication.syncstate import SyncStateChange
from ferrymq.rpc.busypoll import BusyPoll
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection, EncodedFrame, LaterResponse, RequestHandler
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.rpc.testclock import serve_test_clock
from ferrymq.security.acl2 import UserStatus, UserType
from ferrymq.security.acl2guard import Acl2Guard, AuthStore, acl2_guard, init_super_user
from ferrymq.security.aclguard import AclGuard, acl_guard
from ferrymq.store.atomic import write_atomic
from ferrymq.store.config import FlushDiskType
from ferrymq.store.epochs import EpochFile
from ferrymq.store.store import Store
from ferrymq.wire.bodies import RegisterBrokerBody, encode_register_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.ha import EpochEntry
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.namesrv import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)

__all__ = ["Broker"]

log = logging.getLogger(__name__)

Handler = Callable[
    [BrokerState, Connection, RemotingCommand],
    Awaitable[RemotingCommand | EncodedFrame | LaterResponse | None],
]

_HANDLERS: dict[int, Handler] = {
    RequestCode.SEND_MESSAGE: send.send_message,
    RequestCode.SEND_MESSAGE_V2: send.send_message,
    RequestCode.SEND_BATCH_MESSAGE: send.send_message,
    RequestCode.CONSUMER_SEND_MSG_BACK: send.consumer_send_back,
    RequestCode.END_TRANSACTION: end_transaction,
    RequestCode.PULL_MESSAGE: pull.pull_message,
    RequestCode.HEART_BEAT: consumer.heartbeat,
    RequestCode.UNREGISTER_CLIENT: consumer.unregister_client,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.get_consumer_list,
    RequestCode.QUERY_CONSUMER_OFFSET: consumer.query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: consumer.update_consumer_offset,
    RequestCode.LOCK_BATCH_MQ: consumer.lock_batch,
    RequestCode.UNLOCK_BATCH_MQ: consumer.unlock_batch,
    RequestCode.GET_MAX_OFFSET: query.get_max_offset,
    RequestCode.GET_MIN_OFFSET: query.get_min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: query.search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: query.get_earliest_store_time,
    RequestCode.QUERY_MESSAGE: query.query_message,
    RequestCode.VIEW_MESSAGE_BY_ID: query.view_message,
    RequestCode.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
    RequestCode.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
    RequestCode.GET_ALL_TOPIC_CONFIG: admin.get_all_topics,
    RequestCode.GET_TOPIC_STATS_INFO: admin.get_topic_stats,
    RequestCode.GET_CONSUME_STATS: admin.get_consume_stats,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.update_group,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: admin.delete_group,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.get_all_groups,
    RequestCode.GET_BROKER_RUNTIME_INFO: admin.get_runtime_info,
    RequestCode.GET_BROKER_CONFIG: admin.get_broker_config,
    RequestCode.UPDATE_BROKER_CONFIG: admin.update_broker_config,
    RequestCode.DELETE_EXPIRED_COMMITLOG: admin.delete_expired_commit_log,
    RequestCode.GET_FENCE: admin.get_fence,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: admin.get_consumer_connections,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: admin.get_producer_connections,
    RequestCode.GET_ALL_PRODUCER_INFO: admin.get_all_producer_info,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: admin.query_topic_consume_by_who,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: admin.reset_offset,
    RequestCode.VIEW_BROKER_STATS_DATA: statsdata.view_broker_stats,
    RequestCode.CLONE_GROUP_OFFSET: cloneoffset.clone_group_offset,
    RequestCode.GET_CONSUMER_RUNNING_INFO: admin.get_consumer_running_info,
    RequestCode.CONSUME_MESSAGE_DIRECTLY: admin.consume_message_directly,
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: admin.get_system_topics,
    RequestCode.GET_TOPIC_CONFIG: admin.get_topic_config,
    RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: admin.get_subscription_group_config,
    RequestCode.GET_GROUP_MEMBERS: consumer.get_group_members,
    RequestCode.POP_MESSAGE: pop_message,
    RequestCode.ACK_MESSAGE: ack_message,
    RequestCode.BATCH_ACK_MESSAGE: batch_ack_message,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: change_invisible_time,
    RequestCode.NOTIFICATION: notification,
    RequestCode.PEEK_MESSAGE: peek_message,
    RequestCode.POLLING_INFO: polling_info,
    RequestCode.POP_ROLLBACK: pop_rollback,
}
"""Every request code the broker serves, in one table."""

_SEND_CODES = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)
"""Requests whose handling time is the send latency (`metrics.py`)."""
_STATS_SAMPLE_S = 5.0
"""How often the throughput counts are snapshotted for their rates (`metrics.stats`)."""
_CLIENT_SCAN_S = 10.0
_CLIENT_SCAN_MIN_S = 0.05
"""The shortest wait of the client expiry loop (a session deadline just passed)."""
_RETENTION_SCAN_S = 10.0
_NAMESRV_TIMEOUT_S = 3.0


def _source_host(listen_host: str) -> str | None:
    """The source address of the broker's own connections: its listen address on loopback.

    Brokers on per-node loopback addresses (127.0.0.i, as `ferry chaos` runs them) then reach
    their peers from their own address, so firewall rules can tell the nodes apart; anywhere
    else the kernel chooses.
    """
    return listen_host if listen_host.startswith("127.") else None


class Broker:
    """One broker; use as an async context manager."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Callable[[], float] = process_clock.mono,
        wall_ms: Callable[[], int] = process_clock.wall_ms,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall_ms = wall_ms
        self.router = Router("broker")
        for code, handler in _HANDLERS.items():
            timed = code in _SEND_CODES
            self.router.add(code, self._bind_timed(handler) if timed else self._bind(handler))
        for code in SINK_CODES:
            self.router.add(code, self._bind(self._sink_request))
        serve_test_clock(self.router)
        self.router.add(RequestCode.SWITCH_BROKER_ROLE, switchover.switch_role_handler(self))
        self.router.add(RequestCode.SEAL_QUEUE, self._bind(self._seal_queue))
        for code, auth_handler in auth_admin.HANDLERS.items():
            self.router.add(code, self._bind(auth_handler))
        self.busy_poll = (
            BusyPoll(config.busy_poll_micros / 1_000_000) if config.busy_poll_micros else None
        )
        self.acl: AclGuard[Connection, Any] | None = acl_guard(
            self.router, config.acl_enable, config.acl_file, "broker"
        )
        self.auth = AuthStore()
        self.auth_guard: Acl2Guard[Connection, Any] | None = acl2_guard(
            self.router,
            self.auth,
            authentication=config.authentication_enabled,
            authorization=config.authorization_enabled,
            authentication_whitelist=config.authentication_whitelist,
            authorization_whitelist=config.authorization_whitelist,
            server_name="broker",
        )
        if self.acl is not None and self.auth_guard is not None:
            raise ConfigError("authenticationEnabled", "ACL 1.0 (aclEnable) or 2.0, not both")
        self._server = RpcServer(
            self.acl or self.auth_guard or self.router,
            host=config.listen_host,
            port=config.listen_port,
            max_frame_bytes=max(16 * 1024 * 1024, config.max_message_size * 2),
            on_close=self._connection_closed,
            busy_poll=self.busy_poll,
        )
        self._namesrv = RpcClient(local_host=_source_host(config.listen_host))
        self._state: BrokerState | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._register_now = asyncio.Event()
        self._clients_wake = asyncio.Event()
        self.schedule: ScheduleService | None = None
        self.timer: TimerService | None = None
        self.transactions: TransactionService | None = None
        self.sink: SinkService | None = None
        self.pop_reviver: PopReviver | None = None
        self.replication: ReplicationMaster | None = None
        self.slave: ReplicationSlave | None = None
        self._master_ha_address: str | None = None
        self._master_address: str | None = None
        self._epochs: EpochFile | None = None
        self._master_epoch = 0
        self._metalog: MetadataLog | None = None
        self._follower: MetadataFollower | None = None
        self.metadata_replayed = 0
        """Metadata records applied before this broker last became master (on a start: those
        from the last snapshot on)."""
        self._role_tasks: list[asyncio.Task[None]] = []
        self._role_lock = asyncio.Lock()
        self.broker_id = config.broker_id
        """This broker's id in its group (controller mode: its persistent id, whatever its role)."""
        self.fenced = config.enable_controller_mode
        """Controller mode, until the controller named this broker's role: no writes, no
        NameServer registration (RocketMQ `setFenced`)."""
        self.on_sync_state_change: Callable[[SyncStateChange], bool] | None = None
        """Controller mode: a SyncStateSet change goes to the controller before it applies."""
        self.on_role_change: Callable[[], None] = lambda: None
        self.on_master: Callable[[], None] = lambda: None
        """Called when this broker is master, before it leaves the fence (controller mode:
        reconcile its topics with the controller's, `topicsync.py`)."""
        self.role_assigned = asyncio.Event()
        """Set once this broker has a role (at start in classic mode; controller mode: once
        the controller named one)."""
        self.replicas: ReplicasManager | None = None
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint (`metricsExporterType=PROM`), once started."""

    @property
    def state(self) -> BrokerState:
        """The broker's state (after `start`)."""
        if self._state is None:
            raise RuntimeError("broker not started")
        return self._state

    @property
    def address(self) -> str:
        """`brokerIP1:port` clients use."""
        return format_address(self.config.broker_ip1, self._server.port)

    @property
    def store(self) -> Store:
        """The broker's store."""
        return self.state.store

    def _bind(self, handler: Handler) -> RequestHandler:
        async def run(
            conn: Connection, request: RemotingCommand
        ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
            state = self._state
            if state is None:
                raise RequestError(ResponseCode.SYSTEM_BUSY, "the broker is starting")
            return await handler(state, conn, request)

        return run

    def _bind_timed(self, handler: Handler) -> RequestHandler:
        """`_bind`, timing one send in `LATENCY_SAMPLE_EVERY` as send latency.

        A later answer (SYNC_MASTER) is timed by its own callback (`send._CommitAnswer`).
        """

        async def run(
            conn: Connection, request: RemotingCommand
        ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
            state = self._state
            if state is None:
                raise RequestError(ResponseCode.SYSTEM_BUSY, "the broker is starting")
            stats = state.stats
            stats.send_seq += 1
            if stats.send_seq % LATENCY_SAMPLE_EVERY:
                return await handler(state, conn, request)
            started = time.perf_counter()
            answer = await handler(state, conn, request)
            if not isinstance(answer, LaterResponse):
                stats.send_latency.observe(time.perf_counter() - started)
            return answer

        return run

    async def _seal_queue(
        self, state: BrokerState, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        sink = self.sink
        stages_into = sink.stages_into if sink is not None else None
        return await queuemap.seal_queue(state, conn, request, stages_into)

    async def _sink_request(
        self, state: BrokerState, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        if self.sink is None:
            raise RequestError(ResponseCode.SYSTEM_BUSY, "the broker is starting")
        return await self.sink.handle(conn, request)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind, recover the store, load metadata, register, start background work."""
        if not self.config.enable_controller_mode:  # a switchover's role outlives restarts
            self.config = switchover.apply_role_file(self.config)
            self.broker_id = self.config.broker_id
        config = self.config
        await self._server.start()
        longpoll = LongPoll()
        root = config.store_path_root_dir
        store = Store.open(
            config.store_config(self._server.port),
            clock_ms=self._wall_ms,
            on_dispatch=longpoll.notify,
        )
        if store.recovery is not None and store.recovery.cut_reason:
            log.warning("store recovery cut the commit log: %s", store.recovery.cut_reason)
        topics = TopicTable(root / "config" / "topics.json")
        topics.load(
            default_topic_queue_nums=config.default_topic_queue_nums,
            auto_create=config.auto_create_topic_enable,
            delay_levels=len(config.delay_levels_ms),
        )
        groups = GroupTable(root / "config" / "subscriptionGroup.json")
        groups.load()
        offsets = OffsetTable(root / "config" / "consumerOffset.json")
        offsets.load()
        delay_offsets = DelayOffsetTable(root / "config" / "delayOffset.json")
        delay_offsets.load()
        self._state = BrokerState(
            config=config,
            store=store,
            topics=topics,
            groups=groups,
            offsets=offsets,
            delay_offsets=delay_offsets,
            clients=ClientTable(config.channel_expired_timeout / 1000),
            locks=QueueLocks(config.rebalance_lock_max_live_time / 1000),
            longpoll=longpoll,
            address=self.address,
            fences=FencedTopics(store, topics),
            clock=self._clock,
            wall_ms=self._wall_ms,
            on_topics_changed=self._register_now.set,
            perm=config.broker_permission,
            role=config.broker_role,
            serving_since=self._clock(),
            wake_clients=self._clients_wake.set,
            stats=BrokerStats(self._clock()),
            auth=self.auth,
            boot_ms=self._wall_ms(),
        )
        store.observe_flushes(self._state.stats.flush_latency.observe)
        store.keep_log_offset = self._state.fences.keep_log_offset
        start_queues = functools.partial(queuemap.start_hosted_queues, store, config.broker_name)
        topics.observers.append(start_queues)
        for topic_config in list(topics.configs.values()):
            start_queues(topic_config)
        forwarder = Forwarder(self._namesrv, config.namesrv_addrs)  # deliveries moved off
        self.schedule = ScheduleService(self._state, forwarder)
        self.timer = TimerService(self._state, forwarder)
        self.transactions = TransactionService(self._state)
        self.sink = SinkService(self._state, prepared_timeout_ms=config.sink_prepared_timeout)
        self.pop_reviver = PopReviver(self._state)
        self._spawn(self.pop_reviver.run())
        await self._start_replication(store)
        for work in (
            self._register_loop(),
            self._offsets_loop(),
            self._clients_loop(),
            self._retention_loop(),
            self.schedule.run(),
            self.timer.run(),
            self.transactions.run(),
            self.sink.run(),
            self._stats_loop(),
        ):
            self._spawn(work)
        if config.metrics_exporter_type is MetricsExporterType.PROM:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(FuncCollector(lambda: metrics.collect(self.state)))
            self.metrics = MetricsServer(
                registry,
                config.metrics_prom_exporter_host or config.listen_host,
                config.metrics_prom_exporter_port,
            )
            await self.metrics.start()
        log.info(
            "broker %s (%s/%s) listening on %s",
            config.broker_name,
            config.broker_cluster_name,
            config.broker_role.value,
            self.address,
        )

    async def _start_replication(self, store: Store) -> None:
        self._epochs = EpochFile.open(self.config.store_path_root_dir)
        self._master_epoch = self._epochs.history.last_epoch
        if self.config.enable_controller_mode:
            self.state.role = BrokerRole.SLAVE  # fenced until the controller names a role
            self.replicas = ReplicasManager(self, self._namesrv)
            self.router.add(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self.replicas.notified)
            self.router.add(RequestCode.GET_BROKER_EPOCH_CACHE, self.replicas.epoch_cache)
            self.router.add(RequestCode.NOTIFY_TOPICS_CHANGED, self.replicas.topics.notified)
            self._spawn(self.replicas.run())
        elif self.config.broker_role is BrokerRole.SLAVE:
            self._start_slave()
            self.role_assigned.set()
        else:
            await self._start_master(self.config.broker_role)
            self.role_assigned.set()

    def _ha_secret(self, access_key: str) -> str | None:
        """The secret a slave proves on the HA port: an admin account's, or a Super user's."""
        if self.acl is None:
            user = self.auth.state.users.get(access_key)
            if user is None or user.status is not UserStatus.ENABLE:
                return None
            return user.password if user.user_type is UserType.SUPER else None
        account = self.acl.acl.config.accounts.get(access_key)
        return account.secret_key if account is not None and account.admin else None

    def _start_slave(self) -> None:
        config, state = self.config, self.state
        state.role = BrokerRole.SLAVE
        slave = ReplicationSlave(
            state.store,
            self._require_epochs(),
            SlaveConfig(
                self.broker_id,
                heartbeat_interval=config.ha_send_heartbeat_interval / 1000,
                housekeeping_interval=config.ha_housekeeping_interval / 1000,
                local_host=_source_host(config.listen_host),
            ),
            self._master_ha,
        )
        slave.expected_epoch = self._master_epoch
        self.slave = slave
        state.serving_since = self._clock()
        self._follower = MetadataFollower.from_last_snapshot(state)
        self._spawn_role(slave.run())
        self._spawn_role(self._follower.run())

    async def _start_master(
        self,
        role: BrokerRole,
        epoch: int | None = None,
        members: frozenset[int] | None = None,
        follower: MetadataFollower | None = None,
    ) -> None:
        """Become master; `follower`: the metadata reader this broker ran as a slave, if any."""
        config, state = self.config, self.state
        master = ReplicationMaster(
            state.store,
            self._require_epochs(),
            HAConfig(
                sync=role is BrokerRole.SYNC_MASTER,
                heartbeat_interval=config.ha_send_heartbeat_interval / 1000,
                housekeeping_interval=config.ha_housekeeping_interval / 1000,
                transfer_batch_bytes=config.ha_transfer_batch_size,
                max_lag_seconds=config.ha_max_time_slave_not_catchup / 1000,
                min_in_sync_replicas=config.min_in_sync_replicas,
                commit_timeout=config.slave_timeout / 1000,
                durable_only=config.flush_disk_type is FlushDiskType.SYNC_FLUSH,
            ),
            master_id=self.broker_id,
            members=members,
            clock=self._clock,
            on_change=self.on_sync_state_change,
            on_confirm=state.schedule_dispatch,
            busy_poll=self.busy_poll,
            secret_of=self._ha_secret if self.acl or self.auth_guard else None,
        )
        self._master_epoch = master.become_master(epoch)
        # this log is the group's now: apply every metadata record it holds before writing the
        # snapshot. A broker that starts as master (after a crash) has only its periodic
        # consumerOffset.json otherwise, and would forget offset commits it acknowledged since
        # (commit-regression found by `ferry chaos`, schedule strand-slave seed 3).
        state.store.dispatch()
        follower = follower or MetadataFollower.from_last_snapshot(state)
        while follower.catch_up():
            pass
        # and the records above the watermark this broker knows: the old master may have
        # acknowledged an offset commit among them just before this replica heard of it
        # (commit-regression found by a one-hour `ferry chaos` soak, seed 1)
        follower.apply_held()
        self.metadata_replayed = follower.replayed
        # the fences too: this log's records, held ones included, decide the next appends
        state.fences.become_master()
        await master.start(config.listen_host, config.ha_port)
        state.role = role
        state.serving_since = self._clock()
        self.replication = master
        state.replication = master
        state.topics.set_state_version(self._master_epoch)
        metalog = MetadataLog(state)
        metalog.snapshot()
        self._metalog = metalog
        state.metadata_committed = metalog.committed
        self._spawn_role(metalog.run())
        if config.init_authentication_user:
            init_super_user(state.auth, config.init_authentication_user)

    def _require_epochs(self) -> EpochFile:
        if self._epochs is None:
            raise RuntimeError("broker not started")
        return self._epochs

    def _spawn_role(self, work: Coroutine[Any, Any, None]) -> None:
        self._role_tasks.append(asyncio.get_running_loop().create_task(work))

    async def _stop_role(self) -> None:
        """Stop what the current role runs: the HA side and the metadata writer or reader."""
        tasks, self._role_tasks = self._role_tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.state.fences.stop_master()  # a slave's log may be cut: its view would be stale
        if self.replication is not None:
            await self.replication.close()  # commit waiters answer "not committed"
            self.replication = None
            self.state.replication = None
        if self._metalog is not None:
            self._metalog.detach()
            self._metalog = None
            self.state.metadata_committed = None
        self.slave = None
        self._follower = None

    def _stale(self, master_epoch: int) -> bool:
        """Whether a role change for `master_epoch` comes too late (a newer one is known).

        The first role a fenced broker gets may repeat the epoch it knows (it restarted and
        nothing changed); every later one must be newer.
        """
        known = self._master_epoch
        if master_epoch > known or (self.fenced and master_epoch == known):
            return False
        log.warning("ignoring master epoch %d: epoch %d is already known", master_epoch, known)
        return True

    @property
    def epoch_entries(self) -> tuple[EpochEntry, ...]:
        """This broker's epoch history (epoch, start offset), oldest first."""
        return tuple(self._require_epochs().history.entries)

    @property
    def log_epoch(self) -> int:
        """The last epoch in this broker's epoch file (what its log was last written under)."""
        return self._require_epochs().history.last_epoch

    @property
    def master_epoch(self) -> int:
        """The newest master epoch this broker knows (its own, or the one a controller named)."""
        return self._master_epoch

    async def change_to_master(
        self,
        master_epoch: int,
        sync_state_set: frozenset[int] = frozenset(),
        *,
        role: BrokerRole = BrokerRole.SYNC_MASTER,
    ) -> bool:
        """Become the group's master for `master_epoch` (a controller's election; a switchover).

        The epoch is on disk before any write is taken; bytes this broker holds above the old
        confirm offset are kept and commit once the new SyncStateSet has them (Kafka leader-epoch
        semantics). Returns False, changing nothing, for an epoch not newer than the known one.
        """
        async with self._role_lock:
            if self._stale(master_epoch):
                return False
            state = self.state
            members = frozenset(sync_state_set) | {self.broker_id}
            if self.replication is not None:
                self._master_epoch = self.replication.become_master(master_epoch)
                state.topics.set_state_version(master_epoch)
            else:
                follower = self._follower
                await self._stop_role()
                await self._start_master(role, master_epoch, members, follower)
            self.on_master()
            self.fenced = False
            state.lease = NO_LEASE_YET if self.config.enable_controller_mode else None
            self.role_assigned.set()
            self.on_role_change()
            log.info(
                "now master of %s at epoch %d, SyncStateSet %s",
                self.config.broker_name,
                master_epoch,
                sorted(members),
            )
            self._register_now.set()
            return True

    async def change_to_slave(self, master_address: str, master_epoch: int) -> bool:
        """Follow the master at `master_address`, elected for `master_epoch`.

        A deposed master stops taking writes (waiting sends answer "not committed") and its
        log is truncated to where it matches the new master's in the HA handshake. Returns
        False, changing nothing, for an epoch not newer than the known one.
        """
        async with self._role_lock:
            if self._stale(master_epoch):
                return False
            self._master_epoch = master_epoch
            moved = master_address != self._master_address
            self._master_address = master_address
            if self.slave is not None:
                self.slave.expected_epoch = master_epoch
                if moved:
                    # the address learned for the old master is stale; follow the new one now
                    self._master_ha_address = None
                    self.slave.reconnect()
            else:
                await self._stop_role()
                self._master_ha_address = None
                self._start_slave()
            self.fenced = False
            self.state.lease = None
            self.role_assigned.set()
            self.on_role_change()
            log.info(
                "now slave of %s (%s) at epoch %d",
                self.config.broker_name,
                master_address,
                master_epoch,
            )
            self._register_now.set()
            return True

    async def follow_master_at(self, master_address: str, master_epoch: int) -> None:
        """As a slave, follow the known epoch's master at a new address (it restarted there).

        A master back before any election keeps its epoch (`change_to_slave` takes newer ones
        only); without this its slaves kept asking the old address for its HA port, for ever.
        """
        async with self._role_lock:
            if (
                self.slave is None
                or master_epoch != self._master_epoch
                or master_address == self._master_address
            ):
                return
            self._master_address = master_address
            self._master_ha_address = None
            self.slave.reconnect()
            log.info(
                "the master of %s at epoch %d is now at %s: following it there",
                self.config.broker_name,
                master_epoch,
                master_address,
            )
            self._register_now.set()

    async def switch_classic_role(
        self,
        role: BrokerRole,
        broker_id: int,
        master_address: str | None = None,
        master_epoch: int | None = None,
    ) -> int:
        """Classic mode: take the id and role a switchover assigns (`switchover.py`).

        A slave becomes master under its log's next epoch; a master becomes the slave of
        `master_address` from `master_epoch` on. The new id and role are on disk first, so a
        crash midway restarts the broker in the role the switchover gave it. Asking for the role
        the broker already has, with its id, changes nothing. Returns the master epoch the broker
        now leads or follows.

        Raises:
            RequestError: controller mode, or a role change the broker cannot make.
        """
        state = self.state
        if self.config.enable_controller_mode:
            raise RequestError(ResponseCode.NO_PERMISSION, "controller mode: a controller decides")
        if (role is BrokerRole.SLAVE) == (not state.is_master) and broker_id == self.broker_id:
            if role is BrokerRole.SLAVE and master_address != self._master_address:
                raise RequestError(
                    ResponseCode.SYSTEM_ERROR,
                    f"already a slave, of {self._master_address}, not of {master_address}",
                )
            return self._master_epoch
        if role is BrokerRole.SLAVE and (master_address is None or master_epoch is None):
            raise RequestError(ResponseCode.INVALID_PARAMETER, "a slave needs its master")
        await asyncio.to_thread(switchover.save_role_file, self.config, broker_id, role)
        self.config = dataclasses.replace(self.config, broker_id=broker_id, broker_role=role)
        state.config = dataclasses.replace(state.config, broker_id=broker_id, broker_role=role)
        self.broker_id = broker_id
        if role is BrokerRole.SLAVE:
            assert master_address is not None  # checked above
            assert master_epoch is not None
            changed = await self.change_to_slave(master_address, master_epoch)
        else:
            epoch = max(self._master_epoch, self.log_epoch) + 1
            changed = await self.change_to_master(epoch, role=role)
        if not changed:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"epoch {master_epoch} is older than this broker's"
            )
        return self._master_epoch

    async def _master_ha(self) -> str | None:
        """Where a slave's master takes HA connections.

        Learned from the NameServers' answer to this slave's registration (RocketMQ's
        `haServerAddr`); while the slave is not connected it asks them again at each retry.
        """
        if self.config.ha_master_address:
            return self.config.ha_master_address
        if self.config.enable_controller_mode and self._master_address is None:
            return None  # only the master a controller named is followed
        if self.slave is not None and not self.slave.connected.is_set():
            self._register_now.set()
        return self._master_ha_address

    @property
    def ha_address(self) -> str | None:
        """`brokerIP1:port` of this master's HA listener (None on a slave)."""
        if self.replication is None:
            return None
        return format_address(self.config.broker_ip1, self.replication.port)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(work))

    async def close(self) -> None:
        """Unregister, stop background work and serving, flush and close the store."""
        state = self._state
        if state is not None:
            await self._unregister()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if state is not None:
            await self._stop_role()
        if state is not None:
            state.longpoll.wake_all()
        await self._server.close()
        await self._namesrv.close()
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None
        if state is not None:
            state.offsets.save_if_dirty()
            state.delay_offsets.save_if_dirty()
            state.stop_dispatch_retry()
            state.store.close()
            self._state = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ NameServers

    def _register_request(self) -> RemotingCommand:
        state = self.state
        config = self.config
        header = RegisterBrokerRequestHeader(
            broker_name=config.broker_name,
            broker_addr=self.address,
            cluster_name=config.broker_cluster_name,
            ha_server_addr=self.ha_address or "",
            broker_id=self.broker_id if not state.is_master else 0,
            heartbeat_timeout_millis=config.broker_timeout_millis,
        )
        wrapper = state.topics.wrapper()
        if state.perm & 6 != 6:  # a read-only or write-only broker says so in every route
            wrapper.topic_config_table = {
                name: msgspec.structs.replace(topic, perm=topic.perm & (state.perm | ~6))
                for name, topic in wrapper.topic_config_table.items()
            }
        body = RegisterBrokerBody(wrapper)
        return RemotingCommand(
            code=RequestCode.REGISTER_BROKER,
            ext_fields=to_ext_fields(header),
            body=encode_register_body(body, compressed=False),
        )

    async def register(self) -> int:
        """Register with every NameServer now; returns how many accepted."""
        accepted = 0
        for address in self.config.namesrv_addrs:
            try:
                response = await self._namesrv.call(
                    address, self._register_request(), _NAMESRV_TIMEOUT_S
                )
            except FerryError as exc:
                log.warning("could not register with NameServer %s: %s", address, exc)
                continue
            if response.code == ResponseCode.SUCCESS:
                accepted += 1
                result = from_ext_fields(RegisterBrokerResponseHeader, response.ext_fields)
                named = self._master_address
                if result.ha_server_addr and (named is None or result.master_addr == named):
                    self._master_ha_address = result.ha_server_addr
            else:
                log.warning("NameServer %s refused the registration: %s", address, response.remark)
        return accepted

    async def _unregister(self) -> None:
        header = UnregisterBrokerRequestHeader(
            broker_name=self.config.broker_name,
            broker_addr=self.address,
            cluster_name=self.config.broker_cluster_name,
            broker_id=self.broker_id if not self.state.is_master else 0,
        )
        for address in self.config.namesrv_addrs:
            request = RemotingCommand(
                code=RequestCode.UNREGISTER_BROKER, ext_fields=to_ext_fields(header)
            )
            with contextlib.suppress(FerryError):
                await self._namesrv.call(address, request, 1.0)

    async def _register_loop(self) -> None:
        period = self.config.register_name_server_period / 1000
        while True:
            self._register_now.clear()
            if not self.fenced:
                await self.register()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):
                    await self._register_now.wait()

    # ------------------------------------------------------------------ housekeeping

    async def _offsets_loop(self) -> None:
        state = self.state
        interval = self.config.flush_consumer_offset_interval / 1000
        while True:
            await asyncio.sleep(interval)
            for table in (state.offsets, state.delay_offsets):
                data = table.snapshot()
                if data is not None:
                    await _write_file(table.path, data)

    def _connection_closed(self, conn: Connection) -> None:
        state = self._state
        if state is None:
            return
        for group in state.clients.connection_closed(conn):
            log.info("a client of group %s disconnected", group)
            consumer.notify_group_changed(state, group)

    async def _clients_loop(self) -> None:
        """Expire silent clients: every `_CLIENT_SCAN_S`, or at the next session deadline."""
        state = self.state
        while True:
            self._clients_wake.clear()
            deadline = state.clients.next_deadline()
            wait_s = _CLIENT_SCAN_S
            if deadline is not None:
                wait_s = min(wait_s, max(deadline - state.clock(), _CLIENT_SCAN_MIN_S))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._clients_wake.wait()
            consumer.expire_clients(state)

    async def _stats_loop(self) -> None:
        """Snapshot the throughput counts, so rates cover the last seconds, minute, 10 minutes."""
        while True:
            runtime.roll_days(self.state)  # the midnight totals (GET_BROKER_RUNTIME_INFO)
            await asyncio.sleep(_STATS_SAMPLE_S)
            self.state.stats.sample(self._clock())

    async def _retention_loop(self) -> None:
        state = self.state
        while True:
            await asyncio.sleep(_RETENTION_SCAN_S)
            config = state.config  # UPDATE_BROKER_CONFIG may have changed it
            usage = shutil.disk_usage(config.store_path_root_dir)
            full = usage.used / usage.total > config.disk_max_used_space_ratio / 100
            now = datetime.datetime.fromtimestamp(self._wall_ms() / 1000)
            hour = f"{now.hour:02d}"
            due = hour in [h.strip() for h in config.delete_when.split(";")]
            if full or due:
                deleted = await retention.delete_expired(state)
                if deleted:
                    log.info("deleted %d expired commit-log segment(s)", deleted)


async def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(write_atomic, path, data)
