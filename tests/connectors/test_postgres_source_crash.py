"""PostgresSource into ferrymq across kill -9 of its driver, while transactions commit out of order.

Writers insert rows from a sequence in concurrent transactions that commit in a different order
than their ids (some hold their rows for 4 s while others commit), so a poller keyed by
"id > last id" would skip rows. The driver (`driver.py`) is killed mid-stream, restarted from
its checkpoint, and every row must be in the topic exactly once.
"""

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ..spark.conftest import Ferry
from .conftest import (
    create_topic,
    end_offsets,
    read_topic,
    start_driver,
    stop_driver,
    wait_until,
)
from .postgres import Database

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


class Writers:
    """Threads inserting rows in transactions that commit out of id order, until stopped."""

    def __init__(self, url: str, seed: int, threads: int = 4, late_every: int = 10) -> None:
        self.url = url
        self.seed = seed
        self.stopped = threading.Event()
        self.errors: list[BaseException] = []
        self.out_of_order = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i, late_every), daemon=True)
            for i in range(threads)
        ]
        self._lock = threading.Lock()
        self._last_committed = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self._threads:
            thread.join(30)
        assert not self.errors, self.errors

    def _run(self, index: int, late_every: int) -> None:
        rng = random.Random(self.seed + index)
        deadline = time.monotonic() + 240
        try:
            with psycopg.connect(self.url) as conn:
                turn = 0
                while not self.stopped.is_set() and time.monotonic() < deadline:
                    turn += 1
                    rows = rng.randint(1, 20)
                    ids = conn.execute(
                        "INSERT INTO events (body) SELECT 'w' || %s || '-' || g "
                        "FROM generate_series(1, %s) g RETURNING id",
                        [index, rows],
                    ).fetchall()
                    # one in `late_every` transactions holds its rows across several micro-batches
                    time.sleep(4 if turn % late_every == index else rng.uniform(0, 0.03))
                    conn.commit()
                    with self._lock:
                        if min(i for (i,) in ids) < self._last_committed:
                            self.out_of_order += 1
                        self._last_committed = max(self._last_committed, max(i for (i,) in ids))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)


def topic_size(servers: str, topic: str) -> int:
    return sum(asyncio.run(end_offsets(servers, topic)).values())


@pytest.mark.timeout(300)
def test_source_is_exactly_once_across_kill_9_with_out_of_order_commits(
    ferry: Ferry, database: Database, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    topic = "pgsrc-events"
    asyncio.run(create_topic(ferry.servers, topic, 4))
    database.query("CREATE TABLE events (id bigserial PRIMARY KEY, body text NOT NULL)")
    log = tmp_path / "driver.log"
    args: dict[str, Any] = {
        "plugin": "PostgresSource",
        "servers": ferry.servers,
        "connector": "pgsrc",
        "incarnation": "inc-1",
        "config": {
            "name": "pgsrc",
            "connector.class": "PostgresSource",
            **database.config,
            "mode": "incrementing",
            "incrementing.column.name": "id",
            "table.whitelist": "events",
            "topic.prefix": "pgsrc-",
            "message.key.column": "id",
            "poll.interval.ms": "200",
            "batch.max.rows": "1500",
        },
        "tasks": [{"task": 0, "generation": 1, "checkpoint": str(tmp_path / "cp")}],
    }
    writers = Writers(database.url, seed)
    writers.start()
    try:
        driver = start_driver(log, **args)
        try:
            wait_until("streaming", lambda: topic_size(ferry.servers, topic) >= 2000, driver, log)
            time.sleep(rng.uniform(0, 2))
        finally:
            stop_driver(driver)
        at_kill = topic_size(ferry.servers, topic)
        driver = start_driver(log, **args)
        try:
            wait_until(
                "streaming again",
                lambda: topic_size(ferry.servers, topic) >= at_kill + 2000,
                driver,
                log,
            )
            writers.stop()
            [(rows,)] = database.query("SELECT count(*) FROM events")
            wait_until(
                "caught up", lambda: topic_size(ferry.servers, topic) >= int(str(rows)), driver, log
            )
            time.sleep(1)  # anything more (a duplicate) would land now
        finally:
            stop_driver(driver)
    finally:
        writers.stop()

    assert writers.out_of_order > 0, "no transaction committed out of id order: nothing tested"
    ids = [json.loads(m.body)["id"] for m in asyncio.run(read_topic(ferry.servers, topic))]
    table = {int(str(i)) for (i,) in database.query("SELECT id FROM events")}
    assert len(ids) == len(set(ids)), f"seed {seed}: {len(ids) - len(set(ids))} duplicates"
    assert set(ids) == table, f"seed {seed}: missing {sorted(table - set(ids))[:20]}"
