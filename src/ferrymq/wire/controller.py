"""Typed headers and JSON bodies of the controller's requests (RocketMQ controller mode).

Spec: reference/rocketmq-controller-spec.md sections 1.4 and 1.9 (`*RequestHeader` and
`*ResponseHeader` under `header/controller`, bodies `SyncStateSet`, `ElectMasterResponseBody`,
`BrokerReplicasInfo`). Field names on the wire are RocketMQ's; every header field travels as a
string in `extFields` (see `wire.headers`). BROKER_HEARTBEAT (904) uses the header the NameServer
also accepts, `wire.namesrv.BrokerHeartbeatRequestHeader`, re-exported here.

ferrymq additions, all optional so RocketMQ peers can ignore them:
- `BrokerHeartbeatResponseHeader`: the controller leader answers a heartbeat with the master lease
  it assumes (`masterLeaseMills`) and its current view of the group (`masterEpoch`), so a master
  renews its lease only from the leader that would elect its replacement.
- `NotLeaderResponseHeader`: CONTROLLER_NOT_LEADER (2007) carries the leader's id and address.
- `BrokerHeartbeatResponseHeader.topicVersion`: the controller's topic version (`wire.topics`),
  so a broker learns of topic changes it missed from its next heartbeat.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.wire.bodies import decode_body
from ferrymq.wire.headers import I32, I64, CommandHeader
from ferrymq.wire.namesrv import BrokerHeartbeatRequestHeader

__all__ = [
    "CONTROLLER_TRIGGER_BROKER_ID",
    "AlterSyncStateSetRequestHeader",
    "AlterSyncStateSetResponseHeader",
    "ApplyBrokerIdRequestHeader",
    "ApplyBrokerIdResponseHeader",
    "AuthVersionResponseHeader",
    "BrokerHeartbeatRequestHeader",
    "BrokerHeartbeatResponseHeader",
    "BrokerMemberGroup",
    "BrokerReplicasInfo",
    "CleanControllerBrokerDataRequestHeader",
    "ElectMasterRequestHeader",
    "ElectMasterResponseBody",
    "ElectMasterResponseHeader",
    "EpochEntry",
    "EpochEntryCache",
    "GetMetaDataResponseHeader",
    "GetNextBrokerIdRequestHeader",
    "GetNextBrokerIdResponseHeader",
    "GetReplicaInfoRequestHeader",
    "GetReplicaInfoResponseHeader",
    "NotLeaderResponseHeader",
    "NotifyBrokerRoleChangedRequestHeader",
    "RegisterBrokerToControllerRequestHeader",
    "RegisterBrokerToControllerResponseHeader",
    "ReplicaIdentity",
    "ReplicasInfo",
    "SyncStateSet",
    "decode_broker_names",
    "decode_sync_state_set",
    "parse_broker_id_list",
]

CONTROLLER_TRIGGER_BROKER_ID: Final = -1
"""`brokerId` of an ElectMaster the controller triggers itself (`ofControllerTrigger`)."""


# ---------------------------------------------------------------------- persistent broker ids


class GetNextBrokerIdRequestHeader(CommandHeader):
    """CONTROLLER_GET_NEXT_BROKER_ID (1012)."""

    cluster_name: str
    broker_name: str


class GetNextBrokerIdResponseHeader(CommandHeader):
    """The id the controller would assign next (1 for an unknown broker group)."""

    cluster_name: str | None = None
    broker_name: str | None = None
    next_broker_id: I64 | None = None


class ApplyBrokerIdRequestHeader(CommandHeader):
    """CONTROLLER_APPLY_BROKER_ID (1013): claim `applied_broker_id`, proven by the check code.

    `register_check_code` is `brokerAddress;millis`; the controller stores the address before `;`.
    """

    cluster_name: str
    broker_name: str
    applied_broker_id: I64
    register_check_code: str


class ApplyBrokerIdResponseHeader(CommandHeader):
    """Answer to ApplyBrokerId."""

    cluster_name: str | None = None
    broker_name: str | None = None


class RegisterBrokerToControllerRequestHeader(CommandHeader, kw_only=True):
    """CONTROLLER_REGISTER_BROKER (1003): an id-holding broker announces its current address."""

    cluster_name: str
    broker_name: str
    broker_id: I64 | None = None
    broker_address: str
    invoke_time: I64 | None = None


class RegisterBrokerToControllerResponseHeader(CommandHeader):
    """The group's master, when there is one and it is alive; the body is the SyncStateSet."""

    cluster_name: str | None = None
    broker_name: str | None = None
    master_broker_id: I64 | None = None
    master_address: str | None = None
    master_epoch: I32 | None = None
    sync_state_set_epoch: I32 | None = None


