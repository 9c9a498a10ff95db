"""`ferry bench produce|consume|e2e`: load against a running cluster, through the SDK.

- produce: a bounded window of sends in flight (`--window`; 1 = synchronous), open loop at
  `--rate` messages per second or as fast as the window allows, for `--duration` seconds or
  `--count` messages; latency per send (send -> acknowledgement);
- consume: read the topic's queues from the start (or the group's committed offsets) until
  `--count` messages or `--duration`;
- e2e: both at once; latency from the send to the consumer's hands (the send time rides in the
  body).

Prints throughput and latency p50/p99/p999 with a progress bar; `--json` prints one JSON summary
line last. Loops are bounded by count and time. A send error that every later send would repeat
(no route for the topic, an invalid topic or message) stops the run at once: its message is
printed and the exit status is 1 (other errors are counted and the load goes on).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

import click
from rich.console import Console

from ferrymq.cli.admin import DEFAULT_NAMESRV
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, PushConsumer
from ferrymq.errors import (
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    TopicNotFoundError,
)

__all__ = ["bench_consume", "bench_e2e", "bench_produce"]

_STAMP: Final = struct.Struct(">d")
_FATAL: Final = (TopicNotFoundError, InvalidNameError, InvalidMessageError, MessageTooLargeError)
"""Send errors every later send would repeat: the run stops at the first."""


@dataclass
class _Stats:
    count: int = 0
    errors: int = 0
    bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    fatal: Exception | None = None
    """The first error that stopped the run (one of `_FATAL`)."""

    def is_stopped(self) -> bool:
        """Whether an error stopped the run."""
        return self.fatal is not None

    started: float = field(default_factory=time.perf_counter)
    cpu_started: float = field(default_factory=time.process_time)

    def summary(self, mode: str, size: int) -> dict[str, object]:
        elapsed = time.perf_counter() - self.started
        ordered = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return (
                round(ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000, 3)
                if ordered
                else None
            )

        return {
            "mode": mode,
            "size": size,
            "messages": self.count,
            "errors": self.errors,
            "seconds": round(elapsed, 3),
            "msgs_per_s": round(self.count / elapsed, 1) if elapsed else 0,
            "mb_per_s": round(self.bytes / elapsed / 1e6, 3) if elapsed else 0,
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
            "p999_ms": pct(0.999),
            "client_cpu_pct": round((time.process_time() - self.cpu_started) / elapsed * 100, 1)
            if elapsed
            else 0,
        }


def _stop_if_fatal(stats: _Stats) -> None:
    """Exit 1 with the error that stopped the run, in one line."""
    if stats.fatal is not None:
        raise click.ClickException(f"stopped at the first send error: {stats.fatal}")


def _report(summary: dict[str, object], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(
        f"{summary['mode']}: {summary['messages']} messages in {summary['seconds']} s = "
        f"{summary['msgs_per_s']} msg/s ({summary['mb_per_s']} MB/s); "
        f"latency p50 {summary['p50_ms']} ms, "
        f"p99 {summary['p99_ms']} ms, p999 {summary['p999_ms']} ms; errors {summary['errors']}; "
        f"client CPU {summary['client_cpu_pct']}%"
    )


F = TypeVar("F", bound=Callable[..., None])


def _options(command: F) -> F:
    for option in reversed(
        [
            click.option(
                "--namesrv", envvar="FERRY_NAMESRV", default=DEFAULT_NAMESRV, show_default=True
            ),
            click.option("--topic", required=True),
            click.option(
                "--size", type=click.IntRange(8, 4 * 1024 * 1024), default=1024, show_default=True
            ),
            click.option(
                "--duration",
                type=click.FloatRange(min=0.1),
                help="Seconds (default 10 unless --count).",
            ),
            click.option("--count", type=click.IntRange(min=1), help="Messages."),
            click.option("--json", "as_json", is_flag=True, help="Print a JSON summary line last."),
        ]
    ):
        command = option(command)
    return command


def _bounds(duration: float | None, count: int | None) -> tuple[float, int]:
    if duration is None and count is None:
        duration = 10.0
    return time.perf_counter() + (duration if duration is not None else 3600.0), count or 2**62


async def _produce(
    producer: Producer,
    topic: str,
    size: int,
    window: int,
    rate: float | None,
    deadline: float,
    limit: int,
    stats: _Stats,
    stamp: bool,
) -> None:
    payload = os.urandom(size)
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[None]] = set()
    interval = 1.0 / rate if rate else 0.0
    next_send = time.perf_counter()

    async def one() -> None:
        started = time.perf_counter()
        body = _STAMP.pack(time.time()) + payload[_STAMP.size :] if stamp else payload
        try:
            await producer.send(topic, body)
            stats.latencies.append(time.perf_counter() - started)
            stats.count += 1
            stats.bytes += size
        except _FATAL as exc:
            stats.errors += 1
            if stats.fatal is None:
                stats.fatal = exc
        except Exception:  # noqa: BLE001 - a load generator counts failures and goes on
            stats.errors += 1
        finally:
            slots.release()

    sent = 0
    while sent < limit and time.perf_counter() < deadline and not stats.is_stopped():
        if interval:
            delay = next_send - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            next_send += interval
        await slots.acquire()
        if stats.is_stopped():  # a send that finished while this waited for a slot
            slots.release()
            break
        task = asyncio.get_running_loop().create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    if tasks:
        await asyncio.gather(*tasks)


@click.command("produce")
@_options
@click.option(
    "--window",
    type=click.IntRange(1, 100_000),
    default=1,
    show_default=True,
    help="Sends in flight (1 = synchronous).",
)
@click.option("--rate", type=click.FloatRange(min=1), help="Messages per second (open loop).")
def bench_produce(
    namesrv: str,
    topic: str,
    size: int,
    duration: float | None,
    count: int | None,
    as_json: bool,
    window: int,
    rate: float | None,
) -> None:
    """Send messages through the SDK and report throughput and latency."""
    deadline, limit = _bounds(duration, count)
    stats = _Stats()

    async def main() -> None:
        async with Producer(namesrv, "ferry-bench-producer", send_timeout=10) as producer:
            with Console(stderr=True).status(f"producing to {topic}"):
                await _produce(
                    producer, topic, size, window, rate, deadline, limit, stats, stamp=False
                )

    asyncio.run(main())
    _report(stats.summary(f"produce window {window}", size), as_json)
    _stop_if_fatal(stats)


@click.command("consume")
@_options
@click.option("--group", default="ferry-bench-consumer", show_default=True)
def bench_consume(
    namesrv: str,
    topic: str,
    size: int,
    duration: float | None,
    count: int | None,
    as_json: bool,
    group: str,
) -> None:
    """Read the topic's queues from their start and report throughput."""
    deadline, limit = _bounds(duration, count)
    stats = _Stats()

    async def main() -> None:
        async with PullConsumer(namesrv, group) as consumer:
            queues = await consumer.queues(topic)
            offsets = {q: await consumer.min_offset(q) for q in queues}
            idle = 0
            while stats.count < limit and time.perf_counter() < deadline and idle < len(queues):
                idle = 0
                for queue in queues:
                    result = await consumer.pull(queue, offsets[queue], max_messages=256)
                    if result.status is not PullStatus.FOUND:
                        idle += 1
                        continue
                    stats.count += len(result.messages)
                    stats.bytes += sum(len(m.body) for m in result.messages)
                    offsets[queue] = result.next_offset

    asyncio.run(main())
    _report(stats.summary("consume 256", size), as_json)


