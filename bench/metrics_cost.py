"""What the metrics cost the send path: broker CPU per send with and without them, side by side.

Two single-broker groups run side by side from the same code. "with metrics" is a broker as
shipped, serving Prometheus metrics (`metricsExporterType=PROM`; scraped `--scrapes` times after
the slices, for what a scrape costs apart);
"without" is the same broker started with the counting patched out (a `sitecustomize` on its
PYTHONPATH: `StatsTable.add`, `Latency.observe` and `BrokerStats.pulled` do nothing and the send
route is the untimed one), which is the broker before metrics. A producer sends to each in turn,
in alternating slices of `--window` sends in flight; each row is the broker's CPU (every
thread's schedstat run time) per acknowledged send over all its slices, and the last row the
cost: over the totals, and the median and quartiles of the rounds' own ratios (a round pairs
two adjacent slices, so load that comes and goes hits both). Nothing is asserted;
docs/benchmarks.md ("Metrics cost") has the command and what runs measured.

`--callgrind SENDS` counts instead of timing: each side's broker runs under valgrind's callgrind
with instrumentation off until its warm-up is done; then `callgrind_control` zeroes, counts
exactly `SENDS` acknowledged sends (`--window` in flight) and dumps. Instructions per send do not
depend on what else the machine runs (two runs of one side agree within ~1 %), so the cost shows
where the timed run's slot bias hides it. The sides alternate over `--rounds`.

    .venv/bin/python bench/metrics_cost.py [--seconds 20] [--rounds 10] [--window 16]
        [--busy-poll-micros 0] [--control] [--callgrind SENDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from callgrind import count_sends, valgrind

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import FERRY, spawn
from ferrymq.rpc.loop import new_event_loop

_WITHOUT_METRICS = """\
from ferrymq.broker import broker, metrics
from ferrymq.metrics import stats

stats.StatsTable.add = lambda self, key, count, size: None
stats.Latency.observe = lambda self, seconds: None
metrics.BrokerStats.pulled = lambda self, topic, group, count, size: None
broker.Broker._bind_timed = broker.Broker._bind
"""


def _without_counting(workdir: Path, name: str) -> dict[str, str]:
    """The environment of a broker whose counting is patched out (`_WITHOUT_METRICS`)."""
    patch = workdir / f"{name}-patch"
    patch.mkdir(exist_ok=True)
    (patch / "sitecustomize.py").write_text(_WITHOUT_METRICS)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(patch), os.environ.get("PYTHONPATH")]))}


def _cpu_s(pid: int) -> float:
    """Seconds on CPU of every thread of `pid`, to the nanosecond (schedstat; /proc/stat's
    utime + stime count 10 ms ticks, too coarse for a 2 s slice)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


@contextlib.asynccontextmanager
async def _group(
    workdir: Path, name: str, metrics: bool, counting: bool, broker_flags: list[str]
) -> AsyncIterator[tuple[Callable[[], Awaitable[object]], int, str | None, str]]:
    env = None if counting else _without_counting(workdir, name)
    namesrv = await spawn(
        f"{name}-namesrv", ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"], workdir
    )
    extra = (
        ["--metrics-exporter-type", "PROM", "--metrics-prom-exporter-port", "0"] if metrics else []
    )
    broker = await spawn(
        f"{name}-broker",
        [
            "broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr,
            "--store-dir", str(workdir / f"{name}-store"), "--log-level", "WARNING",
            "--mapped-file-size-commit-log", str(256 * 1024 * 1024), *extra, *broker_flags,
        ],
        workdir,
        env=env,
    )  # fmt: skip
    try:
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Cost", queues=4)
            deadline = time.monotonic() + 30
            while await admin.route("Cost") is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the topic never reached the NameServer")
                await asyncio.sleep(0.05)
        async with Producer(namesrv.addr, f"{name}-producer", send_timeout=10) as producer:
            payload = os.urandom(256)

            async def send() -> object:
                return await producer.send("Cost", payload)

            endpoint = broker.info.get("metrics")
            yield send, broker.pid, None if endpoint is None else str(endpoint), namesrv.addr
    finally:
        await broker.stop()
        await namesrv.stop()


