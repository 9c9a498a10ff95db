"""Liveness table: timeouts, closed channels, first sighting, expiry; the state machine wrapper."""

from ferrymq.controller.liveness import Liveness
from ferrymq.controller.server import ControllerStateMachine
from ferrymq.controller.state import ControllerState
from ferrymq.wire.controller_log import ApplyBrokerIdEvent, encode_entry

from .helpers import NAME, beat


def test_a_broker_is_alive_within_its_timeout_only() -> None:
    liveness = Liveness()
    beat(liveness, 1, 10.0, timeout=3.0)
    assert liveness.is_alive(NAME, 1, 13.0)
    assert not liveness.is_alive(NAME, 1, 13.01)
    assert not liveness.is_alive(NAME, 2, 10.0)


def test_a_closed_channel_kills_at_once_but_keeps_the_last_heartbeat() -> None:
    liveness = Liveness()
    beat(liveness, 1, 10.0)
    assert [i.broker_id for i in liveness.close_channel([(NAME, 1), (NAME, 9)])] == [1]
    assert liveness.close_channel([(NAME, 1)]) == []
    assert not liveness.is_alive(NAME, 1, 10.0)
    info = liveness.info(NAME, 1)
    assert info is not None
    assert info.last_heartbeat == 10.0
    beat(liveness, 1, 11.0)
    assert liveness.is_alive(NAME, 1, 11.0), "a new heartbeat revives it"


def test_heartbeats_replace_election_data_even_downwards() -> None:
    liveness = Liveness()
    beat(liveness, 1, 10.0, epoch=3, max_log_offset=500)
    beat(liveness, 1, 11.0, epoch=2, max_log_offset=100)
    info = liveness.info(NAME, 1)
    assert info is not None
    assert (info.epoch, info.max_log_offset) == (2, 100)


def test_first_seen_expire_and_forget() -> None:
    liveness = Liveness()
    beat(liveness, 1, 10.0, timeout=1.0)
    beat(liveness, 2, 12.0, timeout=1.0)
    assert liveness.first_seen(NAME) == 10.0
    assert [i.broker_id for i in liveness.expire(13.5, keep_for=2.0)] == [1]
    assert liveness.info(NAME, 1) is None
    liveness.forget(NAME, [2])
    assert liveness.info(NAME, 2) is None
    beat(liveness, 3, 20.0)
    liveness.forget(NAME)
    assert liveness.first_seen(NAME) is None
    assert list(liveness.brokers()) == []


def test_the_state_machine_skips_an_undecodable_entry_on_every_node() -> None:
    machines = [ControllerStateMachine(ControllerState()) for _ in range(2)]
    seen: list[int] = []
    machines[0].listeners.append(lambda events, outcomes: seen.append(len(events)))
    good = encode_entry(
        [
            ApplyBrokerIdEvent(
                cluster_name="c",
                broker_name=NAME,
                broker_address="h:1",
                new_broker_id=1,
                register_check_code="h:1;1",
            )
        ]
    )
    for machine in machines:
        assert machine.apply(1, b"\x01not json") == ()
        assert machine.apply(2, good) == (True,)
    assert seen == [0, 1]
    assert machines[0].snapshot() == machines[1].snapshot()
    restored = ControllerStateMachine(ControllerState())
    restored.restore(machines[0].snapshot())
    assert restored.state == machines[0].state


def test_after_the_clock_steps_back_a_silent_broker_dies_within_its_timeout_not_the_step() -> None:
    liveness = Liveness()
    beat(liveness, 1, 1000.0, timeout=3.0)
    beat(liveness, 2, 1000.0, timeout=3.0)
    liveness.step_back(760.0)  # the clock went back four minutes
    info = liveness.info(NAME, 1)
    assert info is not None
    assert info.last_heartbeat == 760.0
    assert liveness.first_seen(NAME) == 760.0
    beat(liveness, 2, 761.0, timeout=3.0)
    assert liveness.is_alive(NAME, 1, 763.0)
    assert not liveness.is_alive(NAME, 1, 763.5), "silent since the step: dead after 3 s"
    assert liveness.is_alive(NAME, 2, 763.5)
    liveness.step_back(770.0)  # a clock that did not step back changes nothing
    assert liveness.is_alive(NAME, 2, 764.0)
