"""The controller state machine: apply semantics per event, determinism, snapshots."""

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.controller.state import ControllerState
from ferrymq.errors import ProtocolError
from ferrymq.wire.controller_log import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    CleanBrokerDataEvent,
    ElectMasterEvent,
    Event,
    UpdateBrokerAddressEvent,
    UpdateControllerConfigEvent,
    encode_entry,
)

from .helpers import CLUSTER, NAME, address, check_code, group_state


def _apply_id(broker_id: int, name: str = NAME, code: str | None = None) -> ApplyBrokerIdEvent:
    return ApplyBrokerIdEvent(
        cluster_name=CLUSTER,
        broker_name=name,
        broker_address=address(broker_id),
        new_broker_id=broker_id,
        register_check_code=code or check_code(broker_id),
    )


def test_first_broker_id_creates_the_group() -> None:
    state = ControllerState()
    assert state.apply_event(_apply_id(1))
    group = state.groups[NAME]
    assert group.cluster_name == CLUSTER
    assert group.next_broker_id == 2
    assert group.replicas[1].register_check_code == check_code(1)
    assert (group.master_broker_id, group.master_epoch, group.sync_state_set) == (None, 0, set())


def test_a_taken_broker_id_is_not_reassigned() -> None:
    state = group_state(replicas=2, master=None)
    assert not state.apply_event(_apply_id(2, code="other;1"))
    assert state.groups[NAME].replicas[2].register_check_code == check_code(2)
    assert state.groups[NAME].next_broker_id == 3


def test_an_id_applied_out_of_order_is_never_handed_out_again() -> None:
    state = group_state(replicas=1, master=None)
    assert state.apply_event(_apply_id(5))
    assert state.groups[NAME].next_broker_id == 6
    assert state.apply_event(_apply_id(2))
    assert state.groups[NAME].next_broker_id == 6


def test_update_broker_address_keeps_the_check_code() -> None:
    state = group_state(replicas=1, master=None)
    event = UpdateBrokerAddressEvent(
        cluster_name=CLUSTER, broker_name=NAME, broker_id=1, broker_address="127.0.0.9:10911"
    )
    assert state.apply_event(event)
    replica = state.groups[NAME].replicas[1]
    assert (replica.broker_address, replica.register_check_code) == (
        "127.0.0.9:10911",
        check_code(1),
    )
    unknown = UpdateBrokerAddressEvent(
        cluster_name=CLUSTER, broker_name=NAME, broker_id=7, broker_address="x:1"
    )
    assert not state.apply_event(unknown)


def test_elect_master_sets_master_and_set_and_bumps_both_epochs() -> None:
    state = group_state(master=1, sync_state_set=(1, 2, 3))
    group = state.groups[NAME]
    assert (group.master_epoch, group.sync_state_set_epoch) == (1, 2)
    assert state.apply_event(
        ElectMasterEvent(
            broker_name=NAME,
            new_master_elected=True,
            new_master_broker_id=2,
            expected_master_epoch=1,
        )
    )
    assert group.master_broker_id == 2
    assert group.sync_state_set == {2}
    assert (group.master_epoch, group.sync_state_set_epoch) == (2, 3)


def test_failed_election_clears_master_bumps_epoch_and_keeps_the_set() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    group = state.groups[NAME]
    assert state.apply_event(
        ElectMasterEvent(broker_name=NAME, new_master_elected=False, expected_master_epoch=1)
    )
    assert group.master_broker_id is None
    assert group.master_epoch == 2
    assert group.sync_state_set == {1, 2}
    assert group.sync_state_set_epoch == 2


def test_events_decided_against_old_epochs_change_nothing() -> None:
    state = group_state(master=1, sync_state_set=(1, 2))
    before = state.snapshot()
    stale_elect = ElectMasterEvent(
        broker_name=NAME, new_master_elected=True, new_master_broker_id=2, expected_master_epoch=0
    )
    stale_alter = AlterSyncStateSetEvent(
        broker_name=NAME,
        new_sync_state_set=(1,),
        expected_master_epoch=1,
        expected_sync_state_set_epoch=1,
    )
    assert not state.apply_event(stale_elect)
    assert not state.apply_event(stale_alter)
    assert state.snapshot() == before


