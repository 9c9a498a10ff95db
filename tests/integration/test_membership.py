"""Group membership with member data and session timeouts (issue 18) on an in-process broker:
what Connect workers heartbeat with, and what GET_GROUP_MEMBERS answers."""

import asyncio
import time
from pathlib import Path

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.membership import GroupMembers, GroupMembership
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire.bodies import ConsumerData, HeartbeatData, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

TOPIC = "ConnectConfigs"
GROUP = "connect-c1"


async def _cluster(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path)
    await cluster.start()
    try:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
    except BaseException:
        await cluster.close()
        raise
    return cluster


async def _until_ids(
    members: GroupMembership, wanted: list[str], timeout: float = 10.0
) -> GroupMembers:
    deadline = time.monotonic() + timeout
    while True:
        found = await members.members()
        if [m.client_id for m in found.members] == wanted:
            return found
        assert time.monotonic() < deadline, f"members {found.members}, wanted {wanted}"
        await asyncio.sleep(0.02)


async def test_members_carry_their_data_and_a_silent_one_leaves_after_its_session(
    tmp_path: Path,
) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with GroupMembership(cluster.namesrv_addr, TOPIC, GROUP) as members:
            await members.heartbeat("w1", '{"url": "http://w1"}', 60_000)
            await members.heartbeat("w2", '{"url": "http://w2"}', 1_000)
            found = await members.members()
            assert found.broker_addr == cluster.broker.address
            assert [(m.client_id, m.member_data) for m in found.members] == [
                ("w1", '{"url": "http://w1"}'),
                ("w2", '{"url": "http://w2"}'),
            ]
            assert all(0 <= m.last_heartbeat_ago_ms < 1_000 for m in found.members)
            await members.heartbeat("w1", '{"url": "http://w1", "tasks": 3}', 60_000)
            silent_since = time.monotonic()

            # w1 keeps heartbeating; w2 goes silent and leaves after its 1 s session
            async def keep_alive() -> None:
                for _ in range(40):
                    await members.heartbeat("w1", '{"url": "http://w1", "tasks": 3}', 60_000)
                    await asyncio.sleep(0.1)

            alive = asyncio.get_running_loop().create_task(keep_alive())
            try:
                found = await _until_ids(members, ["w1"])
            finally:
                alive.cancel()
            gone_after = time.monotonic() - silent_since
            assert 1.0 <= gone_after < 3.0, gone_after
            assert found.members[0].member_data == '{"url": "http://w1", "tasks": 3}'
            await members.leave("w1")
            assert (await members.members()).members == []
    finally:
        await cluster.close()


async def test_a_closed_connection_leaves_at_once(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with GroupMembership(cluster.namesrv_addr, TOPIC, GROUP) as watcher:
            worker = GroupMembership(cluster.namesrv_addr, TOPIC, GROUP)
            await worker.heartbeat("w9", "data", 120_000)
            assert [m.client_id for m in (await watcher.members()).members] == ["w9"]
            closed_at = time.monotonic()
            await worker.close()
            await _until_ids(watcher, [], timeout=2.0)
            assert time.monotonic() - closed_at < 1.0
    finally:
        await cluster.close()


async def test_master_since_tells_a_fresh_membership_table_from_an_absence(
    tmp_path: Path,
) -> None:
    cluster = await _cluster(tmp_path)
    try:
        await asyncio.sleep(0.3)
        async with GroupMembership(cluster.namesrv_addr, TOPIC, GROUP) as members:
            await members.heartbeat("w1", "", 30_000)
            before = await members.members()
            assert before.master_since_ms >= 300
            await cluster.restart_broker(0)
            members.routes.invalidate(TOPIC)
            after = await members.members()
            assert after.members == []  # the new broker heard nobody yet ...
            assert after.master_since_ms < before.master_since_ms  # ... and says it just began
            await asyncio.sleep(0.2)
            assert (await members.members()).master_since_ms >= after.master_since_ms + 150
    finally:
        await cluster.close()


async def test_bad_member_fields_are_refused_with_the_field_named(tmp_path: Path) -> None:
    cluster = await _cluster(tmp_path)
    try:
        async with (
            GroupMembership(cluster.namesrv_addr, TOPIC, GROUP) as members,
            RpcClient() as client,
        ):
            with pytest.raises(ValueError, match="session_timeout_ms"):
                await members.heartbeat("w1", "", 999)
            with pytest.raises(ValueError, match="member_data"):
                await members.heartbeat("w1", "x" * 8193, 5_000)
            await members.heartbeat("w1", "é" * 4096, 5_000)  # 8 KiB of UTF-8 exactly
            for consumer, field in (
                (ConsumerData(group_name=GROUP, session_timeout_ms=500), "sessionTimeoutMs"),
                (ConsumerData(group_name=GROUP, session_timeout_ms=120_001), "sessionTimeoutMs"),
                (ConsumerData(group_name=GROUP, member_data="é" * 4097), "memberData"),
            ):
                body = encode_body(HeartbeatData(client_id="raw", consumer_data_set=[consumer]))
                response = await client.call(
                    cluster.broker.address,
                    RemotingCommand(code=RequestCode.HEART_BEAT, body=body),
                    5,
                )
                assert response.code == ResponseCode.INVALID_PARAMETER
                assert field in (response.remark or "")
            # nothing of a refused heartbeat was registered
            assert [m.client_id for m in (await members.members()).members] == ["w1"]
    finally:
        await cluster.close()
