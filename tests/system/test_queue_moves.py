"""Moving queues between broker groups (issue 20 section 4), as real processes.

Three controllers, a NameServer and two groups of two replicas (`ferry up --groups 2`). A
producer sends to each of a topic's 4 logical queues in turn (each body names its queue and a
sequence number) and an orderly push consumer reads them, while:
1. broker-a's master is stopped (SIGSTOP), broker-a's queue 1 starts moving to broker-b, and
   the controller leader and broker-a's master are killed with SIGKILL: the move is left
   mid-way (started, not sealed) with neither its driver nor its source; a new leader resumes
   it once broker-a has a new master, and it finishes;
2. `ferry admin broker drain broker-a --json` moves every other queue off broker-a.
Then: the consumer got every acknowledged message once, each queue in the order sent, and
nothing else but sends whose outcome was unknown (each at most once); each logical queue reads
back from offset 0 with contiguous offsets across its segments; broker-a takes no more writes.
Only outcomes are asserted, never how fast anything went.
"""

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message, SendResult
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, PushConsumer
from ferrymq.cmd.local import Child
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, SendFailedError, SendOutcomeUnknownError
from ferrymq.model import MessageQueue
from ferrymq.wire.topics import ControllerReassignRequestHeader

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

TOPIC = "Moving"
_SMALL_LOG = ("--mapped-file-size-commit-log", str(16 * 1024 * 1024))
"""Commit log segments of 16 MiB: a killed broker's recovery reads less (1 GiB took 24 s once)."""
_SEND_LIMIT_S = 120.0
"""How long one message may keep being refused (surely not stored) before the test fails:
a failover of a stopped, then killed master on a loaded box, with room to spare."""
_MAX_ROUNDS = 5_000
"""Bound on the producer loop (it ends on its stop event long before)."""


@dataclass
class _Tally:
    acked: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    unknown: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))
    failed: int = 0


async def _produce(
    producer: Producer, queues: list[MessageQueue], tally: _Tally, stop: asyncio.Event
) -> None:
    for seq in range(_MAX_ROUNDS):
        if stop.is_set():
            return
        for queue in queues:
            name = (queue.broker_name, queue.queue_id)
            body = f"{queue.broker_name}:{queue.queue_id}:{seq}".encode()
            deadline = time.monotonic() + _SEND_LIMIT_S
            while True:
                try:
                    await producer.send(TOPIC, body, queue=queue)
                except SendOutcomeUnknownError:
                    tally.unknown[name].add(seq)  # maybe stored: never sent again
                except FerryError as exc:
                    tally.failed += 1  # surely not stored: sent again
                    if stop.is_set():
                        return
                    if time.monotonic() >= deadline:
                        limit = f"{_SEND_LIMIT_S:g} s"
                        raise AssertionError(f"no send accepted within {limit}: {exc}") from exc
                    await asyncio.sleep(0.05)
                    continue
                else:
                    tally.acked[name].append(seq)
                break


async def _wait(what: str, predicate: Callable[[], Awaitable[bool]], limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.1)


