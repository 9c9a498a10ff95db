"""A controller node's Prometheus metrics, read at scrape time from its Raft driver and state.

Raft: term, commit and applied index, leader changes seen, whether this node leads. Controller
state (the same on every node once applied): each broker group's SyncStateSet size, master
epoch (one step per election) and replicas known. Labels are node ids and broker names only.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ferrymq.controller.state import ControllerState
from ferrymq.raft.driver import RaftDriver

__all__ = ["collect"]


def collect(raft: RaftDriver, state: ControllerState) -> Iterator[Metric]:
    """Every metric of this controller node, read now."""
    node = [raft.node_id]
    for name, doc, value in (
        ("rocketmq_controller_raft_term", "Current Raft term", raft.term),
        (
            "rocketmq_controller_raft_commit_index",
            "Highest Raft index known committed",
            raft.commit_index,
        ),
        (
            "rocketmq_controller_raft_applied_index",
            "Highest Raft index applied",
            raft.applied_index,
        ),
        (
            "rocketmq_controller_role",
            "1 on the leader (once it applied its term's first entry)",
            1 if raft.is_leader else 0,
        ),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=["node"])
        gauge.add_metric(node, value)
        yield gauge
    changes = CounterMetricFamily(
        "rocketmq_controller_raft_leader_changes", "Leader changes this node saw", labels=["node"]
    )
    changes.add_metric(node, raft.leader_changes)
    yield changes

    labels = ["cluster", "broker"]
    set_size = GaugeMetricFamily(
        "rocketmq_controller_sync_state_set_size", "Replicas in the SyncStateSet", labels=labels
    )
    epoch = GaugeMetricFamily(
        "rocketmq_controller_master_epoch", "Master epoch (one per election)", labels=labels
    )
    replicas = GaugeMetricFamily(
        "rocketmq_controller_replicas", "Replicas the controller knows", labels=labels
    )
    active = 0
    for group in list(state.groups.values()):
        values = [group.cluster_name, group.broker_name]
        set_size.add_metric(values, len(group.sync_state_set))
        epoch.add_metric(values, group.master_epoch)
        replicas.add_metric(values, len(group.replicas))
        active += len(group.replicas)
    yield set_size
    yield epoch
    yield replicas
    brokers = GaugeMetricFamily(
        "rocketmq_active_broker_num", "Broker replicas known to the controller", labels=["node"]
    )
    brokers.add_metric(node, active)
    yield brokers
