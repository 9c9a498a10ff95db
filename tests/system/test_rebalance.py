"""Consumers of one group across a rebalance: one joins, one is killed -9, nothing is skipped."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer

from .procs import start

pytestmark = pytest.mark.system

TOTAL = 3000


def _worker(namesrv: str, output: Path) -> subprocess.Popen[bytes]:
    with output.with_suffix(".log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.system.consumer_worker",
                namesrv,
                "G",
                "Stream",
                str(output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def _lines(path: Path) -> list[tuple[str, int, int, str]]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        broker, queue, offset, body = line.split(" ", 3)
        rows.append((broker, int(queue), int(offset), body))
    return rows


async def test_no_message_is_skipped_when_consumers_join_and_die(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    broker = start(
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
        "broker",
    )
    out_a, out_b = tmp_path / "a.txt", tmp_path / "b.txt"
    worker_a = worker_b = None
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Stream", queues=4)
            while await admin.route("Stream") is None:
                await asyncio.sleep(0.05)
        worker_a = _worker(namesrv.addr, out_a)
        async with Producer(namesrv.addr) as producer:
            for i in range(TOTAL):
                await producer.send("Stream", f"m{i}".encode())
                if i == TOTAL // 4:
                    worker_b = _worker(namesrv.addr, out_b)
                if i == TOTAL // 2:
                    os.kill(worker_a.pid, signal.SIGKILL)
                    worker_a.wait(10)
                if i % 50 == 0:
                    await asyncio.sleep(0.02)  # a steady stream, not a burst
        deadline = time.monotonic() + 60
        while (
            len({r[3] for r in _lines(out_a) + _lines(out_b)}) < TOTAL
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.2)
    finally:
        for worker in (worker_a, worker_b):
            if worker is not None and worker.poll() is None:
                worker.terminate()
                worker.wait(10)
        broker.stop()
        namesrv.stop()
    seen_a, seen_b = _lines(out_a), _lines(out_b)
    assert seen_a, "consumer A consumed nothing before it was killed"
    assert seen_b, "consumer B never got queues"
    bodies = [r[3] for r in seen_a + seen_b]
    assert set(bodies) == {f"m{i}" for i in range(TOTAL)}  # nothing skipped
    duplicated = {b for b in set(bodies) if bodies.count(b) > 1}
    # every duplicate was handled by A before it died, after its last commit: per queue, the
    # duplicates are a tail of what A handled there
    a_by_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
    for broker_name, queue, offset, _ in seen_a:
        a_by_queue[broker_name, queue].append(offset)
    dup_by_queue: dict[tuple[str, int], set[int]] = defaultdict(set)
    for broker_name, queue, offset, body in seen_a:
        if body in duplicated:
            dup_by_queue[broker_name, queue].add(offset)
    for key, offsets in dup_by_queue.items():
        tail = {o for o in a_by_queue[key] if o >= min(offsets)}
        assert offsets == tail, f"duplicates in {key} are not a tail of what A handled"
    assert len(bodies) - TOTAL == len(duplicated)  # each duplicate came back exactly once
    assert len(duplicated) < len(seen_a)  # only A's uncommitted tail, not everything A handled
