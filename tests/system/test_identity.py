"""Persistent broker ids (seed 000): a broker killed at every step of its registration recovers
its id on restart, a second broker of the group gets the next id, and a broker restarted on a new
address keeps its id."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ferrymq.broker.identity import BrokerIdentity
from ferrymq.cmd.measure import free_port

from .procs import FERRY, Server, start

pytestmark = pytest.mark.system

POINTS = [
    "identity-before-temp",
    "identity-after-temp",
    "identity-after-apply",
    "identity-after-metadata",
]


def _broker_args(
    tmp_path: Path, controller: str, namesrv: Server, group: str, store: str
) -> list[str]:
    return [
        "broker",
        "--controller-mode",
        "--controller",
        controller,
        "--broker-name",
        group,
        "--listen",
        "127.0.0.1:0",
        "--namesrv",
        namesrv.addr,
        "--store-dir",
        str(tmp_path / store),
        "--broker-heartbeat-interval",
        "200",
    ]


def _identity(tmp_path: Path, store: str) -> BrokerIdentity:
    return BrokerIdentity.decode((tmp_path / store / "brokerIdentity").read_bytes(), temp=False)


def test_a_broker_killed_at_each_registration_step_keeps_one_id(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    controller = start(
        ["controller", "--id", "n1", "--peers", f"n1={address}", "--data-dir", str(tmp_path / "c")],
        tmp_path,
        "controller",
    )
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    servers = [controller, namesrv]
    try:
        for point in POINTS:
            group = f"g-{point}"
            args = _broker_args(tmp_path, controller.addr, namesrv, group, group)
            with (tmp_path / f"{group}.log").open("ab") as log:
                dying = subprocess.Popen(
                    [*FERRY, *args],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env={**os.environ, "FERRYMQ_FAULT_POINTS": point},
                )
            assert dying.wait(60) == -signal.SIGKILL, (tmp_path / f"{group}.log").read_text()
            broker = start(args, tmp_path, group, timeout=60)
            servers.append(broker)
            assert broker.info["broker_id"] == 1, point
            assert _identity(tmp_path, group) == BrokerIdentity("DefaultCluster", group, 1)
            assert not (tmp_path / group / "brokerIdentity-temp").exists()

        # the next broker of a group gets the next id; nothing was handed out twice
        group = f"g-{POINTS[1]}"
        second = start(
            _broker_args(tmp_path, controller.addr, namesrv, group, f"{group}-second"),
            tmp_path,
            f"{group}-second",
            timeout=60,
        )
        servers.append(second)
        assert second.info["broker_id"] == 2
        assert second.info["role"] == "SLAVE"

        # restarted on another port (a new address), the first keeps id 1
        first = servers[3]
        first.stop()
        again = start(
            _broker_args(tmp_path, controller.addr, namesrv, group, group),
            tmp_path,
            f"{group}-again",
            timeout=60,
        )
        servers.append(again)
        assert again.info["broker_id"] == 1
    finally:
        for server in reversed(servers):
            server.stop()
