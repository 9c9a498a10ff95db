"""The controller part of the admin client, also what brokers use to talk to the controller.

Spec: reference/rocketmq-controller-spec.md sections 1.4, 1.9 and 5 (`mqadmin getSyncStateSet`,
`electMaster`, `getControllerMetaData`, `getControllerConfig`, `updateControllerConfig`,
`cleanBrokerMetadata`), and ferrymq's topics kept by the controller (issue 20 section 3,
`wire.topics`).

Requests go to the controller leader. The client finds it with GET_METADATA_INFO, follows the
leader named in a CONTROLLER_NOT_LEADER answer, and moves on to the next address when one cannot
be reached; every search is bounded by the number of addresses and one deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

from ferrymq.config import parse_properties
from ferrymq.errors import FerryError, RemoteError, RpcError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    BrokerHeartbeatResponseHeader,
    BrokerReplicasInfo,
    CleanControllerBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    EpochEntryCache,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotLeaderResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    SyncStateSet,
)
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields, to_ext_fields
from ferrymq.wire.topics import (
    ControllerDeleteTopicRequestHeader,
    ControllerReassignRequestHeader,
    ControllerTopicsBody,
    ControllerUpdateTopicRequestHeader,
    GetControllerTopicsRequestHeader,
    ReassignBody,
)

__all__ = ["ControllerAdmin", "ElectResult", "ReplicaInfo", "broker_epoch_cache"]

_LEADER_RETRY_DELAY: Final = 0.1


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A group's master and SyncStateSet (GET_REPLICA_INFO, REGISTER_BROKER answers)."""

    master_broker_id: int | None
    master_address: str | None
    master_epoch: int | None
    sync_state_set: SyncStateSet


@dataclass(frozen=True, slots=True)
class ElectResult:
    """An ElectMaster answer: a new master, or (`still_exists`) the one that remains."""

    header: ElectMasterResponseHeader
    body: ElectMasterResponseBody
    still_exists: bool


