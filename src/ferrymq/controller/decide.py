"""Controller decisions: a request and a read-only view in, events and a response out.

Spec: reference/rocketmq-controller-spec.md section 1.4 (every check, in order, and its response
code), 1.6 (election policy), 2.2 (persistent broker ids); ARCHITECTURE.md section 6 items 4 and 6.

Rules:
1. `decide` and the `decide_*` functions never mutate the view. The leader proposes the returned
   events through Raft; every node then applies them (`ControllerState.apply`). A decision with no
   events is answered at once (reads, refusals, idempotent retries).
2. Time is `now`, monotonic seconds on the leader; liveness is the leader's own table.
3. A master is presumed active until proven gone (`is_master_gone`): it is alive, or it may still
   hold its lease, or this node has led for less than the grace period. Only a gone master is
   replaced by a controller- or broker-triggered election.

Where ferrymq differs from RocketMQ:
- The first election of a group does not crown whoever asks first: it waits until every
  registered replica is alive or `firstElectionWaitMillis` has passed since the group was first
  heard from, and picks by data among the live registered replicas.
- ApplyBrokerId checks the cluster name and a non-empty check code; an idempotent retry is
  answered without a log entry.
- CleanBrokerData without an id list is refused while any replica of the group is alive.
- A controller-triggered election that finds no candidate records "no master" (bumping the
  epoch) only when there was a master to remove.
- Topics are controller state (issue 20 section 3): the topic requests are decided in
  `controller.topics` and answered here with the controller's topic version; so are moves of
  queues between groups (issue 20 section 4), and the leader's own FinishMove.
- ACL 2.0 users and ACLs are controller state too (issue 23): their admin requests are decided
  in `controller.auth` and answered here with the controller's auth version.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ferrymq import testbugs
from ferrymq.config import ConfigError
from ferrymq.controller.auth import AuthCommand, GetAuth, auth_body, plan_auth
from ferrymq.controller.config import ControllerConfig, validate_overrides
from ferrymq.controller.election import elect
from ferrymq.controller.liveness import BrokerLiveInfo, Liveness
from ferrymq.controller.state import BrokerGroup, ControllerState
from ferrymq.controller.topics import (
    DeleteTopic,
    FinishMove,
    GetGroupTopics,
    GetTopics,
    ReassignQueues,
    TopicOutcome,
    UpdateTopic,
    group_topics,
    plan_delete,
    plan_finish,
    plan_reassign,
    plan_update,
    topics_body,
)
from ferrymq.wire.bodies import encode_body
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller import (
    CONTROLLER_TRIGGER_BROKER_ID,
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    ApplyBrokerIdResponseHeader,
    AuthVersionResponseHeader,
    BrokerMemberGroup,
    BrokerReplicasInfo,
    CleanControllerBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    ReplicaIdentity,
    ReplicasInfo,
    SyncStateSet,
    parse_broker_id_list,
)
from ferrymq.wire.controller_log import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    CleanBrokerDataEvent,
    ElectMasterEvent,
    Event,
    UpdateBrokerAddressEvent,
    UpdateControllerConfigEvent,
)
from ferrymq.wire.headers import CommandHeader
from ferrymq.wire.topics import TopicVersionResponseHeader

__all__ = [
    "AlterSyncStateSet",
    "ControllerRequest",
    "Decision",
    "GetSyncStateData",
    "UpdateControllerConfig",
    "View",
    "decide",
    "decide_alter_sync_state_set",
    "decide_apply_broker_id",
    "decide_clean_broker_data",
    "decide_elect_master",
    "decide_get_next_broker_id",
    "decide_get_replica_info",
    "decide_get_sync_state_data",
    "decide_register_broker",
    "decide_update_config",
    "groups_to_elect",
    "is_master_gone",
]


@dataclass(frozen=True, slots=True)
class View:
    """What a decision may read: the applied state, this node's liveness table, the policy."""

    state: ControllerState
    liveness: Liveness
    config: ControllerConfig
    leader_since: float
    """When this node became a serving leader (monotonic seconds)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The events to replicate and the response to give once they are applied."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    header: CommandHeader | None = None
    body: bytes = b""
    events: tuple[Event, ...] = ()
    warning: str | None = None
    """Something the operator must hear about (an unclean election), for the server to log."""


@dataclass(frozen=True, slots=True)
class AlterSyncStateSet:
    """CONTROLLER_ALTER_SYNC_STATE_SET: header and body."""

    header: AlterSyncStateSetRequestHeader
    body: SyncStateSet


@dataclass(frozen=True, slots=True)
class GetSyncStateData:
    """CONTROLLER_GET_SYNC_STATE_DATA: the group names of its body."""

    broker_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UpdateControllerConfig:
    """UPDATE_CONTROLLER_CONFIG: the `key=value` pairs of its body."""

    properties: Mapping[str, str]


ControllerRequest = (
    GetNextBrokerIdRequestHeader
    | ApplyBrokerIdRequestHeader
    | RegisterBrokerToControllerRequestHeader
    | AlterSyncStateSet
    | ElectMasterRequestHeader
    | GetReplicaInfoRequestHeader
    | GetSyncStateData
    | CleanControllerBrokerDataRequestHeader
    | UpdateControllerConfig
    | UpdateTopic
    | DeleteTopic
    | GetGroupTopics
    | GetTopics
    | ReassignQueues
    | FinishMove
    | AuthCommand
    | GetAuth
)
"""Every request the leader decides."""


def decide(request: ControllerRequest, view: View, now: float) -> Decision:
    """Decide any controller request (rule 1)."""
    match request:
        case GetNextBrokerIdRequestHeader():
            return decide_get_next_broker_id(view, request)
        case ApplyBrokerIdRequestHeader():
            return decide_apply_broker_id(view, request)
        case RegisterBrokerToControllerRequestHeader():
            return decide_register_broker(view, request, now)
        case AlterSyncStateSet():
            return decide_alter_sync_state_set(view, request.header, request.body, now)
        case ElectMasterRequestHeader():
            return decide_elect_master(view, request, now)
        case GetReplicaInfoRequestHeader():
            return decide_get_replica_info(view, request)
        case GetSyncStateData():
            return decide_get_sync_state_data(view, request.broker_names, now)
        case CleanControllerBrokerDataRequestHeader():
            return decide_clean_broker_data(view, request, now)
        case UpdateControllerConfig():
            return decide_update_config(view, request.properties)
        case UpdateTopic():
            return _topic_decision(plan_update(view.state, request.header))
        case DeleteTopic():
            outcome = plan_delete(
                view.state, request.header, enabled=view.config.delete_topic_enable
            )
            return _topic_decision(outcome)
        case GetGroupTopics():
            body = group_topics(view.state, request.broker_name, request.held)
            return Decision(
                header=TopicVersionResponseHeader(topic_version=body.topic_version),
                body=encode_body(body),
            )
        case GetTopics():
            topics = topics_body(view.state, request.topic)
            return Decision(
                header=TopicVersionResponseHeader(topic_version=topics.topic_version),
                body=encode_body(topics),
            )
        case ReassignQueues():
            return _topic_decision(plan_reassign(view.state, request.header))
        case FinishMove():
            return _topic_decision(plan_finish(view.state, request))
        case AuthCommand():
            auth = plan_auth(view.state, request)
            if auth.code != ResponseCode.SUCCESS:
                return _fail(auth.code, auth.remark or "refused")
            return Decision(
                header=AuthVersionResponseHeader(auth_version=auth.auth_version),
                body=auth.body,
                events=auth.events,
            )
        case GetAuth():
            return Decision(
                header=AuthVersionResponseHeader(auth_version=view.state.auth_version),
                body=auth_body(view.state),
            )


def _topic_decision(outcome: TopicOutcome) -> Decision:
    if outcome.code != ResponseCode.SUCCESS:
        return _fail(outcome.code, outcome.remark or "refused")
    return Decision(
        header=TopicVersionResponseHeader(topic_version=outcome.topic_version),
        body=encode_body(outcome.body) if outcome.body is not None else b"",
        events=outcome.events,
    )


def _fail(code: int, remark: str) -> Decision:
    return Decision(code=code, remark=remark)


# ---------------------------------------------------------------------- liveness questions


def _live_info(view: View, group: BrokerGroup, broker_id: int, now: float) -> BrokerLiveInfo | None:
    info = view.liveness.info(group.broker_name, broker_id)
    return info if info is not None and info.is_alive(now) else None


def _live_candidates(
    view: View, group: BrokerGroup, broker_ids: Collection[int], now: float
) -> list[BrokerLiveInfo]:
    found = (_live_info(view, group, broker_id, now) for broker_id in sorted(broker_ids))
    return [info for info in found if info is not None]


def is_master_gone(view: View, group: BrokerGroup, now: float) -> bool:
    """Whether the group's master is surely no longer accepting writes (rule 3)."""
    if group.master_broker_id is None:
        return True
    if now < view.leader_since + view.config.election_grace:
        return False
    info = view.liveness.info(group.broker_name, group.master_broker_id)
    if info is None:
        return True
    return not info.is_alive(now) and now >= info.last_heartbeat + view.config.master_replace_wait


