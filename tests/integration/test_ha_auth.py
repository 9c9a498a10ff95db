"""HA link authentication over real sockets: a slave with wrong credentials cannot replicate."""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from ferrymq.replication.master import HAConfig, ReplicationMaster
from ferrymq.replication.slave import ReplicationSlave, SlaveConfig
from ferrymq.security.acl import Credentials
from ferrymq.store.config import StoreConfig
from ferrymq.store.epochs import EpochFile
from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem, pack_host

ADMINS = {"cluster": "right-secret"}
NOT_ADMIN = {"app": "app-secret"}


def _store(root: Path) -> Store:
    return Store.open(
        StoreConfig(
            root_dir=root,
            flush_interval=0.5,
            commitlog_segment_bytes=4096,
            consume_queue_entries=64,
            index_slot_count=64,
            index_max_entries=500,
            confirm_gated=True,
        )
    )


async def _until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_only_a_slave_with_an_admin_accounts_secret_replicates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ferrymq.replication")
    master_store = _store(tmp_path / "master")
    master = ReplicationMaster(
        master_store,
        EpochFile.open(tmp_path / "master"),
        HAConfig(heartbeat_interval=0.2),
        secret_of=ADMINS.get,
    )
    master.become_master()
    await master.start("127.0.0.1", 0)
    items = [BatchItem.of(b"m%d" % i, {}) for i in range(5)]
    master_store.put("T", 0, items, born_host=pack_host("127.0.0.1", 1), born_timestamp_ms=1)
    master.appended()
    end = master_store.max_log_offset

    async def address() -> str:
        return f"127.0.0.1:{master.port}"

    stores: list[Store] = []
    tasks: list[asyncio.Task[None]] = []

    def slave(broker_id: int, credentials: Credentials | None) -> Store:
        root = tmp_path / f"slave{broker_id}"
        store = _store(root)
        config = SlaveConfig(broker_id, retry_interval=0.1, credentials=credentials)
        replica = ReplicationSlave(store, EpochFile.open(root), config, address)
        stores.append(store)
        tasks.append(asyncio.get_running_loop().create_task(replica.run()))
        return store

    try:
        wrong = slave(1, Credentials("cluster", "wrong-secret"))
        stranger = slave(2, Credentials("app", NOT_ADMIN["app"]))
        refused = ("slave 1 failed: wrong proof", "slave 2 failed: access key 'app' is not")
        await _until(lambda: all(text in caplog.text for text in refused))
        right = slave(3, Credentials("cluster", ADMINS["cluster"]))
        await _until(lambda: right.max_log_offset == end)
        await asyncio.sleep(0.3)  # the refused ones have retried several times by now
        assert wrong.max_log_offset == 0
        assert stranger.max_log_offset == 0
        assert "slave 3 at" in caplog.text
        assert "slave 1 at" not in caplog.text  # never got past the challenge
        assert "right-secret" not in caplog.text
        assert "wrong-secret" not in caplog.text
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for store in stores:
            store.close()
        await master.close()
        master_store.close()
