"""A push consumer process for the rebalance test: one line per handled message, flushed at once.

Usage: python -m tests.system.consumer_worker NAMESRV GROUP TOPIC OUTPUT
"""

import asyncio
import sys
from pathlib import Path

from ferrymq.client.message import Message
from ferrymq.client.push import ConsumeFrom, PushConsumer


async def main(namesrv: str, group: str, topic: str, output: Path) -> None:
    with output.open("a", buffering=1) as out:

        async def record(message: Message) -> None:
            where = f"{message.broker_name} {message.queue_id} {message.queue_offset}"
            out.write(f"{where} {message.body.decode()}\n")

        consumer = PushConsumer(
            namesrv,
            group,
            record,
            consume_from=ConsumeFrom.FIRST_OFFSET,
            pull_wait=0.5,
            commit_interval=0.5,
            rebalance_interval=0.5,
            heartbeat_interval=1.0,
        )
        consumer.subscribe(topic)
        async with consumer:
            await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
