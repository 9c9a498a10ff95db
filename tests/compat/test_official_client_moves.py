"""The official RocketMQ 4.x client, unchanged, across a queue moved between broker groups
(issue 20 section 4): it knows nothing of the queue map and sees physical queues.

Controller mode with two groups as processes (`ferry up --groups 2 --replicas 1`, one
controller). The official producer sends, broker-a's queue 1 moves to broker-b, it sends again
(its sends to the sealed queue are refused NO_PERMISSION and retried on another queue, as its
own retry rule does), and an official push consumer of a new group then gets every message
once: the old queue read to its end, the new one from the move's end offset (the broker gives a
group with no offset there the segment's start).
"""

import asyncio
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.model import MessageQueue
from ferrymq.wire.topics import ControllerReassignRequestHeader

from .test_official_client import PushWorker, _message, _produce

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

TOPIC = "CompatMove"


async def _until(condition: object, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
        await asyncio.sleep(0.1)


async def test_the_official_client_sends_and_consumes_across_a_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the C++ core logs under ~/logs/rocketmq-cpp
    cluster = ProcessCluster(
        UpConfig(
            data_dir=tmp_path,
            groups=2,
            replicas=1,
            controllers=1,
            # 16 MiB commit log segments, as tests/system/test_queue_moves.py: not 1 GiB files
            broker_flags=("--mapped-file-size-commit-log", str(16 * 1024 * 1024)),
        )
    )
    await cluster.start()
    namesrv = cluster.namesrv_addr
    try:
        async with AdminClient(namesrv) as admin:
            await admin.create_topic(TOPIC, 2)
            before = await asyncio.to_thread(
                _produce, namesrv, "PMove", [_message(TOPIC, f"b{i}") for i in range(40)]
            )
            assert [r["status"] for r in before] == ["OK"] * 40
            body = await admin.reassign(
                ControllerReassignRequestHeader(
                    action="move",
                    topic=TOPIC,
                    broker_name="broker-a",
                    queue_id=1,
                    to_broker_name="broker-b",
                )
            )
            deadline = time.monotonic() + 30
            while (progress := (await admin.move_progress(body.moves))[0]).state != "done":
                assert time.monotonic() < deadline, "the move did not finish"
                await asyncio.sleep(0.1)
            end = progress.end_offset
            assert end is not None
            after = await asyncio.to_thread(
                _produce, namesrv, "PMove", [_message(TOPIC, f"a{i}") for i in range(40)]
            )
            assert [r["status"] for r in after] == ["OK"] * 40
        worker = PushWorker(namesrv, "CMove", TOPIC, tmp_path / "move.jsonl")
        try:
            expected = {f"b{i}" for i in range(40)} | {f"a{i}" for i in range(40)}
            await _until(lambda: set(worker.delivered()) >= expected, "every message delivered", 90)
            await asyncio.sleep(1.0)  # a repeat would arrive by now
        finally:
            await asyncio.to_thread(worker.stop)
        delivered = worker.delivered()
        assert sorted(delivered) == sorted(expected)  # each once
        # the official client wrote to the moved queue's new physical queue (broker-b's 2) and
        # read it from the move's end offset on
        async with PullConsumer(namesrv, "readers") as reader:
            assert await reader.max_offset(MessageQueue(TOPIC, "broker-a", 1)) > end
        from_new = [r["queue_offset"] for r in worker.rows() if r["queue_id"] == 2]
        assert from_new
        assert min(from_new) == end
    finally:
        await cluster.stop()
