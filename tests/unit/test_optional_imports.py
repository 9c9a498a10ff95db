"""The `ferry` command loads without the optional extras (spark, connect, bench).

A core install (`pip install ferrymq`) runs the servers and the CLI: a module that needs pyspark,
psycopg, FastAPI or nats at import time must be imported only by the subcommand that uses it.
"""

import subprocess
import sys
import textwrap

BLOCKED = ("psycopg", "pyspark", "pyarrow", "fastapi", "uvicorn", "nats")

PROGRAM = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ModuleNotFoundError(f"blocked optional module {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    from click.testing import CliRunner
    from ferrymq.cmd.ferry import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    assert "namesrv" in result.output and "broker" in result.output, result.output
    print("loaded")
    """
)


def test_the_ferry_command_loads_without_optional_extras() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"
