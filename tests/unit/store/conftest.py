from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ferrymq.store.config import StoreConfig
from ferrymq.store.store import Store
from ferrymq.wire.records import pack_host

BORN = pack_host("127.0.0.1", 40000)

OpenStore = Callable[..., Store]


def small_config(root: Path, **overrides: object) -> StoreConfig:
    """Tiny segments so tests roll files, with flushes only when asked."""
    base = StoreConfig(
        root_dir=root,
        commitlog_segment_bytes=4096,
        consume_queue_entries=16,
        index_slot_count=32,
        index_max_entries=20,
        flush_interval=3600.0,
        checkpoint_interval=3600.0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[OpenStore]:
    opened: list[Store] = []

    def _open(**overrides: object) -> Store:
        store = Store.open(small_config(tmp_path / "store", **overrides))
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
