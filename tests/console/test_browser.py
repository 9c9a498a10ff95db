"""The web console in headless chromium against `ferry up`, under load, with a master killed.

One test walks every page (a screenshot of each in artefacts/console/, path printed), reads the
numbers the pages show from the live DOM over the DevTools protocol and checks them against the
admin API, and kills broker-a's master in the middle of the load: the SyncStateSet page must show
the new master within a few seconds. After the load: the groups page's lag chart follows the
admin API's lag while messages are produced and not consumed, a message is looked up by its id,
and offsets are reset and a topic created through the pages' confirmation dialogs.
"""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue

from .cdp import Page, chromium_path, open_page

# ferry up alone took 72 s at load 16 on 2 cores (3 controllers, 3 brokers, 2 workers, console)
pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.timeout(300)]

ARTEFACTS = Path(__file__).resolve().parents[2] / "artefacts" / "console"
TOPIC = "console-load"
GROUP = "console-readers"
LOAD_MESSAGES = 3000
LOAD_SECONDS = 60.0
NEW_MASTER_WITHIN_S = 20.0


@contextlib.asynccontextmanager
async def ferry_up(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    ready = tmp_path / "up.json"
    log = (tmp_path / "up.log").open("ab")
    process = subprocess.Popen(  # noqa: ASYNC220 - returns at once; waited on in a thread
        [
            *[sys.executable, "-m", "ferrymq.cmd.ferry"],
            "up",
            "--data-dir",
            str(tmp_path / "data"),
            "--connect",
            "1",
            "--mapped-file-size-commit-log",
            str(16 * 1024 * 1024),
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert process.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "ferry up never became ready"
            await asyncio.sleep(0.1)
        yield json.loads(ready.read_text())
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 60)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait, 10)
        log.close()


async def produce(namesrv: str, stop: asyncio.Event, acked: list[str]) -> None:
    """Up to LOAD_MESSAGES sends (about 150/s), retried through the failover; keys recorded."""
    deadline = time.monotonic() + LOAD_SECONDS
    async with Producer(namesrv, send_timeout=2.0) as producer:
        for i in range(LOAD_MESSAGES):
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    await producer.send(TOPIC, b"load %d" % i, keys=f"key-{i}")
                    acked.append(f"key-{i}")
                    break
                except FerryError:
                    await asyncio.sleep(0.2)
            if stop.is_set() or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.005)


async def consume(consumer: PullConsumer, queues: list[MessageQueue], stop: asyncio.Event) -> None:
    """Read queues 0 and 1 and commit as it goes (queues 2 and 3 are left to lag)."""
    offsets = dict.fromkeys(queues[:2], 0)
    while not stop.is_set():
        for queue, offset in offsets.items():
            with contextlib.suppress(FerryError):
                result = await consumer.pull(queue, offset, max_messages=64)
                if result.status is PullStatus.FOUND:
                    offsets[queue] = result.next_offset
                    await consumer.commit(queue, result.next_offset)
        await asyncio.sleep(0.1)


async def shows(page: Page, selector: str, attribute: str) -> Any:
    """An attribute of the first element matching `selector`, or null."""
    return await page.evaluate(
        f"(e => e ? e.getAttribute({json.dumps(attribute)}) : null)"
        f"(document.querySelector({json.dumps(selector)}))"
    )


async def admin_lag(admin: AdminClient) -> int:
    """The group's lag as the admin API gives it: queue ends less committed offsets."""
    progress = await admin.consumer_progress(GROUP)
    return sum(max(0, e.broker_offset - max(e.consumer_offset, 0)) for e in progress)


