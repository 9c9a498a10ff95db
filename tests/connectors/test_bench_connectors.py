"""`ferry bench connectors` with tiny parameters: every job measured, the ratios and latency."""

import json
import subprocess
import sys

import pytest

from ferrymq.cmd.bench_connectors import JDBC_JAR
from ferrymq.connectors.runtime import SPARK_MASTER

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


@pytest.mark.timeout(400)
def test_bench_connectors_reports_every_job_its_ratios_and_the_latency() -> None:
    command = [sys.executable, "-m", "ferrymq.cmd.ferry", "bench", "connectors", "--rows", "1000"]
    completed = subprocess.run(
        [
            *command,
            "--repeat",
            "1",
            "--latency-seconds",
            "1",
            "--latency-rate",
            "50",
            "--no-warmup",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    systems = {(r["group"], r["system"]): r for r in report["rows"]}
    expected = {
        ("postgres sink", "PostgresSink"),
        ("postgres sink", "psycopg COPY"),
        ("postgres sink steady", "PostgresSink"),
        ("postgres sink steady", "psycopg COPY"),
        ("ferrymq write", "FileSource"),
        ("ferrymq write", "produce --window 256"),
        ("ferrymq write", "PostgresSource"),
        ("ferrymq write", "produce --window 256 (PostgresSource size)"),
    }
    ratios = {
        "pg_sink_vs_copy",
        "pg_sink_steady_vs_copy",
        "file_source_vs_produce",
        "pg_source_vs_produce",
    }
    if JDBC_JAR.is_file():
        expected |= {("postgres sink", "Spark JDBC"), ("postgres sink steady", "Spark JDBC")}
        ratios |= {"pg_sink_vs_jdbc", "pg_sink_steady_vs_jdbc"}
        assert report["skipped"] == {}
    else:
        assert "libpostgresql-jdbc-java" in report["skipped"]["Spark JDBC"]
    assert set(systems) == expected
    assert report["master"] == SPARK_MASTER  # a Connect worker's default, as the plugins' defaults
    assert all(
        r["rows"] == 1000 and r["seconds"] > 0 and len(r["runs"]) == 1 for r in systems.values()
    )
    # produce sends bodies of the FileSource rows' size
    write = systems[("ferrymq write", "FileSource")]
    assert systems[("ferrymq write", "produce --window 256")]["size"] == write["size"] == 100
    assert set(report["ratios"]) == ratios
    assert all(ratio > 0 for ratio in report["ratios"].values())
    latency = report["latency"]
    assert latency["rows"] >= 10
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