# ---------------------------------------------------------------------- SyncStateSet and masters


class AlterSyncStateSetRequestHeader(CommandHeader):
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001); the body is the proposed `SyncStateSet`.

    Fenced by `master_broker_id`, `master_epoch` and the body's `syncStateSetEpoch`.
    """

    broker_name: str
    master_broker_id: I64
    master_epoch: I32
    invoke_time: I64 | None = None


class AlterSyncStateSetResponseHeader(CommandHeader):
    """The SyncStateSet epoch after the change."""

    new_sync_state_set_epoch: I32 | None = None


class ElectMasterRequestHeader(CommandHeader):
    """CONTROLLER_ELECT_MASTER (1002), in three flavours (spec section 1.4).

    controller-triggered: `broker_id` = -1, `designate_elect` false; broker-triggered: the
    asking broker's id (it counts only while the group never had a master), `designate_elect`
    false; admin-triggered: `designate_elect` true and `broker_id` the broker to make master.
    """

    cluster_name: str = ""
    broker_name: str = ""
    broker_id: I64 = CONTROLLER_TRIGGER_BROKER_ID
    designate_elect: bool = False
    invoke_time: I64 | None = None


class ElectMasterResponseHeader(CommandHeader):
    """The master after an election (or the one that still exists)."""

    master_broker_id: I64 | None = None
    master_address: str | None = None
    master_epoch: I32 | None = None
    sync_state_set_epoch: I32 | None = None


class GetReplicaInfoRequestHeader(CommandHeader):
    """CONTROLLER_GET_REPLICA_INFO (1004)."""

    broker_name: str


class GetReplicaInfoResponseHeader(CommandHeader):
    """A group's master; the body is its `SyncStateSet`."""

    master_broker_id: I64 | None = None
    master_address: str | None = None
    master_epoch: I32 | None = None


class CleanControllerBrokerDataRequestHeader(CommandHeader, kw_only=True):
    """CLEAN_BROKER_DATA (1011): forget some (`1;2;3`) or all ids of a group."""

    cluster_name: str | None = None
    broker_name: str
    broker_controller_ids_to_clean: str | None = None
    is_clean_living_broker: bool = False
    invoke_time: I64 | None = None


class NotifyBrokerRoleChangedRequestHeader(CommandHeader):
    """NOTIFY_BROKER_ROLE_CHANGED (1008), pushed to a group's brokers; body `SyncStateSet`."""

    master_address: str | None = None
    master_epoch: I32 | None = None
    sync_state_set_epoch: I32 | None = None
    master_broker_id: I64 | None = None


class BrokerHeartbeatResponseHeader(CommandHeader):
    """ferrymq: the leader's answer to BROKER_HEARTBEAT (RocketMQ sends heartbeats oneway).

    `master_lease_mills` is how long after sending this heartbeat a master may keep accepting
    writes; the controller waits longer than that before it elects a replacement.
    """

    master_lease_mills: I64 | None = None
    master_epoch: I32 | None = None
    master_broker_id: I64 | None = None
    topic_version: I64 | None = None
    auth_version: I64 | None = None
    """The version of the users and ACLs the controllers keep (ACL 2.0, `controller/auth.py`)."""


class AuthVersionResponseHeader(CommandHeader):
    """ferrymq: the controllers' auth version after an ACL 2.0 request (`controller/auth.py`)."""

    auth_version: I64 | None = None