def test_alter_sync_state_set_needs_the_master_and_registered_members() -> None:
    state = group_state(master=1)
    for members in [(2, 3), (1, 9)]:
        event = AlterSyncStateSetEvent(
            broker_name=NAME,
            new_sync_state_set=members,
            expected_master_epoch=1,
            expected_sync_state_set_epoch=1,
        )
        assert not state.apply_event(event)
    assert state.groups[NAME].sync_state_set == {1}


def test_clean_broker_data_removes_ids_and_a_cleaned_master() -> None:
    state = group_state(master=1, sync_state_set=(1, 2, 3))
    assert state.apply_event(CleanBrokerDataEvent(broker_name=NAME, broker_id_set_to_clean=(3,)))
    group = state.groups[NAME]
    assert set(group.replicas) == {1, 2}
    assert group.sync_state_set == {1, 2}
    assert (group.master_broker_id, group.master_epoch) == (1, 1)
    assert state.apply_event(CleanBrokerDataEvent(broker_name=NAME, broker_id_set_to_clean=(1,)))
    assert (group.master_broker_id, group.master_epoch) == (None, 2)
    assert state.apply_event(CleanBrokerDataEvent(broker_name=NAME, broker_id_set_to_clean=(2,)))
    assert NAME not in state.groups


def test_clean_broker_data_without_ids_drops_the_group() -> None:
    state = group_state()
    assert state.apply_event(CleanBrokerDataEvent(broker_name=NAME))
    assert state.groups == {}
    assert not state.apply_event(CleanBrokerDataEvent(broker_name=NAME))


def test_a_group_registered_again_after_its_removal_continues_its_epochs() -> None:
    """Its brokers' epoch files still hold the old epochs, and a broker follows only a higher
    master epoch: a group starting again at epoch 0 would have no master they accept."""
    state = group_state()
    old = state.groups[NAME]
    epochs = (old.master_epoch, old.sync_state_set_epoch)
    assert epochs > (0, 0)
    assert state.apply_event(CleanBrokerDataEvent(broker_name=NAME))
    restored = ControllerState()
    restored.restore(state.snapshot())  # the removed group's epochs survive a snapshot too
    assert restored == state
    for s in (state, restored):
        assert s.apply_event(_apply_id(1))
        again = s.groups[NAME]
        assert (again.master_epoch, again.sync_state_set_epoch) == epochs
        assert again.master_broker_id is None
        assert s.retired_epochs == {}


def test_a_snapshot_without_retired_epochs_still_restores() -> None:
    state = group_state()
    record = msgspec.json.decode(state.snapshot()[1:])
    del record["retiredEpochs"]
    older = state.snapshot()[:1] + msgspec.json.encode(record)
    restored = ControllerState()
    restored.restore(older)
    assert restored == state


def test_config_updates_are_replicated_state() -> None:
    state = ControllerState()
    state.apply_event(UpdateControllerConfigEvent(properties={"enableElectUncleanMaster": "true"}))
    assert state.config_overrides == {"enableElectUncleanMaster": "true"}


def test_apply_decodes_entries_and_records_the_index() -> None:
    state = ControllerState()
    assert state.apply(1, b"") == ()
    assert state.apply(2, encode_entry([_apply_id(1), _apply_id(1, code="x;1")])) == (True, False)
    assert state.applied_index == 2
    with pytest.raises(ProtocolError):
        state.apply(3, b"\x01[{}]")
    with pytest.raises(ProtocolError):
        state.apply(3, b"\x07[]")
    assert state.applied_index == 2


# ---------------------------------------------------------------------- properties

_names = st.sampled_from(["a", "b"])
_ids = st.integers(0, 5)
_epochs = st.integers(0, 4)

