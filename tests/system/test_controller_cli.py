"""A controller embedded in `ferry namesrv`, driven by `ferry admin controller ...`."""

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.controller.config import ControllerConfig
from ferrymq.wire.controller import BrokerHeartbeatRequestHeader

from .procs import Server, start

pytestmark = pytest.mark.system

CLUSTER = "DefaultCluster"
NAME = "broker-a"


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[Server]:
    addr = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.1:9876"
    server = start(
        [
            "namesrv",
            "--enable-controller",
            "--controller-id",
            "n1",
            "--controller-peers",
            f"n1={addr}",
            "--controller-dir",
            str(tmp_path / "controller"),
        ],
        tmp_path,
        "namesrv",
    )
    yield server
    server.stop()


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferrymq.cmd.ferry", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def controller(addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    return ferry("admin", "controller", "--controller", addr, *args)


async def test_embedded_controller_answers_the_admin_commands(namesrv: Server) -> None:
    addr = namesrv.addr
    async with ControllerAdmin(addr, timeout=10.0) as admin:
        await admin.leader()
        for broker_id in (1, 2):
            await admin.apply_broker_id(CLUSTER, NAME, broker_id, f"127.0.0.1:{broker_id};1")
            lease = await admin.heartbeat(
                BrokerHeartbeatRequestHeader(
                    cluster_name=CLUSTER,
                    broker_addr=f"127.0.0.1:{broker_id}",
                    broker_name=NAME,
                    broker_id=broker_id,
                    heartbeat_timeout_mills=120_000,
                )
            )
            assert lease.master_lease_mills == ControllerConfig().master_lease_millis

        # The heartbeats' connection stays open: closing it would mark both brokers dead.
        meta = controller(addr, "meta", "--json")
        assert meta.returncode == 0, meta.stderr
        assert json.loads(meta.stdout)[addr]["isLeader"] is True

        clusters = ferry("admin", "--namesrv", addr, "cluster", "list", "--json")
        assert clusters.returncode == 0, clusters.stderr

        config = controller(addr, "config", "--set", "enableElectUncleanMaster=true", "--json")
        assert config.returncode == 0, config.stderr
        assert json.loads(config.stdout)["enableElectUncleanMaster"] == "true"
        refused = controller(addr, "config", "--set", "configStorePath=/tmp/x")
        assert refused.returncode == 1
        assert "NO_PERMISSION" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1

        elected = controller(addr, "elect-master", NAME, "--broker-id", "2", "--json")
        assert elected.returncode == 0, elected.stderr
        result = json.loads(elected.stdout)
        # The controller may already have held the group's first election by itself.
        assert result["masterBrokerId"] == 2
        assert result["masterEpoch"] >= 1

        table = controller(addr, "sync-state-set", NAME, "--json")
        assert table.returncode == 0, table.stderr
        info = json.loads(table.stdout)["replicasInfoTable"][NAME]
        assert info["masterBrokerId"] == 2
        assert [r["brokerId"] for r in info["inSyncReplicas"]] == [2]
        human = controller(addr, "sync-state-set", NAME)
        assert human.returncode == 0
        assert "master" in human.stdout

        alive = controller(addr, "clean-broker-metadata", NAME, "--broker-ids", "1")
        assert alive.returncode == 1
        assert "still alive" in alive.stderr
        cleaned = controller(
            addr, "clean-broker-metadata", NAME, "--broker-ids", "1", "--clean-living"
        )
        assert cleaned.returncode == 0, cleaned.stderr

        unknown = controller(addr, "elect-master", "no-such-group")
        assert unknown.returncode == 1
        assert "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED" in unknown.stderr

        epochs = controller(addr, "broker-epoch", "--namesrv", addr, "--json")
        assert epochs.returncode == 0, epochs.stderr
        assert json.loads(epochs.stdout) == {}
