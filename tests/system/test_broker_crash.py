"""kill -9 of a broker under SYNC_FLUSH while producing: every acknowledged message survives."""

import asyncio
from pathlib import Path

import pytest

from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import QueryConsumerOffsetRequestHeader, UpdateConsumerOffsetRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode

from ..integration.remoting import command, create_topic, pull, send
from .procs import Server, start

pytestmark = pytest.mark.system

QUEUES = 4


def _start_broker(tmp_path: Path, namesrv: Server, name: str) -> Server:
    return start(
        [
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(tmp_path / "store"),
            "--flush-disk-type",
            "SYNC_FLUSH",
            "--mapped-file-size-commit-log",
            str(1 << 20),
        ],
        tmp_path,
        name,
    )


async def test_acknowledged_messages_survive_kill_9_in_order_and_once(tmp_path: Path) -> None:
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    broker = _start_broker(tmp_path, namesrv, "broker-1")
    acked: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(QUEUES)}
    try:
        async with RpcClient() as client:
            await create_topic(client, broker.addr, "Crash", QUEUES)
            stop = asyncio.Event()
            enough = asyncio.Event()

            async def producer(queue_id: int) -> None:
                for n in range(100_000):
                    if stop.is_set():
                        return
                    body = f"q{queue_id}-{n}".encode() * 8
                    try:
                        response = await send(client, broker.addr, "Crash", body, queue_id)
                    except FerryError:
                        return  # the broker is gone; this send's outcome is unknown
                    if response.code != 0:
                        return
                    acked[queue_id].append((int(response.ext_fields["queueOffset"]), body))
                    if sum(len(v) for v in acked.values()) >= 400:
                        enough.set()

            producers = [asyncio.create_task(producer(q)) for q in range(QUEUES)]
            await asyncio.wait_for(enough.wait(), 60)
            broker.kill()
            stop.set()
            await asyncio.gather(*producers)
        assert sum(len(v) for v in acked.values()) >= 400

        restarted = _start_broker(tmp_path, namesrv, "broker-2")
        try:
            async with RpcClient() as client:
                for queue_id, expected in acked.items():
                    stored: list[tuple[int, bytes]] = []
                    offset = 0
                    while True:
                        response, records = await pull(
                            client, restarted.addr, "Crash", queue_id, offset
                        )
                        if not records:
                            break
                        stored += [(r.queue_offset, r.body) for r in records]
                        offset = int(response.ext_fields["nextBeginOffset"])
                    assert [o for o, _ in stored] == list(range(len(stored)))  # dense, in order
                    assert stored[: len(expected)] == expected  # every ack, at its offset, once
        finally:
            restarted.stop()
    finally:
        broker.stop()
        namesrv.stop()


async def test_a_master_restarted_after_kill_9_keeps_the_offset_commits_it_acknowledged(
    tmp_path: Path,
) -> None:
    """The offsets come back from the metadata log, not only the periodic consumerOffset.json."""
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], tmp_path, "namesrv")
    broker = _start_broker(tmp_path, namesrv, "broker-1")
    try:
        async with RpcClient() as client:
            await create_topic(client, broker.addr, "Offsets", 2)
            for offset in (5, 17, 42):  # the last one lands well inside the persist interval
                update = UpdateConsumerOffsetRequestHeader(
                    consumer_group="G", topic="Offsets", queue_id=1, commit_offset=offset
                )
                response = await client.call(
                    broker.addr, command(RequestCode.UPDATE_CONSUMER_OFFSET, update), 5
                )
                assert response.code == ResponseCode.SUCCESS, response.remark
        broker.kill()
        broker = _start_broker(tmp_path, namesrv, "broker-2")
        async with RpcClient() as client:
            query = QueryConsumerOffsetRequestHeader(
                consumer_group="G", topic="Offsets", queue_id=1, set_zero_if_not_found=False
            )
            response = await client.call(
                broker.addr, command(RequestCode.QUERY_CONSUMER_OFFSET, query), 5
            )
            assert response.code == ResponseCode.SUCCESS, response.remark
            assert int(response.ext_fields["offset"]) == 42
    finally:
        broker.stop()
        namesrv.stop()
