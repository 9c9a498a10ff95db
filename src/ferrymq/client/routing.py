"""Topic routes for clients: fetched from any NameServer, cached, refreshed.

A route is refreshed on a timer (`refresh_interval`), and at once when a broker answers that it
is not the master or does not know the topic (`invalidate`). NameServers are tried in turn,
starting after the last one that failed. Brokers that just failed are avoided for a while when
choosing a queue (RocketMQ's latency fault tolerance, simplified to "failed recently").

A topic with moved queues (issue 20 section 4, `wire.queuemap`) comes with its queue map: the
route's queues are then its logical queues, named as they always were, and `segment` /
`send_target` say which physical queue holds an offset or takes a send. Offsets are the same
in every segment, so only the address changes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Final

from ferrymq.errors import FerryError, TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import Perm, TopicRouteData, decode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import GetRouteInfoRequestHeader
from ferrymq.wire.queuemap import QueueMap, QueueSegment, decode_queue_map

__all__ = ["Routes", "TopicRoute"]

log = logging.getLogger(__name__)

_REFETCH_FLOOR_S: Final = 0.2
"""A route that named no master is asked for again once it is this old (`Routes.refetch_soon`)."""

MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic's queues and the addresses of the broker groups holding them."""

    topic: str
    write_queues: list[MessageQueue]
    read_queues: list[MessageQueue]
    brokers: dict[str, dict[int, str]]
    fetched_at: float
    queue_map: QueueMap | None = None
    """The topic's logical queues, when some moved (issue 20 section 4)."""
    named_write_queues: tuple[MessageQueue, ...] = ()
    """With a map: every logical queue that takes writes, moving ones too (a stable list to
    choose from by key); the others are `write_queues`."""

    def segment(self, queue: MessageQueue, offset: int) -> QueueSegment | None:
        """The physical queue of a logical one that holds `offset` (None: no map)."""
        if self.queue_map is None:
            return None
        logical = self.queue_map.logical(queue.broker_name, queue.queue_id)
        return logical.segment_at(offset) if logical is not None else None

    def next_segment(self, queue: MessageQueue, segment: QueueSegment) -> QueueSegment | None:
        """The segment after `segment` of a logical queue, if it is known yet."""
        if self.queue_map is None:
            return None
        logical = self.queue_map.logical(queue.broker_name, queue.queue_id)
        return logical.next_after(segment) if logical is not None else None

    def is_moving(self, queue: MessageQueue) -> bool:
        """Whether the logical queue is being moved (its writes wait for the move's end)."""
        if self.queue_map is None:
            return False
        logical = self.queue_map.logical(queue.broker_name, queue.queue_id)
        return logical is not None and logical.moving is not None

    def send_target(self, queue: MessageQueue) -> MessageQueue | None:
        """The physical queue a send to `queue` goes to (None: it is moving; wait)."""
        if self.queue_map is None:
            return queue
        logical = self.queue_map.logical(queue.broker_name, queue.queue_id)
        if logical is None:
            return queue
        if logical.moving is not None:
            return None
        current = logical.current
        return MessageQueue(queue.topic, current.broker_name, current.queue_id)

    def master(self, broker_name: str) -> str | None:
        """The master's address of a broker group, if it has one."""
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def any_replica(self, broker_name: str) -> str | None:
        """The master, or else any replica, of a broker group."""
        addrs = self.brokers.get(broker_name, {})
        return addrs.get(MASTER_ID) or next(iter(sorted(addrs.items())), (0, None))[1]

    @classmethod
    def from_data(cls, topic: str, data: TopicRouteData, now: float) -> TopicRoute:
        """Expand route data into queues (queue ids 0..n-1 per group, by permission)."""
        write: list[MessageQueue] = []
        read: list[MessageQueue] = []
        for queue in sorted(data.queue_datas, key=lambda q: q.broker_name):
            if queue.perm & Perm.WRITE:
                write += [
                    MessageQueue(topic, queue.broker_name, i) for i in range(queue.write_queue_nums)
                ]
            if queue.perm & Perm.READ:
                read += [
                    MessageQueue(topic, queue.broker_name, i) for i in range(queue.read_queue_nums)
                ]
        brokers = {b.broker_name: dict(b.broker_addrs) for b in data.broker_datas}
        if data.ferry_queue_map:
            try:
                queue_map = decode_queue_map(data.ferry_queue_map)
            except FerryError as exc:
                log.warning("queue map of %s ignored: %s", topic, exc)
            else:
                return cls._mapped(topic, data, queue_map, brokers, now)
        return cls(topic, write, read, brokers, now)

    @classmethod
    def _mapped(
        cls,
        topic: str,
        data: TopicRouteData,
        queue_map: QueueMap,
        brokers: dict[str, dict[int, str]],
        now: float,
    ) -> TopicRoute:
        writable = {q.broker_name for q in data.queue_datas if q.perm & Perm.WRITE}
        read: list[MessageQueue] = []
        named: list[MessageQueue] = []
        write: list[MessageQueue] = []
        for logical in queue_map.logical_queues():
            name = MessageQueue(topic, logical.broker_name, logical.queue_id)
            read.append(name)
            if not queue_map.is_writable_name(*logical.name):
                continue
            named.append(name)
            if logical.moving is None and logical.current.broker_name in writable:
                write.append(name)
        return cls(topic, write, read, brokers, now, queue_map, tuple(named))


