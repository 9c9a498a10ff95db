"""The README's first command: `ferry demo` runs the HA story end to end and reports success."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.postgres]


@pytest.mark.timeout(660)  # 2 min on a quiet box; 6 with other suites running beside it
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
        timeout=640,
        check=False,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps at 80 without a terminal
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every acknowledged message was consumed; the master failed over" in done.stdout
    assert "old master rejoined as slave" in done.stdout
    assert "Spark read" in done.stdout  # the pipeline ran; `ok` checks it read every message
    # the connector created over REST on a follower ran; `ok` checks it mirrored every message
    assert "Connect mirror (a Spark query on a worker)" in done.stdout
    assert "201 from connect-" in done.stdout
    # PostgreSQL -> PostgresSource -> topic -> PostgresSink -> PostgreSQL, across the failover:
    # rows inserted before, during and after it, each copied once
    assert "201, 201 from connect-" in done.stdout
    before = re.search(r"orders_copy: (\d+) rows copied; rows keep coming in", done.stdout)
    assert before, done.stdout
    counts = re.search(
        r"after the failover: orders ([\d,]+) rows, orders_copy ([\d,]+) rows \(([\d,]+) distinct",
        done.stdout,
    )
    assert counts, done.stdout
    rows, copied, distinct = (int(n.replace(",", "")) for n in counts.groups())
    assert rows == copied == distinct > int(before[1]) > 0
    assert "the pipeline copied every row once" in done.stdout
    assert (tmp_path / "spark-aggregate.parquet" / "_SUCCESS").exists()
    for replica in (1, 2, 3):  # every broker, the restarted one too, shut down cleanly
        assert not (tmp_path / f"broker-a-{replica}" / "abort").exists()
