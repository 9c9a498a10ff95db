"""The official 4.x client (PyPI `rocketmq` 0.4.4, C++ core) sending without pause, as a process.

    python -m tests.proxy.cpp_stream NAMESRV TOPIC SECONDS

One JSON line per send: body, wall-clock start and end, and whether it was acknowledged. Stops
after SECONDS or on SIGTERM (then shuts the producer down and exits 0).
"""

import json
import signal
import sys
import threading
import time

from rocketmq.client import Message, Producer
from rocketmq.exceptions import ProducerException


def main(namesrv: str, topic: str, seconds: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    producer = Producer("proxy_stream")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    deadline = time.monotonic() + seconds
    i = 0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            body = f"s-{i:06d}"
            message = Message(topic)
            message.set_body(body)
            start = time.time()
            try:
                result = producer.send_sync(message)
                ok, error = result.status.name == "OK", ""
            except ProducerException as exc:
                ok, error = False, str(exc)[:200]
            row = {"body": body, "start": start, "end": time.time(), "ok": ok, "error": error}
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()
            i += 1
            time.sleep(0.005)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
