"""`ferry demo`'s verdict: the PostgreSQL pipeline must have copied every row once, and a
PostgreSQL that could not run fails the demo (pyspark missing skips every pipeline instead)."""

import io
from pathlib import Path

from rich.console import Console

from ferrymq.cmd.demo import DEMO_SEGMENT_BYTES, DemoReport, demo_config, tidy
from ferrymq.cmd.up import ProcessCluster


def passing() -> DemoReport:
    return DemoReport(
        sent=600,
        new_master="127.0.0.1:2",
        old_master="127.0.0.1:1",
        rejoined=True,
        clean_exits={"broker-a-1": 0},
        pg_rows=5140,
        pg_copied=5140,
        pg_distinct=5140,
    )


def test_the_demo_passes_only_when_both_tables_hold_the_same_rows_once() -> None:
    assert passing().ok
    short = passing()
    short.pg_copied = short.pg_distinct = 5139
    assert not short.ok
    twice = passing()
    twice.pg_copied = 5141
    assert not twice.ok
    never = passing()
    never.pg_rows = never.pg_copied = never.pg_distinct = None
    assert not never.ok


def test_a_postgresql_that_cannot_run_fails_the_demo_and_missing_pyspark_skips() -> None:
    unavailable = passing()
    unavailable.pg_rows = unavailable.pg_copied = unavailable.pg_distinct = None
    unavailable.pg_error = "PostgreSQL cannot run here: no PostgreSQL server"
    assert not unavailable.ok
    skipped = passing()
    skipped.pg_rows = skipped.pg_copied = skipped.pg_distinct = None
    skipped.pipeline_skipped = "pyspark is not installed"
    assert skipped.ok


def test_the_demo_removes_its_own_directory_only_when_it_passed(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    for own, ok in ((True, False), (False, True), (False, False), (True, True)):
        workdir = tmp_path / f"demo-{own}-{ok}"
        (workdir / "broker-a-1").mkdir(parents=True)
        (workdir / "broker-a-1" / "broker.log").write_text("log")
        tidy(workdir, own=own, ok=ok, console=console)
        assert workdir.exists() == (not (own and ok)), (own, ok)
        assert (f"kept in {workdir}" in out.getvalue()) == (not ok), (own, ok)


def test_the_demo_brokers_use_small_segments_unless_told_otherwise(tmp_path: Path) -> None:
    for config, size in (
        (demo_config(tmp_path), DEMO_SEGMENT_BYTES),
        (demo_config(tmp_path, 64 * 1024 * 1024), 64 * 1024 * 1024),
    ):
        args = ProcessCluster(config)._broker_args(0, 0, "broker-a-1")
        flag = args.index("--mapped-file-size-commit-log")
        assert args[flag + 1] == str(size)
        assert "--mapped-file-size-commit-log" not in args[flag + 1 :]
