"""Connect on real processes: ferrymq in controller mode with 3 replicas and N worker processes.

Issue 18's must-shows: a kill -9 of the leader (at a random moment and at the named crash points)
while clients write to followers; two leaders (workers started at once, a SIGSTOPped leader that
resumes, a stale append, a plain send); the config through kill -9 of every worker; a worker's
kill -9 moving only its tasks; a burst of creations; a kill -9 of the config topic's broker
master. Connectors are PAUSED or STOPPED here (tasks assigned, no Spark query): the data path is
tested with real Spark elsewhere.
"""

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedTopicWriter
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster
from ferrymq.errors import FencedError, FerryError

from .connect_cluster import (
    GRACE_S,
    check_epochs,
    cluster_view,
    connect_cluster,
    converged,
    leader,
    paused,
    raw_log,
    rest,
    start_worker,
    url,
)

pytestmark = pytest.mark.system
log = logging.getLogger(__name__)

CONFIG_TOPIC = "connector-config-topic"

# ---------------------------------------------------------------------- a model of one connector

State = tuple[str, str] | None
"""(the config's x, the target state) or absent."""


@dataclass
class Op:
    kind: str
    value: str
    status: int
    message: str = ""


def _apply(kind: str, value: str, state: State) -> tuple[bool, State]:
    """Whether the op succeeds on `state`, and the state after it."""
    if kind == "create":
        return (True, (value, "PAUSED")) if state is None else (False, state)
    if state is None:
        return False, None
    if kind == "patch":
        return True, (value, state[1])
    if kind == "pause":
        return True, (state[0], "PAUSED")
    if kind == "stop":
        return True, (state[0], "STOPPED")
    return True, None  # delete


def possible_states(ops: list[Op]) -> set[State]:
    """Every state the connector may be in after `ops` (2xx applied, 504 maybe, else not)."""
    states: set[State] = {None}
    for op in ops:
        after: set[State] = set()
        for state in states:
            ok, nxt = _apply(op.kind, op.value, state)
            if 200 <= op.status < 300:
                if ok:  # applied: only states where it could succeed remain
                    after.add(nxt)
            elif op.status == 504:  # it may or may not have landed
                after.update({state, nxt} if ok else {state})
            elif op.status == 404 or (op.status == 409 and "already exists" in op.message):
                if not ok:  # refused by the leader's decision: it could not apply
                    after.add(state)
            else:  # 409 without a (reachable) leader, 400: nothing was written
                after.add(state)
        states = after
    return states


REQUESTS: dict[str, Callable[[str, str], tuple[str, str, Any]]] = {
    "create": lambda name, v: (
        "POST",
        "/connectors",
        {"name": name, "config": paused(x=v), "initial_state": "PAUSED"},
    ),
    "patch": lambda name, v: ("PATCH", f"/connectors/{name}/config", {"x": v}),
    "pause": lambda name, v: ("PUT", f"/connectors/{name}/pause", None),
    "stop": lambda name, v: ("PUT", f"/connectors/{name}/stop", None),
    "delete": lambda name, v: ("DELETE", f"/connectors/{name}", None),
}


@dataclass
class Writers:
    """Clients writing to followers, each owning its connectors (so each one's ops are ordered)."""

    cluster: ProcessCluster
    leader_id: str
    ops: dict[str, list[Op]] = field(default_factory=dict)
    statuses: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def followers(self) -> list[str]:
        running = [w for w, c in self.cluster.workers.items() if c.running]
        others = [w for w in running if w != self.leader_id]
        return others or running

    async def client(self, index: int, seed: int) -> None:
        rng = random.Random(seed)
        names = [f"c{index}-{j}" for j in range(2)]
        for name in names:
            self.ops[name] = []
        async with httpx.AsyncClient(timeout=30) as http:
            for step in range(400):
                if self.stop.is_set():
                    return
                name = rng.choice(names)
                kind = rng.choice(["create", "create", "patch", "patch", "pause", "stop", "delete"])
                value = f"{index}-{step}"
                method, path, body = REQUESTS[kind](name, value)
                worker = rng.choice(self.followers())
                try:
                    answer = await http.request(method, url(self.cluster, worker) + path, json=body)
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)  # that worker is gone: nothing was sent
                    continue
                except httpx.HTTPError:
                    self.ops[name].append(Op(kind, value, 504, "client saw no answer"))
                    continue
                message = answer.json().get("message", "") if answer.content else ""
                self.statuses.append(answer.status_code)
                self.ops[name].append(Op(kind, value, answer.status_code, message))
                if answer.status_code == 409 and "already exists" not in message:
                    await asyncio.sleep(0.05)


