"""`ferry broker --config broker.conf`: a RocketMQ broker.conf with RocketMQ's key names starts a
broker that uses every key, logs keys ferrymq does not use once, and refuses bad values by key."""

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.cmd.measure import free_port
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import TopicRouteData
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from ..integration.remoting import pull, send
from .procs import FERRY, Server, start

pytestmark = pytest.mark.system

SEGMENT = 1024 * 1024


def _conf(tmp_path: Path, namesrv: Server, port: int, ha_port: int) -> str:
    return f"""\
# a broker.conf as RocketMQ ships it, plus keys ferrymq does not use
brokerClusterName = ConfCluster
brokerName=conf-broker
brokerId=0
brokerRole=SYNC_MASTER
flushDiskType=SYNC_FLUSH
namesrvAddr={namesrv.addr}
listenPort={port}
haListenPort={ha_port}
brokerIP1=127.0.0.1
storePathRootDir={tmp_path / "root"}
storePathCommitLog={tmp_path / "elsewhere" / "commitlog"}
mappedFileSizeCommitLog={SEGMENT}
fileReservedTime=48
deleteWhen=04
autoCreateTopicEnable=true
defaultTopicQueueNums=2
maxMessageSize=2048
enableControllerMode=false
traceTopicEnable=true
! a comment in the other Properties style
sendMessageThreadPoolNums=16
"""


async def _route(admin: AdminClient, topic: str) -> TopicRouteData:
    deadline = time.monotonic() + 10
    while True:
        route = await admin.route(topic)
        if route is not None or time.monotonic() > deadline:
            assert route is not None, f"no route for {topic}"
            return route
        await asyncio.sleep(0.1)


async def test_a_rocketmq_broker_conf_configures_every_key(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    port = free_port()
    conf = tmp_path / "broker.conf"
    # a free HA port too: 0 would mean listenPort + 1, which another process may hold
    conf.write_text(_conf(tmp_path, namesrv, port, free_port()))
    try:
        broker = start(["broker", "--config", str(conf)], tmp_path, "broker")
    except BaseException:
        namesrv.stop()  # a broker that never starts leaves no NameServer running
        raise
    client = RpcClient()
    try:
        assert broker.addr == f"127.0.0.1:{port}"
        assert broker.info["cluster"] == "ConfCluster"
        assert broker.info["broker_name"] == "conf-broker"
        assert broker.info["role"] == "SYNC_MASTER"
        assert broker.info["store_dir"] == str(tmp_path / "root")

        # autoCreateTopicEnable with defaultTopicQueueNums=2: a send creates the topic with
        # min(4 asked by the producer, 2) queues, and the NameServer routes it
        sent = await send(client, broker.addr, "FromConf", b"hello")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        async with AdminClient(namesrv.addr) as admin:
            route = await _route(admin, "FromConf")
            assert route.queue_datas[0].write_queue_nums == 2
            assert route.broker_datas[0].cluster == "ConfCluster"
            assert route.broker_datas[0].broker_addrs == {0: broker.addr}
            clusters = await admin.cluster_info()
            assert set(clusters.cluster_addr_table["ConfCluster"]) == {"conf-broker"}
        fetched, records = await pull(client, broker.addr, "FromConf", 0, 0)
        assert fetched.code == ResponseCode.SUCCESS
        assert [r.body for r in records] == [b"hello"]

        # maxMessageSize=2048
        too_big = await send(client, broker.addr, "FromConf", b"x" * 4096)
        assert too_big.code == ResponseCode.MESSAGE_ILLEGAL
        assert "2048" in (too_big.remark or "")

        # storePathCommitLog and mappedFileSizeCommitLog: the segment is there, at that size
        segments = sorted((tmp_path / "elsewhere" / "commitlog").iterdir())
        assert [s.name for s in segments] == [f"{0:020d}"]
        assert segments[0].stat().st_size == SEGMENT
        # SYNC_FLUSH warms segments (warmMapedFileEnable): the first one is zero-filled, not sparse
        assert segments[0].stat().st_blocks * 512 >= SEGMENT
        assert not (tmp_path / "root" / "commitlog").exists()

        served = await client.call(
            broker.addr, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG), 5
        )
        lines = set(served.body.decode().splitlines())
        for line in (
            "flushDiskType=SYNC_FLUSH",
            "fileReservedTime=48.0",
            "deleteWhen=04",
            "brokerRole=SYNC_MASTER",
            "enableControllerMode=false",
        ):
            assert line in lines, (line, sorted(lines))
    finally:
        await client.close()
        broker.stop()
        namesrv.stop()
    log = broker.log.read_text()
    for unused in ("traceTopicEnable", "sendMessageThreadPoolNums"):
        assert log.count(f"config key {unused} is not used by ferrymq; ignored") == 1, log
    assert "deleteWhen is not used" not in log


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("listenPort=notaport", "listenPort"),
        ("flushDiskType=SOMETIMES", "flushDiskType"),
        ("brokerRole=LEADER", "brokerRole"),
        ("maxMessageSize=-1", "maxMessageSize"),
        ("busyPollMicros=-1", "busyPollMicros"),
        ("autoCreateTopicEnable=perhaps", "autoCreateTopicEnable"),
        ("=value-without-key", "broker.conf:3: cannot parse"),
    ],
)
def test_a_bad_value_stops_the_broker_with_one_line_naming_the_key(
    tmp_path: Path, line: str, named: str
) -> None:
    conf = tmp_path / "broker.conf"
    # port 0 first, so that a value wrongly accepted binds a free port, not RocketMQ's 10911
    conf.write_text(f"listenPort=0\nstorePathRootDir={tmp_path / 'store'}\n{line}\n")
    done = subprocess.run(
        [*FERRY, "broker", "--config", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if x.startswith("ferry: error: ")]
    assert len(errors) == 1, done.stderr
    assert named in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "store" / "commitlog").exists()


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*FERRY, "broker", "--config", str(tmp_path / "nope.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"ferry: error: --config {tmp_path / 'nope.conf'}: No such file or directory"
    ], done.stderr
