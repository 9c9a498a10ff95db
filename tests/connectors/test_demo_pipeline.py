"""`ferry demo`'s PostgreSQL pipeline: a PostgreSQL error while it inserts or counts rows is one
line in the demo's report (the demo fails), never a traceback."""

import io

import pytest
from rich.console import Console

from ferrymq.cmd.demo import DemoReport, _Pipeline

from .postgres import Database

pytestmark = pytest.mark.postgres


async def test_a_postgresql_error_fails_the_pipeline_in_one_line(database: Database) -> None:
    # a real error: the database has no `orders` table to insert into or count
    pipeline = _Pipeline(database, {})
    console = Console(file=io.StringIO(), width=200)
    report = DemoReport()
    assert await pipeline.first_rows(report, console) is None
    assert report.pg_error.startswith('PostgreSQL failed the pipeline: relation "orders"')
    assert "\n" not in report.pg_error
    drained = DemoReport()
    await pipeline.drain(drained, console)
    assert drained.pg_error.startswith('PostgreSQL failed the pipeline: relation "orders"')
    assert not drained.ok
