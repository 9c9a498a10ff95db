"""The master side of HA replication: the HA listener, one sender per slave, commit waiters.

Spec: reference/rocketmq-controller-spec.md sections 4.2-4.3 (master read and write threads),
4.6 (one batch within one epoch), 4.7-4.8 (confirm offset, sync replication); ARCHITECTURE.md
section 6 items 1-3. One asyncio loop (the broker's) owns all of it:

- per slave: read the handshake, answer with the whole epoch history and the log end, then stream
  the commit log from the offset of the slave's first ack; each packet's bytes belong to one epoch
  and carry that epoch's own entry (RocketMQ labels an epoch's last chunk with the next epoch);
- the appends of one loop turn are written to every caught-up slave by one callback right after
  it (no wake-up of a task); a sender task per slave handles the rest (catching up,
  back-pressure, heartbeats);
- each transfer tells `SyncState` the log end it was sent at, so an ack proves the slave was
  caught up then (seed 001's lastMasterMaxOffset and lastTransferTimeMs);
- acks feed `SyncState`; the confirm offset it computes resolves the sends waiting to be
  committed (their responses go first), then gates what the store serves; a changed confirm
  offset goes to every slave with the next transfer, or alone after `_CONFIRM_DELAY`;
- a slave that sends nothing for `housekeeping_interval` is dropped; idle slaves get heartbeats;
- bad packets close that slave's connection with a logged reason; nothing else is affected;
- with `secret_of` (the broker's ACL is on) a slave is served only once it answered the
  connection's challenge with an admin account (`haauth`); a wrong answer drops it, logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import os
import time
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ferrymq import clock as process_clock
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.replication.haauth import SecretOf, check_proof
from ferrymq.replication.syncstate import SyncState, SyncStateChange
from ferrymq.rpc.busypoll import BusyPoll
from ferrymq.security.tls import process_server_tls
from ferrymq.security.tlsserve import Listener, listen
from ferrymq.store.epochs import EpochFile
from ferrymq.store.store import Store
from ferrymq.wire.ha import (
    NONCE_BYTES,
    MasterHandshake,
    SlaveAck,
    SlaveAuth,
    SlaveHandshake,
    SlavePacketDecoder,
    encode_auth_challenge,
    encode_master_handshake,
    encode_transfer_header,
)

__all__ = ["HAConfig", "ReplicationMaster"]

log = logging.getLogger(__name__)

_READ_BYTES = 64 * 1024
_CONFIRM_DELAY = 0.005
"""A confirm-offset change waits this long for a transfer to carry it before a heartbeat does."""


@dataclass(frozen=True, slots=True)
class HAConfig:
    """Replication settings (RocketMQ keys in parentheses)."""

    sync: bool = False
    """Sends are acknowledged only once committed (`brokerRole=SYNC_MASTER`)."""
    heartbeat_interval: float = 5.0
    """`haSendHeartbeatInterval`."""
    housekeeping_interval: float = 20.0
    """`haHousekeepingInterval`: silence after which a connection is dropped."""
    transfer_batch_bytes: int = 32 * 1024
    """`haTransferBatchSize`."""
    max_lag_seconds: float = 15.0
    """`haMaxTimeSlaveNotCatchup`: a member this long behind leaves the SyncStateSet."""
    min_in_sync_replicas: int = 1
    """`minInSyncReplicas`."""
    commit_timeout: float = 3.0
    """`slaveTimeout`: how long a sync send waits to be committed."""
    durable_only: bool = False
    """SYNC_FLUSH: the master counts only its fsynced bytes towards the confirm offset."""


class ReplicationMaster:
    """Serves slaves of this master and tracks what is committed."""

    def __init__(
        self,
        store: Store,
        epochs: EpochFile,
        config: HAConfig,
        *,
        master_id: int = 0,
        members: frozenset[int] | None = None,
        clock: Callable[[], float] = process_clock.mono,
        on_change: Callable[[SyncStateChange], bool] | None = None,
        on_confirm: Callable[[], None] | None = None,
        busy_poll: BusyPoll | None = None,
        secret_of: SecretOf | None = None,
    ) -> None:
        self.store = store
        self.secret_of = secret_of
        """Admin secrets by access key when slaves must authenticate (None: they need not)."""
        self.busy_poll = busy_poll
        """The broker's loop poller, told of every read of a slave's acks."""
        self.epochs = epochs
        self.config = config
        self.clock = clock
        self.state = SyncState(
            master_id,
            members,
            confirm_offset=store.confirm_offset,
            max_lag_seconds=config.max_lag_seconds,
            min_in_sync_replicas=config.min_in_sync_replicas,
        )
        self._on_change = on_change
        self._on_confirm = on_confirm
        """Schedules the store's dispatch after the watermark moved (None: dispatch at once)."""
        self._server: Listener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._links: set[_SlaveLink] = set()
        """Slaves past their handshake: what `appended` pushes to."""
        self._connections: set[_SlaveLink] = set()
        """Every open HA connection."""
        self._waiters: list[tuple[int, int, _Waiter]] = []
        self._expiries: collections.deque[tuple[float, _Waiter]] = collections.deque()
        """The waiters by deadline (loop time): one timer expires them all, oldest first."""
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._push_scheduled = False
        self._sequence = itertools.count()
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    def become_master(self, epoch: int | None = None) -> int:
        """Start `epoch` (default: the next one) at the end of the log, on disk before any write.

        A controller names the epoch; it must be newer than every epoch in this log's history,
        or be the last one again (this broker led that epoch, restarted, and still leads it).

        Raises:
            StoreError: `epoch` is older than the log's last epoch.
        """
        if epoch is None:
            epoch = self.epochs.history.last_epoch + 1
        if epoch != self.epochs.history.last_epoch or not self.epochs.history.entries:
            self.epochs.assign(epoch, self.store.max_log_offset)
        # else: this log's last epoch again (a master restarted before anyone replaced it):
        # the epoch goes on where it is
        self._apply_confirm()
        log.info("master epoch %d starts at log offset %d", epoch, self.store.max_log_offset)
        return epoch

    async def start(self, host: str, port: int) -> None:
        """Listen for slaves."""
        self._server = await listen(
            lambda: _SlaveLink(self), host, port, process_server_tls(), name="HA"
        )
        self.port = self._server.sockname[1]
        self._spawn(self._lag_loop())

    async def close(self) -> None:
        """Stop listening, drop every slave, fail every commit waiter."""
        if self._server is not None:
            self._server.close()
        for link in list(self._connections):
            link.drop("closed by the master")
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        waiters = [waiter for _, _, waiter in self._waiters]
        self._waiters.clear()
        for waiter in waiters:
            waiter.resolve(False)
        self._expiries.clear()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ writes

    @property
    def writable(self) -> bool:
        """Whether the SyncStateSet is large enough to take writes."""
        return not self.config.sync or self.state.writable

    def appended(self) -> None:
        """The log grew: send it to the slaves (and, alone in the set, commit it).

        Sent once this loop turn's requests are in: one transfer per slave covers all the
        appends of the turn (a window of sends arrives in one read).
        """
        if self._links and not self._push_scheduled:
            self._push_scheduled = True
            asyncio.get_running_loop().call_soon(self._push)
        if len(self.state.members) > 1 and not self.config.durable_only:
            # the other members' acks bound the confirm offset and none can cover what was just
            # appended, so it stays; only what the store serves must stop short of the new bytes
            if self.config.sync:
                self.store.set_confirm_offset(self.state.confirm_offset, dispatch=False)
            return
        self._apply_confirm()

    def _push(self) -> None:
        self._push_scheduled = False
        for link in self._links:
            link.send_now()

    async def wait_committed(self, end_offset: int) -> bool:
        """Wait until the confirm offset reaches `end_offset`; False after `commit_timeout`."""
        if self.committed(end_offset):
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def resolve(committed: bool) -> None:
            if not future.done():
                future.set_result(committed)

        self.on_committed(end_offset, resolve)
        return await future

    def committed(self, end_offset: int) -> bool:
        """Whether the confirm offset reached `end_offset`."""
        return self.state.confirm_offset >= end_offset

    def on_committed(self, end_offset: int, callback: Callable[[bool], object]) -> None:
        """Call `callback(True)` once the confirm offset reaches `end_offset`, else False.

        False comes after `commit_timeout`, or when this master closes. True comes right away
        when it already has, else from the code that moved the confirm offset (an ack's
        processing), with no loop turn in between: a sync send's answer goes out in the same
        turn its last ack came in.
        """
        if self.committed(end_offset):
            callback(True)
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(callback)
        heapq.heappush(self._waiters, (end_offset, next(self._sequence), waiter))
        deadline = loop.time() + self.config.commit_timeout
        self._expiries.append((deadline, waiter))  # deadlines only grow: the deque stays sorted
        if self._expiry_timer is None:
            self._expiry_timer = loop.call_at(deadline, self._expire_waiters)

    def _expire_waiters(self) -> None:
        """Fail the waiters whose `commit_timeout` is over; arm the timer for the next one."""
        self._expiry_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expiries = self._expiries
        while expiries and (expiries[0][1].done or expiries[0][0] <= now):
            _, waiter = expiries.popleft()
            waiter.resolve(False)
        if expiries:
            self._expiry_timer = loop.call_at(expiries[0][0], self._expire_waiters)

    def own_end(self) -> int:
        """What this master itself holds: its log's end or, with `durable_only`, what is fsynced.

        With SYNC_FLUSH the confirm offset never passes the master's fsynced bytes: a message
        consumers saw must survive the master's power failure too (found by `ferry chaos`).
        """
        end = self.store.max_log_offset
        if self.config.durable_only:
            return min(end, self.store.flushed_log_offset)
        return end

    def _apply_confirm(self, before: int | None = None) -> None:
        """Recompute the confirm offset; resolve the sends it commits, then index and tell slaves.

        `before`: the confirm offset before the caller changed the state (an ack, a new set
        already moved it); default: the current one.
        """
        if before is None:
            before = self.state.confirm_offset
        written = self.store.max_log_offset
        confirm = self.state.update_confirm(self.own_end())
        if self.config.sync:
            self.store.set_confirm_offset(confirm if confirm < written else None, dispatch=False)
        # the committed sends first: answered here, before the indexing scheduled below
        while self._waiters and self._waiters[0][0] <= confirm:
            _, _, waiter = heapq.heappop(self._waiters)
            waiter.resolve(True)
        expiries = self._expiries
        while expiries and expiries[0][1].done:  # let go of the answered ones
            expiries.popleft()
        if self.config.sync:
            if self._on_confirm is None:
                self.store.dispatch()
            elif confirm != before:
                self._on_confirm()
        if confirm != before:
            for link in self._links:
                link.confirm_moved()

    def apply_change(self, change: SyncStateChange) -> None:
        """Make `change` the SyncStateSet now (one a controller accepted)."""
        if change.members == self.state.members:
            return
        before = self.state.confirm_offset
        log.info(
            "SyncStateSet %s -> %s: %s",
            sorted(self.state.members),
            sorted(change.members),
            change.reason,
        )
        self.state.apply(change, self.own_end(), self.clock())
        self._apply_confirm(before)

    def _change(self, change: SyncStateChange | None) -> None:
        if change is None:
            return
        if self._on_change is not None and not self._on_change(change):
            return
        self.apply_change(change)

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.max_lag_seconds / 4))
            self._change(self.state.check_lag(self.store.max_log_offset, self.clock()))
            if self.config.durable_only:
                self._apply_confirm()  # fsyncs with no send waiting on them (metadata records)


