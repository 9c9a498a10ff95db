"""The slave side of HA replication: connect, handshake, truncate, replay, ack.

Spec: reference/rocketmq-controller-spec.md sections 4.2-4.3 (slave states), 4.5 (`doTruncate`)
and section 9 items 4, 5 and 12, which ferrymq follows:

- the truncation point comes from `handshake.consistent_point`; a slave without an epoch history
  or without a common epoch is wiped and resynced, never trusted;
- the epoch history is cut with the log (the store writes its intent first, so a crash mid-way
  finishes the cut at the next open);
- the first ack goes out right after the handshake, then after every read that grew the log
  (records checked and written, before they are indexed: the master's sends wait for it) and
  every `heartbeat_interval`;
- transfers must continue the log exactly where it ends; a record split across two packets is
  held until the rest arrives; anything else closes the connection with a logged reason, and the
  slave reconnects after a back-off;
- packets are handled in the connection's `data_received` as they arrive (an asyncio Protocol,
  not streams: no task wake-up between the bytes and the ack);
- a master with ACL on challenges first: the slave answers with its credentials (`haauth`),
  the process's unless `SlaveConfig.credentials` names others; without any it stops, logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ferrymq import testbugs
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.model import parse_address
from ferrymq.replication.haauth import proof
from ferrymq.replication.handshake import consistent_point
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import process_credentials
from ferrymq.security.tls import process_client_tls
from ferrymq.store.epochs import EpochFile, EpochHistory
from ferrymq.store.store import Store
from ferrymq.wire.ha import (
    AuthChallenge,
    MasterHandshake,
    MasterPacketDecoder,
    SlaveAuth,
    SlaveHandshake,
    Transfer,
    encode_slave_ack,
    encode_slave_auth,
    encode_slave_handshake,
)

__all__ = ["ReplicationSlave", "SlaveConfig"]

log = logging.getLogger(__name__)

_FAST_RETRY_S = 5.0
"""How long after a new master was named the slave retries every `_FAST_RETRY_INTERVAL_S`."""
_FAST_RETRY_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class SlaveConfig:
    """Slave settings (RocketMQ keys in parentheses)."""

    broker_id: int
    heartbeat_interval: float = 5.0
    """`haSendHeartbeatInterval`: acks go out at least this often."""
    housekeeping_interval: float = 20.0
    """`haHousekeepingInterval`: a master silent this long is dropped and reconnected."""
    retry_interval: float = 1.0
    """Back-off before reconnecting (RocketMQ: 5 s)."""
    local_host: str | None = None
    """Source address of the connection to the master (None: the kernel's choice)."""
    credentials: Credentials | None = None
    """The account answering a master's HA challenge (None: the process's credentials)."""


class ReplicationSlave:
    """Keeps this store a copy of its master's log."""

    def __init__(
        self,
        store: Store,
        epochs: EpochFile,
        config: SlaveConfig,
        master_address: Callable[[], Awaitable[str | None]],
    ) -> None:
        self.store = store
        self.epochs = epochs
        self.config = config
        self._master_address = master_address
        self.connected = asyncio.Event()
        self.master_confirm_offset = 0
        self.expected_epoch = 0
        """The master epoch a controller named: a master with an older last epoch is refused."""
        self._link: _MasterLink | None = None
        self._fast_retry_until = 0.0
        self._tail = b""
        self._first_transfer = True
        """No transfer applied yet on this connection: the only one that may start past the log's
        end (the master no longer has what follows it)."""
        self._reported = 0
        self._last_ack = 0.0

    async def run(self) -> None:
        """Replicate until cancelled, reconnecting after any failure."""
        while True:
            address = await self._master_address()
            if not address:
                await asyncio.sleep(self._retry_interval())
                continue
            try:
                await self._replicate(address)
            except (ProtocolError, FerryError) as exc:
                log.warning("replication from %s stopped: %s", address, exc)
            except (OSError, TimeoutError) as exc:
                log.info("replication from %s interrupted: %s", address, exc)
            finally:
                self.connected.clear()
                self._tail = b""
            await asyncio.sleep(self._retry_interval())

    def _retry_interval(self) -> float:
        """Seconds before the next attempt: short for a while after a new master was named."""
        if time.monotonic() < self._fast_retry_until:
            return min(_FAST_RETRY_INTERVAL_S, self.config.retry_interval)
        return self.config.retry_interval

    async def _replicate(self, address: str) -> None:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        link = _MasterLink(self)
        tls = process_client_tls().context
        transport, _ = await asyncio.wait_for(
            loop.create_connection(
                lambda: link,
                host,
                port,
                local_addr=(self.config.local_host, 0) if self.config.local_host else None,
                ssl=tls,
                server_hostname=host if tls is not None else None,
            ),
            self.config.housekeeping_interval,
        )
        self._link = link
        ticker = loop.create_task(self._tick(link))
        try:
            await link.ended
        finally:
            ticker.cancel()
            self._link = None
            transport.abort()

    def reconnect(self) -> None:
        """Drop the master connection (a new master was named) and look for the new one now."""
        self._fast_retry_until = time.monotonic() + _FAST_RETRY_S
        if self._link is not None:
            self._link.abort()

    def _handshaken(self, link: _MasterLink, handshake: MasterHandshake) -> None:
        """The master's HANDSHAKE: truncate to it, then ack at once (not after 5 s: RocketMQ)."""
        self._truncate_to_master(handshake)
        self._first_transfer = True
        self._reported = self.store.max_log_offset
        link.ack(self._reported)
        self.connected.set()

    def _received(self, link: _MasterLink, transfers: list[Transfer]) -> None:
        """Apply transfers; ack what grew the log, then index it (sends wait for the ack)."""
        for transfer in transfers:
            self._apply(transfer)
        end = self.store.max_log_offset
        if end > self._reported:
            link.ack(end)
            self._reported, self._last_ack = end, time.monotonic()
        self.store.dispatch()

    async def _tick(self, link: _MasterLink) -> None:
        """Ack every `heartbeat_interval`; drop a master silent for `housekeeping_interval`."""
        config = self.config
        while True:
            await asyncio.sleep(min(config.heartbeat_interval, config.housekeeping_interval) / 2)
            now = time.monotonic()
            if now - link.last_read >= config.housekeeping_interval:
                log.warning(
                    "the master sent nothing for %g s: reconnecting", config.housekeeping_interval
                )
                link.abort()
                return
            if link.handshaken and now - self._last_ack >= config.heartbeat_interval:
                link.ack(self.store.max_log_offset)
                self._last_ack = now

    def _truncate_to_master(self, handshake: MasterHandshake) -> None:
        store, epochs = self.store, self.epochs
        newest = max(epochs.history.last_epoch, self.expected_epoch)
        if handshake.last_epoch < newest:
            # A deposed master still listening: following it would cut bytes its successor
            # committed. Refuse before anything is truncated.
            raise FerryError(
                f"the master's last epoch {handshake.last_epoch} is older than epoch {newest} "
                "this slave already knows: not following a deposed master"
            )
        local_end = store.max_log_offset
        point = consistent_point(
            epochs.history,
            local_end,
            EpochHistory(list(handshake.epochs)),
            handshake.max_log_offset,
        )
        if point < local_end and not testbugs.SKIP_TRUNCATION:
            if not epochs.history.entries:
                log.warning("log without an epoch history: wiping %d bytes to resync", local_end)
            log.warning(
                "truncating the log from %d to %d, where it stops matching the master's",
                local_end,
                point,
            )
            store.truncate(point)
        epochs.truncate_from_offset(point)

    def _apply(self, packet: Transfer) -> None:
        store = self.store
        expected = store.max_log_offset + len(self._tail)
        if packet.log_offset != expected:
            if not (self._first_transfer and packet.log_offset > expected and not self._tail):
                raise ProtocolError(
                    f"transfer at log offset {packet.log_offset}, but this log continues at "
                    f"{expected}"
                )
            # The master starts at its first byte when it no longer has what follows this log
            # (retention deleted it): this replica's older bytes cannot be continued.
            log.warning(
                "the master's log starts at %d, past this log's end %d: dropping this log's "
                "%d bytes and continuing from there",
                packet.log_offset,
                expected,
                expected - store.min_log_offset,
            )
            store.restart_log_at(packet.log_offset)
            self.epochs.truncate_from_offset(0)
        self._first_transfer = False
        if packet.epoch != self.epochs.history.last_epoch:
            self.epochs.assign(packet.epoch, packet.epoch_start_offset)
        if packet.body:
            data = self._tail + packet.body
            base = packet.log_offset - len(self._tail)
            written = store.append_replica(base, data)
            self._tail = data[written - base :]
        self.master_confirm_offset = packet.confirm_offset
        store.set_confirm_offset(packet.confirm_offset, dispatch=False)


class _MasterLink(asyncio.Protocol):
    """The connection to the master: packets are handled in `data_received` as they arrive.

    Acks go out at once; while the transport's buffer is full (a master that stopped reading)
    only the newest is kept and written when it drains. `ended` fails when the connection is
    gone, with the error that ended it (a bad packet, or the connection's own end).
    """

    def __init__(self, slave: ReplicationSlave) -> None:
        self.slave = slave
        self.decoder = MasterPacketDecoder()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.handshaken = False
        self.answered = False
        self.last_read = time.monotonic()
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._unsent_ack: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.write(encode_slave_handshake(SlaveHandshake(self.slave.config.broker_id)))

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        try:
            packets = self.decoder.feed(data)
            while not self.handshaken and packets and isinstance(packets[0], AuthChallenge):
                self._answer(typing.cast(AuthChallenge, packets.pop(0)))
            if not self.handshaken and packets:
                handshake = packets.pop(0)
                if not isinstance(handshake, MasterHandshake):
                    raise ProtocolError("the master sent a TRANSFER before its HANDSHAKE")
                self.handshaken = True
                self.slave._handshaken(self, handshake)
            transfers: list[Transfer] = []
            for packet in packets:
                if isinstance(packet, MasterHandshake):
                    raise ProtocolError("a second HANDSHAKE on one connection")
                if isinstance(packet, AuthChallenge):
                    raise ProtocolError("an AUTH challenge after the HANDSHAKE")
                transfers.append(packet)
            if transfers:
                self.slave._received(self, transfers)
        except Exception as exc:  # noqa: BLE001 - handed to `run`, which logs or re-raises it
            self._end(exc)
            self.abort()

    def _answer(self, challenge: AuthChallenge) -> None:
        """Prove the account to a master that asked (once per connection)."""
        if self.answered:
            raise ProtocolError("a second AUTH challenge on one connection")
        self.answered = True
        credentials = self.slave.config.credentials or process_credentials()
        if credentials is None:
            raise FerryError(
                "the master requires HA authentication (its ACL is on) and this broker has no "
                "credentials (FERRY_ACCESS_KEY / FERRY_SECRET_KEY of a cluster admin account)"
            )
        mac = proof(credentials.secret_key, challenge.nonce, self.slave.config.broker_id)
        assert self._transport is not None
        self._transport.write(encode_slave_auth(SlaveAuth(credentials.access_key, mac)))

    def ack(self, offset: int) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._paused:
            self._unsent_ack = offset  # acks are cumulative: the newest says it all
            return
        transport.write(encode_slave_ack(offset))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._unsent_ack is not None:
            offset, self._unsent_ack = self._unsent_ack, None
            self.ack(offset)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._end(exc or ConnectionError("the master closed the connection"))

    def _end(self, exc: BaseException) -> None:
        if not self.ended.done():
            self.ended.set_exception(exc)
