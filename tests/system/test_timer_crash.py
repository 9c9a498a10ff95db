"""Timer messages across kill -9 of the broker: none early, none lost, none delivered twice."""

import asyncio
import json
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.wire import properties as props

from .procs import Server, start

pytestmark = pytest.mark.system

SHORT, LONG = 10, 10


def _start_broker(tmp_path: Path, namesrv: Server, name: str) -> Server:
    return start(
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(tmp_path / "store"),
        ],
        tmp_path,
        name,
    )


async def _visible(namesrv: str) -> list[Message]:
    async with PullConsumer(namesrv, "Reader") as consumer:
        queues = await consumer.queues("Timed")
        return [m for q in queues for m in await consumer.fetch_range(q, 0, 1000)]


async def _wait_for(namesrv: str, count: int, timeout: float = 30.0) -> list[Message]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = await _visible(namesrv)
        except Exception:  # noqa: BLE001 - the broker is (re)starting: ask again
            got = []
        if len(got) >= count or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


def _saved_progress(store_dir: Path) -> dict[str, int]:
    path = store_dir / "config" / "delayOffset.json"
    if not path.exists():
        return {}
    progress: dict[str, int] = json.loads(path.read_text()).get("timerProgress") or {}
    return progress


async def test_timer_messages_survive_kill_9(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    broker = _start_broker(tmp_path, namesrv, "broker-1")
    restarted: Server | None = None
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Timed", queues=2)
            while await admin.route("Timed") is None:
                await asyncio.sleep(0.05)
        async with Producer(namesrv.addr) as producer:
            # the long ones first, so the delivered short ones sit above the pending floor
            for i in range(LONG):
                await producer.send("Timed", f"long-{i}".encode(), delay_ms=8000)
            for i in range(SHORT):
                await producer.send("Timed", f"short-{i}".encode(), delay_ms=1000)
        assert await _visible(namesrv.addr) == []
        short = await _wait_for(namesrv.addr, SHORT)
        assert sorted(m.body for m in short) == sorted(f"short-{i}".encode() for i in range(SHORT))
        last_due_ms = max(int(m.properties[props.TIMER_OUT_MS]) for m in short)
        deadline = time.monotonic() + 10
        while _saved_progress(tmp_path / "store").get("deliveredMs", 0) < last_due_ms:
            assert time.monotonic() < deadline, "the timer progress was never saved"
            await asyncio.sleep(0.05)
        broker.kill()

        restarted = _start_broker(tmp_path, namesrv, "broker-2")
        got = await _wait_for(namesrv.addr, SHORT + LONG)
        bodies = sorted(m.body for m in got)
        assert bodies == sorted(
            [f"short-{i}".encode() for i in range(SHORT)]
            + [f"long-{i}".encode() for i in range(LONG)]
        )  # every one, once
        for message in got:
            assert message.store_timestamp_ms >= int(message.properties[props.TIMER_OUT_MS])
    finally:
        if restarted is not None:
            restarted.stop()
        broker.stop()
        namesrv.stop()


async def test_timer_messages_and_their_progress_reach_a_slave(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    common = ["--listen", "127.0.0.1:0", "--namesrv", namesrv.addr]
    master = start(
        [
            "broker",
            *common,
            "--store-dir",
            str(tmp_path / "master"),
            "--ha-send-heartbeat-interval",
            "300",
        ],
        tmp_path,
        "master",
    )
    slave = start(
        [
            "broker",
            *common,
            "--store-dir",
            str(tmp_path / "slave"),
            "--role",
            "SLAVE",
            "--broker-id",
            "1",
            "--ha-send-heartbeat-interval",
            "300",
        ],
        tmp_path,
        "slave",
    )
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Timed", queues=1)
            while await admin.route("Timed") is None:
                await asyncio.sleep(0.05)
        async with Producer(namesrv.addr) as producer:
            await producer.send("Timed", b"pending", delay_ms=3_600_000)
            await producer.send("Timed", b"due", delay_ms=500)
        (delivered,) = await _wait_for(namesrv.addr, 1)
        assert delivered.body == b"due"
        due_ms = int(delivered.properties[props.TIMER_OUT_MS])
        deadline = time.monotonic() + 15
        while True:
            saved = _saved_progress(tmp_path / "slave")
            if saved.get("deliveredMs", 0) >= due_ms:
                break
            assert time.monotonic() < deadline, f"the slave never got the progress: {saved}"
            await asyncio.sleep(0.1)
        assert saved["pendingFloorOffset"] == 0  # the hour-long one still waits
        assert saved["scanQueueOffset"] == 2
    finally:
        slave.stop()
        master.stop()
        namesrv.stop()
