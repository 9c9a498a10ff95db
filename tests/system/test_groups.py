"""Controller mode with two broker groups (issue 20 section 2), as real processes.

Three controllers, a NameServer and two groups of three replicas (`ferry up --groups 2`). A topic
spreads over both groups. While one producer pins every send to broker-b's queues and another
sends round robin over the whole topic, broker-a's master is killed with SIGKILL: broker-a fails
over, and not one send to broker-b fails or comes back unknown meanwhile; afterwards every
acknowledged message of the topic is read back from both groups. Only outcomes are asserted,
never how fast anything went.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient

from .group_load import read_topic, runtime

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]

TOPIC = "TwoGroups"
_MAX_SENDS = 20_000
"""Bound on each producer loop (it ends on its stop event long before)."""


@dataclass
class _Tally:
    acked: dict[bytes, tuple[float, str]] = field(default_factory=dict)
    """Body -> (monotonic time of its acknowledgement, the broker group that stored it)."""
    unknown: list[tuple[bytes, str]] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)


async def _produce(
    producer: Producer,
    tally: _Tally,
    prefix: str,
    stop: asyncio.Event,
    queues: list[MessageQueue] | None = None,
) -> None:
    for i in range(_MAX_SENDS):
        if stop.is_set():
            return
        body = f"{prefix}-{i:05d}".encode()
        queue = queues[i % len(queues)] if queues else None
        try:
            result = await producer.send(TOPIC, body, queue=queue)
        except SendOutcomeUnknownError as exc:
            tally.unknown.append((body, repr(exc)))
        except FerryError as exc:
            tally.failed.append((body, repr(exc)))
            await asyncio.sleep(0.05)
        else:
            tally.acked[body] = (time.monotonic(), result.queue.broker_name)


async def _master_of(admin: AdminClient, group: str, *, not_addr: str = "") -> str | None:
    route = await admin.route(TOPIC)
    for broker in route.broker_datas if route is not None else ():
        address = broker.broker_addrs.get(0)
        if broker.broker_name == group and address and address != not_addr:
            return address
    return None


async def _wait(what: str, predicate: Callable[[], Awaitable[bool]], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.1)


async def test_a_failover_in_one_group_leaves_the_other_groups_sends_alone(
    tmp_path: Path,
) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, groups=2, replicas=3, controllers=3))
    await cluster.start()
    pinned, spread = _Tally(), _Tally()
    stop = asyncio.Event()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as rpc:
            await admin.create_topic(TOPIC, queues=2)
            masters = {}
            for group in ("broker-a", "broker-b"):

                async def routed(group: str = group) -> bool:
                    masters[group] = await _master_of(admin, group)
                    return masters[group] is not None

                await _wait(f"{group} in the route", routed)

                async def full(group: str = group) -> bool:
                    info = await runtime(rpc, str(masters[group]))
                    return len(info.get("syncStateSet", "").split(",")) == 3

                await _wait(f"{group}'s SyncStateSet full", full)
            old_master = str(masters["broker-a"])
            victim = next(n for n, c in cluster.brokers.items() if c.addr == old_master)

            async with (
                Producer(cluster.namesrv_addr, send_timeout=10.0) as to_b,
                Producer(cluster.namesrv_addr, send_timeout=10.0) as anywhere,
            ):
                queues_b = [q for q in await to_b.queues(TOPIC) if q.broker_name == "broker-b"]
                assert len(queues_b) == 2
                tasks = [
                    asyncio.create_task(_produce(to_b, pinned, "b", stop, queues_b)),
                    asyncio.create_task(_produce(anywhere, spread, "s", stop)),
                ]

                async def warmed_up() -> bool:
                    return len(pinned.acked) >= 50 and len(spread.acked) >= 50

                await _wait("both producers acknowledged", warmed_up)
                cluster.brokers[victim].kill()
                killed_at = time.monotonic()

                async def new_master() -> bool:
                    masters["broker-a"] = await _master_of(admin, "broker-a", not_addr=old_master)
                    return masters["broker-a"] is not None

                await _wait("broker-a elected a new master", new_master)
                elected_at = time.monotonic()

                async def both_take_sends() -> bool:
                    after = [g for at, g in spread.acked.values() if at > elected_at]
                    return after.count("broker-a") >= 20 and after.count("broker-b") >= 20

                await _wait("both groups take sends after the failover", both_take_sends)
                stop.set()
                await asyncio.gather(*tasks)

            for group in ("broker-a", "broker-b"):
                # consumers see a record once every in-sync replica has it: what the old master
                # acknowledged last is visible once the new master's slaves acked it again

                async def settled(group: str = group) -> bool:
                    info = await runtime(rpc, str(masters[group]))
                    return info.get("confirmOffset") == info.get("commitLogMaxOffset")

                await _wait(f"{group}'s master committed its whole log", settled)

        during = [at for at, _ in pinned.acked.values() if killed_at <= at <= elected_at]
        assert during, "no send to broker-b completed while broker-a failed over"
        assert not pinned.failed, f"sends to broker-b failed: {pinned.failed[:5]}"
        assert not pinned.unknown, f"sends to broker-b came back unknown: {pinned.unknown[:5]}"

        stored = await read_topic(cluster.namesrv_addr, "TwoGroupsCheck", TOPIC)
        acked = set(pinned.acked) | set(spread.acked)
        lost = sorted(acked - stored)
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
        unknown = {body for body, _ in spread.unknown}
        unexpected = sorted(stored - acked - unknown)
        assert not unexpected, unexpected[:5]
        assert {g for _, g in pinned.acked.values()} == {"broker-b"}
    finally:
        stop.set()
        await cluster.stop()
