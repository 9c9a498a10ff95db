"""The official RocketMQ 4.x client (PyPI `rocketmq` 0.4.4, Apache's C++ core) against ferrymq.

`ferry namesrv` and `ferry broker` run as processes; every client runs in its own process through
`cpp_worker`, unchanged. The broker's delay levels are shortened (a RocketMQ `messageDelayLevel`
setting) so retries come back in a second instead of ten.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.fenced import FencedTopicWriter

from ..system.procs import Server, start

pytestmark = pytest.mark.compat

WORKER = [sys.executable, "-m", "tests.compat.cpp_worker"]
TOPICS = {
    "CompatSend": 4,
    "CompatOrder": 2,
    "CompatTags": 4,
    "CompatShare": 4,
    "CompatRestart": 2,
    "CompatRetry": 2,
    "CompatPull": 2,
    "CompatFencedControl": 1,
}


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("compat")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(workdir))  # the C++ core logs under ~/logs/rocketmq-cpp
        yield from _cluster(workdir)


def _cluster(workdir: Path) -> Iterator[str]:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], workdir, "namesrv")
    broker: Server | None = None
    try:
        broker = start(
            [
                "broker",
                "--listen",
                "127.0.0.1:0",
                "--namesrv",
                namesrv.addr,
                "--store-dir",
                str(workdir / "store"),
                "--message-delay-level",
                "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
            ],
            workdir,
            "broker",
        )
        asyncio.run(_create_topics(namesrv.addr))
        yield namesrv.addr
        assert broker.process.poll() is None, "broker died during the compat tests"
        assert namesrv.process.poll() is None, "namesrv died during the compat tests"
    finally:
        if broker is not None:
            broker.stop()
        namesrv.stop()


FENCED = "CompatFenced"


async def _create_topics(namesrv: str) -> None:
    async with AdminClient(namesrv) as admin:
        for topic, queues in TOPICS.items():
            await admin.create_topic(topic, queues=queues)
        await admin.create_topic(FENCED, 1, broker_name="broker-a", fenced=True)
        for topic in [*TOPICS, FENCED]:
            deadline = time.monotonic() + 30
            while await admin.route(topic) is None:
                assert time.monotonic() < deadline, f"no route for {topic}"
                await asyncio.sleep(0.05)


def _produce(namesrv: str, group: str, spec: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*WORKER, "produce", namesrv, group, json.dumps(spec)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout, f"no results printed; stderr: {done.stderr.decode()[-3000:]}"
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def _pull(namesrv: str, group: str, topic: str, offsets: dict[int, int]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*WORKER, "pull", namesrv, group, topic, json.dumps(offsets)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


class PushWorker:
    """A C++ PushConsumer process writing one JSON line per delivery."""

    def __init__(
        self,
        namesrv: str,
        group: str,
        topic: str,
        output: Path,
        expression: str = "*",
        fail_once: list[str] | None = None,
    ) -> None:
        self.output = output
        with output.with_suffix(".log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *WORKER,
                    "push",
                    namesrv,
                    group,
                    topic,
                    expression,
                    str(output),
                    json.dumps(fail_once or []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def rows(self) -> list[dict[str, Any]]:
        if not self.output.exists():
            return []
        return [json.loads(line) for line in self.output.read_text().splitlines() if line]

    def delivered(self) -> list[str]:
        """Bodies the listener accepted, in delivery order."""
        return [row["body"] for row in self.rows() if not row.get("failed")]

    def stop(self) -> None:
        """SIGTERM: the worker shuts the consumer down cleanly (offsets persisted, unregistered)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        assert self.process.returncode == 0, self.output.with_suffix(".log").read_text()[-3000:]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; fail with `what` once `timeout` seconds have passed.

    The bound stays well under pytest's 120 s timeout, so a stuck test fails with this message
    instead of being killed. Every wait in this file takes a few seconds at most when it works
    (the longest, a retry, waits for the C++ client's 10 s rebalance to pick up the retry queue).
    """
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _message(topic: str, body: str, **fields: Any) -> dict[str, Any]:
    return {"topic": topic, "body": body, **fields}


def test_sync_and_oneway_send_keep_keys_tags_and_properties(namesrv: str) -> None:
    spec = [
        _message(
            "CompatSend",
            f"s{i}",
            mode="sync" if i < 5 else "oneway",
            tags=f"Tag{i % 2}",
            keys=f"key-{i}",
            properties={"color": f"c{i}"},
        )
        for i in range(10)
    ]
    results = _produce(namesrv, "PSend", spec)
    assert [r["status"] for r in results[:5]] == ["OK"] * 5
    assert all(r["msg_id"] for r in results[:5])
    assert [r["status"] for r in results[5:]] == ["ONEWAY"] * 5

    stored: list[dict[str, Any]] = []

    def all_stored() -> bool:
        stored[:] = _pull(namesrv, "CSendCheck", "CompatSend", dict.fromkeys(range(4), 0))
        return len(stored) >= 10

    _wait(all_stored, "the oneway messages")
    by_body = {row["body"]: row for row in stored}
    assert len(stored) == 10
    assert sorted(by_body) == sorted(f"s{i}" for i in range(10))
    for i in range(10):
        row = by_body[f"s{i}"]
        assert (row["tags"], row["keys"], row["color"]) == (f"Tag{i % 2}", f"key-{i}", f"c{i}")
    # A sync send's result names the message a consumer sees: its id (the client's UNIQ_KEY,
    # kept by the broker) and its offset in the queue.
    for i, result in enumerate(results[:5]):
        row = by_body[f"s{i}"]
        assert (result["msg_id"], result["offset"]) == (row["id"], row["queue_offset"])


def test_orderly_send_puts_each_key_on_its_queue_in_order(namesrv: str) -> None:
    spec = [_message("CompatOrder", f"o{i}", mode="orderly", arg=i % 2) for i in range(20)]
    results = _produce(namesrv, "POrder", spec)
    assert {r["status"] for r in results} == {"OK"}
    rows = _pull(namesrv, "COrderCheck", "CompatOrder", {0: 0, 1: 0})
    for queue_id in (0, 1):
        in_queue = sorted(
            (r for r in rows if r["queue_id"] == queue_id), key=lambda r: r["queue_offset"]
        )
        assert [r["body"] for r in in_queue] == [f"o{i}" for i in range(queue_id, 20, 2)]
        assert [r["queue_offset"] for r in in_queue] == list(range(10))


def test_push_consumer_receives_exactly_the_matching_tags(namesrv: str, tmp_path: Path) -> None:
    tags = ["TagA", "TagB", "TagC"]
    spec = [
        _message(
            "CompatTags", f"t{i}", tags=tags[i % 3], keys=f"k{i}", properties={"color": f"c{i}"}
        )
        for i in range(30)
    ]
    _produce(namesrv, "PTags", spec)
    wanted = sorted(f"t{i}" for i in range(30) if tags[i % 3] in ("TagA", "TagC"))
    worker = PushWorker(namesrv, "CTags", "CompatTags", tmp_path / "tags.jsonl", "TagA || TagC")
    try:
        _wait(lambda: len(worker.delivered()) >= len(wanted), "the tagged messages")
        time.sleep(2)  # anything unwanted would arrive with or right after the wanted ones
    finally:
        worker.stop()
    assert sorted(worker.delivered()) == wanted  # each matching message once, nothing else
    for row in worker.rows():
        i = int(row["body"][1:])
        assert (row["tags"], row["keys"], row["color"]) == (tags[i % 3], f"k{i}", f"c{i}")


def test_two_consumers_share_the_queues_and_one_takes_over(namesrv: str, tmp_path: Path) -> None:
    first = PushWorker(namesrv, "CShare", "CompatShare", tmp_path / "a.jsonl")
    second = PushWorker(namesrv, "CShare", "CompatShare", tmp_path / "b.jsonl")
    stopped = False
    try:
        # Both registered: each owns only part of the four queues. A fresh producer starts its
        # round robin at queue 0, so each probe round sends eight, two to every queue.
        def split() -> bool:
            probes = [_message("CompatShare", f"probe{time.monotonic_ns()}-{i}") for i in range(8)]
            _produce(namesrv, "PShare", probes)
            queues_a = {r["queue_id"] for r in first.rows()}
            queues_b = {r["queue_id"] for r in second.rows()}
            return bool(queues_a) and bool(queues_b)

        _wait(split, "both consumers to receive messages")
        batch_one = [f"x{i}" for i in range(40)]
        _produce(namesrv, "PShare", [_message("CompatShare", body) for body in batch_one])
        _wait(
            lambda: set(batch_one) <= set(first.delivered()) | set(second.delivered()),
            "the first batch across both consumers",
        )
        got_a = set(batch_one) & set(first.delivered())
        got_b = set(batch_one) & set(second.delivered())
        assert got_a, "the first consumer owns some queues"
        assert got_b, "the second consumer owns some queues"
        assert not got_a & got_b, "each message went to one consumer"
        both = Counter(first.delivered() + second.delivered())
        assert {body: both[body] for body in batch_one} == dict.fromkeys(batch_one, 1)

        second.stop()
        stopped = True
        batch_two = [f"y{i}" for i in range(40)]
        _produce(namesrv, "PShare", [_message("CompatShare", body) for body in batch_two])
        _wait(lambda: set(batch_two) <= set(first.delivered()), "the survivor to take every queue")
        time.sleep(1)  # a duplicate would come with or right after the batch
        # The leaver shut down cleanly (its offsets committed), so the takeover neither loses
        # nor repeats anything: the second batch once, the first batch not again.
        survivor = Counter(first.delivered())
        assert {body: survivor[body] for body in batch_two} == dict.fromkeys(batch_two, 1)
        assert not set(batch_two) & set(second.delivered())
        both = Counter(first.delivered() + second.delivered())
        assert {body: both[body] for body in batch_one} == dict.fromkeys(batch_one, 1)
    finally:
        first.stop()
        if not stopped:
            second.stop()


def test_offsets_survive_a_consumer_restart(namesrv: str, tmp_path: Path) -> None:
    batch_one = [f"r{i}" for i in range(20)]
    _produce(namesrv, "PRestart", [_message("CompatRestart", body) for body in batch_one])
    worker = PushWorker(namesrv, "CRestart", "CompatRestart", tmp_path / "one.jsonl")
    try:
        _wait(lambda: set(batch_one) <= set(worker.delivered()), "the first batch")
    finally:
        worker.stop()
    batch_two = [f"q{i}" for i in range(20)]
    _produce(namesrv, "PRestart", [_message("CompatRestart", body) for body in batch_two])
    restarted = PushWorker(namesrv, "CRestart", "CompatRestart", tmp_path / "two.jsonl")
    try:
        _wait(lambda: set(batch_two) <= set(restarted.delivered()), "the second batch")
        time.sleep(1)
    finally:
        restarted.stop()
    assert Counter(worker.delivered()) == Counter(batch_one)
    assert Counter(restarted.delivered()) == Counter(batch_two), "resumed from the committed offset"


def test_a_failed_message_comes_back_through_the_retry_topic(namesrv: str, tmp_path: Path) -> None:
    bodies = [f"f{i}" for i in range(5)]
    _produce(namesrv, "PRetry", [_message("CompatRetry", body) for body in bodies])
    worker = PushWorker(
        namesrv, "CRetry", "CompatRetry", tmp_path / "retry.jsonl", fail_once=["f3"]
    )
    try:
        _wait(lambda: set(bodies) <= set(worker.delivered()), "the retried message")
    finally:
        worker.stop()
    rows = worker.rows()
    assert [r["body"] for r in rows if r.get("failed")] == ["f3"]
    retried = [r for r in rows if r["body"] == "f3" and not r.get("failed")]
    assert len(retried) == 1
    assert retried[0]["reconsume_times"] == 1
    # The C++ core hands its listener a whole pulled batch and sends all of it back when the
    # status is RECONSUME_LATER, so f3's batch mates may come back too, each exactly once more.
    first = [r["body"] for r in rows if r["reconsume_times"] == 0]
    again = [r["body"] for r in rows if r["reconsume_times"] == 1]
    assert sorted(first) == bodies
    assert "f3" in again
    assert len(again) == len(set(again))

    async def retry_topic_size() -> int:
        async with AdminClient(namesrv) as admin:
            status = await admin.topic_status("%RETRY%CRetry")
        return sum(queue.max_offset - queue.min_offset for queue in status)

    assert asyncio.run(retry_topic_size()) == len(again), "redeliveries came via %RETRY%CRetry"


def test_pull_consumer_fetches_from_a_queue_offset(namesrv: str) -> None:
    spec = [_message("CompatPull", f"p{i}", mode="orderly", arg=i % 2) for i in range(20)]
    _produce(namesrv, "PPull", spec)
    rows = _pull(namesrv, "CPull", "CompatPull", {0: 6, 1: 0})
    queue_zero = [(r["queue_offset"], r["body"]) for r in rows if r["queue_id"] == 0]
    queue_one = [(r["queue_offset"], r["body"]) for r in rows if r["queue_id"] == 1]
    assert queue_zero == [(offset, f"p{offset * 2}") for offset in range(6, 10)]
    assert queue_one == [(offset, f"p{offset * 2 + 1}") for offset in range(10)]


def test_a_send_to_a_fenced_topic_is_refused_and_nothing_is_stored(namesrv: str) -> None:
    """Issue 18: only fenced appends (claim/snapshot/write under the holder's epoch) write it.

    The C++ core reports any send that failed on every try as "No route info of this topic";
    the answer it got (FENCED, 9210, with the holder) is in its log. A send to an unfenced topic
    with one queue from the same process goes through, so the route is not what failed.
    """

    async def claim() -> None:
        async with FencedTopicWriter(namesrv, FENCED) as log:
            await log.append(b"claim", op="claim", epoch=1, writer="w1", url="http://w1")

    asyncio.run(claim())
    spec = [
        _message("CompatFencedControl", "control"),
        _message(FENCED, "plain"),
        _message(
            FENCED,
            "forged",
            properties={"FERRY_FENCE_OP": "write", "FERRY_FENCE_EPOCH": "1"},
        ),
    ]
    results = _produce(namesrv, "PFenced", spec)
    assert [r["status"] for r in results] == ["OK", "ERROR", "ERROR"], results
    logs = Path(os.environ["HOME"]) / "logs" / "rocketmq-cpp"
    refusals = [
        line
        for path in logs.iterdir()
        for line in path.read_text(errors="replace").splitlines()
        if "error code:9210" in line and f'"topic":"{FENCED}"' in line
    ]
    assert refusals, "the C++ client never got FENCED"
    assert '"writer":"w1"' in refusals[-1]
    stored = _pull(namesrv, "CFencedCheck", FENCED, {0: 0})
    assert [row["body"] for row in stored] == ["claim"]
