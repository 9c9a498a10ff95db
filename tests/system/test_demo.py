"""The README's first command: `ferry demo` runs the HA story end to end and reports success."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system


@pytest.mark.timeout(300)
def test_the_demo_fails_over_loses_nothing_and_stops_cleanly(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ferrymq.cmd.ferry",
            "demo",
            "--messages",
            "600",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every acknowledged message was consumed; the master failed over" in done.stdout
    assert "old master rejoined as slave" in done.stdout
    assert "Spark read" in done.stdout  # the pipeline ran; `ok` checks it read every message
    # the connector created over REST on a follower ran; `ok` checks it mirrored every message
    assert "Connect mirror (a Spark query on a" in done.stdout
    assert "201 from connect-" in done.stdout
    assert (tmp_path / "spark-aggregate.parquet" / "_SUCCESS").exists()
    for replica in (1, 2, 3):  # every broker, the restarted one too, shut down cleanly
        assert not (tmp_path / f"broker-a-{replica}" / "abort").exists()
