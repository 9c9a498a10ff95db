"""Start `ferry` servers as real processes and stop them by PID."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FERRY = [sys.executable, "-m", "ferrymq.cmd.ferry"]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    info: dict[str, object]
    log: Path

    @property
    def addr(self) -> str:
        return str(self.info["addr"])

    def kill(self) -> None:
        """SIGKILL: what a crash or power cut does to the process."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start(
    args: list[str],
    workdir: Path,
    name: str,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> Server:
    """Run `ferry ARGS --ready-file ...` (with `env` added) and wait until it is serving."""
    ready = workdir / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    log = workdir / f"{name}.log"
    with log.open("ab") as stderr:
        process = subprocess.Popen(
            [*FERRY, *args, "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"{name} exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{name} not ready in {timeout} s: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return Server(process, json.loads(ready.read_text()), log)