def _is_first_election_ready(view: View, group: BrokerGroup, now: float) -> bool:
    if all(view.liveness.is_alive(group.broker_name, i, now) for i in group.replicas):
        return True
    first_seen = view.liveness.first_seen(group.broker_name)
    return first_seen is not None and now >= first_seen + view.config.first_election_wait


# ---------------------------------------------------------------------- persistent broker ids


def decide_get_next_broker_id(view: View, header: GetNextBrokerIdRequestHeader) -> Decision:
    """GetNextBrokerId (1012): the id to try next; 1 for an unknown group."""
    group = view.state.groups.get(header.broker_name)
    return Decision(
        header=GetNextBrokerIdResponseHeader(
            cluster_name=header.cluster_name,
            broker_name=header.broker_name,
            next_broker_id=group.next_broker_id if group else 1,
        )
    )


def decide_apply_broker_id(view: View, header: ApplyBrokerIdRequestHeader) -> Decision:
    """ApplyBrokerId (1013): claim an id; a retry with the same check code succeeds again."""
    response = ApplyBrokerIdResponseHeader(
        cluster_name=header.cluster_name, broker_name=header.broker_name
    )
    broker_id = header.applied_broker_id
    if not header.register_check_code:
        return _fail(ResponseCode.CONTROLLER_INVALID_REQUEST, "registerCheckCode is empty")
    group = view.state.groups.get(header.broker_name)
    if group is None:
        if broker_id != 1:
            return _fail(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"broker group {header.broker_name} is new: its first id is 1, not {broker_id}",
            )
    else:
        if group.cluster_name != header.cluster_name:
            return _fail(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"broker group {header.broker_name} belongs to cluster {group.cluster_name}, "
                f"not {header.cluster_name}",
            )
        replica = group.replicas.get(broker_id)
        if replica is not None:
            if replica.register_check_code == header.register_check_code:
                return Decision(header=response)
            return _fail(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"broker id {broker_id} of {header.broker_name} belongs to another broker; "
                f"next id is {group.next_broker_id}",
            )
        if broker_id < 1:
            return _fail(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID, f"broker ids start at 1, not {broker_id}"
            )
    event = ApplyBrokerIdEvent(
        cluster_name=header.cluster_name,
        broker_name=header.broker_name,
        broker_address=header.register_check_code.split(";", 1)[0],
        new_broker_id=broker_id,
        register_check_code=header.register_check_code,
    )
    return Decision(header=response, events=(event,))


