"""The 5.x side of `ferry bench proxy`, run by the official client's own venv (never imported).

    python bench_proxy_v5.py send ENDPOINT TOPIC COUNT SIZE WINDOW  -> {"seconds", "failed"}
    python bench_proxy_v5.py receive ENDPOINT TOPIC GROUP COUNT WINDOW -> {"seconds", "received"}

Each prints {"phase": "start"} when its timed part starts (the bench starts its CPU meters on
the servers then), and its result line, with this process's CPU seconds over the timed part
("cpu_seconds", every thread: `time.process_time`), as soon as the timed part ends.

`send`: COUNT sends of SIZE bytes after 20 unmeasured ones, sync (WINDOW 1) or `send_async` with
up to WINDOW in flight. `receive`: receive (batches of up to 32) and ack each message, one ack
at a time (WINDOW 1) or a batch's acks at once (`ack_async`), until COUNT were acked.
"""

import json
import sys
import time
from typing import Any

from rocketmq import (  # the official 5.x client, in its venv only
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)


def _start() -> float:
    """Say the timed part starts; this process's CPU seconds so far."""
    sys.stdout.write(json.dumps({"phase": "start"}) + "\n")
    sys.stdout.flush()
    return time.process_time()


def _result(result: dict[str, Any], cpu_start: float) -> None:
    result["cpu_seconds"] = time.process_time() - cpu_start
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def send(endpoint: str, topic: str, count: int, size: int, window: int) -> None:
    """Time `count` sends of `size` bytes, `window` in flight (1: sync sends)."""
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), (topic,))
    producer.startup()
    body = b"x" * size
    failed = 0
    try:

        def one() -> None:
            message = Message()
            message.topic = topic
            message.body = body
            producer.send(message)

        for _ in range(20):
            one()
        cpu_start = _start()
        start = time.perf_counter()
        if window <= 1:
            for _ in range(count):
                try:
                    one()
                except Exception:  # noqa: BLE001 -- counted, as the SDK side counts its failures
                    failed += 1
        else:
            pending: list[Any] = []
            for _ in range(count):
                message = Message()
                message.topic = topic
                message.body = body
                pending.append(producer.send_async(message))
                if len(pending) >= window:
                    failed += _settle(pending)
            failed += _settle(pending)
        _result({"seconds": time.perf_counter() - start, "failed": failed}, cpu_start)
    finally:
        producer.shutdown()


def _settle(pending: list[Any]) -> int:
    """Wait for every future; how many failed (the first failure is written to stderr)."""
    failed = 0
    for future in pending:
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001
            if not failed:
                sys.stderr.write(f"failed: {exc!r}\n")
            failed += 1
    pending.clear()
    return failed


def receive(endpoint: str, topic: str, group: str, count: int, window: int) -> None:
    """Time receiving and acking `count` messages (`window` > 1: a batch's acks at once)."""
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    acked = 0
    try:
        cpu_start = _start()
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while acked < count and time.monotonic() < deadline:
            messages = consumer.receive(32, 30)
            if window <= 1:
                for message in messages:
                    consumer.ack(message)
            else:
                if _settle([consumer.ack_async(message) for message in messages]):
                    raise RuntimeError("an ack failed")
            acked += len(messages)
        _result({"seconds": time.perf_counter() - start, "received": acked}, cpu_start)
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "send":
        send(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    else:
        receive(args[0], args[1], args[2], int(args[3]), int(args[4]))
