"""The README's first command: `ferry demo` runs end to end (its Spark pipeline too)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system


@pytest.mark.timeout(300)
def test_the_demo_produces_consumes_and_stops_cleanly(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ferrymq.cmd.ferry",
            "demo",
            "--messages",
            "300",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every acknowledged message was consumed once, in order" in done.stdout
    assert "missing / duplicated / out of order" in done.stdout
    assert "Spark read 300 messages of 300 consumed." in done.stdout
    assert (tmp_path / "spark-aggregate.parquet" / "_SUCCESS").exists()
    assert not (tmp_path / "store" / "abort").exists()  # the broker shut down cleanly