class Routes:
    """Cached routes; one per client."""

    def __init__(
        self,
        rpc: RpcClient,
        namesrv_addrs: list[str],
        *,
        refresh_interval: float = 30.0,
        timeout: float = 3.0,
        fault_pause: float = 3.0,
    ) -> None:
        if not namesrv_addrs:
            raise ValueError("at least one NameServer address is needed")
        self._rpc = rpc
        self._namesrvs = list(namesrv_addrs)
        self._start = itertools.cycle(range(len(self._namesrvs)))
        self._refresh_interval = refresh_interval
        self._timeout = timeout
        self._fault_pause = fault_pause
        self._routes: dict[str, TopicRoute] = {}
        self._fetching: dict[str, asyncio.Task[TopicRoute]] = {}
        self._faults: dict[str, float] = {}

    def fresh(self, topic: str) -> TopicRoute | None:
        """The cached route of `topic` if it is not stale (what `get` returns without a fetch)."""
        route = self._routes.get(topic)
        if route is not None and time.monotonic() - route.fetched_at < self._refresh_interval:
            return route
        return None

    async def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the cache unless stale or `refresh`.

        Raises:
            TopicNotFoundError: no NameServer has a route for it.
            ConnectError: no NameServer answered.
        """
        route = self._routes.get(topic)
        if (
            route is not None
            and not refresh
            and time.monotonic() - route.fetched_at < self._refresh_interval
        ):
            return route
        task = self._fetching.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(topic))
            self._fetching[topic] = task
            task.add_done_callback(lambda _: self._fetching.pop(topic, None))
        try:
            return await asyncio.shield(task)
        except FerryError:
            if route is not None and not isinstance(task.exception(), TopicNotFoundError):
                log.warning("keeping the cached route of %s: NameServers unreachable", topic)
                return route
            raise

    def invalidate(self, topic: str) -> None:
        """Forget a topic's route (a broker said it moved)."""
        self._routes.pop(topic, None)

    def refetch_soon(self, topic: str) -> bool:
        """Forget a topic's route unless it is fresher than `_REFETCH_FLOOR_S`; whether it did.

        For a route that names no master for a group a caller needs: the new master registers
        within moments of its election, so waiting for the timer (`refresh_interval`) would
        refuse sends for up to that long. The floor bounds NameServer requests while there is
        no master at all.
        """
        route = self._routes.get(topic)
        if route is not None and time.monotonic() - route.fetched_at >= _REFETCH_FLOOR_S:
            self._routes.pop(topic, None)
            return True
        return False

    async def _fetch(self, topic: str) -> TopicRoute:
        header = to_ext_fields(GetRouteInfoRequestHeader(topic=topic))
        first = next(self._start)
        last_error: FerryError | None = None
        for i in range(len(self._namesrvs)):
            address = self._namesrvs[(first + i) % len(self._namesrvs)]
            request = RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields=dict(header)
            )
            try:
                response = await self._rpc.call(address, request, self._timeout)
            except FerryError as exc:
                last_error = exc
                continue
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                self._routes.pop(topic, None)
                raise TopicNotFoundError(topic)
            if response.code != ResponseCode.SUCCESS:
                last_error = FerryError(f"NameServer {address}: {response.remark}")
                continue
            route = TopicRoute.from_data(
                topic, decode_body(response.body, TopicRouteData), time.monotonic()
            )
            self._routes[topic] = route
            return route
        assert last_error is not None
        raise last_error

    def master_of(self, broker_name: str) -> str | None:
        """The master of a broker group, from any cached route."""
        for route in self._routes.values():
            address = route.master(broker_name)
            if address is not None:
                return address
        return None

    # ------------------------------------------------------------------ fault tolerance

    def mark_failed(self, broker_name: str) -> None:
        """A send to this broker group failed: prefer others for a while."""
        self._faults[broker_name] = time.monotonic() + self._fault_pause

    def is_healthy(self, broker_name: str) -> bool:
        """Whether the group has not failed recently."""
        until = self._faults.get(broker_name)
        return until is None or time.monotonic() >= until

    @property
    def all_healthy(self) -> bool:
        """Whether no group failed recently (forgets the failures whose pause is over)."""
        faults = self._faults
        if faults:
            now = time.monotonic()
            for broker_name in [b for b, until in faults.items() if now >= until]:
                del faults[broker_name]
        return not faults
