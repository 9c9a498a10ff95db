"""Group membership with member data and a short session timeout (issue 18).

Members of a consumer group heartbeat to the master of one topic's broker group (a Connect
worker: group `connect-<clusterId>`, the config topic). Each heartbeat carries the member's data
(opaque text, at most 8 KiB) and its session timeout (1000..120000 ms): the broker drops a member
silent for that long, and at once when its connection closes. `members()` lists who is there
with their data and how long ago each was heard (GET_GROUP_MEMBERS); `master_since_ms` says how
long that broker has been master, so a master elected a moment ago (whose table is still
empty) is not taken for every member gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

from ferrymq import clock
from ferrymq.client.routing import Routes
from ferrymq.errors import ConnectError, FerryError, RemoteError, RpcError
from ferrymq.model import validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import (
    MAX_MEMBER_DATA_BYTES,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    ConsumerData,
    HeartbeatData,
    decode_body,
    encode_body,
)
from ferrymq.wire.bodies import GroupMembers as GroupMembersBody
from ferrymq.wire.broker import GetGroupMembersRequestHeader, UnregisterClientRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields

__all__ = ["GroupMembers", "GroupMembership", "Member"]

_RETRY_PAUSE_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Member:
    """One live member of a group."""

    client_id: str
    member_data: str
    last_heartbeat_ago_ms: int


@dataclass(frozen=True, slots=True)
class GroupMembers:
    """A group's members at one broker, and how long that broker has been master."""

    members: list[Member]
    master_since_ms: int
    broker_addr: str


class GroupMembership:
    """Heartbeats of one consumer group's members to the master of a topic's broker group."""

    def __init__(
        self,
        namesrv_addr: str,
        topic: str,
        group: str,
        *,
        timeout_s: float = 3.0,
        rpc: RpcClient | None = None,
    ) -> None:
        self.topic = validate_topic(topic)
        self.group = validate_group(group)
        self._timeout_s = timeout_s
        self._rpc = rpc or RpcClient()
        self._owns_rpc = rpc is None
        self.routes = Routes(self._rpc, [a.strip() for a in namesrv_addr.split(";") if a.strip()])

    async def close(self) -> None:
        """Close connections (when this object owns them): the broker drops its members."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _master(self, deadline: float, refresh: bool) -> str:
        """The master of the topic's broker group (waiting until `deadline` for one).

        Raises:
            FerryError: the topic's queues are on several broker groups.
            ConnectError: no master within the deadline.
            TopicNotFoundError: the topic has no route.
        """
        while True:
            route = await self.routes.get(self.topic, refresh=refresh)
            groups = sorted(route.brokers)
            if len(groups) > 1:
                raise FerryError(
                    f"topic {self.topic} is on {len(groups)} broker groups; membership needs one"
                )
            address = route.master(groups[0]) if groups else None
            if address is not None:
                return address
            if clock.mono() >= deadline:
                raise ConnectError(groups[0] if groups else self.topic, "no master")
            await asyncio.sleep(_RETRY_PAUSE_S)
            refresh = True

    async def _call(self, request: RemotingCommand) -> tuple[RemotingCommand, str]:
        """Send to the master, once more to a fresh route's master if the first was not sent.

        Raises:
            RemoteError: the broker refused.
            RpcError: no answer (ConnectError: surely not sent).
        """
        deadline = clock.mono() + self._timeout_s
        refresh = False
        while True:
            address = await self._master(deadline, refresh)
            try:
                response = await self._rpc.call(address, request, max(deadline - clock.mono(), 0.1))
            except RpcError as exc:
                if exc.request_sent or refresh or clock.mono() >= deadline:
                    raise
                self.routes.invalidate(self.topic)
                refresh = True
                continue
            if response.code == ResponseCode.NO_PERMISSION and not refresh:
                # not the master any more (a failover): nothing was registered; ask again
                self.routes.invalidate(self.topic)
                refresh = True
                continue
            if response.code != ResponseCode.SUCCESS:
                raise RemoteError(response.code, response.remark)
            return response, address

    async def heartbeat(self, client_id: str, member_data: str, session_timeout_ms: int) -> None:
        """Tell the master this member is alive, with its data and session timeout.

        Raises:
            ValueError: member data over 8 KiB, or a session timeout outside 1000..120000 ms.
            RemoteError: the broker refused (INVALID_PARAMETER names the field).
            RpcError: the master did not answer.
        """
        if not client_id:
            raise ValueError("client_id must not be empty")
        if len(member_data.encode()) > MAX_MEMBER_DATA_BYTES:
            raise ValueError(f"member_data is over {MAX_MEMBER_DATA_BYTES} bytes of UTF-8")
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise ValueError(
                f"session_timeout_ms must be in {MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}"
            )
        data = HeartbeatData(
            client_id=client_id,
            consumer_data_set=[
                ConsumerData(
                    group_name=self.group,
                    consume_type="CONSUME_ACTIVELY",
                    member_data=member_data,
                    session_timeout_ms=session_timeout_ms,
                )
            ],
        )
        await self._call(RemotingCommand(code=RequestCode.HEART_BEAT, body=encode_body(data)))

    async def members(self) -> GroupMembers:
        """The group's live members at the master (GET_GROUP_MEMBERS).

        Raises:
            RemoteError: the broker refused.
            RpcError: the master did not answer.
        """
        header = GetGroupMembersRequestHeader(consumer_group=self.group)
        response, address = await self._call(
            RemotingCommand(code=RequestCode.GET_GROUP_MEMBERS, ext_fields=to_ext_fields(header))
        )
        found = decode_body(response.body, GroupMembersBody)
        return GroupMembers(
            [Member(m.client_id, m.member_data, m.last_heartbeat_ago_ms) for m in found.members],
            found.master_since_ms,
            address,
        )

    async def leave(self, client_id: str) -> None:
        """Leave the group now (UNREGISTER_CLIENT).

        Raises:
            RemoteError: the broker refused.
            RpcError: the master did not answer.
        """
        header = UnregisterClientRequestHeader(client_i_d=client_id, consumer_group=self.group)
        await self._call(
            RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields=to_ext_fields(header))
        )
