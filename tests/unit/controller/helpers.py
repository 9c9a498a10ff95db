"""Builders for controller core tests: states made by applying events, heartbeats, views."""

from ferrymq.controller.config import INT32_MAX, ControllerConfig
from ferrymq.controller.decide import View
from ferrymq.controller.liveness import BrokerLiveInfo, Liveness
from ferrymq.controller.state import ControllerState
from ferrymq.wire.controller_log import (
    AlterSyncStateSetEvent,
    ApplyBrokerIdEvent,
    ElectMasterEvent,
)

NAME = "broker-a"
CLUSTER = "DefaultCluster"
CONFIG = ControllerConfig()


def address(broker_id: int) -> str:
    return f"127.0.0.1:{10910 + broker_id}"


def check_code(broker_id: int) -> str:
    return f"{address(broker_id)};170000000000{broker_id}"


def group_state(
    replicas: int = 3, master: int | None = 1, sync_state_set: tuple[int, ...] | None = None
) -> ControllerState:
    """A group with ids 1..replicas; `master` elected (epoch 1), then the set altered."""
    state = ControllerState()
    for broker_id in range(1, replicas + 1):
        assert state.apply_event(
            ApplyBrokerIdEvent(
                cluster_name=CLUSTER,
                broker_name=NAME,
                broker_address=address(broker_id),
                new_broker_id=broker_id,
                register_check_code=check_code(broker_id),
            )
        )
    if master is not None:
        assert state.apply_event(
            ElectMasterEvent(
                broker_name=NAME,
                new_master_elected=True,
                new_master_broker_id=master,
                expected_master_epoch=0,
            )
        )
        if sync_state_set is not None and set(sync_state_set) != {master}:
            assert state.apply_event(
                AlterSyncStateSetEvent(
                    broker_name=NAME,
                    new_sync_state_set=sync_state_set,
                    expected_master_epoch=1,
                    expected_sync_state_set_epoch=1,
                )
            )
    return state


def beat(
    liveness: Liveness,
    broker_id: int,
    now: float,
    *,
    epoch: int = 1,
    max_log_offset: int = 0,
    priority: int = INT32_MAX,
    name: str = NAME,
    timeout: float = CONFIG.heartbeat_timeout,
) -> None:
    liveness.heartbeat(
        BrokerLiveInfo(
            cluster_name=CLUSTER,
            broker_name=name,
            broker_id=broker_id,
            broker_addr=address(broker_id),
            last_heartbeat=now,
            heartbeat_timeout=timeout,
            epoch=epoch,
            max_log_offset=max_log_offset,
            election_priority=priority,
        )
    )


def view(
    state: ControllerState,
    liveness: Liveness | None = None,
    config: ControllerConfig = CONFIG,
    leader_since: float = -1000.0,
) -> View:
    return View(state, liveness or Liveness(), config, leader_since)
