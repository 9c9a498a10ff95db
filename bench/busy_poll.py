"""What a broker's busy polling (`busyPollMicros`) buys and costs, at paced send rates.

Two single-broker groups run side by side, one with `busyPollMicros=0` and one with the default;
for each rate, a sync producer (one send in flight) sends to each in turn, in alternating slices:
at a fixed rate (a send every 1/rate seconds, as scheduled, waiting when ahead) or as fast as it
can ("max"). Rows: msg/s, p50/p99 of the send latency, and the broker's CPU (% of one core) over
the row. Nothing is asserted; docs/benchmarks.md has the command and what one run measured.

    .venv/bin/python bench/busy_poll.py [--seconds 4] [--rounds 4] [--rates 200,1000,3000,max]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import spawn
from ferrymq.rpc.loop import new_event_loop

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@contextlib.asynccontextmanager
async def _group(
    workdir: Path, name: str, busy_poll_micros: int | None
) -> AsyncIterator[tuple[Callable[[], Awaitable[object]], int]]:
    namesrv = await spawn(
        f"{name}-namesrv", ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"], workdir
    )
    extra = [] if busy_poll_micros is None else ["--busy-poll-micros", str(busy_poll_micros)]
    broker = await spawn(
        f"{name}-broker",
        [
            "broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr,
            "--store-dir", str(workdir / f"{name}-store"), "--log-level", "WARNING", *extra,
        ],
        workdir,
    )  # fmt: skip
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Paced", queues=4)
            deadline = time.monotonic() + 30
            while await admin.route("Paced") is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the topic never reached the NameServer")
                await asyncio.sleep(0.05)
        async with Producer(namesrv.addr, f"{name}-producer", send_timeout=10) as producer:
            payload = os.urandom(100)

            async def send() -> object:
                return await producer.send("Paced", payload)

            yield send, broker.pid
    finally:
        await broker.stop()
        await namesrv.stop()


@dataclass
class _Total:
    count: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    latencies: list[float] = field(default_factory=list)


async def _slice(
    send: Callable[[], Awaitable[object]], rate: float | None, seconds: float
) -> tuple[int, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    due = start
    while time.perf_counter() - start < seconds:
        if rate is not None:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            due += 1 / rate
        began = time.perf_counter()
        await send()
        latencies.append(time.perf_counter() - began)
    return len(latencies), latencies


async def _main(args: argparse.Namespace) -> list[dict[str, object]]:
    workdir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-busy-poll-"))
    rows: list[dict[str, object]] = []
    try:
        async with (
            _group(workdir, "off", 0) as (send_off, pid_off),
            _group(workdir, "on", None) as (send_on, pid_on),
        ):
            sides = {"busyPollMicros=0": (send_off, pid_off), "default": (send_on, pid_on)}
            for send, _ in sides.values():
                await _slice(send, None, 0.3)  # routes and connections first
            for rate_text in args.rates.split(","):
                rate = None if rate_text == "max" else float(rate_text)
                totals = {name: _Total() for name in sides}
                for round_number in range(args.rounds):
                    order = list(sides) if round_number % 2 == 0 else list(sides)[::-1]
                    for name in order:
                        send, pid = sides[name]
                        cpu, wall = _cpu_s(pid), time.perf_counter()
                        count, latencies = await _slice(send, rate, args.seconds / args.rounds)
                        total = totals[name]
                        total.count += count
                        total.wall_s += time.perf_counter() - wall
                        total.cpu_s += _cpu_s(pid) - cpu
                        total.latencies += latencies
                for name, total in totals.items():
                    ordered = sorted(total.latencies)
                    rows.append(
                        {
                            "broker": name,
                            "rate": rate_text,
                            "msg_s": round(total.count / total.wall_s),
                            "p50_ms": round(statistics.median(ordered) * 1000, 3),
                            "p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 3),
                            "broker_cpu_pct": round(total.cpu_s / total.wall_s * 100),
                        }
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    """Parse the arguments, run, print one line per row (JSON)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per row, over the rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rates", default="200,1000,3000,max")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        for row in runner.run(_main(args)):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
