"""`ferry bench spark`: every job measured; the stream-read pair repeated, its median reported."""

import json
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


def test_bench_spark_reports_every_job_and_the_median_of_the_repeated_reads() -> None:
    command = [sys.executable, "-m", "ferrymq.cmd.ferry", "bench", "spark", "--rows", "2000"]
    completed = subprocess.run(
        [*command, "--repeat", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    jobs = {(r["job"], r["source"], r["sink"]): r for r in report["rows"]}
    assert set(jobs) == {
        ("batch read", "ferrymq", "noop"),
        ("batch read", "parquet", "noop"),
        ("stream read", "ferrymq", "parquet"),
        ("stream read", "parquet", "parquet"),
        ("stream write", "parquet", "ferrymq"),
        ("stream write", "parquet", "parquet"),
    }
    assert all(r["rows"] == 2000 and r["seconds"] > 0 for r in report["rows"])
    for source in ("ferrymq", "parquet"):
        read = jobs[("stream read", source, "parquet")]
        assert len(read["runs"]) == 2
        assert read["seconds"] == pytest.approx(statistics.median(read["runs"]), abs=0.002)
    assert set(report["ratios"]) == {"batch_read", "stream_read", "stream_write"}
    assert all(ratio > 0 for ratio in report["ratios"].values())
