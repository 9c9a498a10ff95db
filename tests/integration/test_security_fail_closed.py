"""Security keys fail closed in the real commands (issue 23): exit 2, one line naming the key."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

COMMANDS = {
    "broker": ["broker", "--store-dir", "{tmp}/store", "--listen", "127.0.0.1:0"],
    "namesrv": ["namesrv", "--listen", "127.0.0.1:0"],
    "controller": ["controller", "--id", "n1", "--peers", "n1=127.0.0.1:0", "--data-dir", "{tmp}"],
    "connect": ["connect", "worker"],
}
KEYS = {
    "broker": "authenticationProvider=org.example.Provider",
    "namesrv": 'innerClientAuthenticationCredentials={"accessKey": "a", "secretKey": "b"}',
    "controller": "aclEnable=true",
    "connect": "authenticationProvider=org.example.Provider",
}


async def _run(tmp: Path, name: str) -> tuple[str, int, str]:
    conf = tmp / f"{name}.properties"
    conf.write_text(f"# migrated\n{KEYS[name]}\n")
    args = [a.format(tmp=tmp) for a in COMMANDS[name]] + ["--config", str(conf)]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return name, process.returncode, err.decode()


async def test_every_server_refuses_to_start_with_a_security_key_it_does_not_implement(
    tmp_path: Path,
) -> None:
    results = await asyncio.gather(*(_run(tmp_path, name) for name in COMMANDS))
    for name, code, err in results:
        key = KEYS[name].split("=")[0]
        lines = err.strip().splitlines()
        assert code == 2, (name, code, err)
        assert lines[-1].startswith(f"ferry: error: config {key}: "), (name, err)
        assert "refusing to start" in lines[-1]
        assert '"secretKey": "b"' not in err  # a refused secret is not echoed