def decide_register_broker(
    view: View, header: RegisterBrokerToControllerRequestHeader, now: float
) -> Decision:
    """RegisterBrokerToController (1003): update the address; answer with the live master."""
    group = view.state.groups.get(header.broker_name)
    if group is None:
        return _fail(
            ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
            f"broker group {header.broker_name} is not registered: apply for a broker id first",
        )
    broker_id = header.broker_id
    if broker_id is None or broker_id not in group.replicas:
        return _fail(
            ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
            f"broker id {broker_id} of {header.broker_name} is not registered",
        )
    events: tuple[Event, ...] = ()
    if group.replicas[broker_id].broker_address != header.broker_address:
        events = (
            UpdateBrokerAddressEvent(
                cluster_name=header.cluster_name,
                broker_name=header.broker_name,
                broker_id=broker_id,
                broker_address=header.broker_address,
            ),
        )
    response = RegisterBrokerToControllerResponseHeader(
        cluster_name=header.cluster_name, broker_name=header.broker_name
    )
    master = group.master_broker_id
    if master is not None and not is_master_gone(view, group, now):
        address = header.broker_address if master == broker_id else group.master_address
        response = RegisterBrokerToControllerResponseHeader(
            cluster_name=header.cluster_name,
            broker_name=header.broker_name,
            master_broker_id=master,
            master_address=address,
            master_epoch=group.master_epoch,
            sync_state_set_epoch=group.sync_state_set_epoch,
        )
    body = SyncStateSet(
        sync_state_set=sorted(group.sync_state_set),
        sync_state_set_epoch=group.sync_state_set_epoch,
    )
    return Decision(header=response, body=encode_body(body), events=events)


