"""The blocking facade (`ferrymq.sync`) against a real broker, called from a plain thread.

The cluster runs on the test's loop; each scenario is a plain function run in a worker thread,
as a script or a Spark worker would call the SDK.
"""

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from ferrymq import sync
from ferrymq.client.message import Message
from ferrymq.client.push import ConsumeFrom
from ferrymq.client.simple import ReceivedMessage
from ferrymq.client.transaction import TransactionState
from ferrymq.errors import InvalidMessageError, TopicNotFoundError
from ferrymq.testing import LocalCluster

FAST = {
    "message_delay_level": "1s 1s 1s 1s 1s",
    "transaction_timeout": 100,
    "transaction_check_interval": 150,
}

pytestmark = pytest.mark.parametrize("cluster", [FAST], indirect=True)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def produce_pull_and_administer(namesrv: str) -> None:
    with sync.AdminClient(namesrv) as admin:
        admin.create_topic("S", queues=2)
        wait_until(lambda: admin.route("S") is not None)
        assert "S" in admin.topics()
        with sync.Producer(namesrv) as producer:
            sent = [producer.send("S", f"m{i}".encode(), keys=f"k{i}") for i in range(6)]
            batch = producer.send_batch("S", [b"b0", b"b1"], queue=sent[0].queue)
            assert batch.queue_offset == 3
            with pytest.raises(TopicNotFoundError):
                producer.send("Missing", b"x")
            with pytest.raises(InvalidMessageError):
                producer.send("S", b"x", delay_ms=-1)
            oneway_id = producer.send_oneway("S", b"one-way", queue=sent[1].queue)
            assert oneway_id
        with pytest.raises(RuntimeError, match="closed"):
            producer.send("S", b"after close")
        with sync.PullConsumer(namesrv, "SyncGroup") as consumer:
            queues = consumer.queues("S")
            expected = sorted([f"m{i}".encode() for i in range(6)] + [b"b0", b"b1", b"one-way"])
            got = []
            for _ in range(200):  # the oneway send has no answer to wait for
                got = [
                    m for q in queues for m in consumer.fetch_range(q, 0, consumer.max_offset(q))
                ]
                if len(got) == len(expected):
                    break
                time.sleep(0.01)
            assert sorted(m.body for m in got) == expected
            consumer.commit(queues[0], 2)
            assert consumer.committed(queues[0]) == 2
            assert consumer.pull(queues[0], 0, max_messages=1).messages[0].queue_offset == 0
        progress = admin.consumer_progress("SyncGroup", "S")
        assert {(e.queue_id, e.consumer_offset) for e in progress} >= {(queues[0].queue_id, 2)}
        (found,) = admin.messages_by_key("S", "k4")
        assert found.body == b"m4"
        assert admin.message_by_id(sent[4].offset_msg_id).body == b"m4"


async def test_produce_pull_and_administer_from_a_thread(cluster: LocalCluster) -> None:
    await asyncio.to_thread(produce_pull_and_administer, cluster.namesrv_addr)


def push_with_a_callback(namesrv: str) -> None:
    with sync.AdminClient(namesrv) as admin:
        admin.create_topic("P", queues=2)
        wait_until(lambda: admin.route("P") is not None)
    seen: list[tuple[bytes, int]] = []
    threads: set[str] = set()
    lock = threading.Lock()

    def callback(message: Message) -> None:
        with lock:
            seen.append((message.body, message.reconsume_times))
            threads.add(threading.current_thread().name)
        if message.body == b"fail-once" and message.reconsume_times == 0:
            raise RuntimeError("try me again")

    consumer = sync.PushConsumer(
        namesrv, "PushGroup", callback, consume_from=ConsumeFrom.FIRST_OFFSET, commit_interval=0.2
    )
    consumer.subscribe("P")
    with consumer, sync.Producer(namesrv) as producer:
        for i in range(10):
            producer.send("P", f"p{i}".encode())
        producer.send("P", b"fail-once")
        wait_until(lambda: consumer.consumed >= 11)
        assert consumer.assigned
    with lock:
        bodies = {body for body, _ in seen}
        assert bodies == {f"p{i}".encode() for i in range(10)} | {b"fail-once"}
        assert (b"fail-once", 1) in seen
        assert all(name.startswith("ferrymq-consume") for name in threads)


async def test_a_push_consumer_calls_a_plain_callback(cluster: LocalCluster) -> None:
    await asyncio.to_thread(push_with_a_callback, cluster.namesrv_addr)


def transactions(namesrv: str) -> None:
    with sync.AdminClient(namesrv) as admin:
        admin.create_topic("Tx", queues=1)
        wait_until(lambda: admin.route("Tx") is not None)
    checked: list[bytes] = []

    def check(message: Message) -> TransactionState:
        checked.append(message.body)
        return TransactionState.COMMIT

    with sync.TransactionProducer(namesrv, "SyncTx", check) as producer:
        done = producer.send_in_transaction("Tx", b"now", lambda m: TransactionState.COMMIT)
        assert done.end_sent
        later = producer.send_in_transaction("Tx", b"later", lambda m: TransactionState.UNKNOWN)
        assert later.state is TransactionState.UNKNOWN
        with sync.PullConsumer(namesrv) as consumer:
            (queue,) = consumer.queues("Tx")
            wait_until(lambda: len(consumer.fetch_range(queue, 0, 10)) == 2)
            assert [m.body for m in consumer.fetch_range(queue, 0, 10)] == [b"now", b"later"]
    assert b"later" in checked


async def test_transactions_with_plain_functions(cluster: LocalCluster) -> None:
    await asyncio.to_thread(transactions, cluster.namesrv_addr)


def receive_ack_and_change(namesrv: str) -> None:
    with sync.AdminClient(namesrv) as admin:
        admin.create_topic("Pop", queues=2)
        wait_until(lambda: admin.route("Pop") is not None)
    with sync.Producer(namesrv) as producer:
        for i in range(4):
            producer.send("Pop", f"s{i}".encode())
    with sync.SimpleConsumer(namesrv, "SyncPop") as consumer:
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + 20
        while len(got) < 4 and time.monotonic() < deadline:
            got += consumer.receive("Pop", invisible_duration=2, wait=1)
        assert sorted(m.message.body for m in got) == [b"s0", b"s1", b"s2", b"s3"]
        by_body = {m.message.body: m for m in got}
        consumer.ack(by_body[b"s0"])
        consumer.ack_batch([by_body[b"s1"], by_body[b"s2"]])
        consumer.change_invisible_duration(by_body[b"s3"], 0.5)
        # past the first invisible time (2 s) only the message made visible again comes back
        again: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            for received in consumer.receive("Pop", wait=0.5):
                again.append((received.message.body, received.message.reconsume_times))
                consumer.ack_batch([received])
        assert again == [(b"s3", 1)]


async def test_simple_consumer_receives_acks_and_changes_from_a_thread(
    cluster: LocalCluster,
) -> None:
    await asyncio.to_thread(receive_ack_and_change, cluster.namesrv_addr)
