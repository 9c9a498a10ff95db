"""Online offset reset (mqadmin resetOffsetByTime): running push consumers start again at the
offsets the broker pushes (INVOKE_BROKER_TO_RESET_OFFSET, then RESET_CONSUMER_CLIENT_OFFSET)."""

import asyncio
import time

from ferrymq.client.admin import AdminClient
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import PushConsumer
from ferrymq.testing import LocalCluster

from .test_admin_cli import Ferry


async def _until(check: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_running_consumers_obey_an_online_reset(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    async with AdminClient(ns) as admin:
        await admin.create_topic("Replay", queues=2)
    seen: list[bytes] = []

    async def listener(message: Message) -> None:
        seen.append(message.body)

    consumers = [
        PushConsumer(ns, "Replayers", listener, client_id=f"c{i}", commit_interval=0.2)
        for i in range(2)
    ]
    for consumer in consumers:
        consumer.subscribe("Replay")
    async with consumers[0], consumers[1]:
        await _until(lambda: all(len(c.assigned) >= 1 for c in consumers), "queues never shared")
        begin = int(time.time() * 1000) - 1
        async with Producer(ns) as producer:
            for i in range(10):
                await producer.send("Replay", f"m{i}".encode())
        await _until(lambda: len(seen) == 10, "the first pass never finished")
        reset = await Ferry(ns)(
            "offset", "reset-by-time", "--group", "Replayers", "--topic", "Replay",
            "--timestamp", str(begin), "--json",
        )  # fmt: skip
        assert reset["online"] is True
        assert sorted(o["offset"] for o in reset["offsets"]) == [0, 0]
        await _until(lambda: len(seen) == 20, "the consumers never read the topic again")
        assert sorted(seen[10:]) == sorted(seen[:10])
        await asyncio.sleep(0.3)  # a commit round after the replay
    assert len(seen) == 20  # nothing came a third time
    latest = await Ferry(ns)(
        "resetOffsetByTime", "-n", ns, "-g", "Replayers", "-t", "Replay", "-s", "now", "--json"
    )
    assert latest["online"] is False  # nobody runs: committed offline, at each queue's end
    assert sum(o["offset"] for o in latest["offsets"]) == 10
