"""The official 5.x Python client's own virtual environment (made once, cached outside the repo).

PyPI `rocketmq-python-client` installs the top-level module `rocketmq`, as the 4.x client of
tests/compat does, so it lives in its own venv under ~/.cache/ferrymq (`.ci/run` makes it before
the test run; a missing one is made here, with pip, once).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

from ferrymq.proxy.stubs import CLIENT_PIN, cache_dir

__all__ = ["v5_python"]


def v5_python() -> Path:
    """The venv's python, the venv made first when missing."""
    venv = cache_dir() / f"rmq5-venv-{CLIENT_PIN.split('==')[1]}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / "rmq5-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes never build it at once
        if not ready.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", CLIENT_PIN],
                check=True,
                timeout=600,
            )
            ready.touch()
    return python


if __name__ == "__main__":  # `python -m tests.proxy.v5env` (.ci/run): make it now
    sys.stdout.write(f"{v5_python()}\n")
