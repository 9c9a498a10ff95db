"""Controller decisions: every check and response code of spec section 1.4, election policy."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.controller.decide import (
    AlterSyncStateSet,
    ControllerRequest,
    Decision,
    GetSyncStateData,
    UpdateControllerConfig,
    View,
    decide,
    groups_to_elect,
)
from ferrymq.controller.liveness import Liveness
from ferrymq.controller.state import ControllerState
from ferrymq.wire.bodies import decode_body
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.controller import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
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
    SyncStateSet,
)
from ferrymq.wire.controller_log import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    CleanBrokerDataEvent,
    ElectMasterEvent,
    UpdateBrokerAddressEvent,
    UpdateControllerConfigEvent,
    encode_entry,
)

from .helpers import CLUSTER, CONFIG, NAME, address, beat, check_code, group_state, view

NOW = 100.0


def _decide(request: ControllerRequest, v: View, now: float = NOW) -> Decision:
    before = v.state.snapshot()
    decision = decide(request, v, now)
    assert v.state.snapshot() == before, "decide must not mutate the state"
    return decision


def _apply(state: ControllerState, decision: Decision) -> None:
    assert all(state.apply(state.applied_index + 1, encode_entry(decision.events)))


def _live(*broker_ids: int, now: float = NOW) -> Liveness:
    liveness = Liveness()
    for broker_id in broker_ids:
        beat(liveness, broker_id, now)
    return liveness


# ---------------------------------------------------------------------- GetNextBrokerId


def test_next_broker_id_is_one_for_an_unknown_group_then_follows_assignments() -> None:
    request = GetNextBrokerIdRequestHeader(cluster_name=CLUSTER, broker_name=NAME)
    decision = _decide(request, view(ControllerState()))
    assert decision.header == GetNextBrokerIdResponseHeader(
        cluster_name=CLUSTER, broker_name=NAME, next_broker_id=1
    )
    assert decision.events == ()
    decision = _decide(request, view(group_state(replicas=2, master=None)))
    assert isinstance(decision.header, GetNextBrokerIdResponseHeader)
    assert decision.header.next_broker_id == 3


# ---------------------------------------------------------------------- ApplyBrokerId


def _apply_request(
    broker_id: int, code: str | None = None, cluster: str = CLUSTER
) -> ApplyBrokerIdRequestHeader:
    return ApplyBrokerIdRequestHeader(
        cluster_name=cluster,
        broker_name=NAME,
        applied_broker_id=broker_id,
        register_check_code=check_code(broker_id) if code is None else code,
    )


def test_apply_broker_id_on_a_new_group_accepts_only_id_one() -> None:
    decision = _decide(_apply_request(1), view(ControllerState()))
    assert decision.code == ResponseCode.SUCCESS
    assert decision.events == (
        ApplyBrokerIdEvent(
            cluster_name=CLUSTER,
            broker_name=NAME,
            broker_address=address(1),
            new_broker_id=1,
            register_check_code=check_code(1),
        ),
    )
    assert _decide(_apply_request(2), view(ControllerState())).code == (
        ResponseCode.CONTROLLER_BROKER_ID_INVALID
    )


def test_apply_broker_id_takes_a_free_id_of_a_known_group() -> None:
    state = group_state(replicas=2, master=None)
    decision = _decide(_apply_request(3), view(state))
    assert decision.code == ResponseCode.SUCCESS
    _apply(state, decision)
    assert state.groups[NAME].replicas[3].broker_address == address(3)


def test_apply_broker_id_retry_with_the_same_code_succeeds_without_an_event() -> None:
    decision = _decide(_apply_request(2), view(group_state(replicas=2, master=None)))
    assert decision.code == ResponseCode.SUCCESS
    assert decision.events == ()


def test_apply_broker_id_taken_by_another_broker_is_refused_with_the_next_id() -> None:
    decision = _decide(
        _apply_request(2, code="127.0.0.9:1;5"), view(group_state(replicas=2, master=None))
    )
    assert decision.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    assert decision.remark is not None
    assert "next id is 3" in decision.remark
    assert decision.events == ()


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (_apply_request(3, cluster="Other"), ResponseCode.CONTROLLER_BROKER_ID_INVALID),
        (_apply_request(0), ResponseCode.CONTROLLER_BROKER_ID_INVALID),
        (_apply_request(3, code=""), ResponseCode.CONTROLLER_INVALID_REQUEST),
    ],
)
def test_apply_broker_id_refusals(request_: ApplyBrokerIdRequestHeader, code: int) -> None:
    decision = _decide(request_, view(group_state(replicas=2, master=None)))
    assert (decision.code, decision.events) == (code, ())


# ---------------------------------------------------------------------- RegisterBrokerToController


def _register(
    broker_id: int | None, addr: str | None = None
) -> RegisterBrokerToControllerRequestHeader:
    return RegisterBrokerToControllerRequestHeader(
        cluster_name=CLUSTER,
        broker_name=NAME,
        broker_id=broker_id,
        broker_address=addr or address(broker_id or 0),
    )


@pytest.mark.parametrize("broker_id", [None, 9])
def test_register_needs_an_assigned_id(broker_id: int | None) -> None:
    decision = _decide(_register(broker_id), view(group_state()))
    assert decision.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_register_needs_a_known_group() -> None:
    decision = _decide(_register(1), view(ControllerState()))
    assert decision.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_register_answers_the_live_master_and_records_a_new_address() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    decision = _decide(_register(2, "127.9.9.9:10911"), view(state, _live(1, 2)))
    assert decision.code == ResponseCode.SUCCESS
    assert decision.header == RegisterBrokerToControllerResponseHeader(
        cluster_name=CLUSTER,
        broker_name=NAME,
        master_broker_id=1,
        master_address=address(1),
        master_epoch=1,
        sync_state_set_epoch=2,
    )
    assert decode_body(decision.body, SyncStateSet) == SyncStateSet(
        sync_state_set=[1, 2], sync_state_set_epoch=2
    )
    assert decision.events == (
        UpdateBrokerAddressEvent(
            cluster_name=CLUSTER, broker_name=NAME, broker_id=2, broker_address="127.9.9.9:10911"
        ),
    )
    same_address = _decide(_register(2), view(state, _live(1, 2)))
    assert same_address.events == ()


def test_register_leaves_out_a_master_that_is_gone() -> None:
    state = group_state(master=1)
    liveness = _live(2)
    beat(liveness, 1, NOW - 10)
    decision = _decide(_register(2), view(state, liveness))
    assert isinstance(decision.header, RegisterBrokerToControllerResponseHeader)
    assert decision.header.master_broker_id is None
    assert decision.header.master_address is None


# ---------------------------------------------------------------------- AlterSyncStateSet


def _alter(
    members: list[int], master: int = 1, master_epoch: int = 1, set_epoch: int = 1
) -> AlterSyncStateSet:
    return AlterSyncStateSet(
        AlterSyncStateSetRequestHeader(
            broker_name=NAME, master_broker_id=master, master_epoch=master_epoch
        ),
        SyncStateSet(sync_state_set=members, sync_state_set_epoch=set_epoch),
    )


def test_alter_sync_state_set_succeeds_with_both_epochs_current() -> None:
    state = group_state(master=1)
    decision = _decide(_alter([1, 2, 3]), view(state, _live(1, 2, 3)))
    assert decision.code == ResponseCode.SUCCESS
    assert decision.header == AlterSyncStateSetResponseHeader(new_sync_state_set_epoch=2)
    assert decode_body(decision.body, SyncStateSet) == SyncStateSet(
        sync_state_set=[1, 2, 3], sync_state_set_epoch=2
    )
    assert decision.events == (
        AlterSyncStateSetEvent(
            broker_name=NAME,
            new_sync_state_set=(1, 2, 3),
            expected_master_epoch=1,
            expected_sync_state_set_epoch=1,
        ),
    )
    _apply(state, decision)
    assert state.groups[NAME].sync_state_set == {1, 2, 3}


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (_alter([1]), ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
        (_alter([1, 2], master=2), ResponseCode.CONTROLLER_INVALID_MASTER),
        (_alter([1, 2], master_epoch=0), ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH),
        (_alter([1, 2], set_epoch=0), ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
        (_alter([1, 7]), ResponseCode.CONTROLLER_INVALID_REPLICAS),
        (_alter([1, 3]), ResponseCode.CONTROLLER_BROKER_NOT_ALIVE),
        (_alter([2]), ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
    ],
    ids=[
        "same-set",
        "not-master",
        "stale-master-epoch",
        "stale-set-epoch",
        "unregistered",
        "not-alive",
        "lacks-master",
    ],
)
def test_alter_sync_state_set_refusals(request_: AlterSyncStateSet, code: int) -> None:
    decision = _decide(request_, view(group_state(master=1), _live(1, 2)))
    assert (decision.code, decision.events) == (code, ())


def test_alter_sync_state_set_of_an_unknown_group_fails() -> None:
    decision = _decide(_alter([1, 2]), view(ControllerState()))
    assert decision.code == ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED


# ---------------------------------------------------------------------- ElectMaster


def _elect(broker_id: int = -1, designate: bool = False) -> ElectMasterRequestHeader:
    return ElectMasterRequestHeader(
        cluster_name=CLUSTER, broker_name=NAME, broker_id=broker_id, designate_elect=designate
    )


def _elected(decision: Decision) -> int | None:
    assert decision.code == ResponseCode.SUCCESS, decision.remark
    assert isinstance(decision.header, ElectMasterResponseHeader)
    return decision.header.master_broker_id


def test_elect_master_of_an_unknown_group_needs_registration() -> None:
    decision = _decide(_elect(), view(ControllerState()))
    assert decision.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_first_election_waits_for_registered_replicas_then_picks_by_data() -> None:
    state = group_state(master=None)
    liveness = Liveness()
    beat(liveness, 1, NOW, max_log_offset=10)
    beat(liveness, 2, NOW, max_log_offset=50)
    waiting = _decide(_elect(broker_id=1), view(state, liveness))
    assert waiting.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
    assert waiting.events == ()
    beat(liveness, 3, NOW, max_log_offset=20)
    decision = _decide(_elect(broker_id=1), view(state, liveness))
    assert _elected(decision) == 2, "the replica with the most data wins, not the one who asked"
    body = decode_body(decision.body, ElectMasterResponseBody)
    assert body.sync_state_set == [2]
    assert body.broker_member_group is not None
    assert body.broker_member_group.broker_addrs == {1: address(1), 2: address(2), 3: address(3)}
    assert decision.header == ElectMasterResponseHeader(
        master_broker_id=2, master_address=address(2), master_epoch=1, sync_state_set_epoch=1
    )


def test_first_election_after_the_wait_picks_among_the_live_replicas() -> None:
    state = group_state(master=None)
    liveness = Liveness()
    beat(liveness, 1, NOW, max_log_offset=10)
    beat(liveness, 3, NOW, max_log_offset=5)
    later = NOW + CONFIG.first_election_wait
    beat(liveness, 1, later, max_log_offset=10)
    beat(liveness, 3, later, max_log_offset=5)
    assert _elected(_decide(_elect(broker_id=3), view(state, liveness), later)) == 1


def test_broker_trigger_while_the_master_is_alive_answers_master_still_exist() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    decision = _decide(_elect(broker_id=2), view(state, _live(1, 2)))
    assert decision.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    assert decision.header == ElectMasterResponseHeader(
        master_broker_id=1, master_address=address(1), master_epoch=1, sync_state_set_epoch=2
    )
    assert decision.events == ()


def test_a_master_whose_channel_closed_is_not_replaced_within_its_lease() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    liveness = _live(1, 2)
    liveness.close_channel([(NAME, 1)])
    within = NOW + CONFIG.master_replace_wait / 2
    beat(liveness, 2, within)
    assert _decide(_elect(), view(state, liveness), within).code == (
        ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    )
    past = NOW + CONFIG.master_replace_wait
    beat(liveness, 2, past)
    assert _elected(_decide(_elect(), view(state, liveness), past)) == 2


def test_no_election_during_the_grace_period_after_a_leader_change() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    liveness = _live(2)
    fresh = view(state, liveness, leader_since=NOW - 0.1)
    assert _decide(_elect(), fresh).code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
    assert groups_to_elect(fresh, NOW) == []
    settled = view(state, liveness, leader_since=NOW - CONFIG.election_grace)
    assert groups_to_elect(settled, NOW) == [NAME]
    assert _elected(_decide(_elect(), settled)) == 2


@pytest.mark.parametrize(
    ("beats", "winner"),
    [
        ({2: (1, 500, 9), 3: (2, 100, 9)}, 3),  # higher epoch first
        ({2: (2, 500, 9), 3: (2, 100, 9)}, 2),  # then more data
        ({2: (2, 100, 9), 3: (2, 100, 1)}, 3),  # then lower election priority
        ({2: (2, 100, 9), 3: (2, 100, 9)}, 2),  # then lower broker id
        ({2: (2, 2**40, 9), 3: (2, 2**40 - 2**33, 9)}, 2),  # no int32 overflow
    ],
)
def test_election_ranks_candidates_by_epoch_offset_priority_id(
    beats: dict[int, tuple[int, int, int]], winner: int
) -> None:
    state = group_state(master=1, sync_state_set=(1, 2, 3))
    liveness = Liveness()
    for broker_id, (epoch, log_offset, priority) in beats.items():
        beat(liveness, broker_id, NOW, epoch=epoch, max_log_offset=log_offset, priority=priority)
    decision = _decide(_elect(), view(state, liveness))
    assert _elected(decision) == winner
    assert decision.events == (
        ElectMasterEvent(
            broker_name=NAME,
            new_master_elected=True,
            new_master_broker_id=winner,
            expected_master_epoch=1,
            # the dead master leaves the set; the live members stay in it (Kafka's ISR)
            new_sync_state_set=(2, 3),
        ),
    )


def test_controller_trigger_without_candidates_records_no_master() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    liveness = _live(3)
    decision = _decide(_elect(), view(state, liveness))
    assert decision.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    assert decision.events == (
        ElectMasterEvent(broker_name=NAME, new_master_elected=False, expected_master_epoch=1),
    )
    _apply(state, decision)
    group = state.groups[NAME]
    assert (group.master_broker_id, group.master_epoch, group.sync_state_set) == (None, 2, {1, 2})
    again = _decide(_elect(), view(state, liveness))
    assert (again.code, again.events) == (ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE, ())


def test_broker_trigger_without_candidates_fails_without_an_event() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    decision = _decide(_elect(broker_id=3), view(state, _live(3)))
    assert (decision.code, decision.events) == (ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, ())


def test_a_group_without_master_gets_one_when_a_set_member_returns() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    _apply(state, _decide(_elect(), view(state, _live(3))))
    v = view(state, _live(1, 3))
    assert groups_to_elect(v, NOW) == [NAME]
    decision = _decide(_elect(), v)
    assert _elected(decision) == 1
    _apply(state, decision)
    assert state.groups[NAME].master_epoch == 3


def test_admin_designates_a_live_set_member() -> None:
    state = group_state(master=1, sync_state_set=(1, 2, 3))
    assert _elected(_decide(_elect(3, designate=True), view(state, _live(1, 2, 3)))) == 3
    designated_dead = _decide(_elect(3, designate=True), view(state, _live(1, 2)))
    assert designated_dead.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
    same = _decide(_elect(1, designate=True), view(state, _live(1, 2)))
    assert same.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST


def test_unclean_election_is_off_by_default_and_warns_when_on() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    liveness = _live(3)
    clean = _decide(_elect(), view(state, liveness))
    assert clean.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    unclean_config = dataclasses.replace(CONFIG, enable_elect_unclean_master=True)
    unclean = _decide(_elect(), view(state, liveness, unclean_config))
    assert _elected(unclean) == 3
    assert unclean.warning is not None
    assert "lost" in unclean.warning


def test_groups_to_elect_finds_a_gone_master_and_a_ready_first_election() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    assert groups_to_elect(view(state, _live(1, 2)), NOW) == []
    assert groups_to_elect(view(state, _live(2)), NOW) == [NAME]
    assert groups_to_elect(view(state, Liveness()), NOW) == [], "nobody alive: keep the master"
    fresh = group_state(master=None)
    assert groups_to_elect(view(fresh, _live(1, 2, 3)), NOW) == [NAME]
    assert groups_to_elect(view(fresh, _live(1)), NOW) == []


# ---------------------------------------------------------------------- reads


def test_get_replica_info() -> None:
    missing = _decide(GetReplicaInfoRequestHeader(broker_name=NAME), view(ControllerState()))
    assert missing.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    decision = _decide(
        GetReplicaInfoRequestHeader(broker_name=NAME), view(group_state(sync_state_set=(1, 3)))
    )
    assert decision.header == GetReplicaInfoResponseHeader(
        master_broker_id=1, master_address=address(1), master_epoch=1
    )
    assert decode_body(decision.body, SyncStateSet) == SyncStateSet(
        sync_state_set=[1, 3], sync_state_set_epoch=2
    )


def test_get_sync_state_data_lists_replicas_by_set_and_liveness() -> None:
    decision = _decide(
        GetSyncStateData((NAME, "unknown")), view(group_state(sync_state_set=(1, 3)), _live(1))
    )
    table = decode_body(decision.body, BrokerReplicasInfo).replicas_info_table
    assert list(table) == [NAME]
    info = table[NAME]
    assert (info.master_broker_id, info.master_epoch, info.sync_state_set_epoch) == (1, 1, 2)
    assert [(r.broker_id, r.alive) for r in info.in_sync_replicas] == [(1, True), (3, False)]
    assert [(r.broker_id, r.alive) for r in info.not_in_sync_replicas] == [(2, False)]


# ---------------------------------------------------------------------- CleanBrokerData


def _clean(ids: str | None = None, living: bool = False) -> CleanControllerBrokerDataRequestHeader:
    return CleanControllerBrokerDataRequestHeader(
        cluster_name=CLUSTER,
        broker_name=NAME,
        broker_controller_ids_to_clean=ids,
        is_clean_living_broker=living,
    )


@pytest.mark.parametrize(
    ("request_", "alive"),
    [(_clean("1;x"), ()), (_clean("2"), (2,)), (_clean(), (3,))],
    ids=["malformed", "listed-alive", "group-alive"],
)
def test_clean_broker_data_refusals(
    request_: CleanControllerBrokerDataRequestHeader, alive: tuple[int, ...]
) -> None:
    decision = _decide(request_, view(group_state(), _live(*alive)))
    assert (decision.code, decision.events) == (
        ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
        (),
    )


def test_clean_broker_data_of_an_unknown_group_fails() -> None:
    decision = _decide(_clean("1"), view(ControllerState()))
    assert decision.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA


def test_clean_broker_data_events() -> None:
    dead = _decide(_clean("3;2"), view(group_state(), _live(1)))
    assert dead.events == (CleanBrokerDataEvent(broker_name=NAME, broker_id_set_to_clean=(2, 3)),)
    living = _decide(_clean(living=True), view(group_state(), _live(1, 2, 3)))
    assert living.events == (CleanBrokerDataEvent(broker_name=NAME),)


# ---------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("properties", "code"),
    [
        ({}, ResponseCode.INVALID_PARAMETER),
        ({"configStorePath": "/tmp/x"}, ResponseCode.NO_PERMISSION),
        ({"noSuchKey": "1"}, ResponseCode.INVALID_PARAMETER),
        ({"masterLeaseMillis": "soon"}, ResponseCode.INVALID_PARAMETER),
        ({"masterLeaseMillis": "-5"}, ResponseCode.INVALID_PARAMETER),
    ],
)
def test_update_config_refusals(properties: dict[str, str], code: int) -> None:
    decision = _decide(UpdateControllerConfig(properties), view(ControllerState()))
    assert (decision.code, decision.events) == (code, ())


def test_update_config_is_replicated() -> None:
    decision = _decide(
        UpdateControllerConfig({"enableElectUncleanMaster": "true"}), view(ControllerState())
    )
    assert decision.events == (
        UpdateControllerConfigEvent(properties={"enableElectUncleanMaster": "true"}),
    )


# ---------------------------------------------------------------------- model-based


_requests: st.SearchStrategy[ControllerRequest] = st.one_of(
    st.builds(
        ApplyBrokerIdRequestHeader,
        cluster_name=st.just(CLUSTER),
        broker_name=st.just(NAME),
        applied_broker_id=st.integers(0, 4),
        register_check_code=st.sampled_from(["h:1;1", "h:2;2", "h:3;3"]),
    ),
    st.builds(
        RegisterBrokerToControllerRequestHeader,
        cluster_name=st.just(CLUSTER),
        broker_name=st.just(NAME),
        broker_id=st.integers(1, 4),
        broker_address=st.sampled_from(["h:1", "h:9"]),
    ),
    st.builds(
        lambda members, master, epoch, set_epoch: _alter(members, master, epoch, set_epoch),
        st.lists(st.integers(1, 4), max_size=4, unique=True),
        st.integers(1, 4),
        st.integers(0, 4),
        st.integers(0, 4),
    ),
    st.builds(
        ElectMasterRequestHeader,
        cluster_name=st.just(CLUSTER),
        broker_name=st.just(NAME),
        broker_id=st.integers(-1, 4),
        designate_elect=st.booleans(),
    ),
    st.builds(
        lambda ids, living: _clean(ids, living),
        st.none() | st.sampled_from(["1", "2;3"]),
        st.booleans(),
    ),
)


@given(
    st.lists(st.tuples(_requests, st.frozensets(st.integers(1, 4)), st.floats(0, 5)), max_size=30),
    st.booleans(),
)
def test_any_request_sequence_keeps_the_state_consistent(
    steps: list[tuple[ControllerRequest, frozenset[int], float]], unclean: bool
) -> None:
    state = ControllerState()
    config = dataclasses.replace(CONFIG, enable_elect_unclean_master=unclean)
    now = NOW
    for request, alive, advance in steps:
        now += advance
        liveness = Liveness()
        for broker_id in alive:
            beat(liveness, broker_id, now)
        decision = _decide(request, view(state, liveness, config), now)
        if decision.code != ResponseCode.SUCCESS:
            assert decision.remark
        before = {n: (g.master_epoch, g.sync_state_set_epoch) for n, g in state.groups.items()}
        outcomes = state.apply(state.applied_index + 1, encode_entry(decision.events))
        assert all(outcomes), "events decided on the applied state always apply"
        for name, group in state.groups.items():
            assert group.sync_state_set <= group.replicas.keys()
            if group.master_broker_id is not None:
                assert group.master_broker_id in group.sync_state_set
            if name in before:
                assert group.master_epoch >= before[name][0]
                assert group.sync_state_set_epoch >= before[name][1]