def observed(view: dict[str, Any], statuses: dict[str, str]) -> dict[str, State]:
    return {
        name: (entry["info"]["config"].get("x", ""), statuses[name]) for name, entry in view.items()
    }


async def _statuses(base: str) -> dict[str, str]:
    view = (await rest(base, "GET", "/connectors", expand=["status"])).json()
    return {name: entry["status"]["connector"]["state"] for name, entry in view.items()}


@pytest.mark.parametrize("crash", ["kill", "after_append_before_ack", "after_ack_before_apply"])
async def test_kill_9_of_the_leader_while_clients_write_to_followers(
    tmp_path: Path, crash: str
) -> None:
    async with connect_cluster(tmp_path, 0) as cluster:
        hooks = (
            {} if crash == "kill" else {"FERRYMQ_TEST_HOOKS": "1", "FERRYMQ_TEST_CRASH_AT": crash}
        )
        await start_worker(cluster, "w1", env=hooks)  # alone first: it claims epoch 1
        assert await leader(cluster) == "w1"
        await asyncio.gather(start_worker(cluster, "w2"), start_worker(cluster, "w3"))
        old_epoch = (await cluster_view(cluster, "w2"))["epoch"]
        writers = Writers(cluster, "w1")
        clients = [asyncio.create_task(writers.client(i, 1000 + i)) for i in range(4)]
        if crash == "kill":
            await asyncio.sleep(1.5)
            cluster.workers["w1"].kill()
        # (at a crash point, w1 exits by itself at its first write)
        await asyncio.wait_for(cluster.workers["w1"].process.wait(), 60)
        killed_at = time.monotonic()
        while (await cluster_view(cluster, "w2"))["epoch"] == old_epoch:
            assert time.monotonic() - killed_at < 30, "no new claim"
            await asyncio.sleep(0.02)
        claim_gap = time.monotonic() - killed_at
        new_leader = await leader(cluster)
        assert new_leader in ("w2", "w3")
        writers.leader_id = new_leader
        await asyncio.sleep(3)
        writers.stop.set()
        await asyncio.gather(*clients)
        assert writers.statuses, "no write was answered"
        assert 500 not in writers.statuses
        assert set(writers.statuses) <= {200, 201, 202, 204, 400, 404, 409, 504}
        acked = sum(200 <= s < 300 for s in writers.statuses)
        assert acked > 0
        view = await converged(cluster)
        states = observed(view, await _statuses(url(cluster, new_leader)))
        for name, ops in writers.ops.items():
            assert states.get(name) in possible_states(ops), (name, states.get(name), ops)
        check_epochs(await raw_log(url(cluster, new_leader)))
        log.info(
            "%s: a new claim %.2f s after the leader died (grace %s s)", crash, claim_gap, GRACE_S
        )


