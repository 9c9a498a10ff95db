"""A Connect worker on an ACL 1.0 cluster (issue 23): it signs with its config file's account.

`ferry connect worker --config FILE` as a real process (its accessKey/secretKey reach its clients
through the command), an in-process LocalCluster with aclEnable, the REST API over HTTP; the
wrong-secret worker in-process (its start refused, typed). A PAUSED connector: no Spark starts.
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from ferrymq.cmd.connect import load_worker_config
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.worker import Worker, WorkerStartError
from ferrymq.connectors.runtime import SparkTaskRunner
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.testing import LocalCluster

ACL = """
accounts:
- {accessKey: connect-worker, secretKey: worker-secret, admin: true}
"""
CONNECTOR = {
    "name": "copy",
    "config": {
        "connector.class": "FerrymqReplicator",
        "topics": "src",
        "target.topic.format": "${topic}-copy",
    },
    "initial_state": "PAUSED",
}


def _properties(path: Path, namesrv: str, secret: str) -> Path:
    path.write_text(
        f"namesrvAddr={namesrv}\nhttpPort=0\nstorePathRootDir={path.with_suffix('')}\n"
        "heartbeatIntervalMs=100\nsessionTimeoutMs=1000\nleaderFailoverGraceMs=200\n"
        f"restRequestTimeoutMs=10000\naccessKey=connect-worker\nsecretKey={secret}\n"
    )
    return path


async def _worker(config: Path, ready: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferrymq.cmd.ferry", "connect", "worker", "--config", str(config),
        "--ready-file", str(ready), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_a_worker_signs_with_its_config_files_account_and_a_wrong_secret_stops_it(
    tmp_path: Path,
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with LocalCluster(tmp_path / "ferry", acl_enable=True, acl_file=acl_file) as cluster:
        config = _properties(tmp_path / "right.properties", cluster.namesrv_addr, "worker-secret")
        ready = tmp_path / "ready.json"
        process = await _worker(config, ready)
        try:
            deadline = time.monotonic() + 90  # a process start on a loaded 2-core box
            while not ready.exists() or not ready.read_text().strip():
                assert process.returncode is None, "the worker exited"
                assert time.monotonic() < deadline, "the worker never served"
                await asyncio.sleep(0.1)
            url = json.loads(ready.read_text())["url"]
            async with httpx.AsyncClient(base_url=url, timeout=20) as http:
                deadline = time.monotonic() + 30
                while (created := await http.post("/connectors", json=CONNECTOR)).status_code in (
                    409, 503,
                ):  # fmt: skip
                    assert time.monotonic() < deadline, created.text  # no leader yet
                    await asyncio.sleep(0.1)
                assert created.status_code == 201, created.text
                shown = await http.get("/connectors/copy/config")
                assert shown.status_code == 200, shown.text
                assert shown.json()["topics"] == "src"
        finally:
            if process.returncode is None:
                process.terminate()
            _, err = await process.communicate()
        assert b"worker-secret" not in err
        assert cluster.broker.acl is not None
        assert cluster.broker.acl.denied == 0  # every call of the worker was signed right

        # the same file with a wrong secret, loaded and installed as the command does, in-process
        wrong = load_worker_config(
            _properties(tmp_path / "wrong.properties", cluster.namesrv_addr, "not-it"), {}
        )
        install_credentials(Credentials(wrong.access_key, wrong.secret_key))
        try:
            plugins = Plugins()
            runner = SparkTaskRunner(
                plugins, cluster_id=wrong.connect_cluster_id, namesrv_addr=wrong.namesrv_addr,
                state_dir=wrong.store_path_root_dir,
            )  # fmt: skip
            with pytest.raises(WorkerStartError) as refused:
                await Worker(wrong, runner=runner, plugins=plugins).start()
        finally:
            install_credentials(None)
        message = str(refused.value)
        assert message.startswith("the broker refused this worker's account"), message
        assert "Check signature failed for accessKey=connect-worker" in message
        assert "not-it" not in message
        assert cluster.broker.acl.denied >= 1
