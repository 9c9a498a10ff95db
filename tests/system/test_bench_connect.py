"""`ferry bench connect` end to end with tiny parameters: every phase runs and reports."""

import json
import math
import subprocess
import sys

import pytest

from ferrymq.cmd.bench_connect import quantile

pytestmark = pytest.mark.system


def test_quantiles_are_the_median_and_nearest_ranks() -> None:
    values = [float(v) for v in range(10, 0, -1)]
    assert quantile(values, 0.5) == 5.5
    assert quantile(values, 0.9) == 9.0
    assert quantile(values, 1.0) == 10.0
    assert quantile(values[:3], 0.99) == 10.0
    assert math.isnan(quantile([], 0.5))


def test_bench_connect_reports_failover_latency_and_start_times() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "ferrymq.cmd.ferry", "bench", "connect",
            "--rounds", "1", "--timings", "fast", "--writes", "10", "--slice-writes", "5",
            "--connectors", "3", "--start-samples", "1", "--json",
        ],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["benchmark"] == "connect"
    (failover,) = summary["failover"]
    assert failover["timing"] == "fast"
    assert failover["leader_failover_grace_ms"] == 500
    (one,) = failover["rounds"]
    assert one["killed"] != one["new_leader"]
    assert 0 < one["claim_s"] < 60
    assert 0 < one["write_s"] < 60
    assert set(one["answers"]) <= {"409", "504", "error"}  # never a 500 while it fails over
    assert failover["write_median_s"] == one["write_s"] == failover["write_max_s"]
    latency = summary["latency"]
    assert latency["timing"] == "fast"
    assert latency["writes_per_side"] == 10
    for side in ("leader", "follower"):
        assert 0 < latency[f"{side}_p50_ms"] <= latency[f"{side}_p99_ms"]
    assert latency["follower_over_leader_p50"] == pytest.approx(
        latency["follower_p50_ms"] / latency["leader_p50_ms"], abs=0.01
    )
    start = summary["start"]
    assert start["connectors"] == 3
    assert start["log_records"] >= 4  # a claim and three creations at least
    for which in ("empty", "full"):
        (sample,) = start["samples"][which]
        assert 0 < sample["ready_s"] <= sample["serve_s"]