async def _send_surely(producer: Producer, body: bytes, queue: MessageQueue) -> SendResult:
    """Send to one queue, again after a send that surely failed (nothing stored, no repeat)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await producer.send(TOPIC, body, queue=queue)
        except SendFailedError:  # e.g. a master between leases on a loaded box
            assert time.monotonic() < deadline, "no send accepted within 60 s"
            await asyncio.sleep(0.1)


def _ferry(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferrymq.cmd.ferry", "admin", "--namesrv", namesrv, *args],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def _child_at(children: dict[str, Child], address: str) -> str:
    (name,) = [name for name, child in children.items() if child.addr == address]
    return name


def _check_queue(name: tuple[str, int], got: list[int], tally: _Tally) -> None:
    acked, unknown = tally.acked[name], tally.unknown[name]
    assert got == sorted(set(got)), f"{name}: out of order or repeated"
    assert set(acked) <= set(got), f"{name}: acknowledged messages lost"
    assert set(got) <= set(acked) | unknown, f"{name}: messages never sent"


async def test_queues_move_under_load_across_kill_9_of_leader_and_source(tmp_path: Path) -> None:
    cluster = ProcessCluster(
        UpConfig(data_dir=tmp_path, groups=2, replicas=2, controllers=3, broker_flags=_SMALL_LOG)
    )
    await cluster.start()
    got: dict[tuple[str, int], list[int]] = defaultdict(list)

    async def listener(message: Message) -> None:
        broker, queue_id, seq = message.body.decode().split(":")
        got[broker, int(queue_id)].append(int(seq))

    consumer = PushConsumer(
        cluster.namesrv_addr,
        "movers",
        listener,
        orderly=True,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        pull_wait=1.0,
        rebalance_interval=2.0,
        commit_interval=1.0,
    )
    tally = _Tally()
    stop = asyncio.Event()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 2)
            queues = [MessageQueue(TOPIC, g, q) for g in ("broker-a", "broker-b") for q in (0, 1)]
            consumer.subscribe(TOPIC)
            await consumer.start()
            async with Producer(cluster.namesrv_addr, send_timeout=5.0) as producer:
                load = asyncio.create_task(_produce(producer, queues, tally, stop))

                async def sent(count: int) -> bool:
                    assert not load.done(), load
                    return sum(map(len, tally.acked.values())) >= count

                await _wait("load before the move", lambda: sent(200))

                # 1. broker-a's master stopped (SIGSTOP: it cannot seal, and is not replaced
                # within the controller's 3 s heartbeat timeout), a move of its queue 1, then
                # SIGKILL of the controller leader and of that master: the move is mid-way
                controllers = await admin.controllers()
                assert controllers is not None

                async def in_sync() -> bool:  # broker-a's slave can take over
                    info = await controllers.replica_info("broker-a")
                    return len(info.sync_state_set.sync_state_set) == 2

                await _wait("both of broker-a's replicas in its SyncStateSet", in_sync)
                leader = _child_at(cluster.controllers, await controllers.leader())
                master = (await controllers.replica_info("broker-a")).master_address
                assert master is not None
                source = _child_at(cluster.brokers, master)
                cluster.brokers[source].suspend()
                body = await admin.reassign(
                    ControllerReassignRequestHeader(
                        action="move",
                        topic=TOPIC,
                        broker_name="broker-a",
                        queue_id=1,
                        to_broker_name="broker-b",
                    )
                )
                assert [(m.from_broker_name, m.to_broker_name) for m in body.moves] == [
                    ("broker-a", "broker-b")
                ]
                (progress,) = await admin.move_progress(body.moves)
                assert progress.state == "moving"
                cluster.controllers[leader].kill()
                cluster.brokers[source].kill()

                async def moved() -> bool:
                    record = await admin.topic_record(TOPIC)
                    assert record is not None
                    queue = record.queue_map.logical("broker-a", 1)
                    return queue is not None and queue.moving is None

                await _wait("the move finished under a new leader and a new source master", moved)
                await cluster.restart_controller(leader)
                await cluster.restart(source, 120.0)  # crash recovery on a loaded box
                await _wait("load after the move", lambda: sent(600))

                # 2. drain broker-a while the load goes on
                drained = _ferry(cluster.namesrv_addr, "broker", "drain", "broker-a", "--json")
                assert drained.returncode == 0, drained.stderr
                report = json.loads(drained.stdout)
                assert [(m["queueId"], m["toBrokerName"], m["state"]) for m in report["moves"]] == [
                    (0, "broker-b", "done")
                ]
                await _wait("load after the drain", lambda: sent(1000))
                stop.set()
                await load

            total = sum(map(len, tally.acked.values()))

            async def consumed() -> bool:
                return all(set(tally.acked[n]) <= set(got[n]) for n in tally.acked)

            try:
                await _wait("the consumer got every acknowledged message", consumed)
            except AssertionError:
                missing = {
                    n: (len(tally.acked[n]), sorted(set(tally.acked[n]) - set(got[n]))[:5])
                    for n in tally.acked
                }
                raise AssertionError(f"missing (acked, first missing): {missing}") from None
            await asyncio.sleep(1.0)  # anything extra (a repeat) would arrive by now
        for queue in queues:
            name = (queue.broker_name, queue.queue_id)
            _check_queue(name, got[name], tally)

        # each logical queue reads back from 0, offsets contiguous across its segments
        async with PullConsumer(cluster.namesrv_addr, "readers") as reader:
            for queue in queues:
                name = (queue.broker_name, queue.queue_id)
                end = await reader.max_offset(queue)
                messages = await reader.fetch_range(queue, 0, end)
                assert [m.queue_offset for m in messages] == list(range(end))
                seqs = [int(m.body.decode().split(":")[2]) for m in messages]
                _check_queue(name, seqs, tally)
        async with AdminClient(cluster.namesrv_addr) as admin:
            route = await admin.route(TOPIC)
            assert route is not None
            perms = {q.broker_name: q.perm for q in route.queue_datas}
            assert perms["broker-a"] & 2 == 0, "broker-a still takes writes after the drain"
        unknown = sum(map(len, tally.unknown.values()))
        log.info("acked %d, unknown %d, failed and sent again %d", total, unknown, tally.failed)
    finally:
        stop.set()
        await consumer.close()
        await cluster.stop()


@pytest.mark.timeout(300)
async def test_a_move_survives_its_crash_points_on_controllers_and_source(tmp_path: Path) -> None:
    """The named crash points (FERRYMQ_TEST_HOOKS=1): every controller armed to die between
    getting the source's end offset and recording it (`move_sealed_before_finish`), both of
    broker-a's replicas armed to die after deciding the end and before answering
    (`seal_answered_before_reply`). Each process that dies is started again unarmed. The move
    ends once, at the offset every acknowledged message lies below, and the queue reads on
    with contiguous offsets."""
    cluster = ProcessCluster(
        UpConfig(data_dir=tmp_path, groups=2, replicas=2, controllers=3, broker_flags=_SMALL_LOG)
    )
    await cluster.start()
    armed = {"FERRYMQ_TEST_HOOKS": "1"}
    queue = MessageQueue(TOPIC, "broker-a", 1)
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 2)
            async with Producer(cluster.namesrv_addr, send_timeout=5.0) as producer:
                for seq in range(50):
                    await _send_surely(producer, b"%d" % seq, queue)
            for node in list(cluster.controllers):  # one at a time: a quorum stays
                cluster.controllers[node].kill()
                await cluster.restart_controller(
                    node, env={**armed, "FERRYMQ_TEST_CRASH_AT": "move_sealed_before_finish"}
                )
            controllers = await admin.controllers()
            assert controllers is not None

            async def in_sync() -> bool:
                info = await controllers.replica_info("broker-a")
                return len(info.sync_state_set.sync_state_set) == 2

            a_names = [name for name in cluster.brokers if name.startswith("broker-a")]
            for name in a_names:
                await _wait("broker-a's replicas in sync", in_sync)
                cluster.brokers[name].kill()
                seal_crash = {**armed, "FERRYMQ_TEST_CRASH_AT": "seal_answered_before_reply"}
                await cluster.restart(name, 120.0, env=seal_crash)
            await _wait("broker-a's replicas in sync", in_sync)

            await admin.reassign(
                ControllerReassignRequestHeader(
                    action="move",
                    topic=TOPIC,
                    broker_name="broker-a",
                    queue_id=1,
                    to_broker_name="broker-b",
                )
            )
            crashed: dict[str, int | None] = {}
            restarting: dict[str, asyncio.Task[Child]] = {}

            async def moved() -> bool:
                for name, child in [*cluster.controllers.items(), *cluster.brokers.items()]:
                    if not child.running and name not in restarting:
                        # crashed at its point: again, unarmed, in the background (a broker
                        # is ready once it has a role, which may need a replica still down)
                        crashed[name] = child.process.returncode
                        restarting[name] = asyncio.create_task(
                            cluster.restart_controller(name)
                            if name in cluster.controllers
                            else cluster.restart(name, 90.0)
                        )
                for name, task in list(restarting.items()):
                    if task.done():
                        task.result()
                        del restarting[name]
                try:
                    record = await admin.topic_record(TOPIC)
                except FerryError:
                    return False  # no controller leader at the moment
                logical = record.queue_map.logical("broker-a", 1) if record else None
                return logical is not None and logical.moving is None

            await _wait("the move finished across the crash points", moved, 150)
            await asyncio.gather(*restarting.values())
            assert set(crashed.values()) == {137}
            assert any(
                name.startswith("controller") or name in cluster.controllers for name in crashed
            )
            assert any(name in a_names for name in crashed)
            record = await admin.topic_record(TOPIC)
            assert record is not None
            logical = record.queue_map.logical("broker-a", 1)
            assert logical is not None
            assert [(s.broker_name, s.start_offset, s.end_offset) for s in logical.segments] == [
                ("broker-a", 0, 50),
                ("broker-b", 50, -1),
            ]
            async with Producer(cluster.namesrv_addr, send_timeout=5.0) as producer:
                for seq in range(50, 60):
                    result = await _send_surely(producer, b"%d" % seq, queue)
                    assert result.queue_offset == seq
        async with PullConsumer(cluster.namesrv_addr, "readers") as reader:
            messages = await reader.fetch_range(queue, 0, 60)
            assert [m.queue_offset for m in messages] == list(range(60))
            assert [int(m.body) for m in messages] == list(range(60))
    finally:
        await cluster.stop()
