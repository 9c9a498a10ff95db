"""Drive the official RocketMQ client (PyPI `rocketmq` 0.4.4, Apache's C++ core) in its own process.

Each C++ client runs in a child process, so a crash of the native library fails one test with a
message instead of taking pytest down, and two consumers of one group are two real clients.

    python -m tests.compat.cpp_worker produce NAMESRV GROUP SPEC_JSON   -> JSON results on stdout
    python -m tests.compat.cpp_worker push NAMESRV GROUP TOPIC EXPR OUTPUT [FAIL_ONCE_BODIES_JSON]
    python -m tests.compat.cpp_worker pull NAMESRV GROUP TOPIC OFFSETS_JSON -> JSON lines on stdout

With CPP_ACCESS_KEY and CPP_SECRET_KEY in the environment, every client signs its requests with
those session credentials (ACL 1.0, channel ALIYUN as the C++ core's default).

`push` appends one JSON line per delivered message to OUTPUT and runs until SIGTERM, when it shuts
the consumer down (which persists its offsets) and exits 0. A body listed in FAIL_ONCE_BODIES_JSON
makes the listener return RECONSUME_LATER on its first delivery, so the client sends it back
for a retry.
"""

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer, RecvMessage
from rocketmq.exceptions import ProducerException, ffi_check
from rocketmq.ffi import _CConsumeStatus, _CMessageQueue, dll


class StatusPushConsumer(PushConsumer):  # type: ignore[misc]
    """A PushConsumer whose listener returns the consume status the C++ core acts on.

    The 0.4.4 wrapper's `subscribe` re-raises a listener's exception in a `finally` after choosing
    RECONSUME_LATER, so the exception escapes the ctypes callback: ctypes prints "Exception ignored"
    and hands the C++ core whatever its return buffer held, not a status the listener chose. (In
    practice that buffer is usually non-zero and the message is retried, but nothing guarantees
    it.) This registers the callback through the same C API calls and returns the status
    explicitly, as every other binding of the C++ core does.
    """

    def subscribe_with_status(
        self, topic: str, listener: Callable[[RecvMessage], _CConsumeStatus], expression: str
    ) -> None:
        def on_message(_consumer: int, message: int) -> int:
            status: int = listener(RecvMessage(message)).value
            return status

        ffi_check(dll.Subscribe(self._handle, topic.encode(), expression.encode()))
        self._register_callback(on_message)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _emit(value: Any) -> None:
    """One JSON line on stdout, flushed: the native core may end the process unflushed."""
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def _credentials(client: Any) -> None:
    """Session credentials from the environment, if any (ACL 1.0)."""
    access_key, secret_key = os.environ.get("CPP_ACCESS_KEY"), os.environ.get("CPP_SECRET_KEY")
    if access_key and secret_key:
        client.set_session_credentials(access_key, secret_key, "ALIYUN")


def _record(message: RecvMessage) -> dict[str, Any]:
    row = {
        "topic": message.topic,
        "body": message.body.decode(),
        "tags": message.tags,
        "keys": message.keys,
        "id": message.id,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "reconsume_times": message.reconsume_times,
        "color": message.get_property("color"),
    }
    return {key: _text(value) for key, value in row.items()}


def produce(namesrv: str, group: str, spec: list[dict[str, Any]]) -> None:
    producer = Producer(group)
    producer.set_namesrv_addr(namesrv)
    _credentials(producer)
    producer.start()
    results: list[dict[str, Any]] = []
    try:
        for item in spec:
            message = Message(item["topic"])
            message.set_body(item["body"])
            if item.get("tags"):
                message.set_tags(item["tags"])
            if item.get("keys"):
                message.set_keys(item["keys"])
            for key, value in item.get("properties", {}).items():
                message.set_property(key, value)
            mode = item.get("mode", "sync")
            if mode == "oneway":
                producer.send_oneway(message)
                results.append({"status": "ONEWAY"})
                continue
            try:
                if mode == "orderly":
                    result = producer.send_orderly(message, item["arg"])  # queue = arg % queues
                else:
                    result = producer.send_sync(message)
            except ProducerException as exc:  # a refused send is a result the test checks
                results.append({"status": "ERROR", "error": str(exc)})
                continue
            results.append(
                {"status": result.status.name, "msg_id": result.msg_id, "offset": result.offset}
            )
    finally:
        producer.shutdown()
    _emit(results)


def push(
    namesrv: str, group: str, topic: str, expression: str, output: str, fail_once: set[str]
) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    failed: set[str] = set()
    lock = threading.Lock()
    with open(output, "a", buffering=1) as out:

        def on_message(message: RecvMessage) -> _CConsumeStatus:
            row = _record(message)
            with lock:
                if row["body"] in fail_once and row["body"] not in failed:
                    failed.add(row["body"])
                    out.write(json.dumps({**row, "failed": True}) + "\n")
                    return _CConsumeStatus.RECONSUME_LATER
                out.write(json.dumps(row) + "\n")
                return _CConsumeStatus.CONSUME_SUCCESS

        consumer = StatusPushConsumer(group)
        consumer.set_namesrv_addr(namesrv)
        _credentials(consumer)
        consumer.set_thread_count(2)
        consumer.subscribe_with_status(topic, on_message, expression)
        consumer.start()
        stop.wait()
        consumer.shutdown()


def pull(namesrv: str, group: str, topic: str, offsets: dict[str, int]) -> None:
    consumer = PullConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    _credentials(consumer)
    consumer.start()
    try:
        for queue_id, offset in offsets.items():
            queue = _CMessageQueue(topic=topic.encode(), brokerName=b"", queueId=int(queue_id))
            consumer.set_message_queue_offset(queue, offset)
        for message in consumer.pull(topic):
            _emit(_record(message))
    finally:
        consumer.shutdown()


def main(argv: list[str]) -> None:
    command, namesrv, group = argv[:3]
    if command == "produce":
        produce(namesrv, group, json.loads(argv[3]))
    elif command == "push":
        fail_once = set(json.loads(argv[6])) if len(argv) > 6 else set()
        push(namesrv, group, argv[3], argv[4], argv[5], fail_once)
    elif command == "pull":
        pull(namesrv, group, argv[3], json.loads(argv[4]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