async def test_two_leaders_are_impossible(tmp_path: Path) -> None:
    async with connect_cluster(tmp_path, 3) as cluster:  # started at once on an empty log
        first = await leader(cluster)
        log = await raw_log(url(cluster, first))
        claims = [r for r in log if r["kind"] == "Claim"]
        assert [c["record"]["epoch"] for c in claims] == list(range(1, len(claims) + 1))
        base = url(cluster, first)
        created = await rest(
            base,
            "POST",
            "/connectors",
            {"name": "a", "config": paused(), "initial_state": "PAUSED"},
        )
        assert created.status_code == 201
        # SIGSTOP the leader until another claims; then a write straight to the old leader
        cluster.workers[first].suspend()
        others = [w for w in cluster.workers if w != first]
        deadline = time.monotonic() + 30
        while True:
            view = await cluster_view(cluster, others[0])
            if view["leader"]["worker_id"] not in ("", first):
                break
            assert time.monotonic() < deadline, "nobody claimed while the leader was stopped"
            await asyncio.sleep(0.05)
        second = view["leader"]["worker_id"]
        cluster.workers[first].resume()
        answer = await rest(base, "PATCH", "/connectors/a/config", {"x": "after"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Ferry-Leader"] == url(cluster, second)
        final = await converged(cluster)
        assert final["a"]["info"]["config"]["x"] == "after"
        log = await raw_log(url(cluster, second))
        check_epochs(log)
        # a stale raw append and a plain send are refused by the broker
        async with FencedTopicWriter(cluster.namesrv_addr, CONFIG_TOPIC) as writer:
            holder = await writer.holder()
            with pytest.raises(FencedError) as refused:
                await writer.append(b"{}", op="write", epoch=holder.epoch - 1, writer=first)
            assert refused.value.writer == second
        async with Producer(cluster.namesrv_addr, "stranger") as producer:
            with pytest.raises(FerryError):
                await producer.send(CONFIG_TOPIC, b'{"claim": true}')
        assert len(await raw_log(url(cluster, second))) == len(log)
        # the old leader restarted after the switchover comes back as a follower
        cluster.workers[first].kill()
        await cluster.workers[first].process.wait()
        await start_worker(cluster, first)
        assert await leader(cluster) == second
        assert (await cluster_view(cluster, first))["epoch"] == view["epoch"]


SEGMENT = 1 << 20


async def _force_retention(cluster: ProcessCluster) -> None:
    """Fill four commit-log segments, then delete every segment retention may take."""
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Filler", queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for _ in range(4 * SEGMENT // 4000 + 1):
            await producer.send("Filler", b"f" * 4000)
    await asyncio.sleep(1.5)  # the slaves caught up and every segment is flushed
    brokers = [child.addr for child in cluster.brokers.values() if child.running]
    async with AdminClient(cluster.namesrv_addr) as admin:
        master = await _master(cluster)
        for address in brokers:
            await admin.update_broker_config(address, {"fileReservedTime": "0"})
        for address in [b for b in brokers if b != master]:
            await admin.delete_expired_commit_log(address)
        assert await admin.delete_expired_commit_log(master) >= 3
        await asyncio.sleep(1.5)  # the master's copies reached the slaves
        for address in [b for b in brokers if b != master]:
            await admin.delete_expired_commit_log(address)


async def test_the_config_survives_kill_9_of_every_worker_and_retention(tmp_path: Path) -> None:
    flags = ("--mapped-file-size-commit-log", str(SEGMENT))
    async with connect_cluster(tmp_path, 3, broker_flags=flags) as cluster:
        base = url(cluster, await leader(cluster))
        for name in ("a", "b", "c", "d", "e"):
            body = {"name": name, "config": paused(), "initial_state": "PAUSED"}
            assert (await rest(base, "POST", "/connectors", body)).status_code == 201
        assert (
            await rest(base, "PATCH", "/connectors/a/config", {"tasks.max": "2"})
        ).status_code == 200
        assert (await rest(base, "PUT", "/connectors/b/stop")).status_code == 204
        assert (await rest(base, "DELETE", "/connectors/c")).status_code == 204
        recreate = {"name": "c", "config": paused("other"), "initial_state": "STOPPED"}
        assert (await rest(base, "POST", "/connectors", recreate)).status_code == 201
        before = await converged(cluster)
        log = await raw_log(base)
        incarnations = {
            r["record"]["incarnation"]
            for r in log
            if r["kind"] == "ConnectorPut" and r["record"]["name"] == "c"
        }
        assert len(incarnations) == 2
        for child in cluster.workers.values():
            child.kill()
        for child in list(cluster.workers.values()):
            await child.process.wait()
        del cluster.workers["w2"]
        await start_worker(cluster, "w3")
        await start_worker(cluster, "w1")
        await leader(cluster)
        after = await converged(cluster)
        assert after == before
        assert len(after["c"]["info"]["tasks"]) == 0  # the new incarnation is STOPPED
        assert after["c"]["info"]["config"]["topics"] == "other"
        # every worker down, every segment retention may take deleted, then a new worker
        for child in cluster.workers.values():
            child.kill()
        for child in list(cluster.workers.values()):
            await child.process.wait()
        cluster.workers.clear()
        await _force_retention(cluster)
        async with PullConsumer(cluster.namesrv_addr, "check") as consumer:
            queue = (await consumer.queues(CONFIG_TOPIC))[0]
            assert await consumer.min_offset(queue) > 0  # the originals are gone
        await start_worker(cluster, "w2")
        await leader(cluster)
        assert await converged(cluster) == before


async def test_a_dead_worker_s_tasks_move_and_no_other_task_restarts(tmp_path: Path) -> None:
    async with connect_cluster(tmp_path, 3) as cluster:
        base = url(cluster, await leader(cluster))
        for i in range(6):
            body = {"name": f"p{i}", "config": paused(), "initial_state": "PAUSED"}
            assert (await rest(base, "POST", "/connectors", body)).status_code == 201

        async def placements() -> dict[str, tuple[str, int, int, str]]:
            found: dict[str, tuple[str, int, int, str]] = {}
            view = (await rest(base, "GET", "/connectors", expand=["status"])).json()
            for name, entry in view.items():
                task = entry["status"]["tasks"][0]
                extra = task["ferrymq"]
                found[name] = (
                    task["worker_id"],
                    extra.get("generation", 0),
                    extra.get("starts", -1),
                    task["state"],
                )
            return found

        deadline = time.monotonic() + 30
        while True:
            # one reading: a task's start count is shown only with its report (PAUSED), and a
            # report arriving between two readings made "before" hold starts -1 (not shown)
            before = await placements()
            if len({w for w, _, _, _ in before.values()}) == 3 and all(
                starts >= 0 and state == "PAUSED" for _, _, starts, state in before.values()
            ):
                break
            assert time.monotonic() < deadline, before
            await asyncio.sleep(0.1)
        current = await leader(cluster)
        victim = next(w for w in ("w1", "w2", "w3") if w != current)
        moved = {name for name, (worker, _, _, _) in before.items() if worker == victim}
        assert moved
        cluster.workers[victim].kill()
        killed_at = time.monotonic()
        while True:
            after = await placements()
            if all(after[n][0] not in (victim, "") for n in moved):
                break
            assert time.monotonic() - killed_at < 30, after
            await asyncio.sleep(0.1)
        log.info("the dead worker's tasks moved in %.2f s", time.monotonic() - killed_at)
        for name, placement in before.items():
            if name not in moved:
                assert after[name] == placement  # same worker, generation, start count, state
            else:
                assert after[name][1] > placement[1]  # a newer fencing generation
        # a burst of 50 creations at once: every one 201, few assignment records
        log_before = len(await raw_log(base))

        async def create(i: int) -> int:
            body = {"name": f"burst{i}", "config": paused(), "initial_state": "PAUSED"}
            follower = [w for w, c in cluster.workers.items() if c.running][i % 2]
            return (
                await rest(url(cluster, follower), "POST", "/connectors", body, timeout=60)
            ).status_code

        codes = await asyncio.gather(*(create(i) for i in range(50)))
        assert codes == [201] * 50
        await asyncio.sleep(2)
        burst = (await raw_log(base))[log_before:]
        assignments = [r for r in burst if r["kind"] == "Assignment"]
        assert len([r for r in burst if r["kind"] == "ConnectorPut"]) == 50
        assert 1 <= len(assignments) <= 10, len(assignments)


async def test_kill_9_of_the_config_broker_master_during_config_writes(tmp_path: Path) -> None:
    async with connect_cluster(tmp_path, 2) as cluster:
        leader_id = await leader(cluster)
        writers = Writers(cluster, leader_id)
        clients = [asyncio.create_task(writers.client(i, 2000 + i)) for i in range(3)]
        await asyncio.sleep(1.0)
        async with FencedTopicWriter(cluster.namesrv_addr, CONFIG_TOPIC) as writer:
            fence_before = await writer.holder()
        master_addr = await _master(cluster)
        master = next(name for name, child in cluster.brokers.items() if child.addr == master_addr)
        cluster.brokers[master].kill()
        await asyncio.sleep(6)
        writers.stop.set()
        await asyncio.gather(*clients)
        assert 500 not in writers.statuses
        final_leader = await leader(cluster)
        view = await converged(cluster, timeout=40)
        states = observed(view, await _statuses(url(cluster, final_leader)))
        for name, ops in writers.ops.items():
            assert states.get(name) in possible_states(ops), (name, states.get(name), ops)
        async with FencedTopicWriter(cluster.namesrv_addr, CONFIG_TOPIC) as writer:
            fence_after = await writer.holder()
        assert fence_after.epoch >= fence_before.epoch
        check_epochs(await raw_log(url(cluster, final_leader)))


async def _master(cluster: ProcessCluster) -> str:
    async with AdminClient(cluster.namesrv_addr) as admin:
        route = await admin.route(CONFIG_TOPIC)
        assert route is not None
        return route.broker_datas[0].broker_addrs[0]


async def test_a_worker_killed_and_restarted_within_the_grace_gets_a_new_generation(
    tmp_path: Path,
) -> None:
    """Issue 19: a worker's Python killed -9 may leave its Spark driver writing for a moment, so
    its next process must not hold its tasks under the same fencing generation. The grace is long
    here so the restart is always within it: the tasks stay on the worker (nothing moves), under a
    higher generation given to the new process's run; the other worker's tasks are untouched."""
    grace = ("--task-reassign-grace-ms", "60000")
    async with connect_cluster(tmp_path, 2, replicas=1, controllers=0, extra=grace) as cluster:
        base = url(cluster, await leader(cluster))
        for i in range(4):
            body = {"name": f"p{i}", "config": paused(), "initial_state": "PAUSED"}
            assert (await rest(base, "POST", "/connectors", body)).status_code == 201

        async def placements() -> dict[str, tuple[str, str, int]]:
            view = (await rest(base, "GET", "/connectors", expand=["status"])).json()
            return {
                name: (task["worker_id"], task["state"], task["ferrymq"].get("generation", 0))
                for name, entry in view.items()
                for task in entry["status"]["tasks"]
            }

        async def runs() -> dict[str, str]:
            members = (await rest(base, "GET", "/cluster")).json()["members"]
            return {m["worker_id"]: m["run"] for m in members}

        deadline = time.monotonic() + 30
        while True:
            before = await placements()
            states = {state for _, state, _ in before.values()}
            if len({w for w, _, _ in before.values()}) == 2 and states == {"PAUSED"}:
                break
            assert time.monotonic() < deadline, before
            await asyncio.sleep(0.1)
        victim = "w2" if await leader(cluster) == "w1" else "w1"
        old_run = (await runs())[victim]
        cluster.workers[victim].kill()
        await start_worker(cluster, victim, extra=grace)
        mine = [name for name, (worker, _, _) in before.items() if worker == victim]
        deadline = time.monotonic() + 30
        while True:
            after = await placements()
            if all(after[n][1] == "PAUSED" and after[n][2] > before[n][2] for n in mine):
                break
            assert time.monotonic() < deadline, (before, after)
            await asyncio.sleep(0.1)
        for name, (worker, state, generation) in before.items():
            if worker == victim:
                assert after[name][:2] == (victim, state)  # nothing moved
                assert after[name][2] > generation  # held under a newer fencing generation
            else:
                assert after[name] == (worker, state, generation)
        assert (await runs())[victim] not in ("", old_run)
