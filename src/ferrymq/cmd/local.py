"""Child server processes for `ferry up` and `ferry demo`: ready files in, stopped by PID.

Each child is `python -m ferrymq.cmd.ferry namesrv|broker ... --ready-file F`; it is ready when F
appears (it holds the address it listens on, for port 0). Stopping sends SIGTERM, then SIGKILL
after a bound. Nothing is ever stopped by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Child", "spawn"]

FERRY = [sys.executable, "-m", "ferrymq.cmd.ferry"]


@dataclass
class Child:
    """One server process this program started."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    info: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def addr(self) -> str:
        """The address it listens on."""
        return str(self.info.get("addr", ""))

    @property
    def running(self) -> bool:
        """Whether it has not exited."""
        return self.process.returncode is None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.running:
            os.kill(self.pid, signal.SIGKILL)

    def suspend(self) -> None:
        """SIGSTOP: a silent failure (the process holds its sockets but answers nothing)."""
        if self.running:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        if self.running:
            os.kill(self.pid, signal.SIGCONT)

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
        if self.running:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return self.process.returncode


def _prepare(workdir: Path, ready: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    ready.unlink(missing_ok=True)


async def spawn(
    name: str,
    args: list[str],
    workdir: Path,
    *,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> Child:
    """Start `ferry ARGS` (with `env` added to this environment) and wait for its ready file.

    Raises:
        RuntimeError: it exited or did not get ready within `timeout`; the log tail says why.
    """
    ready = workdir / f"{name}.ready.json"
    log_path = workdir / f"{name}.log"
    await asyncio.to_thread(_prepare, workdir, ready)
    with log_path.open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            *FERRY,
            *args,
            "--ready-file",
            str(ready),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log_file,
            env=None if env is None else {**os.environ, **env},
        )
    child = Child(name, process, log_path)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.returncode is not None or time.monotonic() > deadline:
            await child.stop(1)
            tail = log_path.read_text(errors="replace")[-1500:]
            if "No space left on device" in tail:  # one line: the disk, not a bug
                raise RuntimeError(
                    f"{name} did not start: no space left on device in {workdir} "
                    f"(its log: {log_path})"
                )
            raise RuntimeError(f"{name} did not start (see {log_path}):\n{tail}")
        await asyncio.sleep(0.05)
    child.info = json.loads(ready.read_text())
    return child