_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        ApplyBrokerIdEvent,
        cluster_name=st.just(CLUSTER),
        broker_name=_names,
        broker_address=st.sampled_from(["h:1", "h:2"]),
        new_broker_id=_ids,
        register_check_code=st.sampled_from(["h:1;1", "h:2;2"]),
    ),
    st.builds(
        UpdateBrokerAddressEvent,
        cluster_name=st.just(CLUSTER),
        broker_name=_names,
        broker_id=_ids,
        broker_address=st.sampled_from(["h:3", "h:4"]),
    ),
    st.builds(
        AlterSyncStateSetEvent,
        broker_name=_names,
        new_sync_state_set=st.lists(_ids, max_size=4, unique=True).map(lambda x: tuple(sorted(x))),
        expected_master_epoch=_epochs,
        expected_sync_state_set_epoch=_epochs,
    ),
    st.builds(
        ElectMasterEvent,
        broker_name=_names,
        new_master_elected=st.booleans(),
        new_master_broker_id=st.none() | _ids,
        expected_master_epoch=_epochs,
    ),
    st.builds(
        CleanBrokerDataEvent,
        broker_name=_names,
        broker_id_set_to_clean=st.none()
        | st.lists(_ids, max_size=3, unique=True).map(lambda x: tuple(sorted(x))),
    ),
    st.builds(
        UpdateControllerConfigEvent,
        properties=st.dictionaries(
            st.sampled_from(["enableElectUncleanMaster", "masterLeaseMillis"]),
            st.sampled_from(["true", "1000"]),
            max_size=2,
        ),
    ),
)
_batches = st.lists(st.lists(_events, min_size=1, max_size=3), max_size=25)


def _check_invariants(state: ControllerState) -> None:
    for group in state.groups.values():
        assert group.replicas, "an empty group is dropped"
        assert group.sync_state_set <= group.replicas.keys()
        if group.master_broker_id is not None:
            assert group.master_broker_id in group.replicas
            assert group.master_broker_id in group.sync_state_set
        assert all(i < group.next_broker_id for i in group.replicas)


@given(_batches)
def test_apply_is_deterministic_and_keeps_the_invariants(batches: list[list[Event]]) -> None:
    entries = [encode_entry(batch) for batch in batches]
    first, second = ControllerState(), ControllerState()
    epochs: dict[str, tuple[int, int]] = {}
    for index, entry in enumerate(entries, 1):
        assert first.apply(index, entry) == second.apply(index, entry)
        assert first.snapshot() == second.snapshot()
        _check_invariants(first)
        for name, group in first.groups.items():
            before = epochs.get(name, (0, 0))
            assert group.master_epoch >= before[0]
            assert group.sync_state_set_epoch >= before[1]
        epochs = {n: (g.master_epoch, g.sync_state_set_epoch) for n, g in first.groups.items()}


@given(_batches, _batches)
def test_snapshot_restore_round_trips_and_continues_identically(
    before: list[list[Event]], after: list[list[Event]]
) -> None:
    original = ControllerState()
    for index, batch in enumerate(before, 1):
        original.apply(index, encode_entry(batch))
    restored = ControllerState()
    restored.restore(original.snapshot())
    assert restored == original
    assert restored.snapshot() == original.snapshot()
    for index, batch in enumerate(after, len(before) + 1):
        entry = encode_entry(batch)
        assert original.apply(index, entry) == restored.apply(index, entry)
    assert restored == original


def test_a_corrupt_snapshot_is_refused() -> None:
    state = group_state()
    data = state.snapshot()
    for bad in (b"", b"\x02" + data[1:], data[:-3]):
        with pytest.raises(ProtocolError):
            ControllerState().restore(bad)


@given(_batches, _batches)
def test_an_overlay_takes_events_without_touching_the_state(
    before: list[list[Event]], after: list[list[Event]]
) -> None:
    state = ControllerState()
    for index, batch in enumerate(before, 1):
        state.apply(index, encode_entry(batch))
    frozen = state.snapshot()
    direct = ControllerState()
    direct.restore(frozen)
    overlay = state.overlay()
    for batch in after:
        for event in batch:
            assert overlay.apply_event(event) == direct.apply_event(event)
    assert state.snapshot() == frozen
    assert overlay.snapshot() == direct.snapshot()