@click.command("e2e")
@_options
@click.option("--window", type=click.IntRange(1, 100_000), default=64, show_default=True)
@click.option("--rate", type=click.FloatRange(min=1), help="Messages per second (open loop).")
@click.option("--group", default="ferry-bench-e2e", show_default=True)
def bench_e2e(
    namesrv: str,
    topic: str,
    size: int,
    duration: float | None,
    count: int | None,
    as_json: bool,
    window: int,
    rate: float | None,
    group: str,
) -> None:
    """Produce and consume at once; latency from send to the consumer's hands."""
    deadline, limit = _bounds(duration, count)
    produced = _Stats()
    consumed = _Stats()

    async def listener(message: Message) -> None:
        if len(message.body) >= _STAMP.size:
            (sent_at,) = _STAMP.unpack_from(message.body)
            consumed.latencies.append(max(0.0, time.time() - sent_at))
        consumed.count += 1
        consumed.bytes += len(message.body)

    async def main() -> None:
        consumer = PushConsumer(
            namesrv, group, listener, consume_from=ConsumeFrom.LAST_OFFSET, pull_wait=1.0
        )
        consumer.subscribe(topic)
        async with consumer, Producer(namesrv, "ferry-bench-producer", send_timeout=10) as producer:
            await asyncio.sleep(0.5)  # let the consumer take its queues before the first send
            await _produce(
                producer, topic, size, window, rate, deadline, limit, produced, stamp=True
            )
            drain_until = time.perf_counter() + 10
            while consumed.count < produced.count and time.perf_counter() < drain_until:  # noqa: ASYNC110 - bounded drain
                await asyncio.sleep(0.05)

    asyncio.run(main())
    summary = consumed.summary(f"e2e window {window}", size)
    summary["produced"] = produced.count
    _report(summary, as_json)
    _stop_if_fatal(produced)
