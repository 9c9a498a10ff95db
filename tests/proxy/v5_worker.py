"""Runs the official 5.x Python client, unchanged, in its own venv; prints JSON lines.

`python v5_worker.py produce ENDPOINT TOPIC`: a normal message (tag, keys), two FIFO messages of
one group, a delayed one (2 s), a transactional one committed by the client, and one left open
for the broker's check (the checker commits it): prints what was sent, and each check asked.
Not imported by the tests (the 4.x client's `rocketmq` module is another package).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (  # the 5.x package, installed in this venv only
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
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


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"produce": produce}[command](*args)
