"""A master partitioned away from the controllers and its slaves (issue 7), in a private network
namespace: it stops taking writes within its lease, a new master takes over, nothing acknowledged
is lost, and after healing it rejoins as a slave. Needs root, nft and unshare."""

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


def test_a_partitioned_master_stops_within_its_lease_and_rejoins_as_a_slave(
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
        "tests.system.master_partition_scenario",
        str(tmp_path),
    ]
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=115, check=False
    )
    logs = "\n".join(
        f"--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(tmp_path.glob("*.log"))
    )
    assert result.returncode == 0, f"{result.stderr[-3000:]}\n{logs}"
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["old_master"] != outcome["new_master"]
    assert outcome["acknowledged"] > 0