async def test_console_pages_under_load_with_a_failover(tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {ARTEFACTS}")  # noqa: T201 - where the artefacts are
    async with ferry_up(tmp_path) as info, open_page(tmp_path / "profile") as page:
        url, namesrv = info["console"], info["namesrv"]
        connect_url = info["connect"][0]["url"]
        async with (
            AdminClient(namesrv) as admin,
            Producer(namesrv) as producer,
            PullConsumer(namesrv, GROUP) as consumer,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await admin.create_topic(TOPIC, queues=4)
            created = await http.post(
                f"{connect_url}/connectors",
                json={
                    "name": "files-out",
                    "config": {
                        "connector.class": "FileSink",
                        "topics": TOPIC,
                        "file.path": str(tmp_path / "out"),
                    },
                    "initial_state": "STOPPED",
                },
            )
            assert created.status_code == 201, created.text
            queues = sorted(await consumer.queues(TOPIC), key=lambda q: q.queue_id)
            stop, acked = asyncio.Event(), list[str]()
            load = [
                asyncio.create_task(produce(namesrv, stop, acked)),
                asyncio.create_task(consume(consumer, queues, stop)),
            ]
            try:
                await page.goto(f"{url}/cluster")
                row = '[data-group="broker-a"]'
                old_master = await page.wait_for(
                    f"document.querySelector('{row}')?.dataset.masterAddress"
                )
                await page.wait_for("document.querySelectorAll('[data-replica]').length === 3")
                await page.screenshot(ARTEFACTS / "cluster.png")
                while len(acked) < 300:  # under load before the kill
                    await asyncio.sleep(0.1)

                (master,) = [b for b in info["brokers"] if b["addr"] == old_master]
                os.kill(master["pid"], signal.SIGKILL)
                killed_at = time.monotonic()
                new_master = await page.wait_for(
                    f"(a => a && a !== 'null' && a !== {json.dumps(old_master)} && a)"
                    f"(document.querySelector('{row}')?.dataset.masterAddress)",
                    timeout=NEW_MASTER_WITHIN_S,
                )
                shown_after = time.monotonic() - killed_at
                print(f"new master on the page {shown_after:.2f} s after the kill")  # noqa: T201
                await page.screenshot(ARTEFACTS / "cluster-after-failover.png")
                controllers = await admin.controllers()
                assert controllers is not None
                replicas = (await controllers.sync_state_data(["broker-a"])).replicas_info_table
                assert new_master == replicas["broker-a"].master_address
                epoch = await shows(page, row, "data-master-epoch")
                assert int(epoch) == replicas["broker-a"].master_epoch > 1

                # elect master through the page: the live master designated, so it stays
                new_id = replicas["broker-a"].master_broker_id
                await page.evaluate(
                    "(() => { const f = document.getElementById('elect-master');"
                    f"f.broker_name.value = 'broker-a'; f.broker_id.value = '{new_id}';"
                    "f.requestSubmit(); document.getElementById('confirm-yes').click(); })()"
                )
                elected = await page.wait_for(
                    "document.getElementById('notice').dataset.kind === 'ok' && "
                    "document.getElementById('notice').textContent"
                )
                assert '"still_exists":true' in elected
                assert f'"master_broker_id":{new_id}' in elected

                await page.goto(f"{url}/controller")
                await page.wait_for("!!document.querySelector('[data-election=\"broker-a\"]')")
                assert await shows(page, '[data-election="broker-a"]', "data-epoch") == epoch
                leaders = await page.evaluate(
                    "[...document.querySelectorAll('[data-leader=\"yes\"]')].length"
                )
                assert leaders == 1
                await page.screenshot(ARTEFACTS / "controller.png")

                while len(acked) < 600:  # the load goes on on the new master
                    await asyncio.sleep(0.1)
            finally:
                stop.set()
                await asyncio.gather(*load)

            # the load is over: every figure the pages show is the admin API's
            total = sum(e.max_offset for e in await admin.topic_status(TOPIC))
            assert total >= len(acked)
            await page.goto(f"{url}/topics")
            shown = f"document.querySelector('[data-topic=\"{TOPIC}\"]')?.dataset.maxOffsetTotal"
            assert int(await page.wait_for(f"{shown} === '{total}' && {shown}")) == total
            await page.wait_for("!!document.querySelector('[data-chart] path')")
            await page.screenshot(ARTEFACTS / "topics.png")

            progress = await admin.consumer_progress(GROUP, TOPIC)
            lags = {
                f"{TOPIC}/{e.broker_name}/{e.queue_id}": e.broker_offset - max(e.consumer_offset, 0)
                for e in progress
            }
            assert sum(lags.values()) > 0
            await page.goto(f"{url}/groups?group={GROUP}")
            shown_lags = await page.wait_for(
                "(rows => rows.length === 4 && Object.fromEntries(rows.map("
                "r => [r.dataset.queue, Number(r.dataset.lag)])))"
                "([...document.querySelectorAll('tr[data-lag]')])"
            )
            assert shown_lags == lags

            # the lag chart: its points, and its latest one the admin API's lag, as it grows
            lag_line = f'[data-chart="Consumer lag (messages)"] path[data-key="{GROUP}"]'
            charted = (
                f"(p => p && Number(p.dataset.points) >= 2 && Number(p.dataset.latest))"
                f"(document.querySelector({json.dumps(lag_line)}))"
            )
            group_lag = await admin_lag(admin)
            assert group_lag == sum(lags.values())
            assert await page.wait_for(f"{charted} === {group_lag} && {charted}") == group_lag
            points = int(await shows(page, lag_line, "data-points"))
            extra = [
                await producer.send(TOPIC, b"after %d" % i, keys=f"after-{i}") for i in range(20)
            ]
            assert await admin_lag(admin) == group_lag + len(extra)  # nothing consumes now
            grown = group_lag + len(extra)
            assert await page.wait_for(f"{charted} === {grown} && {charted}") == grown
            assert int(await shows(page, lag_line, "data-points")) > points
            await page.screenshot(ARTEFACTS / "groups.png")

            # reset offsets, behind a confirmation that lists each queue's move
            await page.evaluate(
                "(() => { const f = document.getElementById('reset-offsets');"
                f"f.topic.value = '{TOPIC}'; f.to.value = 'latest'; f.requestSubmit(); }})()"
            )
            planned = await page.wait_for(
                "(rows => !document.getElementById('confirm').hidden && rows.length === 4 && "
                "Object.fromEntries(rows.map(r => [r.dataset.resetQueue, "
                "[Number(r.dataset.from), Number(r.dataset.to)]])))"
                "([...document.querySelectorAll('[data-reset-queue]')])"
            )
            await page.screenshot(ARTEFACTS / "reset-offsets-confirm.png")
            before = await admin.consumer_progress(GROUP, TOPIC)
            assert planned == {
                f"{e.broker_name}/{e.queue_id}": [e.consumer_offset, e.broker_offset]
                for e in before
            }
            text = await page.evaluate("document.getElementById('confirm-text').textContent")
            assert text == (
                f"Move group {GROUP}'s offsets in {TOPIC} to the latest? Lag {grown} → 0."
            )
            await page.evaluate("document.getElementById('confirm-yes').click()")
            await page.wait_for("document.getElementById('notice').dataset.kind === 'ok'")
            after = await admin.consumer_progress(GROUP, TOPIC)
            assert {f"{e.broker_name}/{e.queue_id}": e.consumer_offset for e in after} == {
                queue: to for queue, (_, to) in planned.items()
            }
            assert await admin_lag(admin) == 0

            await page.goto(f"{url}/messages")
            await page.evaluate(
                "(() => { const f = document.getElementById('by-key');"
                f"f.topic.value = '{TOPIC}'; f.key.value = '{acked[7]}';"
                "f.requestSubmit(); })()"
            )
            await page.wait_for("!!document.querySelector('[data-message]')")
            (found,) = await admin.messages_by_key(TOPIC, acked[7])
            assert await shows(page, "[data-message]", "data-message") == found.offset_msg_id
            await page.screenshot(ARTEFACTS / "messages.png")
            sent = extra[5]  # stored after the failover: its id names the live master
            await page.evaluate(
                "(() => { const f = document.getElementById('by-id');"
                f"f.id.value = '{sent.offset_msg_id}'; f.requestSubmit(); }})()"
            )
            row = f'[data-message="{sent.offset_msg_id}"]'
            shown_fields = await page.wait_for(
                f"(r => r && Object.fromEntries([...r.querySelectorAll('[data-field]')]"
                f".map(c => [c.dataset.field, c.textContent])))(document.querySelector('{row}'))"
            )
            assert shown_fields == {
                "topic": TOPIC,
                "queue": f"{sent.queue.broker_name}/{sent.queue.queue_id}",
                "offset": str(sent.queue_offset),
                "keys": "after-5",
                "tags": "",
                "id": sent.offset_msg_id,
                "body": "after 5",
            }
            await page.screenshot(ARTEFACTS / "message-by-id.png")

            await page.goto(f"{url}/connectors")
            await page.wait_for("!!document.querySelector('[data-connector=\"files-out\"]')")
            assert await shows(page, '[data-connector="files-out"]', "data-state") == "STOPPED"
            await page.screenshot(ARTEFACTS / "connectors.png")

            # an action, behind its confirmation; then a bad input, answered with its error
            await page.goto(f"{url}/topics")
            await page.evaluate(
                "(() => { const f = document.getElementById('create-topic');"
                "f.topic.value = 'made-in-console'; f.queues.value = '2'; f.requestSubmit(); })()"
            )
            await page.wait_for("!document.getElementById('confirm').hidden")
            await page.screenshot(ARTEFACTS / "create-topic-confirm.png")
            assert await admin.route("made-in-console") is None  # nothing before the confirm
            await page.evaluate("document.getElementById('confirm-yes').click()")
            await page.wait_for("document.getElementById('notice').dataset.kind === 'ok'")
            route = await admin.route("made-in-console")
            assert route is not None
            assert [q.write_queue_nums for q in route.queue_datas] == [2]
            await page.evaluate(
                "(() => { const f = document.getElementById('create-topic');"
                "f.topic.value = 'bad name!'; f.requestSubmit();"
                "document.getElementById('confirm-yes').click(); })()"
            )
            error = await page.wait_for(
                "document.getElementById('notice').dataset.kind === 'error' && "
                "document.getElementById('notice').textContent"
            )
            assert error.startswith("bad_request: invalid topic name 'bad name!'")
