"""`ferry up` on a laptop: small commit-log segments, its own temporary directory removed at exit,
and a disk too full to start said in one line, by `ferry demo` too (issue 22's small fixes)."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ferrymq.cmd.up import DEFAULT_SEGMENT_BYTES

from .procs import FERRY

pytestmark = pytest.mark.system

SMALL = ("--controllers", "0", "--replicas", "1", "--connect", "0")


def test_up_without_data_dir_uses_small_segments_and_removes_its_directory(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "cluster.json"
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    with (tmp_path / "up.log").open("ab") as log:
        process = subprocess.Popen(
            [*FERRY, "up", *SMALL, "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "TMPDIR": str(temp_root)},  # where mkdtemp makes its directory
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "ferry up never became ready"
            time.sleep(0.05)
        store = Path(json.loads(ready.read_text())["brokers"][0]["store_dir"])
        data_dir = store.parent
        assert data_dir.parent == temp_root
        assert [s.stat().st_size for s in (store / "commitlog").iterdir()] == [
            DEFAULT_SEGMENT_BYTES
        ]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, (tmp_path / "up.log").read_text()
    assert not data_dir.exists()
    assert list(temp_root.iterdir()) == []


@pytest.mark.parametrize("command", [("up", *SMALL), ("demo",)], ids=["up", "demo"])
def test_up_and_demo_on_a_disk_too_full_say_so_in_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    free = shutil.disk_usage(tmp_path).free
    # one broker's first segment cannot fit on this disk
    too_big = ("--mapped-file-size-commit-log", str(free + 1024**3))
    done = subprocess.run(
        [*FERRY, *command, "--data-dir", str(tmp_path / "data"), *too_big],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"not enough disk space in {tmp_path / 'data'}" in lines[0]
    assert list((tmp_path / "data").iterdir()) == []  # nothing was started
