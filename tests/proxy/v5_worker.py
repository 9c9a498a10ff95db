"""Runs the official 5.x Python client, unchanged, in its own venv; prints JSON lines.

`python v5_worker.py produce ENDPOINT TOPIC`: a normal message (tag, keys), two FIFO messages of
one group, a delayed one (2 s), a transactional one committed by the client, and one left open
for the broker's check (the checker commits it): prints what was sent, and each check asked.
Not imported by the tests (the 4.x client's `rocketmq` module is another package).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rocketmq import (  # the 5.x package, installed in this venv only
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def produce(endpoint: str, topic: str) -> None:
    checked = threading.Event()

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            emit(event="check", message_id=message.message_id, body=message.body.decode())
            checked.set()
            return TransactionResolution.COMMIT

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,), checker=Checker())
    producer.startup()
    try:

        def send(body: str, **fields: Any) -> None:
            message = Message()
            message.topic = topic
            message.body = body.encode()
            for name, value in fields.items():
                setattr(message, name, value)
            receipt = producer.send(message)
            emit(event="sent", body=body, message_id=receipt.message_id)

        send("normal", tag="TagA", keys="key-1")
        send("fifo-1", message_group="group-1")
        send("fifo-2", message_group="group-1")
        send("delayed", delivery_timestamp=int(time.time()) + 2)  # seconds in this client
        for body, commit in (("tx-commit", True), ("tx-check", False)):
            transaction = producer.begin_transaction()
            message = Message()
            message.topic = topic
            message.body = body.encode()
            receipt = producer.send(message, transaction)
            emit(event="sent", body=body, message_id=receipt.message_id)
            if commit:
                transaction.commit()
        if not checked.wait(60):
            emit(event="error", reason="no transaction check within 60 s")
    finally:
        producer.shutdown()


def simple(endpoint: str, topic: str, group: str, count: str) -> None:
    """Receive `count` messages: ack most at once; 'm1' after a change of invisible time; 'm2'
    left to expire (3 s) and acked when it comes again; then one more receive finds nothing."""
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        acked: set[str] = set()
        deadline = time.monotonic() + 60
        while len(acked) < int(count) and time.monotonic() < deadline:
            for message in consumer.receive(16, 3):
                body = message.body.decode()
                emit(event="received", body=body, attempt=message.delivery_attempt)
                if body == "m2" and message.delivery_attempt == 1:
                    continue  # left to expire: it must come again
                if body == "m1" and message.delivery_attempt == 1:
                    consumer.change_invisible_duration(message, 5)
                    emit(event="changed", body=body)
                consumer.ack(message)
                acked.add(body)
                emit(event="acked", body=body)
        time.sleep(3.5)  # past every invisible time: an unacked message would be back
        for message in consumer.receive(16, 3):
            emit(event="received", body=message.body.decode(), attempt=message.delivery_attempt)
    finally:
        consumer.shutdown()


def push(endpoint: str, topic: str, group: str, count: str, hold_ms: str = "0") -> None:
    """A push consumer that consumes until it saw `count` distinct bodies (60 s at most), each
    for `hold_ms` (its start and end times are printed)."""
    seen: set[str] = set()
    done = threading.Event()

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            body = message.body.decode()
            start = time.monotonic()
            time.sleep(int(hold_ms) / 1000)
            emit(
                event="consumed",
                body=body,
                attempt=message.delivery_attempt,
                start=start,
                end=time.monotonic(),
            )
            seen.add(body)
            if len(seen) >= int(count):
                done.set()
            return ConsumeResult.SUCCESS

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    consumer = PushConsumer(config, group, Listener(), {topic: FilterExpression()})
    consumer.startup()
    try:
        if not done.wait(60):
            emit(event="error", reason=f"saw {len(seen)} of {count} within 60 s")
    finally:
        consumer.shutdown()


def failover(endpoint: str, topic: str, group: str, seconds: str) -> None:
    """A producer thread sending without pause and a simple consumer acking what it receives,
    except every tenth message on its first delivery (left in flight, invisible 3 s): until
    SIGTERM or `seconds`. Then the producer stops and the consumer drains (30 s at most) until it
    received every send the producer saw acknowledged and holds nothing unacked; it acks at once
    what it holds whose invisible time still runs (what ran out must come again, so is awaited).
    Events: sent (ok or not, message id), received (message id, attempt), acked, ack_failed,
    each timed; `drained` last."""
    invisible = 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
    producer = Producer(config, (topic,))
    producer.startup()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    deadline = time.monotonic() + float(seconds)
    sent_ok: set[str] = set()
    received: set[str] = set()
    unacked: dict[str, tuple[float, Any]] = {}  # body -> (received at, message)

    def produce() -> None:
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            message = Message()
            message.topic = topic
            message.body = f"f-{i:05d}".encode()
            start = time.time()
            message_id = ""
            try:
                message_id = producer.send(message).message_id
                ok = True
            except Exception:  # noqa: BLE001 -- a failed send is an event, not a crash
                ok = False
            emit(
                event="sent", body=f"f-{i:05d}", id=message_id, ok=ok, start=start, end=time.time()
            )
            if ok:
                sent_ok.add(message_id)
            i += 1
            time.sleep(0.01)

    def ack(body: str, message: Any) -> None:
        try:
            consumer.ack(message)
        except Exception as exc:  # noqa: BLE001
            emit(event="ack_failed", body=body, error=str(exc)[:200], at=time.time())
        else:
            unacked.pop(body, None)
            emit(event="acked", body=body, at=time.time())

    sender = threading.Thread(target=produce)
    sender.start()
    drain_until = float("inf")
    try:
        while time.monotonic() < drain_until:
            if drain_until == float("inf") and (stop.is_set() or time.monotonic() > deadline):
                stop.set()
                sender.join()
                drain_until = time.monotonic() + 30
                for body, (at, message) in list(unacked.items()):
                    if time.monotonic() - at < invisible - 0.5:
                        ack(body, message)
            if stop.is_set() and sent_ok <= received and not unacked:
                break
            try:
                messages = consumer.receive(16, invisible)
            except Exception as exc:  # noqa: BLE001 -- the endpoint is failing over
                emit(event="receive_failed", error=str(exc)[:200], at=time.time())
                time.sleep(0.1)
                continue
            for message in messages:
                body = message.body.decode()
                attempt = message.delivery_attempt
                received.add(message.message_id)
                unacked[body] = (time.monotonic(), message)
                emit(
                    event="received",
                    body=body,
                    id=message.message_id,
                    attempt=attempt,
                    at=time.time(),
                )
                if int(body[2:]) % 10 == 0 and attempt == 1 and not stop.is_set():
                    continue  # in flight across the failover: must come again
                ack(body, message)
    finally:
        stop.set()
        sender.join()
        emit(event="drained", missing=len(sent_ok - received), unacked=sorted(unacked)[:20])
        consumer.shutdown()
        producer.shutdown()


def acl(endpoint: str, topic: str, denied: str, group: str) -> None:
    """ACL through the endpoint, keys from V5_AK / V5_SK / V5_BAD_SK: a send and a receive+ack
    with the right keys; a send with the wrong secret and one to the `denied` topic (each
    printed as sent or as the error the client raised)."""
    import os

    def config(secret: str) -> Any:
        keys = Credentials(os.environ["V5_AK"], secret)
        return ClientConfiguration(endpoint, keys, request_timeout=10)

    def try_send(case: str, secret: str, to: str) -> None:
        producer = Producer(config(secret), (to,))
        try:
            producer.startup()
            message = Message()
            message.topic, message.body = to, case.encode()
            producer.send(message)
            emit(event="sent", case=case)
        except Exception as exc:  # noqa: BLE001 -- the refusal is what is printed
            emit(event="refused", case=case, error=str(exc)[:500])
        finally:
            producer.shutdown()

    try_send("ok", os.environ["V5_SK"], topic)
    try_send("wrong-secret", os.environ["V5_BAD_SK"], topic)
    try_send("denied-topic", os.environ["V5_SK"], denied)
    consumer = SimpleConsumer(
        config(os.environ["V5_SK"]), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            messages = consumer.receive(16, 10)
            for message in messages:
                consumer.ack(message)
                emit(event="acked", body=message.body.decode())
            if messages:
                break
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {
        "produce": produce,
        "simple": simple,
        "push": push,
        "failover": failover,
        "acl": acl,
    }
    commands[command](*args)
