"""`ferry console`: prints the URL it serves at (port 0 read back); a bad flag exits 2."""

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
from click.testing import CliRunner

from ferrymq.cmd.console import console_command
from ferrymq.testing import LocalCluster

FERRY = [sys.executable, "-m", "ferrymq.cmd.ferry"]


async def test_ferry_console_prints_its_url_and_serves_the_cluster(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        process = await asyncio.create_subprocess_exec(
            *FERRY,
            "console",
            "--namesrv",
            cluster.namesrv_addr,
            "--port",
            "0",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line.startswith("ferry console: http://127.0.0.1:"), line
            url = line.split(": ", 1)[1].strip()
            async with httpx.AsyncClient(timeout=10) as http:
                state = (await http.get(f"{url}/api/cluster")).json()
            assert [g["master_address"] for g in state["groups"]] == [cluster.broker.address]
        finally:
            os.kill(process.pid, signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0


def test_ferry_console_refuses_a_connect_flag_that_is_no_url() -> None:
    result = CliRunner().invoke(
        console_command, ["--namesrv", "127.0.0.1:1", "--connect", "localhost:8083"]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "ferry: error: --connect takes a URL (http://host:port), not 'localhost:8083'"
    ]