class ControllerAdmin:
    """Requests to a controller group; use as an async context manager or `close()`."""

    def __init__(
        self, controller_addr: str, *, timeout: float = 5.0, rpc: RpcClient | None = None
    ) -> None:
        self.addresses = [a.strip() for a in controller_addr.split(";") if a.strip()]
        if not self.addresses:
            raise ValueError("no controller address given")
        self._rpc = rpc or RpcClient()
        self._owns_rpc = rpc is None
        self._timeout = timeout
        self._leader: str | None = None

    async def close(self) -> None:
        """Close connections (when this client owns them)."""
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

    # ------------------------------------------------------------------ transport

    async def metadata(self, address: str | None = None) -> GetMetaDataResponseHeader:
        """GET_METADATA_INFO from one controller (the first reachable one by default)."""
        targets = [address] if address else self.addresses
        last: FerryError | None = None
        for target in targets:
            try:
                response = await self._rpc.call(
                    target,
                    RemotingCommand(code=RequestCode.CONTROLLER_GET_METADATA_INFO),
                    self._timeout,
                )
            except RpcError as exc:
                last = exc
                continue
            _check(response)
            return from_ext_fields(GetMetaDataResponseHeader, response.ext_fields)
        raise last or FerryError("no controller address given")

    async def leader(self) -> str:
        """The leader's address, asking each controller until one knows it.

        Raises:
            FerryError: no controller names a leader within the timeout.
        """
        deadline = time.monotonic() + self._timeout
        while True:
            hint: str | None = None
            for address in self.addresses:
                try:
                    meta = await self.metadata(address)
                except (RpcError, RemoteError):
                    continue
                if meta.is_leader:
                    self._leader = address
                    return address
                named = meta.controller_leader_address
                if named and named != address and hint is None:
                    hint = named  # a node that is not serving cannot vouch for itself
            if hint is not None:
                self._leader = hint
                return hint
            if time.monotonic() >= deadline:
                raise FerryError(f"no controller leader among {';'.join(self.addresses)}")
            await asyncio.sleep(_LEADER_RETRY_DELAY)

    async def call(
        self, code: int, header: CommandHeader | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """Send a request to the leader, following CONTROLLER_NOT_LEADER answers.

        Returns the leader's response, whatever its code.

        Raises:
            RpcError: the leader could not be reached (or its answer did not come in time).
            FerryError: no leader was found in time.
        """
        deadline = time.monotonic() + self._timeout
        while True:
            address = self._leader or await self.leader()
            request = RemotingCommand(
                code=code, ext_fields=to_ext_fields(header) if header else {}, body=body
            )
            try:
                response = await self._rpc.call(address, request, self._timeout)
            except RpcError:
                self._leader = None
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(_LEADER_RETRY_DELAY)
                continue
            if response.code != ResponseCode.CONTROLLER_NOT_LEADER:
                return response
            hint = from_ext_fields(NotLeaderResponseHeader, response.ext_fields)
            self._leader = hint.controller_leader_address
            if time.monotonic() >= deadline:
                return response
            if self._leader is None or self._leader == address:
                self._leader = None
                await asyncio.sleep(_LEADER_RETRY_DELAY)

    async def _ok(
        self, code: int, header: CommandHeader | None = None, body: bytes = b""
    ) -> RemotingCommand:
        response = await self.call(code, header, body)
        _check(response)
        return response

    # ------------------------------------------------------------------ broker ids (seed 000)

    async def next_broker_id(self, cluster_name: str, broker_name: str) -> int:
        """GET_NEXT_BROKER_ID: the id to apply for next."""
        response = await self._ok(
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
            GetNextBrokerIdRequestHeader(cluster_name=cluster_name, broker_name=broker_name),
        )
        header = from_ext_fields(GetNextBrokerIdResponseHeader, response.ext_fields)
        return header.next_broker_id or 1

    async def apply_broker_id(
        self, cluster_name: str, broker_name: str, broker_id: int, register_check_code: str
    ) -> None:
        """APPLY_BROKER_ID; RemoteError CONTROLLER_BROKER_ID_INVALID when the id is taken."""
        await self._ok(
            RequestCode.CONTROLLER_APPLY_BROKER_ID,
            ApplyBrokerIdRequestHeader(
                cluster_name=cluster_name,
                broker_name=broker_name,
                applied_broker_id=broker_id,
                register_check_code=register_check_code,
            ),
        )

    async def register_broker(
        self, cluster_name: str, broker_name: str, broker_id: int, broker_address: str
    ) -> ReplicaInfo:
        """REGISTER_BROKER (to the controller): the live master, if any, and the SyncStateSet."""
        response = await self._ok(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterBrokerToControllerRequestHeader(
                cluster_name=cluster_name,
                broker_name=broker_name,
                broker_id=broker_id,
                broker_address=broker_address,
                invoke_time=int(time.time() * 1000),
            ),
        )
        header = from_ext_fields(RegisterBrokerToControllerResponseHeader, response.ext_fields)
        return ReplicaInfo(
            header.master_broker_id,
            header.master_address,
            header.master_epoch,
            decode_body(response.body, SyncStateSet),
        )

    async def heartbeat(
        self, header: BrokerHeartbeatRequestHeader
    ) -> BrokerHeartbeatResponseHeader:
        """BROKER_HEARTBEAT to the leader; its answer carries the master lease."""
        response = await self._ok(RequestCode.BROKER_HEARTBEAT, header)
        return from_ext_fields(BrokerHeartbeatResponseHeader, response.ext_fields)

    # ------------------------------------------------------------------ SyncStateSet and masters

    async def replica_info(self, broker_name: str) -> ReplicaInfo:
        """GET_REPLICA_INFO: a group's master and SyncStateSet."""
        response = await self._ok(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            GetReplicaInfoRequestHeader(broker_name=broker_name),
        )
        header = from_ext_fields(GetReplicaInfoResponseHeader, response.ext_fields)
        return ReplicaInfo(
            header.master_broker_id,
            header.master_address,
            header.master_epoch,
            decode_body(response.body, SyncStateSet),
        )

    async def alter_sync_state_set(
        self,
        broker_name: str,
        master_broker_id: int,
        master_epoch: int,
        sync_state_set: SyncStateSet,
    ) -> SyncStateSet:
        """ALTER_SYNC_STATE_SET; returns the accepted set with its new epoch."""
        response = await self._ok(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            AlterSyncStateSetRequestHeader(
                broker_name=broker_name,
                master_broker_id=master_broker_id,
                master_epoch=master_epoch,
                invoke_time=int(time.time() * 1000),
            ),
            encode_body(sync_state_set),
        )
        from_ext_fields(AlterSyncStateSetResponseHeader, response.ext_fields)
        return decode_body(response.body, SyncStateSet)

    async def elect_master(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int | None = None,
        *,
        designate: bool = False,
    ) -> ElectResult:
        """ELECT_MASTER: broker-triggered (`broker_id`), admin (`designate`), or controller-like.

        CONTROLLER_MASTER_STILL_EXIST is an answer (`still_exists`), not an error.
        """
        header = ElectMasterRequestHeader(
            cluster_name=cluster_name,
            broker_name=broker_name,
            broker_id=-1 if broker_id is None else broker_id,
            designate_elect=designate,
            invoke_time=int(time.time() * 1000),
        )
        response = await self.call(RequestCode.CONTROLLER_ELECT_MASTER, header)
        still_exists = response.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
        if not still_exists:
            _check(response)
        return ElectResult(
            from_ext_fields(ElectMasterResponseHeader, response.ext_fields),
            decode_body(response.body, ElectMasterResponseBody)
            if response.body
            else ElectMasterResponseBody(),
            still_exists,
        )

    async def sync_state_data(self, broker_names: list[str]) -> BrokerReplicasInfo:
        """GET_SYNC_STATE_DATA: replicas of the named groups (`mqadmin getSyncStateSet`)."""
        response = await self._ok(
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=encode_body(broker_names)
        )
        return decode_body(response.body, BrokerReplicasInfo)

    async def clean_broker_data(
        self,
        cluster_name: str | None,
        broker_name: str,
        broker_ids: list[int] | None = None,
        *,
        clean_living: bool = False,
    ) -> None:
        """CLEAN_BROKER_DATA: forget some (or all) ids of a group."""
        await self._ok(
            RequestCode.CLEAN_BROKER_DATA,
            CleanControllerBrokerDataRequestHeader(
                cluster_name=cluster_name,
                broker_name=broker_name,
                broker_controller_ids_to_clean=";".join(map(str, broker_ids))
                if broker_ids
                else None,
                is_clean_living_broker=clean_living,
                invoke_time=int(time.time() * 1000),
            ),
        )

    # ------------------------------------------------------------------ config

    async def config(self, address: str | None = None) -> dict[str, str]:
        """GET_CONTROLLER_CONFIG from one controller (the leader by default)."""
        request = RemotingCommand(code=RequestCode.GET_CONTROLLER_CONFIG)
        if address is None:
            response = await self.call(request.code)
        else:
            response = await self._rpc.call(address, request, self._timeout)
        _check(response)
        return parse_properties(response.body.decode(), "GET_CONTROLLER_CONFIG")

    async def update_config(self, properties: dict[str, str]) -> None:
        """UPDATE_CONTROLLER_CONFIG: replicated to every controller."""
        text = "".join(f"{key}={value}\n" for key, value in properties.items())
        await self._ok(RequestCode.UPDATE_CONTROLLER_CONFIG, body=text.encode())

    # ------------------------------------------------------------------ topics (issue 20 s. 3)

    async def update_topic(
        self, header: ControllerUpdateTopicRequestHeader
    ) -> ControllerTopicsBody:
        """CONTROLLER_UPDATE_TOPIC: create or change a topic; the topic as decided."""
        response = await self._ok(RequestCode.CONTROLLER_UPDATE_TOPIC, header)
        return decode_body(response.body, ControllerTopicsBody)

    async def delete_topic(
        self, topic: str, *, cluster_name: str | None = None, broker_name: str | None = None
    ) -> ControllerTopicsBody:
        """CONTROLLER_DELETE_TOPIC: delete a topic (or take it off some groups).

        Raises:
            RemoteError: NO_PERMISSION while the controller runs with deleteTopicEnable=false.
        """
        response = await self._ok(
            RequestCode.CONTROLLER_DELETE_TOPIC,
            ControllerDeleteTopicRequestHeader(
                topic=topic, cluster_name=cluster_name, broker_name=broker_name
            ),
        )
        return decode_body(response.body, ControllerTopicsBody)

    async def reassign(self, header: ControllerReassignRequestHeader) -> ReassignBody:
        """CONTROLLER_REASSIGN_QUEUES: start, cancel or clean up moves of queues between groups.

        Raises:
            RemoteError: the controller refused (unknown topic, group or queue, a move to
                another group already running, ...): its remark says why.
        """
        response = await self._ok(RequestCode.CONTROLLER_REASSIGN_QUEUES, header)
        return decode_body(response.body, ReassignBody)

    async def topics(self, topic: str | None = None) -> ControllerTopicsBody:
        """CONTROLLER_GET_TOPICS: one topic's record or tombstone, or every live topic."""
        response = await self._ok(
            RequestCode.CONTROLLER_GET_TOPICS, GetControllerTopicsRequestHeader(topic=topic)
        )
        return decode_body(response.body, ControllerTopicsBody)


def _check(response: RemotingCommand) -> None:
    if response.code != ResponseCode.SUCCESS:
        try:
            name = ResponseCode(response.code).name
        except ValueError:
            name = None
        raise RemoteError(response.code, response.remark, code_name=name)


async def broker_epoch_cache(
    rpc: RpcClient, broker_addr: str, timeout: float = 5.0
) -> EpochEntryCache:
    """GET_BROKER_EPOCH_CACHE from one broker (`mqadmin getBrokerEpoch`)."""
    response = await rpc.call(
        broker_addr, RemotingCommand(code=RequestCode.GET_BROKER_EPOCH_CACHE), timeout
    )
    _check(response)
    return decode_body(response.body, EpochEntryCache)
