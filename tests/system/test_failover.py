"""Controller mode end to end (issue 7): three controllers, a NameServer and a group of three
replicas as processes. Produce under load, kill -9 the master: a new master is elected from the
SyncStateSet, the producer carries on, the old master restarts as a slave and truncates, and every
acknowledged message is consumed; no message appears twice unless its send was reported unknown.
"""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.controller_admin import broker_epoch_cache
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

pytestmark = pytest.mark.system

TOPIC = "Failover"


async def _runtime(client: RpcClient, address: str) -> dict[str, str]:
    response = await client.call(
        address, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 3
    )
    return decode_body(response.body, KVTable).table


async def _master(admin: AdminClient, *, not_addr: str = "", timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(TOPIC)
        if route is not None:
            for broker in route.broker_datas:
                address = broker.broker_addrs.get(0)
                if address and address != not_addr:
                    return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(0.1)


async def test_kill_the_master_under_load_and_lose_nothing(tmp_path: Path) -> None:
    cluster = ProcessCluster(UpConfig(data_dir=tmp_path, replicas=3, controllers=3))
    await cluster.start()
    acked: dict[bytes, tuple[int, int]] = {}
    unknown: set[bytes] = set()
    failed = 0
    try:
        async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as client:
            await admin.create_topic(TOPIC, queues=2)
            old_master = await _master(admin)
            deadline = time.monotonic() + 30
            while (await _runtime(client, old_master)).get("syncStateSet", "").count(",") < 2:
                assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
                await asyncio.sleep(0.1)

            async with Producer(cluster.namesrv_addr, send_timeout=2.0) as producer:

                async def produce(
                    count: int, tag: str, kill: Callable[[], object] | None = None, kill_at: int = 0
                ) -> None:
                    nonlocal failed
                    for i in range(count):
                        if kill is not None and i == kill_at:  # while message i's send is in flight
                            asyncio.get_running_loop().call_soon(kill)
                        body = f"{tag}-{i:05d}".encode()
                        try:
                            result = await producer.send(TOPIC, body)
                        except SendOutcomeUnknownError:
                            unknown.add(body)
                        except FerryError:
                            failed += 1
                        else:
                            acked[body] = (result.queue.queue_id, result.queue_offset)

                await produce(200, "before")
                # metadata committed before the failover: a topic, a group's offset
                await admin.create_topic("FailoverMeta", queues=1)
                async with PullConsumer(cluster.namesrv_addr, "MetaGroup") as meta:
                    meta_queue = (await meta.queues(TOPIC))[0]
                    await meta.commit(meta_queue, 42)
                victim = next(
                    name for name, child in cluster.brokers.items() if child.addr == old_master
                )
                # the kill is placed by count, not time: sends got fast enough to finish 400
                # before a timer's 0.2 s went off
                await produce(400, "during", kill_at=100, kill=cluster.brokers[victim].kill)
                new_master = await _master(admin, not_addr=old_master)
                assert new_master != old_master
                await produce(200, "after")
            assert sum(1 for body in acked if body.startswith(b"after")) > 0

            # the old master comes back as a slave of the new one and truncates what only it had
            await cluster.brokers[victim].process.wait()
            restarted = await cluster.restart(victim)
            deadline = time.monotonic() + 60
            while True:
                info = await _runtime(client, restarted.addr)
                master_info = await _runtime(client, new_master)
                if info.get("brokerRole") == "SLAVE" and info.get(
                    "commitLogMaxOffset"
                ) == master_info.get("commitLogMaxOffset"):
                    break
                assert time.monotonic() < deadline, f"the old master did not rejoin: {info}"
                await asyncio.sleep(0.2)

            # the new master has the metadata; every replica has the same epoch history
            async with PullConsumer(cluster.namesrv_addr, "MetaGroup") as meta:
                assert await meta.committed(meta_queue) == 42
            new_topics = await _runtime(client, new_master)
            assert int(new_topics["topicCount"]) >= 2
            route = await admin.route("FailoverMeta")
            assert route is not None
            caches = [
                await broker_epoch_cache(client, child.addr) for child in cluster.brokers.values()
            ]
            histories = {tuple((e.epoch, e.start_offset) for e in c.epoch_list) for c in caches}
            assert len(histories) == 1, histories
            assert [epoch for epoch, _ in histories.pop()] == [1, 2]

        consumed: dict[bytes, int] = {}
        async with PullConsumer(cluster.namesrv_addr, "FailoverCheck") as consumer:
            for queue in await consumer.queues(TOPIC):
                offset = 0
                while True:
                    pulled = await consumer.pull(queue, offset, max_messages=256)
                    if pulled.status is not PullStatus.FOUND:
                        break
                    for message in pulled.messages:
                        consumed[message.body] = consumed.get(message.body, 0) + 1
                    offset = pulled.next_offset
        lost = [body for body in acked if body not in consumed]
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
        duplicated = [b for b, n in consumed.items() if n > 1 and b not in unknown]
        assert not duplicated, duplicated[:5]
        unexpected = [b for b in consumed if b not in acked and b not in unknown]
        assert not unexpected, unexpected[:5]
    finally:
        await cluster.stop()