async def _slice(send: Callable[[], Awaitable[object]], seconds: float, window: int) -> int:
    end = time.perf_counter() + seconds
    count = 0

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < end:
            await send()
            count += 1

    await asyncio.gather(*(worker() for _ in range(window)))
    return count


async def _put_total(namesrv: str) -> int:
    """Messages the broker's own accounting counted (putMessageTimesTotal)."""
    async with AdminClient(namesrv) as admin:
        info = await admin.cluster_info()
        (brokers,) = info.broker_addr_table.values()
        table = await admin.runtime_info(brokers.broker_addrs[0])
    return int(table["putMessageTimesTotal"])


def _scrape(endpoint: str) -> int:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
        return len(response.read())


async def _main(args: argparse.Namespace) -> list[dict[str, object]]:
    workdir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-metrics-cost-"))
    flags = [] if args.busy_poll_micros is None else ["--busy-poll-micros", args.busy_poll_micros]
    rows: list[dict[str, object]] = []
    try:
        async with (
            _group(workdir, "with", True, not args.control, flags) as with_side,
            _group(workdir, "without", False, False, flags) as without_side,
        ):
            sides = {"with metrics": with_side, "without": without_side}
            for send, _, _, _ in sides.values():
                await _slice(send, 0.5, args.window)  # routes, connections, warm-up
            totals = {name: [0.0, 0.0, 0.0] for name in sides}  # sends, cpu s, wall s
            ratios: list[float] = []  # per round: with / without CPU per send
            for round_number in range(args.rounds):
                order = list(sides) if round_number % 2 == 0 else list(sides)[::-1]
                this_round: dict[str, float] = {}
                for name in order:
                    send, pid, endpoint, _ = sides[name]
                    cpu, wall = _cpu_s(pid), time.perf_counter()
                    count = await _slice(send, args.seconds / args.rounds, args.window)
                    total = totals[name]
                    spent = _cpu_s(pid) - cpu
                    total[0] += count
                    total[1] += spent
                    total[2] += time.perf_counter() - wall
                    this_round[name] = spent / count
                ratios.append(this_round["with metrics"] / this_round["without"])
            for name, (sends, cpu_s, wall_s) in totals.items():
                rows.append(
                    {
                        "broker": name,
                        "sends": int(sends),
                        "msg_s": round(sends / wall_s),
                        "broker_cpu_us_per_send": round(cpu_s / sends * 1e6, 2),
                        "broker_cpu_pct": round(cpu_s / wall_s * 100),
                    }
                )
            # a scrape's own cost, apart from the send path: Prometheus asks every 15 s by default
            _, pid, endpoint, _ = sides["with metrics"]
            assert endpoint is not None
            cpu = _cpu_s(pid)
            scraped = [await asyncio.to_thread(_scrape, endpoint) for _ in range(args.scrapes)]
            rows.append(
                {
                    "scrape_broker_cpu_ms": round((_cpu_s(pid) - cpu) / args.scrapes * 1000, 3),
                    "scrape_bytes": scraped[-1],
                }
            )
            counted = {name: await _put_total(side[3]) for name, side in sides.items()}
            expected = 0 if args.control else totals["with metrics"][0]
            if counted["without"] != 0 or counted["with metrics"] < expected:
                raise RuntimeError(f"the sides are not what they claim: {counted}")
            per_send = {name: t[1] / t[0] for name, t in totals.items()}
            cost = per_send["with metrics"] / per_send["without"] - 1
            quartiles = statistics.quantiles(ratios, n=4)
            rows.append(
                {
                    "metrics_cost_pct": round(cost * 100, 2),
                    "per_round_cost_pct_median": round((statistics.median(ratios) - 1) * 100, 2),
                    "per_round_cost_pct_iqr": [round((q - 1) * 100, 2) for q in quartiles[::2]],
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


async def _callgrind_side(
    workdir: Path, name: str, counting: bool, metrics: bool, args: argparse.Namespace
) -> int:
    """Instructions the broker of one side runs for exactly `args.callgrind` acknowledged sends."""
    namesrv = await spawn(
        f"{name}-namesrv", ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"], workdir
    )
    ready, dump = workdir / f"{name}.ready.json", workdir / f"{name}.callgrind"
    ready.unlink(missing_ok=True)
    dump.unlink(missing_ok=True)
    extra = ["--metrics-exporter-type", "PROM", "--metrics-prom-exporter-port", "0"]
    flags = [] if args.busy_poll_micros is None else ["--busy-poll-micros", args.busy_poll_micros]
    env = {**os.environ, **({} if counting else _without_counting(workdir, name))}
    with (workdir / f"{name}.log").open("ab") as log:
        broker = await asyncio.create_subprocess_exec(
            *valgrind(dump),
            *FERRY, "broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr,
            "--store-dir", str(workdir / f"{name}-store"), "--log-level", "WARNING",
            "--mapped-file-size-commit-log", str(64 * 1024 * 1024), *(extra if metrics else []),
            *flags, "--ready-file", str(ready),
            stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # valgrind without instrumentation: ~10 s here
        while not ready.exists():
            if broker.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s broker did not start under valgrind: {workdir}")
            await asyncio.sleep(0.1)
        async with AdminClient(namesrv.addr) as admin:
            await admin.create_topic("Cost", queues=4)
            while await admin.route("Cost") is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the topic never reached the NameServer")
                await asyncio.sleep(0.1)
        async with Producer(namesrv.addr, f"{name}-producer", send_timeout=60) as producer:
            payload = os.urandom(256)

            async def send() -> object:
                return await producer.send("Cost", payload)

            for _ in range(200):  # routes, connections, the first send's imports and caches
                await send()
            return await count_sends(broker.pid, dump, send, args.callgrind, args.window)
    finally:
        if broker.returncode is None:
            broker.terminate()
            await broker.wait()
        await namesrv.stop()


async def _callgrind(args: argparse.Namespace) -> list[dict[str, object]]:
    workdir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-metrics-instructions-"))
    rows: list[dict[str, object]] = []
    counts: dict[str, list[int]] = {"with metrics": [], "without": []}
    try:
        for round_number in range(args.rounds):
            order = list(counts) if round_number % 2 == 0 else list(counts)[::-1]
            for name in order:
                with_side = name == "with metrics"
                total = await _callgrind_side(
                    workdir,
                    f"{name.split()[0]}-{round_number}",
                    with_side and not args.control,
                    with_side,
                    args,
                )
                counts[name].append(total)
                rows.append(
                    {"round": round_number, "broker": name, "sends": args.callgrind,
                     "instructions_per_send": round(total / args.callgrind)}
                )  # fmt: skip
        per_send = {name: sum(c) / (len(c) * args.callgrind) for name, c in counts.items()}
        ratios = [w / o for w, o in zip(counts["with metrics"], counts["without"], strict=True)]
        rows.append(
            {
                "instructions_per_send": {k: round(v) for k, v in per_send.items()},
                "metrics_cost_pct": round(
                    (per_send["with metrics"] / per_send["without"] - 1) * 100, 2
                ),
                "per_round_cost_pct": [round((r - 1) * 100, 2) for r in ratios],
            }
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    """Parse the arguments, run, print one line per row (JSON)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per side, over the rounds")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=int, default=16, help="sends in flight")
    parser.add_argument("--scrapes", type=int, default=50, help="to time a scrape, after")
    parser.add_argument(
        "--control",
        action="store_true",
        help="both sides without the counting (the 'with' one keeps its endpoint): the bench's own"
        " bias between two brokers, to read the cost against",
    )
    parser.add_argument(
        "--busy-poll-micros", help="both brokers' busyPollMicros (default: the broker's own)"
    )
    parser.add_argument(
        "--callgrind",
        type=int,
        metavar="SENDS",
        help="count each side's broker instructions over SENDS sends under valgrind (no timing)",
    )
    args = parser.parse_args()
    if args.callgrind is not None and args.callgrind < args.window:
        parser.error("--callgrind needs at least --window sends")
    if args.callgrind is not None and shutil.which("valgrind") is None:
        sys.exit("--callgrind needs valgrind (Debian's valgrind package)")
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        for row in runner.run(_main(args) if args.callgrind is None else _callgrind(args)):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
