"""`ferry produce` (stdin lines to a topic) and `ferry consume` (a topic to stdout), kcat-style."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import click

from ferrymq.cli.admin import DEFAULT_NAMESRV
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.simple import SimpleConsumer
from ferrymq.model import MessageQueue

__all__ = ["consume_command", "produce_command"]

namesrv_option = click.option(
    "--namesrv",
    envvar="FERRY_NAMESRV",
    default=DEFAULT_NAMESRV,
    show_default=True,
    help="NameServer address(es) (env FERRY_NAMESRV).",
)


@click.command("produce")
@click.argument("topic")
@namesrv_option
@click.option("--tag", help="Tag every message.")
@click.option("--key", help="Key every message.")
@click.option("--group", default="ferry-cli-producer", show_default=True)
@click.option(
    "--delay-ms",
    type=click.IntRange(min=0),
    help="Deliver each message this many milliseconds after the broker stores it.",
)
@click.option(
    "--deliver-at-ms",
    type=click.IntRange(min=0),
    help="Deliver every message at this time (milliseconds since the epoch).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result per message.")
def produce_command(
    topic: str,
    namesrv: str,
    tag: str | None,
    key: str | None,
    group: str,
    delay_ms: int | None,
    deliver_at_ms: int | None,
    as_json: bool,
) -> None:
    """Send each line of stdin as one message."""
    if delay_ms is not None and deliver_at_ms is not None:
        raise click.UsageError("give --delay-ms or --deliver-at-ms, not both")

    async def main() -> int:
        sent = 0
        async with Producer(namesrv, group) as producer:
            for line in sys.stdin:
                body = line.rstrip("\n").encode()
                result = await producer.send(
                    topic,
                    body,
                    tags=tag,
                    keys=[key] if key else None,
                    delay_ms=delay_ms,
                    deliver_at_ms=deliver_at_ms,
                )
                sent += 1
                if as_json:
                    click.echo(
                        json.dumps(
                            {
                                "msgId": result.msg_id,
                                "offsetMsgId": result.offset_msg_id,
                                "brokerName": result.queue.broker_name,
                                "queueId": result.queue.queue_id,
                                "queueOffset": result.queue_offset,
                            }
                        )
                    )
        return sent

    sent = asyncio.run(main())
    if not as_json:
        click.echo(f"sent {sent} message(s) to {topic}", err=True)


@click.command("consume")
@click.argument("topic")
@namesrv_option
@click.option("--group", required=True, help="Consumer group (offsets are committed for it).")
@click.option(
    "--from",
    "start",
    type=click.Choice(["earliest", "latest"]),
    default="latest",
    show_default=True,
    help="Where queues with no committed offset start.",
)
@click.option(
    "--max", "max_messages", type=click.IntRange(min=1), help="Exit after this many messages."
)
@click.option(
    "--idle-exit",
    type=click.FloatRange(min=0.1),
    help="Exit after this many seconds without a message.",
)
@click.option(
    "--expression", default="*", show_default=True, help="Tag expression, e.g. 'TagA || TagB'."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per message.")
@click.option(
    "--pop",
    is_flag=True,
    help="Consume by POP (RocketMQ 5's simple consumer): each message is acked once printed; "
    "one not acked (the command killed) comes again after --invisible seconds.",
)
@click.option(
    "--invisible",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="With --pop: seconds a received message stays invisible to the group's others.",
)
@click.option("--fifo", is_flag=True, help="With --pop: orderly (one receiver per queue).")
def consume_command(
    topic: str,
    namesrv: str,
    group: str,
    start: str,
    max_messages: int | None,
    idle_exit: float | None,
    expression: str,
    as_json: bool,
    pop: bool,
    invisible: float,
    fifo: bool,
) -> None:
    """Print a topic's messages, committing the group's offsets as it goes and on exit."""
    if pop:
        printed = asyncio.run(
            _consume_pop(
                topic,
                namesrv,
                group,
                start == "earliest",
                max_messages,
                idle_exit,
                expression,
                as_json,
                invisible,
                fifo,
            )
        )
        if not as_json:
            click.echo(f"consumed {printed} message(s) from {topic}", err=True)
        return

    async def main() -> int:
        printed = 0
        async with PullConsumer(namesrv, group) as consumer:
            queues = await consumer.queues(topic)
            offsets: dict[MessageQueue, int] = {}
            for queue in queues:
                committed = await consumer.committed(queue)
                if committed is None:
                    committed = await (
                        consumer.min_offset(queue)
                        if start == "earliest"
                        else consumer.max_offset(queue)
                    )
                offsets[queue] = committed
            last_message = time.monotonic()
            wait = 0.2 if len(queues) == 1 else 0.0
            try:
                while max_messages is None or printed < max_messages:
                    got = 0
                    for queue in queues:
                        result = await consumer.pull(
                            queue, offsets[queue], expression=expression, wait=wait
                        )
                        if result.status in (PullStatus.OFFSET_ILLEGAL, PullStatus.NO_MATCHED_MSG):
                            offsets[queue] = result.next_offset
                        for message in result.messages[
                            : None if max_messages is None else max_messages - printed
                        ]:
                            _print(message, as_json)
                            printed += 1
                            got += 1
                            offsets[queue] = message.queue_offset + 1
                    if got:
                        last_message = time.monotonic()
                    elif idle_exit is not None and time.monotonic() - last_message > idle_exit:
                        break
                    elif wait == 0.0:
                        await asyncio.sleep(0.1)
            finally:
                for queue, offset in offsets.items():
                    await consumer.commit(queue, offset)
        return printed

    printed = asyncio.run(main())
    if not as_json:
        click.echo(f"consumed {printed} message(s) from {topic}", err=True)


async def _consume_pop(
    topic: str,
    namesrv: str,
    group: str,
    from_first: bool,
    max_messages: int | None,
    idle_exit: float | None,
    expression: str,
    as_json: bool,
    invisible: float,
    fifo: bool,
) -> int:
    """`ferry consume --pop`: receive, print, ack; returns how many were printed."""
    printed = 0
    async with SimpleConsumer(namesrv, group, fifo=fifo, from_first=from_first) as consumer:
        last_message = time.monotonic()
        while max_messages is None or printed < max_messages:
            wanted = 16 if max_messages is None else min(16, max_messages - printed)
            received = await consumer.receive(
                topic,
                max_messages=wanted,
                invisible_duration=invisible,
                wait=0.5,
                expression=expression,
            )
            for one in received:
                _print(one.message, as_json)
                await consumer.ack(one)
                printed += 1
            if received:
                last_message = time.monotonic()
            elif idle_exit is not None and time.monotonic() - last_message > idle_exit:
                break
    return printed


def _print(message: Message, as_json: bool) -> None:
    if as_json:
        click.echo(
            json.dumps(
                {
                    "topic": message.topic,
                    "brokerName": message.broker_name,
                    "queueId": message.queue_id,
                    "queueOffset": message.queue_offset,
                    "msgId": message.msg_id,
                    "tags": message.tags,
                    "keys": message.keys,
                    "body": message.body.decode(errors="replace"),
                },
                ensure_ascii=False,
            )
        )
    else:
        click.echo(message.body.decode(errors="replace"))