# ---------------------------------------------------------------------- SyncStateSet and masters


def decide_alter_sync_state_set(
    view: View, header: AlterSyncStateSetRequestHeader, body: SyncStateSet, now: float
) -> Decision:
    """AlterSyncStateSet (1001): the master changes its in-sync set, fenced by both epochs."""
    failed = ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    group = view.state.groups.get(header.broker_name)
    if group is None:
        return _fail(failed, f"broker group {header.broker_name} does not exist")
    new_set = set(body.sync_state_set)
    if new_set == group.sync_state_set:
        return _fail(failed, f"the SyncStateSet is already {sorted(new_set)}")
    if header.master_broker_id != group.master_broker_id:
        return _fail(
            ResponseCode.CONTROLLER_INVALID_MASTER,
            f"broker {header.master_broker_id} is not the master of {header.broker_name} "
            f"(the master is {group.master_broker_id})",
        )
    if header.master_epoch != group.master_epoch:
        return _fail(
            ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
            f"master epoch {header.master_epoch} is stale: the current one is {group.master_epoch}",
        )
    if body.sync_state_set_epoch != group.sync_state_set_epoch:
        return _fail(
            ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
            f"SyncStateSet epoch {body.sync_state_set_epoch} is stale: "
            f"the current one is {group.sync_state_set_epoch}",
        )
    for broker_id in sorted(new_set):
        if broker_id not in group.replicas:
            return _fail(
                ResponseCode.CONTROLLER_INVALID_REPLICAS,
                f"broker {broker_id} is not a registered replica of {header.broker_name}",
            )
        if not view.liveness.is_alive(header.broker_name, broker_id, now):
            return _fail(
                ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                f"broker {broker_id} of {header.broker_name} is not alive",
            )
    if group.master_broker_id not in new_set:
        return _fail(failed, f"the new SyncStateSet {sorted(new_set)} lacks the master")
    new_epoch = group.sync_state_set_epoch + 1
    event = AlterSyncStateSetEvent(
        broker_name=header.broker_name,
        new_sync_state_set=tuple(sorted(new_set)),
        expected_master_epoch=group.master_epoch,
        expected_sync_state_set_epoch=group.sync_state_set_epoch,
    )
    return Decision(
        header=AlterSyncStateSetResponseHeader(new_sync_state_set_epoch=new_epoch),
        body=encode_body(
            SyncStateSet(sync_state_set=sorted(new_set), sync_state_set_epoch=new_epoch)
        ),
        events=(event,),
    )


def _master_still_exists(group: BrokerGroup, remark: str) -> Decision:
    return Decision(
        code=ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
        remark=remark,
        header=ElectMasterResponseHeader(
            master_broker_id=group.master_broker_id,
            master_address=group.master_address,
            master_epoch=group.master_epoch,
            sync_state_set_epoch=group.sync_state_set_epoch,
        ),
        body=encode_body(ElectMasterResponseBody(sync_state_set=sorted(group.sync_state_set))),
    )


