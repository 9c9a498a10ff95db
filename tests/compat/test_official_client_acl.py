"""The official RocketMQ 4.x client (C++ core) with session credentials against an ACL broker.

Issue 23's must-show: `ferry namesrv` and `ferry broker --acl-enable true --acl-file ...` run as
processes; the client signs with `set_session_credentials` (HmacSHA1 over its extFields), sends
and pulls with the right account, and is refused NO_PERMISSION with a wrong secret, a topic the
account may not publish to, and a group it may not consume with.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient

from ..system.procs import Server, start

pytestmark = pytest.mark.compat

WORKER = [sys.executable, "-m", "tests.compat.cpp_worker"]
ACL = """
accounts:
- accessKey: cpp-producer
  secretKey: producer-secret
  topicPerms: [AclSend=PUB, AclDenied=DENY]
- accessKey: cpp-consumer
  secretKey: consumer-secret
  topicPerms: [AclSend=SUB]
  groupPerms: [AclReaders=SUB]
- accessKey: admin-key
  secretKey: admin-secret
  admin: true
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    workdir = tmp_path_factory.mktemp("compat-acl")
    acl_file = workdir / "plain_acl.yml"
    acl_file.write_text(ACL)
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], workdir, "namesrv")
    broker: Server | None = None
    try:
        broker = start(
            ["broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr,
             "--store-dir", str(workdir / "store"), "--mapped-file-size-commit-log", "16777216",
             "--acl-enable", "true", "--acl-file", str(acl_file)],
            workdir,
            "broker",
        )  # fmt: skip
        asyncio.run(_create_topics(namesrv.addr))
        with pytest.MonkeyPatch.context() as env:
            env.setenv("HOME", str(workdir))  # the C++ core logs under ~/logs/rocketmq-cpp
            yield namesrv.addr, broker
        assert broker.process.poll() is None, "broker died during the ACL compat test"
    finally:
        if broker is not None:
            broker.stop()
        namesrv.stop()


async def _create_topics(namesrv: str) -> None:
    async with AdminClient(namesrv, access_key="admin-key", secret_key="admin-secret") as admin:
        await admin.create_topic("AclSend", 1)
        await admin.create_topic("AclDenied", 1)


def _worker(args: list[str], access_key: str, secret_key: str) -> bytes:
    env = {**os.environ, "CPP_ACCESS_KEY": access_key, "CPP_SECRET_KEY": secret_key}
    done = subprocess.run([*WORKER, *args], capture_output=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout


def _produce(namesrv: str, topic: str, body: str, ak: str, sk: str) -> dict[str, Any]:
    spec = [{"topic": topic, "body": body}]
    results: list[dict[str, Any]] = json.loads(
        _worker(["produce", namesrv, "AclProducers", json.dumps(spec)], ak, sk)
    )
    return results[0]


def _pull(namesrv: str, group: str, ak: str, sk: str) -> list[str]:
    out = _worker(["pull", namesrv, group, "AclSend", json.dumps({"0": 0})], ak, sk)
    return [json.loads(line)["body"] for line in out.splitlines()]


def test_the_official_client_signs_sends_and_pulls_and_is_refused_where_its_account_may_not(
    cluster: tuple[str, Server],
) -> None:
    namesrv, broker = cluster
    sent = _produce(namesrv, "AclSend", "signed", "cpp-producer", "producer-secret")
    assert sent["status"] == "OK", sent

    # the C++ core retries a NO_PERMISSION send and then reports only "No route info"; the
    # broker's log says why each was refused, and the pull below shows nothing was stored
    wrong = _produce(namesrv, "AclSend", "forged", "cpp-producer", "not-the-secret")
    assert wrong["status"] == "ERROR", wrong
    denied = _produce(namesrv, "AclDenied", "denied", "cpp-producer", "producer-secret")
    assert denied["status"] == "ERROR", denied

    assert _pull(namesrv, "AclReaders", "cpp-consumer", "consumer-secret") == ["signed"]
    # a pull with a group the account may not use: the C++ core keeps retrying it, so the
    # worker is stopped once the broker logged the refusal
    env = {**os.environ, "CPP_ACCESS_KEY": "cpp-consumer", "CPP_SECRET_KEY": "consumer-secret"}
    args = ["pull", namesrv, "OtherReaders", "AclSend", json.dumps({"0": 0})]
    worker = subprocess.Popen([*WORKER, *args], stdout=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while "No permission for group OtherReaders" not in broker.log.read_text():
            assert time.monotonic() < deadline, "the broker never refused the OtherReaders pull"
            time.sleep(0.1)
    finally:
        worker.kill()
        out, _ = worker.communicate(timeout=30)
    assert out == b"", out
    # a push consumer (heartbeat, rebalance, long-polling pulls, offset commits) signs each request
    output = broker.log.parent / "push.jsonl"
    env = {**os.environ, "CPP_ACCESS_KEY": "cpp-consumer", "CPP_SECRET_KEY": "consumer-secret"}
    args = ["push", namesrv, "AclReaders", "AclSend", "*", str(output), "[]"]
    push = subprocess.Popen([*WORKER, *args], stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        next_send = time.monotonic()
        while "pushed" not in (output.read_text() if output.exists() else ""):
            assert time.monotonic() < deadline, "the push consumer never got the message"
            if time.monotonic() >= next_send:  # sent again until the consumer has its queues
                sent = _produce(namesrv, "AclSend", "pushed", "cpp-producer", "producer-secret")
                assert sent["status"] == "OK", sent
                next_send = time.monotonic() + 3
            time.sleep(0.2)
    finally:
        push.terminate()
        push.wait(30)
    log = broker.log.read_text()
    assert "Check signature failed for accessKey=cpp-producer" in log
    assert "No permission for topic AclDenied: accessKey=cpp-producer needs PUB" in log
    assert "No permission for group OtherReaders: accessKey=cpp-consumer needs SUB" in log
    assert "not-the-secret" not in log
    assert "producer-secret" not in log
