"""`ferry up --tls` (issue 23): Raft, HA, remoting and the CLI over TLS, with real processes."""

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import ConnectionClosedError
from ferrymq.rpc.client import RpcClient
from ferrymq.security.tls import (
    PLAIN_CLIENT,
    TlsSettings,
    install,
    restore,
    settings_for,
    tls_config_from,
)
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

from .test_up import _alive, _pids, _up

pytestmark = pytest.mark.system


async def test_up_tls_runs_raft_ha_and_clients_over_tls_and_refuses_plain_text(
    tmp_path: Path,
) -> None:
    # 3 controllers (Raft between them, over TLS), a master and a slave (HA over TLS)
    process, info = _up(tmp_path, "--tls", "--replicas", "2", "--connect", "0", "--no-console")
    try:
        ca = Path(str(info["tls_ca"]))
        values = {"tls.enable": "true", "tls.client.trustCertPath": str(ca)}
        trusting = settings_for(tls_config_from(values), server_side=False).client
        token = install(TlsSettings(client=trusting))
        brokers = info["brokers"]
        controllers = info["controllers"]
        assert isinstance(brokers, list)
        assert isinstance(controllers, list)
        master = next(b for b in brokers if b["role"] == "SYNC_MASTER")  # elected through Raft
        namesrv = str(info["namesrv"])
        async with RpcClient() as client:
            deadline = time.monotonic() + 30
            while True:
                runtime = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
                response = await client.call(str(master["addr"]), runtime, 5)
                if decode_body(response.body, KVTable).table.get("syncStateSet") == "1,2":
                    break
                assert time.monotonic() < deadline, "the slave never joined over TLS"
                await asyncio.sleep(0.1)
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("TlsUp", queues=1)
            deadline = time.monotonic() + 30
            while await admin.route("TlsUp") is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        async with Producer(namesrv) as producer:
            await producer.send("TlsUp", b"over-tls")  # SYNC_MASTER: the slave has it too
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ferrymq.cmd.ferry",
            "--tls-ca",
            str(ca),
            "produce",
            "--namesrv",
            namesrv,
            "TlsUp",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(cli.communicate(b"from-the-cli\n"), 60)
        assert cli.returncode == 0, err.decode()
        async with PullConsumer(namesrv, "TlsCheck") as consumer:
            (queue,) = await consumer.queues("TlsUp")
            pulled = await consumer.pull(queue, 0, max_messages=10)
            assert pulled.status is PullStatus.FOUND
            assert [m.body for m in pulled.messages] == [b"over-tls", b"from-the-cli"]
        async with RpcClient(tls=PLAIN_CLIENT) as plain:
            for address in (str(controllers[0]["addr"]), str(master["addr"]), namesrv):
                with pytest.raises(ConnectionClosedError):
                    await plain.call(address, RemotingCommand(code=RequestCode.HEART_BEAT), 5)
    finally:
        if "token" in locals():
            restore(token)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert not [pid for pid in _pids(info) if _alive(pid)]
    slave = next(b for b in brokers if b["role"] == "SLAVE")
    heads = []
    for segment in (Path(str(slave["store_dir"])) / "commitlog").iterdir():
        with segment.open("rb") as file:
            heads.append(file.read(64 * 1024))
    assert any(b"over-tls" in head for head in heads)  # replicated over the TLS HA link
