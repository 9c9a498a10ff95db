"""`ferry` client commands carry ACL credentials (issue 23): flags, environment or a file."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from ferrymq.client.admin import AdminClient
from ferrymq.testing import LocalCluster

ACL = """
accounts:
- accessKey: cli-user
  secretKey: cli-secret-1
  topicPerms: [CliTopic=PUB|SUB]
  groupPerms: [cli-readers=SUB]
- accessKey: admin-key
  secretKey: admin-secret
  admin: true
"""


async def _ferry(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean, **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_cli_signs_with_a_credentials_file_or_the_environment_and_is_refused_without(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    credentials = tmp_path / "tools.yml"
    credentials.write_text("accessKey: cli-user\nsecretKey: cli-secret-1\n")
    async with LocalCluster(tmp_path, acl_enable=True, acl_file=acl_file) as cluster:
        addr = cluster.namesrv_addr
        async with AdminClient(addr, access_key="admin-key", secret_key="admin-secret") as admin:
            await admin.create_topic("CliTopic", 1)
        produce = ["produce", "CliTopic", "--namesrv", addr]
        signed, unsigned, half = await asyncio.gather(
            _ferry("--credentials-file", str(credentials), *produce, stdin=b"one\ntwo\n"),
            _ferry(*produce, stdin=b"three\n"),
            _ferry("--access-key", "cli-user", *produce, stdin=b"four\n"),
        )
        assert signed[0] == 0, signed
        assert unsigned[0] != 0, unsigned
        assert "No accessKey is configured" in unsigned[2], unsigned
        assert half[0] == 2, half
        assert "give both keys or neither" in half[2]
        code, out, err = await _ferry(
            "consume", "CliTopic", "--namesrv", addr, "--group", "cli-readers",
            "--from", "earliest", "--max", "2",
            env={"FERRY_ACCESS_KEY": "cli-user", "FERRY_SECRET_KEY": "cli-secret-1"},
        )  # fmt: skip
        assert code == 0, err
        assert out.split() == ["one", "two"]
        for _, text, errors in (signed, unsigned, half):
            assert "cli-secret-1" not in text + errors
