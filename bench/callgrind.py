"""Counting a server process's instructions over exactly N sends, under valgrind's callgrind.

Shared by bench/metrics_cost.py and bench/acl_cost.py (`--callgrind SENDS`): the process runs
under `valgrind --tool=callgrind --instr-atstart=no` (see `VALGRIND`); after the caller's warm-up,
`count_sends` zeroes the counters, turns instrumentation on for `sends` acknowledged sends
(`window` in flight), dumps and turns it off, and reads the dump's total. Instruction counts do
not depend on what else the machine runs, which timing does.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

__all__ = ["control", "count_sends", "dump_total", "valgrind"]


def valgrind(dump: Path) -> list[str]:
    """The command prefix that runs a process counted into `dump` (instrumentation off)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dump}"]


def control(pid: int, *words: str) -> None:
    """`callgrind_control WORDS PID` (e.g. `--zero`, `--instr=on`, `--dump`)."""
    subprocess.run(["callgrind_control", *words, str(pid)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip


def dump_total(dump: Path) -> int:
    """The instruction count of one callgrind dump (its `totals:` line); the dump is removed."""
    try:
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")
    finally:
        dump.unlink(missing_ok=True)


async def count_sends(
    pid: int, dump: Path, send: Callable[[], Awaitable[object]], sends: int, window: int
) -> int:
    """Instructions process `pid` (started with `valgrind(dump)`) runs for `sends` sends."""

    async def some(count: int) -> None:
        for _ in range(count):
            await send()

    await asyncio.to_thread(control, pid, "--zero")
    await asyncio.to_thread(control, pid, "--instr=on")
    share, left = divmod(sends, window)
    await asyncio.gather(*(some(share + (i < left)) for i in range(window)))
    await asyncio.to_thread(control, pid, "--dump")
    await asyncio.to_thread(control, pid, "--instr=off")
    return await asyncio.to_thread(dump_total, Path(f"{dump}.1"))  # the first dump
