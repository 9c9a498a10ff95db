"""Client workloads that record every operation: producers, group consumers, an observer, a drain.

- Producers send unique values (`p<k>-<n>`) to explicit queues (so the SDK never moves or
  retries a send) with sync replication, and record each as ok (with its queue offset and the
  broker that acked), fail (`SendFailedError`, `TopicNotFoundError`: surely not stored) or
  info (anything else: the outcome is unknown).
- Consumers of one group each own a fixed share of the queues (assign mode: strict order
  checks apply), poll from their position, commit it about once a second, and now and then
  crash: a fresh client reads the committed position back (`committed`) and starts a new
  generation there.
- The observer records each broker's role and epoch whenever they change, and each group's
  master as the controllers name it.
- With several broker groups the topic has `queues` queues on each. Producer k sends to the
  queues of group k mod groups only (a send held up by one group's failover never holds up
  another group's sends, so each group's ack gaps are its own); consumers share every queue.
- The drain reads every queue from offset 0 with a fresh client until it has passed each
  queue's highest acked offset.

Client sockets bind their own addresses (producers 127.0.0.10, consumers .11, observer and
drain .12, the Connect workload's clients .13), so partitions can cut clients off too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field
from typing import Final

from ferrymq.chaos.cluster import Cluster
from ferrymq.chaos.recorder import Recorder
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError, SendFailedError, TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient

__all__ = [
    "CLIENT_IPS",
    "CONNECT_CLIENT_IP",
    "CONSUMER_GROUP",
    "TOPIC",
    "Workload",
    "WorkloadConfig",
    "queue_name",
    "value_of",
]

TOPIC: Final = "chaos"
CONSUMER_GROUP: Final = "chaos-group"
PRODUCER_IP: Final = "127.0.0.10"
CONSUMER_IP: Final = "127.0.0.11"
OBSERVER_IP: Final = "127.0.0.12"
CONTROLLER_VIEW: Final = "controller-view"
"""The `proc` of role events that come from the controllers' GET_REPLICA_INFO."""
CONNECT_CLIENT_IP: Final = "127.0.0.13"
"""The Connect workload's REST clients and observer (`connect_workload`)."""
CLIENT_IPS: Final = (PRODUCER_IP, CONSUMER_IP, OBSERVER_IP, "127.0.0.9", CONNECT_CLIENT_IP)

log = logging.getLogger(__name__)


def queue_name(queue: MessageQueue) -> str:
    """The history's name of a queue."""
    return f"{queue.broker_name}/{queue.queue_id}"