class _Waiter:
    """One `on_committed` callback, called once."""

    __slots__ = ("callback", "done")

    def __init__(self, callback: Callable[[bool], object]) -> None:
        self.callback = callback
        self.done = False

    def resolve(self, committed: bool) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.callback(committed)
        except Exception:  # one answer's failure must not stop the others
            log.exception("a commit callback failed")


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _SlaveLink(asyncio.Protocol):
    """One slave's connection: its acks are handled in `data_received`, a task sends the log.

    New bytes usually go out from `send_now` (the push after a loop turn's appends); the sender
    task catches a slave up, waits out back-pressure and sends heartbeats. Anything bad the
    slave sends, or a sender failure, drops the connection with a logged reason.
    """

    def __init__(self, master: ReplicationMaster) -> None:
        self.master = master
        self.peer = "?"
        self.decoder = SlavePacketDecoder()
        self.broker_id: int | None = None
        self.request_offset: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.position = 0
        """The log offset the next transfer starts at (set once the slave's first ack came)."""
        self.sent_confirm = -1
        self.last_sent = time.monotonic()
        self.last_read = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._woken: asyncio.Future[None] | None = None
        self._confirm_due: asyncio.TimerHandle | None = None
        self._nonce: bytes | None = None
        """This connection's challenge until the slave answered it."""
        self._pending: SlaveHandshake | None = None
        """The slave's HANDSHAKE, held until its answer to the challenge came."""

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.master._connections.add(self)
        self._start(self._housekeeping())
        if self.master.secret_of is not None:
            self._nonce = os.urandom(NONCE_BYTES)
            self.transport.write(encode_auth_challenge(self._nonce))

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        poll = self.master.busy_poll
        if poll is not None:
            poll.read_started()
        try:
            packets = self.decoder.feed(data)
            if self._nonce is not None:
                packets = self._authenticate(packets)
            if self.broker_id is None and packets:
                self._handshake(packets.pop(0))
            self._handle(packets)
        except (ProtocolError, FerryError) as exc:
            self.drop(str(exc), warn=True)
        finally:
            if poll is not None:
                poll.read_done()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.drop(str(exc) if exc else "the slave closed the connection")

    def drop(self, reason: str, *, warn: bool = False) -> None:
        """Close the connection (once) and forget the slave; log why."""
        master = self.master
        if self not in master._connections:
            return
        master._connections.discard(self)
        master._links.discard(self)
        who = f"slave {self.broker_id} at {self.peer}" if self.broker_id is not None else self.peer
        if warn:
            log.warning("closing HA connection from %s: %s", who, reason)
        else:
            log.info("HA connection from %s ended: %s", who, reason)
        if self.broker_id is not None:
            master.state.disconnected(self.broker_id)
        for task in self._tasks:
            task.cancel()
        if self._confirm_due is not None:
            self._confirm_due.cancel()
            self._confirm_due = None
        self._writable.set()  # a sender waiting for room ends (its task is cancelled)
        if self.transport is not None:
            self.transport.abort()

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, (ProtocolError, FerryError)):
            self.drop(str(error), warn=True)
        elif error is not None:
            log.error("HA sender for %s failed", self.peer, exc_info=error)
            self.drop(f"sender failed: {error!r}", warn=True)

    # ------------------------------------------------------------------ packets in

    def _authenticate(
        self, packets: list[SlaveHandshake | SlaveAck | SlaveAuth]
    ) -> list[SlaveHandshake | SlaveAck | SlaveAuth]:
        """Hold the HANDSHAKE until the answer to the challenge; what follows a good answer.

        Raises:
            ProtocolError: anything else first, or a wrong answer (the slave is dropped).
        """
        nonce, secret_of = self._nonce, self.master.secret_of
        assert nonce is not None
        assert secret_of is not None
        while packets:
            packet = packets.pop(0)
            if isinstance(packet, SlaveHandshake) and self._pending is None:
                self._pending = packet
            elif isinstance(packet, SlaveAuth) and self._pending is not None:
                broker_id = self._pending.slave_broker_id
                reason = check_proof(secret_of, packet, nonce, broker_id)
                if reason is not None:
                    raise ProtocolError(f"HA authentication of slave {broker_id} failed: {reason}")
                self._nonce = None
                return [self._pending, *packets]
            else:
                raise ProtocolError(
                    f"HA authentication required: got {type(packet).__name__} out of order"
                )
        return []

    def _handshake(self, first: SlaveHandshake | SlaveAck | SlaveAuth) -> None:
        master = self.master
        if not isinstance(first, SlaveHandshake):
            raise ProtocolError(f"expected a HANDSHAKE first, got {type(first).__name__}")
        if first.slave_broker_id == master.state.master_id:
            raise ProtocolError(f"a slave claims the master's broker id {first.slave_broker_id}")
        self.broker_id = first.slave_broker_id
        master.state.connected(self.broker_id, master.clock())
        history = master.epochs.history
        assert self.transport is not None
        self.transport.write(
            encode_master_handshake(
                MasterHandshake(master.store.max_log_offset, history.last_epoch, history.entries)
            )
        )
        log.info("slave %d at %s connected", self.broker_id, self.peer)
        master._links.add(self)
        self._start(self._send())

    def _handle(self, packets: list[SlaveHandshake | SlaveAck | SlaveAuth]) -> None:
        master = self.master
        for packet in packets:
            if isinstance(packet, SlaveHandshake):
                raise ProtocolError("a second HANDSHAKE on one connection")
            if isinstance(packet, SlaveAuth):
                raise ProtocolError("an AUTH the master did not ask for")
            assert self.broker_id is not None
            end = master.store.max_log_offset
            if packet.ack_offset > end:
                raise ProtocolError(
                    f"slave {self.broker_id} acks log offset {packet.ack_offset} beyond the "
                    f"master's end {end}: it did not truncate"
                )
            if not self.request_offset.done():
                self.request_offset.set_result(packet.ack_offset)
            before = master.state.confirm_offset  # `on_ack` moves it
            master._change(
                master.state.on_ack(
                    self.broker_id,
                    packet.ack_offset,
                    end,
                    master.clock(),
                    own_end=master.own_end(),
                )
            )
            master._apply_confirm(before)

    # ------------------------------------------------------------------ the log out

    def wake(self) -> None:
        """The sender goes on (if it waits for nothing but news)."""
        if self._woken is not None:
            _wake(self._woken)

    def send_now(self) -> None:
        """New bytes: write them in this call when the sender is idle and the socket has room.

        Saves the sender task's wake-up on every append. Anything else (the sender busy or
        draining, a batch left over, an error to report) is left to the sender task.
        """
        woken = self._woken
        if woken is None or woken.done():
            return  # the sender is busy, or about to look at the log end anyway
        transport = self.transport
        if transport is None or transport.is_closing():
            self.wake()
            return
        try:
            self._transfer(transport)
        except ProtocolError:
            self.wake()  # the sender task meets it again and closes the connection
            return
        if (
            self.position < self.master.store.max_log_offset
            or transport.get_write_buffer_size() > 0
        ):
            self.wake()  # more to send, or a slow socket: the sender drains

    def confirm_moved(self) -> None:
        """The confirm offset moved: the next transfer carries it, else a confirm-only one soon."""
        if self._confirm_due is None:
            self._confirm_due = asyncio.get_running_loop().call_later(
                _CONFIRM_DELAY, self._confirm_overdue
            )

    def _confirm_overdue(self) -> None:
        self._confirm_due = None
        self.wake()

    def _transfer(self, transport: asyncio.Transport) -> bool:
        """Write the next batch of the log (within one epoch), if any; whether it wrote one.

        Raises:
            ProtocolError: no epoch covers the position, or the log cannot be read there.
        """
        master = self.master
        store = master.store
        position = self.position
        end = store.max_log_offset
        if position >= end:
            return False
        found = master.epochs.history.find(position, end)
        if found is None:
            raise ProtocolError(f"no epoch covers log offset {position}")
        entry, epoch_end = found
        size = min(epoch_end, end, position + master.config.transfer_batch_bytes) - position
        body = store.commitlog.read(position, size)
        if not body:
            raise ProtocolError(f"the master cannot read its own log at {position}")
        confirm = master.state.confirm_offset
        # one write (one segment, one wake-up of the slave), not header then body
        transport.writelines(
            (
                encode_transfer_header(
                    position, entry.epoch, entry.start_offset, confirm, len(body)
                ),
                body,
            )
        )
        self.position = position + len(body)
        self._sent(confirm, end)
        return True

    def _sent(self, confirm: int, master_end: int) -> None:
        self.sent_confirm = confirm
        self.last_sent = time.monotonic()
        if self.broker_id is not None:  # what an ack of this transfer proves (seed 001)
            self.master.state.on_transfer(self.broker_id, master_end, self.master.clock())
        if self._confirm_due is not None:
            self._confirm_due.cancel()
            self._confirm_due = None

    async def _sleep(self, timeout: float) -> None:
        """Until `wake` or `timeout` seconds, with no task and no timeout context."""
        future = asyncio.get_running_loop().create_future()
        self._woken = future
        handle = future.get_loop().call_later(max(timeout, 0.0), _wake, future)
        try:
            await future
        finally:
            handle.cancel()
            self._woken = None

    async def _drain(self) -> asyncio.Transport:
        """Wait while the socket's buffer is full; the transport, or ConnectionError."""
        if not self._writable.is_set():
            await self._writable.wait()
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionError("the slave connection closed")
        return transport

    async def _housekeeping(self) -> None:
        """Drop a slave that sent nothing for `housekeeping_interval` (it acks every heartbeat)."""
        interval = self.master.config.housekeeping_interval
        while True:
            await asyncio.sleep(min(interval / 4, 1.0))
            if time.monotonic() - self.last_read > interval:
                self.drop(f"silent for {interval:g} s", warn=True)
                return

    async def _send(self) -> None:
        master = self.master
        store = master.store
        position = await self.request_offset
        if position < store.min_log_offset:
            # an empty slave, or one away longer than retention keeps segments: it gets what is
            # left, from the first byte on, and drops its own older bytes (`ReplicationSlave`)
            if position != 0:
                log.warning(
                    "slave %d asks for log offset %d, which retention deleted: sending from the "
                    "first byte kept, %d",
                    self.broker_id,
                    position,
                    store.min_log_offset,
                )
            position = store.min_log_offset
        self.position = position
        self.last_sent = time.monotonic()
        while True:
            transport = await self._drain()
            if self._transfer(transport):
                continue
            confirm = master.state.confirm_offset
            idle = time.monotonic() - self.last_sent
            if confirm != self.sent_confirm and idle < _CONFIRM_DELAY:
                # the next transfer will carry it; tell idle slaves after a moment
                await self._sleep(_CONFIRM_DELAY - idle)
                continue
            if confirm != self.sent_confirm or idle >= master.config.heartbeat_interval:
                last = master.epochs.history.last
                epoch, start = (last.epoch, last.start_offset) if last else (0, 0)
                transport.write(encode_transfer_header(self.position, epoch, start, confirm, 0))
                self._sent(confirm, store.max_log_offset)
                continue
            await self._sleep(master.config.heartbeat_interval - idle)
