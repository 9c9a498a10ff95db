"""Process plumbing shared by the server commands: logging, the event loop, signals, exits."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, NoReturn

import click

from ferrymq.rpc.loop import new_event_loop
from ferrymq.store.atomic import write_atomic

__all__ = ["GC_THRESHOLDS", "fail", "kebab", "run_until_signal", "setup_logging", "write_ready"]

GC_THRESHOLDS: Final = (20_000, 20, 10)
"""The garbage collector's thresholds in a server process (CPython's defaults: 700, 10, 10).

A server allocates a few container objects per request (a command, a future, a task while a
send waits for its replicas). With the defaults, the youngest generation is collected every few
dozen requests and whatever is in flight then (every send waiting for its slaves' acks) is
promoted, so full collections come every 150-200 ms: a SYNC_MASTER with two slaves under 256
sends in flight spent about 10 % of its time collecting (gc.callbacks: 847 young, 78 middle and
7 full collections of ~11 ms in 1.5 s). Collecting the youngest every 20,000 allocations lets
requests finish before they are scanned: 18.3k -> 20.0k sends/s, master CPU 43 -> 38 us a send
(`ferry bench replication`'s setup, 100 B, 256 in flight)."""


def setup_logging(level: str) -> None:
    """One line per record on stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)` on uvloop (when installed); SIGINT/SIGTERM set `stop`.

    Also sets the process's garbage-collector thresholds to `GC_THRESHOLDS`.
    """
    gc.set_threshold(*GC_THRESHOLDS)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    with asyncio.Runner(loop_factory=new_event_loop) as asyncio_runner:
        asyncio_runner.run(runner())


def fail(message: str) -> NoReturn:
    """Print a one-line error and exit with status 2 (bad usage or configuration)."""
    click.echo(f"ferry: error: {message}", err=True)
    sys.exit(2)


def write_ready(path: Path | None, info: dict[str, object]) -> None:
    """Write `info` and the pid as JSON to `path` atomically (when a path is given)."""
    if path is not None:
        write_atomic(path, json.dumps({**info, "pid": os.getpid()}).encode())


def kebab(key: str) -> str:
    """`listenPort` -> `listen-port`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", key).lower()
