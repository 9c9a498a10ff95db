"""Run a scenario module in a private network and PID namespace, as the partition tests do.

`python -m tests.system.<module> DIR` runs under `unshare --net --pid --mount-proc --fork
--kill-child`: its own loopback and nftables, and every process it starts dies with it. The
scenario prints one JSON line of measurements last; its servers' logs stay in DIR.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
    reason="needs root, nft and unshare for a private network namespace",
)


def run_scenario(module: str, workdir: Path, timeout: float = 110) -> dict[str, object]:
    """Run `tests.system.<module>` in its own namespaces; returns its JSON line."""
    command = [
        "unshare",
        "--net",
        "--pid",
        "--mount-proc",
        "--fork",
        "--kill-child",
        sys.executable,
        "-m",
        f"tests.system.{module}",
        str(workdir),
    ]
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    logs = "\n".join(
        f"--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(workdir.glob("*.log"))
    )
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{logs}"
    outcome: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return outcome
