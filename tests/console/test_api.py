"""The console's JSON API against an in-process cluster (classic mode, one broker group)."""

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.console.server import Console
from ferrymq.testing import LocalCluster


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, Console]]:
    async with (
        LocalCluster(tmp_path) as cluster,
        Console(cluster.namesrv_addr, port=0, interval=0.2) as served,
    ):
        yield cluster, served


async def test_pages_numbers_match_the_admin_api(console: tuple[LocalCluster, Console]) -> None:
    cluster, served = console
    async with (
        httpx.AsyncClient(base_url=served.url, timeout=10) as http,
        AdminClient(cluster.namesrv_addr) as admin,
        Producer(cluster.namesrv_addr) as producer,
        PullConsumer(cluster.namesrv_addr, "console-readers") as consumer,
    ):
        created = await http.post(
            "/api/actions/create-topic", json={"topic": "orders", "queues": 2}
        )
        assert created.status_code == 200, created.text
        sent = [await producer.send("orders", b"o%d" % i, keys=f"k{i}") for i in range(10)]
        queue = sent[0].queue
        await consumer.commit(queue, 2)

        topic = (await http.get("/api/topics/orders")).json()
        status = await admin.topic_status("orders")
        assert {(q["broker_name"], q["queue_id"], q["max_offset"]) for q in topic["queues"]} == {
            (e.broker_name, e.queue_id, e.max_offset) for e in status
        }
        assert sum(q["messages"] for q in topic["queues"]) == 10
        listed = (await http.get("/api/topics")).json()["topics"]
        assert [(t["topic"], t["messages"]) for t in listed] == [("orders", 10)]

        assert "console-readers" in (await http.get("/api/groups")).json()["groups"][0]["group"]
        group = (await http.get("/api/groups/console-readers")).json()
        progress = await admin.consumer_progress("console-readers")
        assert {(q["queue_id"], q["lag"]) for q in group["queues"]} == {
            (e.queue_id, e.broker_offset - max(e.consumer_offset, 0)) for e in progress
        }

        by_key = (await http.get("/api/messages", params={"topic": "orders", "key": "k3"})).json()
        assert [m["body"] for m in by_key["messages"]] == ["o3"]
        found_id = by_key["messages"][0]["offset_msg_id"]
        by_id = await http.get("/api/messages", params={"id": found_id})
        assert by_id.json()["messages"][0]["keys"] == ["k3"]
        assert by_id.json()["messages"][0]["broker_name"] == by_key["messages"][0]["broker_name"]

        reset = await http.post(
            "/api/actions/reset-offsets",
            json={"group": "console-readers", "topic": "orders", "to": "latest"},
        )
        assert reset.status_code == 200, reset.text
        assert await consumer.committed(queue) == sum(1 for s in sent if s.queue == queue)

        state = (await http.get("/api/cluster")).json()
        assert state["controller_mode"] is False
        (group_row,) = state["groups"]
        assert group_row["master_address"] == cluster.broker.address
        assert group_row["replicas"][0]["max_log_offset"] > 0
        spec = (await http.get("/api/openapi.json")).json()
        assert "/api/actions/elect-master" in spec["paths"]
        page = await http.get("/groups")
        assert page.status_code == 200
        assert "console.js" in page.text


async def test_bad_inputs_are_typed_4xx(console: tuple[LocalCluster, Console]) -> None:
    _, served = console
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as http:
        cases = [
            ("post", "/api/actions/create-topic", {"topic": "bad topic!"}, 400, "bad_request"),
            ("post", "/api/actions/create-topic", {"topic": "t", "queues": 0}, 400, "bad_request"),
            ("post", "/api/actions/create-topic", {"topic": "t", "x": 1}, 400, "bad_request"),
            ("get", "/api/topics/nosuch", None, 404, "not_found"),
            ("get", "/api/messages", None, 400, "bad_request"),
            ("get", "/api/messages?id=zz", None, 400, "bad_request"),
            ("post", "/api/actions/elect-master", {"broker_name": "broker-a"}, 409, "refused"),
            (
                "post",
                "/api/actions/reset-offsets",
                {"group": "g", "topic": "nosuch", "to": "earliest"},
                404,
                "not_found",
            ),
            (
                "post",
                "/api/actions/reset-offsets",
                {"group": "g", "topic": "t", "to": "timestamp"},
                400,
                "bad_request",
            ),
            ("get", "/api/nothing", None, 404, "not_found"),
        ]
        for method, path, body, status, kind in cases:
            response = await http.request(method, path, json=body)
            assert (response.status_code, response.json()["error"]) == (status, kind), (
                path,
                body,
                response.text,
            )
            assert response.json()["message"]
        unset = (await http.get("/api/connectors")).json()
        assert unset == {"configured": False, "url": None, "connectors": []}
