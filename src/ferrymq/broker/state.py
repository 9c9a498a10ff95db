"""What every broker request handler works on: one object, owned by the broker's event loop.

The handler modules (`send`, `pull`, `consumer`, `query`, `admin`) take a `BrokerState` and a
request; `broker.Broker` builds the state, routes request codes to the handlers and runs the
background tasks. Nothing here blocks: the store's only blocking work (fsync) runs on its flusher
thread.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from ferrymq import clock as process_clock
from ferrymq.broker.clients import ClientTable, QueueLocks
from ferrymq.broker.config import BrokerConfig, BrokerRole
from ferrymq.broker.fenced import FencedTopics
from ferrymq.broker.longpoll import LongPoll
from ferrymq.broker.metadata import (
    DelayOffsetTable,
    GroupConfig,
    GroupTable,
    OffsetTable,
    TopicTable,
)
from ferrymq.broker.metrics import BrokerStats
from ferrymq.broker.pop import PopState
from ferrymq.broker.runtime import DailyTotals
from ferrymq.errors import RequestError
from ferrymq.model import parse_address, validate_group
from ferrymq.replication.master import ReplicationMaster
from ferrymq.rpc.connection import Connection
from ferrymq.security.acl2guard import AuthStore
from ferrymq.store.store import Store
from ferrymq.wire.bodies import Perm
from ferrymq.wire.broker import CreateTopicRequestHeader
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.records import pack_host

__all__ = ["NO_LEASE_YET", "BrokerState", "MasterLease", "TopicAuthority"]

log = logging.getLogger(__name__)

_BORN_HOST = "born_host"
_PERM_WRITE = int(Perm.WRITE)
_DISPATCH_RETRY_S = 0.5
"""As a plain int: `IntFlag` arithmetic costs microseconds, and this runs on every send."""


@dataclass(frozen=True, slots=True)
class MasterLease:
    """A master's lease from the controller: writes go on while `clock()` is in [start, until).

    `start` is when the heartbeat that earned it was sent; `until` adds the lease the controller
    granted. A reading before `start` means the clock stepped back since: the lease then proves
    nothing (ARCHITECTURE.md section 6 item 4 assumes time only moves forward), so it does not
    cover it, and writes wait for the next heartbeat's answer.
    """

    start: float
    until: float

    def covers(self, now: float) -> bool:
        """Whether writes may go on at `now`."""
        return self.start <= now < self.until


NO_LEASE_YET: Final = MasterLease(math.inf, -math.inf)
"""A new master in controller mode: no writes until a heartbeat's answer grants a lease."""


class TopicAuthority(Protocol):
    """Who decides this broker's topics in controller mode: the controller (`topicsync.py`)."""

    async def put_on_group(
        self, header: CreateTopicRequestHeader, *, auto_create: bool = False
    ) -> None:
        """Have the controller create or change the topic on this group; hold it on return.

        Raises:
            RequestError: the controller refused, with its code and remark.
            FerryError: no controller leader answered.
        """
        ...

    async def remove_from_group(self, topic: str) -> None:
        """Have the controller take the topic off this group; dropped here on return.

        Raises:
            RequestError: the controller refused, with its code and remark.
            FerryError: no controller leader answered.
        """
        ...