def decide_elect_master(view: View, header: ElectMasterRequestHeader, now: float) -> Decision:
    """ElectMaster (1002), triggered by the controller, a broker or an admin (section 1.4)."""
    group = view.state.groups.get(header.broker_name)
    if group is None:
        return _fail(
            ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
            f"broker group {header.broker_name} is not registered",
        )
    is_admin = header.designate_elect
    is_controller = not is_admin and header.broker_id in (CONTROLLER_TRIGGER_BROKER_ID, None)
    preferred = header.broker_id if is_admin else None
    old_master = group.master_broker_id
    if not is_admin and old_master is not None and not is_master_gone(view, group, now):
        return _master_still_exists(group, f"broker {old_master} is still master")
    warning = None
    survivors: set[int] = set()
    first_election = group.master_epoch == 0 and old_master is None
    if first_election:
        if not is_admin and not _is_first_election_ready(view, group, now):
            return _fail(
                ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                f"the first election of {group.broker_name} waits for its registered replicas "
                f"(up to {view.config.first_election_wait:g} s)",
            )
        new_master = elect(
            _live_candidates(view, group, group.replicas, now),
            old_master=None,
            preferred=preferred,
        )
    else:
        pool = group.replicas if testbugs.ELECT_OUTSIDE_SYNC_STATE_SET else group.sync_state_set
        in_sync = _live_candidates(view, group, pool, now)
        new_master = elect(in_sync, old_master=old_master, preferred=preferred)
        # Kafka's ISR, not RocketMQ's {new master}: the live members of the old set stay in
        # it, so what the new master acknowledges is again on every in-sync replica.
        survivors = {info.broker_id for info in in_sync} - {old_master}
        if new_master is None and view.config.enable_elect_unclean_master:
            new_master = elect(
                _live_candidates(view, group, group.replicas, now),
                old_master=old_master,
                preferred=preferred,
            )
            survivors = set()
            if new_master is not None and new_master != old_master:
                warning = (
                    f"unclean election: broker {new_master} of {group.broker_name} becomes "
                    f"master from outside the SyncStateSet {sorted(group.sync_state_set)}; "
                    "messages acknowledged by the old set and not copied to it are lost"
                )
    if new_master is not None and new_master == old_master:
        return _master_still_exists(group, f"broker {old_master} is still master")
    if new_master is not None:
        new_set = sorted(survivors | {new_master})
        master_epoch = group.master_epoch + 1
        sync_state_set_epoch = group.sync_state_set_epoch + 1
        members = BrokerMemberGroup(
            cluster=group.cluster_name,
            broker_name=group.broker_name,
            broker_addrs={i: r.broker_address for i, r in sorted(group.replicas.items())},
        )
        return Decision(
            header=ElectMasterResponseHeader(
                master_broker_id=new_master,
                master_address=group.address_of(new_master),
                master_epoch=master_epoch,
                sync_state_set_epoch=sync_state_set_epoch,
            ),
            body=encode_body(
                ElectMasterResponseBody(broker_member_group=members, sync_state_set=new_set)
            ),
            events=(
                ElectMasterEvent(
                    broker_name=group.broker_name,
                    new_master_elected=True,
                    new_master_broker_id=new_master,
                    expected_master_epoch=group.master_epoch,
                    new_sync_state_set=tuple(new_set),
                ),
            ),
            warning=warning,
        )
    if is_controller:
        events: tuple[Event, ...] = ()
        if old_master is not None:
            events = (
                ElectMasterEvent(
                    broker_name=group.broker_name,
                    new_master_elected=False,
                    expected_master_epoch=group.master_epoch,
                ),
            )
        return Decision(
            code=ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
            remark=f"no live candidate in the SyncStateSet {sorted(group.sync_state_set)} "
            f"of {group.broker_name}: the group has no master",
            events=events,
        )
    reason = (
        f"broker {preferred} is not a live candidate"
        if preferred is not None
        else "no live candidate"
    )
    return _fail(
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        f"cannot elect a master of {group.broker_name}: {reason} "
        f"(SyncStateSet {sorted(group.sync_state_set)})",
    )


def groups_to_elect(view: View, now: float) -> list[str]:
    """Groups the leader should hold a controller-triggered election for now.

    A group whose master is gone and that has a live registered replica; a group that never had
    a master once its first election may run; a group left without a master once a candidate is
    alive again. Nothing during the grace period after this node became leader.
    """
    if now < view.leader_since + view.config.election_grace:
        return []
    found = []
    for name, group in sorted(view.state.groups.items()):
        if group.master_broker_id is not None:
            if is_master_gone(view, group, now) and _live_candidates(
                view, group, group.replicas, now
            ):
                found.append(name)
        elif group.master_epoch == 0:
            if _is_first_election_ready(view, group, now) and _live_candidates(
                view, group, group.replicas, now
            ):
                found.append(name)
        else:
            pool = (
                group.replicas if view.config.enable_elect_unclean_master else group.sync_state_set
            )
            if _live_candidates(view, group, pool, now):
                found.append(name)
    return found