def value_of(body: bytes) -> str:
    """The value a message body carries."""
    return body.split(b" ", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class WorkloadConfig:
    """Shape and rate of the load."""

    queues: int = 4
    producers: int = 4
    consumers: int = 2
    sends_per_second: float = 100.0
    """In total, over all producers."""
    body_bytes: int = 120
    commit_interval_s: float = 1.0
    consumer_crash_interval_s: float = 25.0
    send_timeout_s: float = 3.0


@dataclass
class Workload:
    """Runs the clients against `cluster` and records what they see."""

    cluster: Cluster
    recorder: Recorder
    config: WorkloadConfig
    rng: random.Random
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    acked_high: dict[str, int] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def namesrv(self) -> str:
        """The NameServer address."""
        return self.cluster.namesrv.addr

    def queues(self) -> list[MessageQueue]:
        """The topic's queues, group by group."""
        return [
            MessageQueue(TOPIC, group, i)
            for group in self.cluster.config.group_names
            for i in range(self.config.queues)
        ]

    async def create_topic(self) -> None:
        """Create the topic on every group's master; wait until the NameServer routes them all."""
        from ferrymq.client.admin import AdminClient

        groups = set(self.cluster.config.group_names)
        async with AdminClient(self.namesrv) as admin:
            for _ in range(300):
                try:
                    await admin.create_topic(TOPIC, queues=self.config.queues)
                    route = await admin.route(TOPIC)
                    if route is not None and {q.broker_name for q in route.queue_datas} >= groups:
                        return
                except FerryError as exc:
                    log.info("topic not created yet: %s", exc)
                await asyncio.sleep(0.1)
        raise FerryError("the topic never got a route")

    def start(self) -> None:
        """Start every client task."""
        loop = asyncio.get_running_loop()
        for k in range(self.config.producers):
            self._tasks.append(loop.create_task(self._produce(k)))
        for c in range(self.config.consumers):
            self._tasks.append(loop.create_task(self._consume(c)))
        self._tasks.append(loop.create_task(self._observe()))

    async def finish(self) -> None:
        """Stop the clients and wait for them."""
        self.stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _produce(self, k: int) -> None:
        proc = f"p{k}"
        interval = self.config.producers / self.config.sends_per_second
        padding = b"x" * self.config.body_bytes
        groups = self.cluster.config.group_names
        queues = [q for q in self.queues() if q.broker_name == groups[k % len(groups)]]
        rpc = RpcClient(local_host=PRODUCER_IP, connect_timeout=1.0)
        async with Producer(
            self.namesrv, "chaos-producer", send_timeout=self.config.send_timeout_s, rpc=rpc
        ) as producer:
            try:
                for n in range(10**9):
                    if self.stop.is_set():
                        return
                    queue = queues[(k + n) % len(queues)]
                    q, v = queue_name(queue), f"{proc}-{n}"
                    self.recorder.record(proc, "invoke", "send", q=q, v=v)
                    before = producer.routes.master_of(queue.broker_name)
                    try:
                        result = await producer.send(
                            TOPIC, v.encode() + b" " + padding, queue=queue
                        )
                    except (SendFailedError, TopicNotFoundError) as exc:
                        self.recorder.record(proc, "fail", "send", q=q, v=v, error=str(exc))
                        await asyncio.sleep(interval)
                        continue
                    except FerryError as exc:
                        self.recorder.record(proc, "info", "send", q=q, v=v, error=str(exc))
                        await asyncio.sleep(interval)
                        continue
                    self.recorder.record(
                        proc,
                        "ok",
                        "send",
                        q=q,
                        v=v,
                        off=result.queue_offset,
                        node=self._acked_by(before, producer.routes.master_of(queue.broker_name)),
                    )
                    self.acked_high[q] = max(self.acked_high.get(q, -1), result.queue_offset)
                    await asyncio.sleep(interval * self.rng.uniform(0.5, 1.5))
            finally:
                await rpc.close()

    async def _consume(self, c: int) -> None:
        proc = f"c{c}"
        owned = [q for i, q in enumerate(self.queues()) if i % self.config.consumers == c]
        gen = 0
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            gen += 1
            crash_at = loop.time() + self.config.consumer_crash_interval_s * self.rng.uniform(
                0.5, 1.5
            )
            rpc = RpcClient(local_host=CONSUMER_IP, connect_timeout=1.0)
            try:
                async with PullConsumer(
                    self.namesrv, CONSUMER_GROUP, request_timeout=3.0, rpc=rpc
                ) as consumer:
                    positions = await self._committed(consumer, proc, owned)
                    await self._poll_until(consumer, proc, gen, owned, positions, crash_at)
            finally:
                await rpc.close()
            if not self.stop.is_set():
                self.recorder.record(proc, "info", "crash", gen=gen)

    async def _committed(
        self, consumer: PullConsumer, proc: str, owned: list[MessageQueue]
    ) -> dict[MessageQueue, int]:
        positions: dict[MessageQueue, int] = {}
        for queue in owned:
            for _ in range(50):
                if self.stop.is_set():
                    positions[queue] = 0
                    break
                self.recorder.record(proc, "invoke", "committed", group=CONSUMER_GROUP)
                try:
                    stored = await consumer.committed(queue)
                except FerryError as exc:
                    self.recorder.record(
                        proc, "fail", "committed", group=CONSUMER_GROUP, error=str(exc)
                    )
                    await asyncio.sleep(0.5)
                    continue
                offset = stored if stored is not None and stored >= 0 else 0
                self.recorder.record(
                    proc,
                    "ok",
                    "committed",
                    group=CONSUMER_GROUP,
                    offsets={queue_name(queue): offset},
                )
                positions[queue] = offset
                break
            else:
                positions[queue] = 0
        return positions

    async def _poll_until(
        self,
        consumer: PullConsumer,
        proc: str,
        gen: int,
        owned: list[MessageQueue],
        positions: dict[MessageQueue, int],
        crash_at: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        next_commit = loop.time() + self.config.commit_interval_s
        committed = dict(positions)
        while not self.stop.is_set() and loop.time() < crash_at:
            found = False
            for queue in owned:
                q = queue_name(queue)
                try:
                    result = await consumer.pull(queue, positions[queue], max_messages=64)
                except FerryError as exc:
                    self.recorder.record(proc, "info", "poll", gen=gen, error=str(exc))
                    await asyncio.sleep(0.2)
                    continue
                if result.status is PullStatus.FOUND and result.messages:
                    reads = [(m.queue_offset, value_of(m.body)) for m in result.messages]
                    self.recorder.record(proc, "ok", "poll", gen=gen, reads={q: reads})
                    positions[queue] = reads[-1][0] + 1
                    found = True
                elif result.status is PullStatus.OFFSET_ILLEGAL:
                    self.recorder.record(
                        proc,
                        "info",
                        "poll",
                        gen=gen,
                        error=f"{q}: offset {positions[queue]} illegal, next {result.next_offset}",
                    )
                    return  # a new generation starts from the committed position
            if loop.time() >= next_commit:
                next_commit = loop.time() + self.config.commit_interval_s
                await self._commit(consumer, proc, owned, positions, committed)
            if not found:
                await asyncio.sleep(0.05)

    async def _commit(
        self,
        consumer: PullConsumer,
        proc: str,
        owned: list[MessageQueue],
        positions: dict[MessageQueue, int],
        committed: dict[MessageQueue, int],
    ) -> None:
        for queue in owned:
            offset = positions[queue]
            if offset <= committed.get(queue, 0):
                continue
            offsets = {queue_name(queue): offset}
            self.recorder.record(proc, "invoke", "commit", group=CONSUMER_GROUP, offsets=offsets)
            try:
                await consumer.commit(queue, offset)
            except FerryError as exc:
                self.recorder.record(
                    proc, "info", "commit", group=CONSUMER_GROUP, offsets=offsets, error=str(exc)
                )
                continue
            self.recorder.record(proc, "ok", "commit", group=CONSUMER_GROUP, offsets=offsets)
            committed[queue] = offset

    def _acked_by(self, before: str | None, after: str | None) -> str | None:
        """The broker that acknowledged a send: the route's master, unless it moved meanwhile."""
        if before is None or before != after:
            return None
        node = self.cluster.node_at(before)
        return node.name if node is not None else before

    async def _observe(self) -> None:
        seen: dict[str, tuple[str, int | None]] = {}
        while not self.stop.is_set():
            for broker in self.cluster.brokers:
                info = await self.cluster.runtime(broker)
                if info is None:
                    continue
                now = (info.role, info.epoch)
                if seen.get(broker.name) != now:
                    seen[broker.name] = now
                    self.recorder.record(
                        "observer",
                        "ok",
                        "role",
                        node=broker.name,
                        group=broker.group,
                        role=info.role,
                        epoch=info.epoch,
                    )
            await self._observe_controllers(seen)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 1.0)

    async def _observe_controllers(self, seen: dict[str, tuple[str, int | None]]) -> None:
        """Record each group's master and epoch when the controllers' choice changes."""
        for group in self.cluster.config.group_names:
            info = await self.cluster.replica_info(group)
            if info is None or not info.master_address:
                continue
            node = self.cluster.node_at(info.master_address)
            now = ("master", info.master_epoch)
            key = f"{CONTROLLER_VIEW}/{group}"
            if node is None or seen.get(key) == now:
                continue
            seen[key] = now
            self.recorder.record(
                CONTROLLER_VIEW,
                "ok",
                "role",
                node=node.name,
                group=group,
                role="master",
                epoch=info.master_epoch,
            )

    async def drain(self, timeout: float) -> bool:
        """Read every queue from 0 past its highest acked offset; True when all got there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rpc = RpcClient(local_host=OBSERVER_IP, connect_timeout=1.0)
        complete = True
        try:
            async with PullConsumer(
                self.namesrv, "chaos-drain", request_timeout=3.0, rpc=rpc
            ) as consumer:
                for queue in self.queues():
                    q = queue_name(queue)
                    high = self.acked_high.get(q, -1)
                    position = 0
                    while loop.time() < deadline:
                        self.recorder.record("drain", "invoke", "drain")
                        try:
                            result = await consumer.pull(queue, position, max_messages=256)
                        except FerryError as exc:
                            self.recorder.record("drain", "info", "drain", error=str(exc))
                            await asyncio.sleep(0.5)
                            continue
                        if (
                            result.status is PullStatus.OFFSET_ILLEGAL
                            and result.next_offset > position
                        ):
                            self.recorder.record(
                                "drain",
                                "info",
                                "drain",
                                error=f"{q}: offsets {position}..{result.next_offset} are gone",
                            )
                            position = result.next_offset
                            continue
                        reads = [(m.queue_offset, value_of(m.body)) for m in result.messages]
                        self.recorder.record(
                            "drain", "ok", "drain", gen=0, reads={q: reads}, node=None
                        )
                        if reads:
                            position = reads[-1][0] + 1
                        elif position > high:
                            break
                        else:
                            await asyncio.sleep(0.2)
                    else:
                        complete = False
                    if position <= high:
                        complete = False
                await self._final_committed(rpc)
        finally:
            await rpc.close()
        if complete:
            self.recorder.record("drain", "ok", "drained")
        else:
            self.recorder.record("drain", "fail", "drained")
        return complete

    async def _final_committed(self, rpc: RpcClient) -> None:
        group_consumer = PullConsumer(self.namesrv, CONSUMER_GROUP, rpc=rpc)
        for queue in self.queues():
            self.recorder.record("final", "invoke", "committed", group=CONSUMER_GROUP)
            try:
                stored = await group_consumer.committed(queue)
            except FerryError as exc:
                self.recorder.record(
                    "final", "fail", "committed", group=CONSUMER_GROUP, error=str(exc)
                )
                continue
            self.recorder.record(
                "final",
                "ok",
                "committed",
                group=CONSUMER_GROUP,
                offsets={queue_name(queue): stored if stored is not None else 0},
            )