# ---------------------------------------------------------------------- controller metadata


class GetMetaDataResponseHeader(CommandHeader):
    """CONTROLLER_GET_METADATA_INFO (1005): who leads; `peers` is `id:addr;id:addr;`.

    ferrymq adds `controllerId` (the answering node), `term` and `appliedIndex` (the last
    controller log entry applied there), so operators and tests can see a node catch up.
    """

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool = False
    peers: str | None = None
    controller_id: str | None = None
    term: I64 | None = None
    applied_index: I64 | None = None


class NotLeaderResponseHeader(CommandHeader):
    """ferrymq: extFields of a CONTROLLER_NOT_LEADER answer, naming the leader when known."""

    controller_leader_id: str | None = None
    controller_leader_address: str | None = None


# ---------------------------------------------------------------------- bodies


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    """Base of JSON bodies: snake_case fields, camelCase on the wire."""


class SyncStateSet(_Body, kw_only=True):
    """A group's in-sync broker ids and the epoch of that set (`SyncStateSet`)."""

    sync_state_set: list[int] = msgspec.field(default_factory=list)
    sync_state_set_epoch: int = 0


class BrokerMemberGroup(_Body, kw_only=True):
    """A group's registered brokers, id -> address (`BrokerMemberGroup`)."""

    cluster: str | None = None
    broker_name: str | None = None
    broker_addrs: dict[int, str] = msgspec.field(default_factory=dict)


class ElectMasterResponseBody(_Body, kw_only=True):
    """Body of a successful ElectMaster: the group's members and the new set."""

    broker_member_group: BrokerMemberGroup | None = None
    sync_state_set: list[int] = msgspec.field(default_factory=list)


class ReplicaIdentity(_Body, kw_only=True):
    """One replica in `BrokerReplicasInfo`."""

    broker_name: str
    broker_id: int
    broker_address: str
    alive: bool


class ReplicasInfo(_Body, kw_only=True):
    """One group in `BrokerReplicasInfo`."""

    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int = 0
    sync_state_set_epoch: int = 0
    in_sync_replicas: list[ReplicaIdentity] = msgspec.field(default_factory=list)
    not_in_sync_replicas: list[ReplicaIdentity] = msgspec.field(default_factory=list)


class BrokerReplicasInfo(_Body):
    """Body of CONTROLLER_GET_SYNC_STATE_DATA (1006): group name -> replicas."""

    replicas_info_table: dict[str, ReplicasInfo] = msgspec.field(default_factory=dict)


def decode_sync_state_set(data: bytes) -> SyncStateSet:
    """Parse a `SyncStateSet` body.

    Raises:
        ProtocolError: not JSON of that shape, or a broker id below 1.
    """
    body = decode_body(data, SyncStateSet)
    if any(broker_id < 1 for broker_id in body.sync_state_set):
        raise ProtocolError(f"SyncStateSet: broker ids start at 1: {body.sync_state_set}")
    return body


def decode_broker_names(data: bytes) -> list[str]:
    """Parse the body of CONTROLLER_GET_SYNC_STATE_DATA: a JSON list of group names.

    Raises:
        ProtocolError: not a JSON list of strings.
    """
    return decode_body(data, list[str])


def parse_broker_id_list(text: str) -> set[int]:
    """Parse `brokerControllerIdsToClean` (`1;2;3`).

    Raises:
        ValueError: an item is not an integer.
    """
    return {int(item) for item in text.split(";") if item.strip()}


class EpochEntry(_Body, kw_only=True):
    """One epoch of a broker's epoch file, as GET_BROKER_EPOCH_CACHE reports it."""

    epoch: int
    start_offset: int
    end_offset: int = -1


class EpochEntryCache(_Body, kw_only=True):
    """Body of GET_BROKER_EPOCH_CACHE (1007), answered by a broker in controller mode."""

    cluster_name: str | None = None
    broker_name: str | None = None
    broker_id: int | None = None
    epoch_list: list[EpochEntry] = msgspec.field(default_factory=list)
    max_offset: int = -1
