"""The controller leader partitioned away in a private network namespace, then healed.

The scenario (partition_scenario.py) runs in `unshare --net --pid`: its own loopback, its own
nftables, and every process it starts dies with it. Needs root and nft.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
        reason="needs root, nft and unshare for a private network namespace",
    ),
]

ROOT = Path(__file__).resolve().parents[2]


def test_a_partitioned_leader_commits_nothing_and_rejoins_without_disturbing(
    tmp_path: Path,
) -> None:
    command = [
        "unshare",
        "--net",
        "--pid",
        "--mount-proc",
        "--fork",
        "--kill-child",
        sys.executable,
        "-m",
        "tests.system.partition_scenario",
        str(tmp_path),
    ]
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    logs = "\n".join(
        f"--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(tmp_path.glob("*.log"))
    )
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{logs}"
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["old_leader"] != outcome["new_leader"]