@dataclass(eq=False)
class BrokerState:
    """The broker's shared state."""

    config: BrokerConfig
    store: Store
    topics: TopicTable
    groups: GroupTable
    offsets: OffsetTable
    delay_offsets: DelayOffsetTable
    clients: ClientTable
    locks: QueueLocks
    longpoll: LongPoll
    address: str
    """`host:port` clients use for this broker."""
    fences: FencedTopics
    """The fences of the fenced topics (`fenced.py`)."""
    clock: Callable[[], float] = process_clock.mono
    """Monotonic seconds for leases and expiry (the process clock, `ferrymq.clock`)."""
    wall_ms: Callable[[], int] = process_clock.wall_ms
    on_topics_changed: Callable[[], None] = lambda: None
    """Called when topic configs change, so NameServers hear of it at once."""
    perm: int = Perm.READ | Perm.WRITE
    replication: ReplicationMaster | None = None
    """This master's HA side (None on a slave)."""
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    """The role now: `brokerRole` at start; a controller changes it (`Broker.change_to_*`)."""
    metadata_committed: Callable[[], Awaitable[bool]] | None = None
    """On a replicating master: write pending metadata changes and wait until they are
    committed (`metalog.MetadataLog.committed`)."""
    lease: MasterLease | None = None
    """Controller mode, on a master: its lease from the controller (writes stop when it no longer
    covers `clock()`; the controller elects no successor before it ends). None: writes need no
    lease (classic mode, or a slave)."""
    serving_since: float = 0.0
    """`clock()` when this broker took its role (became master, or started serving)."""
    wake_clients: Callable[[], None] = lambda: None
    """Called when a client's session timeout may bring the next expiry forward."""
    topic_authority: TopicAuthority | None = None
    """Controller mode, once registered with a controller: topic creates and deletes (admin
    requests, auto-create) go to it (issue 20 section 3). None: this broker decides alone."""
    stats: BrokerStats = field(default_factory=lambda: BrokerStats(process_clock.mono()))
    """Throughput and latency counts (`metrics.py`): TPS in the admin answers, and metrics."""
    pop: PopState = field(default_factory=PopState)
    """POP consumption progress (`pop.py`), replicated through the metadata log."""
    auth: AuthStore = field(default_factory=AuthStore)
    """ACL 2.0 users and ACLs (`security/acl2guard.py`), replicated through the metadata log."""
    boot_ms: int = 0
    """`wall_ms()` when the broker started (`bootTimestamp`)."""
    days: DailyTotals = field(default_factory=DailyTotals)
    """Put and get totals at the last local midnights (`runtime.py`)."""
    _dispatch_scheduled: bool = field(default=False, repr=False)
    _dispatch_retry: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def is_master(self) -> bool:
        """Whether this broker accepts writes by role."""
        return self.role is not BrokerRole.SLAVE

    def check_writable(self) -> None:
        """Raise NO_PERMISSION unless this broker takes sends."""
        if self.role is BrokerRole.SLAVE or not self.perm & _PERM_WRITE:
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self.address}] sending message is forbidden",
            )
        if self.lease is not None and not self.lease.covers(self.clock()):
            raise RequestError(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"the broker[{self.address}] has no master lease from the controller",
            )

    def check_readable(self) -> None:
        """Raise NO_PERMISSION unless this broker serves pulls."""
        if not self.perm & Perm.READ:
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"the broker[{self.address}] pulling message is forbidden",
            )

    def born_host(self, conn: Connection) -> bytes:
        """The packed address of a client connection (stored as each message's born host)."""
        cached = conn.attributes.get(_BORN_HOST)
        if isinstance(cached, bytes):
            return cached
        try:
            host, port = parse_address(conn.peer)
            packed = pack_host(host, port)
        except ValueError:
            packed = pack_host("127.0.0.1", 0)
        conn.attributes[_BORN_HOST] = packed
        return packed

    def schedule_dispatch(self) -> None:
        """Index appended records once this loop turn's requests are in (one write per queue)."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        try:
            self.store.dispatch()
        except Exception:
            log.exception("dispatch failed")
        if self.store.dispatch_error is not None and self._dispatch_retry is None:
            # held records (a full disk) are retried even when no put or read comes to do it
            self._dispatch_retry = asyncio.get_running_loop().call_later(
                _DISPATCH_RETRY_S, self._retry_dispatch
            )

    def stop_dispatch_retry(self) -> None:
        """Cancel a pending retry of held records (before the store closes)."""
        if self._dispatch_retry is not None:
            self._dispatch_retry.cancel()
            self._dispatch_retry = None

    def _retry_dispatch(self) -> None:
        self._dispatch_retry = None
        self.schedule_dispatch()

    def group_config(self, group: str) -> GroupConfig:
        """A subscription group's config, created with defaults when allowed.

        Raises:
            RequestError: SUBSCRIPTION_GROUP_NOT_EXIST when it is unknown and may not be created.
            InvalidNameError: it is unknown and its name breaks the naming rules.
        """
        config = self.groups.get(group)
        if config is not None:
            return config
        validate_group(group)
        if not self.config.auto_create_subscription_group:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist",
            )
        config = GroupConfig(group_name=group, retry_max_times=self.config.max_reconsume_times)
        self.groups.put(config)
        return config
