"""Connected clients: consumer and producer groups, and orderly consumers' queue locks.

RocketMQ's `ConsumerManager`, `ProducerManager` and `RebalanceLockManager`.

Pure bookkeeping with an injected clock; the broker sends the notifications these methods ask for.

Rules:
1. A client belongs to a group while it heartbeats on a live connection; it leaves on
   UNREGISTER_CLIENT, when its connection closes, or after `expire_after` seconds of silence
   (a consumer that sent a session timeout with its heartbeat: after that many).
   A consumer's member data is what its last heartbeat carried.
2. Every change of a consumer group's membership is reported to the caller, which notifies the
   group's clients (NOTIFY_CONSUMER_IDS_CHANGED) so they rebalance at once.
3. A queue lock belongs to one client of a group until it unlocks, or until the lock is not
   renewed within `lock_live_time` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.model import MessageQueue
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import ConsumerData, SubscriptionData

__all__ = ["ClientTable", "ConsumerGroup", "QueueLocks"]


@dataclass(slots=True)
class _Channel:
    client_id: str
    conn: Connection
    last_update: float
    session_timeout: float | None = None
    """Seconds of silence after which this member leaves (None: the table's `expire_after`)."""
    member_data: str = ""
    language: str = "JAVA"
    """The client's language and version, from its heartbeat's header (consumerConnection)."""
    version: int = 0

    def deadline(self, expire_after: float) -> float:
        """When this client leaves unless it heartbeats again."""
        limit = expire_after if self.session_timeout is None else self.session_timeout
        return self.last_update + limit


@dataclass(slots=True)
class ConsumerGroup:
    """One consumer group as its clients describe it."""

    name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    channels: dict[str, _Channel] = field(default_factory=dict)

    @property
    def client_ids(self) -> list[str]:
        """Ids of the group's clients, sorted (what rebalancing divides queues by)."""
        return sorted(self.channels)

    @property
    def connections(self) -> list[Connection]:
        """The group's client connections."""
        return [channel.conn for channel in self.channels.values()]

    def members(self, now: float) -> list[tuple[str, str, float]]:
        """(client id, member data, seconds since its last heartbeat), by client id."""
        return [
            (client_id, channel.member_data, now - channel.last_update)
            for client_id, channel in sorted(self.channels.items())
        ]


class ClientTable:
    """Consumer and producer groups and their clients."""

    def __init__(self, expire_after: float) -> None:
        self.expire_after = expire_after
        self.consumers: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[str, _Channel]] = {}

    def register_consumer(
        self,
        client_id: str,
        conn: Connection,
        data: ConsumerData,
        now: float,
        *,
        language: str = "JAVA",
        version: int = 0,
    ) -> bool:
        """Record a consumer heartbeat; True when the group's membership changed.

        `data.session_timeout_ms` and `data.member_data` must have been checked by the caller.
        """
        group = self.consumers.get(data.group_name)
        if group is None:
            group = self.consumers[data.group_name] = ConsumerGroup(data.group_name)
        group.consume_type = data.consume_type_name
        group.message_model = data.message_model_name
        group.consume_from_where = data.consume_from_where_name
        group.subscriptions = {s.topic: s for s in data.subscription_data_set}
        timeout_ms = data.session_timeout_ms
        session_timeout = None if timeout_ms is None else timeout_ms / 1000
        member_data = data.member_data or ""
        channel = group.channels.get(client_id)
        if channel is not None and channel.conn is conn:
            channel.last_update = now
            channel.session_timeout = session_timeout
            channel.member_data = member_data
            return False
        group.channels[client_id] = _Channel(
            client_id, conn, now, session_timeout, member_data, language, version
        )
        return channel is None

    def register_producer(
        self,
        client_id: str,
        conn: Connection,
        group: str,
        now: float,
        *,
        language: str = "JAVA",
        version: int = 0,
    ) -> None:
        """Record a producer heartbeat."""
        self.producers.setdefault(group, {})[client_id] = _Channel(
            client_id, conn, now, language=language, version=version
        )

    def unregister(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> list[str]:
        """Remove a client from the named groups; returns consumer groups that changed."""
        changed: list[str] = []
        if producer_group and producer_group in self.producers:
            self.producers[producer_group].pop(client_id, None)
        if consumer_group and self._drop_consumer(consumer_group, client_id):
            changed.append(consumer_group)
        return changed

    def _drop_consumer(self, group_name: str, client_id: str) -> bool:
        group = self.consumers.get(group_name)
        if group is None or group.channels.pop(client_id, None) is None:
            return False
        if not group.channels:
            del self.consumers[group_name]
        return True

    def connection_closed(self, conn: Connection) -> list[str]:
        """Remove every client on a closed connection; returns consumer groups that changed."""
        changed = [
            name
            for name, group in list(self.consumers.items())
            for client_id in [c for c, ch in group.channels.items() if ch.conn is conn]
            if self._drop_consumer(name, client_id)
        ]
        for channels in self.producers.values():
            for client_id in [c for c, ch in channels.items() if ch.conn is conn]:
                del channels[client_id]
        return sorted(set(changed))

    def expire(self, now: float) -> list[str]:
        """Remove clients silent past their deadline; returns consumer groups that changed."""
        expire_after = self.expire_after
        changed = {
            name
            for name, group in list(self.consumers.items())
            for client_id in [
                c for c, ch in group.channels.items() if now > ch.deadline(expire_after)
            ]
            if self._drop_consumer(name, client_id)
        }
        for channels in self.producers.values():
            for client_id in [
                c for c, ch in channels.items() if now - ch.last_update > self.expire_after
            ]:
                del channels[client_id]
        return sorted(changed)

    def next_deadline(self) -> float | None:
        """The earliest time a consumer with a session timeout leaves if silent (None: none)."""
        return min(
            (
                channel.deadline(self.expire_after)
                for group in self.consumers.values()
                for channel in group.channels.values()
                if channel.session_timeout is not None
            ),
            default=None,
        )

    def consumer_ids(self, group: str) -> list[str]:
        """The group's client ids (GET_CONSUMER_LIST_BY_GROUP)."""
        found = self.consumers.get(group)
        return found.client_ids if found else []

    def producer_connection(self, group: str) -> Connection | None:
        """A live connection of the producer group (for transaction checks)."""
        for channel in self.producers.get(group, {}).values():
            if not channel.conn.is_closed:
                return channel.conn
        return None


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_update: float


class QueueLocks:
    """Per consumer group, which client holds which queue (for orderly consumption)."""

    def __init__(self, lock_live_time: float) -> None:
        self.lock_live_time = lock_live_time
        self._locks: dict[str, dict[MessageQueue, _Lock]] = {}

    def lock(
        self, group: str, client_id: str, queues: list[MessageQueue], now: float
    ) -> list[MessageQueue]:
        """Lock or renew the queues for `client_id`; returns the ones it now holds."""
        held = self._locks.setdefault(group, {})
        granted: list[MessageQueue] = []
        for queue in queues:
            lock = held.get(queue)
            if (
                lock is None
                or lock.client_id == client_id
                or now - lock.last_update > self.lock_live_time
            ):
                held[queue] = _Lock(client_id, now)
                granted.append(queue)
        return granted

    def unlock(self, group: str, client_id: str, queues: list[MessageQueue]) -> None:
        """Release the queues `client_id` holds."""
        held = self._locks.get(group, {})
        for queue in queues:
            lock = held.get(queue)
            if lock is not None and lock.client_id == client_id:
                del held[queue]

    def holder(self, group: str, queue: MessageQueue, now: float) -> str | None:
        """The client holding a live lock on `queue`, if any."""
        lock = self._locks.get(group, {}).get(queue)
        if lock is None or now - lock.last_update > self.lock_live_time:
            return None
        return lock.client_id
