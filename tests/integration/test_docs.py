"""Every Python example in docs/sdk.md, run in order as its own process against a real cluster."""

import asyncio
import re
import sys
from pathlib import Path

import pytest

from ferrymq.testing import LocalCluster

DOC = Path(__file__).parents[2] / "docs" / "sdk.md"
DOC_NAMESRV = "127.0.0.1:9876"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EXAMPLE_TIMEOUT_S = 60.0


def examples() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def test_the_page_has_examples_that_all_use_the_documented_address() -> None:
    blocks = examples()
    assert len(blocks) >= 7
    assert all(DOC_NAMESRV in block for block in blocks)


async def test_every_example_runs(cluster: LocalCluster, tmp_path: Path) -> None:
    for number, block in enumerate(examples(), 1):
        script = tmp_path / f"example_{number}.py"
        script.write_text(block.replace(DOC_NAMESRV, cluster.namesrv_addr))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), EXAMPLE_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            pytest.fail(f"example {number} did not finish in {EXAMPLE_TIMEOUT_S:g} s:\n{block}")
        assert process.returncode == 0, (
            f"example {number} failed:\n{block}\n--- output ---\n{output.decode()}"
        )