def decide_get_replica_info(view: View, header: GetReplicaInfoRequestHeader) -> Decision:
    """GetReplicaInfo (1004): the group's master and SyncStateSet."""
    group = view.state.groups.get(header.broker_name)
    if group is None:
        return _fail(
            ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
            f"broker group {header.broker_name} does not exist",
        )
    return Decision(
        header=GetReplicaInfoResponseHeader(
            master_broker_id=group.master_broker_id,
            master_address=group.master_address,
            master_epoch=group.master_epoch,
        ),
        body=encode_body(
            SyncStateSet(
                sync_state_set=sorted(group.sync_state_set),
                sync_state_set_epoch=group.sync_state_set_epoch,
            )
        ),
    )


def decide_get_sync_state_data(view: View, broker_names: tuple[str, ...], now: float) -> Decision:
    """GetSyncStateData (1006): replicas of the named groups, in sync or not, alive or not."""
    table: dict[str, ReplicasInfo] = {}
    for name in broker_names:
        group = view.state.groups.get(name)
        if group is None:
            continue
        in_sync: list[ReplicaIdentity] = []
        not_in_sync: list[ReplicaIdentity] = []
        for broker_id, replica in sorted(group.replicas.items()):
            identity = ReplicaIdentity(
                broker_name=name,
                broker_id=broker_id,
                broker_address=replica.broker_address,
                alive=view.liveness.is_alive(name, broker_id, now),
            )
            (in_sync if broker_id in group.sync_state_set else not_in_sync).append(identity)
        table[name] = ReplicasInfo(
            master_broker_id=group.master_broker_id,
            master_address=group.master_address,
            master_epoch=group.master_epoch,
            sync_state_set_epoch=group.sync_state_set_epoch,
            in_sync_replicas=in_sync,
            not_in_sync_replicas=not_in_sync,
        )
    return Decision(body=encode_body(BrokerReplicasInfo(table)))


def decide_clean_broker_data(
    view: View, header: CleanControllerBrokerDataRequestHeader, now: float
) -> Decision:
    """CleanBrokerData (1011): forget dead brokers (or, when asked, living ones too)."""
    invalid = ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    broker_ids: set[int] | None = None
    if header.broker_controller_ids_to_clean:
        try:
            broker_ids = parse_broker_id_list(header.broker_controller_ids_to_clean)
        except ValueError:
            return _fail(
                invalid,
                f"brokerControllerIdsToClean {header.broker_controller_ids_to_clean!r} is not "
                "a ';'-separated list of broker ids",
            )
    group = view.state.groups.get(header.broker_name)
    if group is None:
        return _fail(invalid, f"broker group {header.broker_name} does not exist")
    if not header.is_clean_living_broker:
        checked = sorted(group.replicas) if broker_ids is None else sorted(broker_ids)
        alive = [i for i in checked if view.liveness.is_alive(header.broker_name, i, now)]
        if alive:
            return _fail(
                invalid,
                f"broker {alive[0]} of {header.broker_name} is still alive "
                "(set isCleanLivingBroker to clean it anyway)",
            )
    event = CleanBrokerDataEvent(
        broker_name=header.broker_name,
        broker_id_set_to_clean=tuple(sorted(broker_ids)) if broker_ids is not None else None,
    )
    return Decision(events=(event,))


def decide_update_config(view: View, properties: Mapping[str, str]) -> Decision:
    """UpdateControllerConfig (1009): validated here, replicated to every node."""
    if not properties:
        return _fail(ResponseCode.INVALID_PARAMETER, "no config keys in the request body")
    try:
        validate_overrides(properties)
    except PermissionError as exc:
        return _fail(ResponseCode.NO_PERMISSION, str(exc))
    except ConfigError as exc:
        return _fail(ResponseCode.INVALID_PARAMETER, str(exc))
    return Decision(events=(UpdateControllerConfigEvent(properties=dict(properties)),))
