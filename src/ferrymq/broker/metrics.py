"""The broker's throughput accounting and its Prometheus metrics.

Owns `BrokerStats`, the counts the send and pull paths add to (RocketMQ `BrokerStatsManager`:
TOPIC_PUT_NUMS/SIZE per topic, GROUP_GET_NUMS/SIZE per topic and group, pulls found and missed,
send and pull latency), the TPS figures the admin answers read from it (`runtime_keys`,
`consume_tps`), and `collect`, which builds the broker's metric families at scrape time from
those counts and from the store, offsets and replication state.

Rules:
1. The send and pull paths only call `put`/`got`/`*_latency.observe`: no prometheus-client
   object, no lock, no clock read beyond the latency's own (docs/benchmarks.md "Metrics cost").
2. Everything else (consumer lag, dispatch and flush behind, replication lag, disk ratio) is
   computed when scraped, from the state the broker keeps anyway.
3. Labels are topics, groups, queue ids and broker ids: never a client address or id.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from ferrymq.broker.runtime import DISTRIBUTE_BOUNDS_S
from ferrymq.metrics.stats import DEFAULT_LATENCY_BUCKETS_S, Latency, StatsTable

if TYPE_CHECKING:
    from ferrymq.broker.state import BrokerState

__all__ = ["LATENCY_SAMPLE_EVERY", "BrokerStats", "collect"]

LATENCY_SAMPLE_EVERY: Final = 8
"""One send in this many is timed for `rocketmq_send_latency_seconds` (docs/benchmarks.md
"Metrics cost": timing every send cost more than the rest of the accounting together)."""
_WINDOWS_S = (10.0, 60.0, 600.0)
"""RocketMQ's putTps and getTransferedTps: the rates over 10 s, 1 min and 10 min."""


class BrokerStats:
    """Counts and latencies of one broker since it started."""

    def __init__(self, now: float) -> None:
        self.started = now
        self.put: StatsTable[str] = StatsTable(now, window_s=_WINDOWS_S[-1])
        """Messages and bytes acknowledged per topic (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)."""
        self.get: StatsTable[tuple[str, str]] = StatsTable(now, window_s=_WINDOWS_S[-1])
        """Messages and bytes returned per (topic, group) (GROUP_GET_NUMS, GROUP_GET_SIZE)."""
        self.pulls: StatsTable[bool] = StatsTable(now, window_s=_WINDOWS_S[-1])
        """Pull answers by whether they found messages (getFoundTps, getMissTps)."""
        self.sendbacks: StatsTable[tuple[str, str]] = StatsTable(now, window_s=_WINDOWS_S[-1])
        """Consumer send-backs stored per (original topic, group) (SNDBCK_PUT_NUMS)."""
        self.send_seq = 0
        """Sends handled (the latency sample picks one in `LATENCY_SAMPLE_EVERY`)."""
        self.send_latency = Latency(sorted({*DEFAULT_LATENCY_BUCKETS_S, *DISTRIBUTE_BOUNDS_S}))
        """RocketMQ's put-latency buckets among its bounds (`runtime.distribute_text`)."""
        self.pull_latency = Latency()
        self.flush_latency = Latency()

    def sent(self, topic: str, count: int, size: int) -> None:
        """An acknowledged send of `count` messages, `size` body bytes, to `topic`."""
        self.put.add(topic, count, size)

    def pulled(self, topic: str, group: str, count: int, size: int) -> None:
        """A pull answer carrying `count` messages of `size` stored bytes (0: nothing found)."""
        if count:
            self.get.add((topic, group), count, size)
        self.pulls.add(count > 0, 1, 0)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic: its put counts and every group's get counts of it go.

        RocketMQ's `BrokerStatsManager.onTopicDeleted`; its metric series go with them.
        """
        self.put.forget(lambda key: key == topic)
        self.get.forget(lambda key: key[0] == topic)
        self.sendbacks.forget(lambda key: key[0] == topic)

    def forget_group(self, group: str) -> None:
        """A deleted group: its get counts in every topic go (`onGroupDeleted`)."""
        self.get.forget(lambda key: key[1] == group)
        self.sendbacks.forget(lambda key: key[1] == group)

    def sample(self, now: float) -> None:
        """Snapshot the counts (the broker calls this every few seconds)."""
        self.put.sample(now)
        self.get.sample(now)
        self.pulls.sample(now)
        self.sendbacks.sample(now)

    def consume_tps(self, topic: str | None, group: str, now: float) -> float:
        """Messages per second `group` pulled over the last minute (all topics when None)."""
        total = 0.0
        for key, _, _ in self.get.items():
            if key[1] == group and (topic is None or key[0] == topic):
                total += self.get.rate(key, now, 60.0).count_per_s
        return total

    def in_tps(self, now: float) -> float:
        """Messages per second acknowledged over the last minute, every topic."""
        return self.put.rate_all(now, 60.0).count_per_s

    def out_tps(self, now: float) -> float:
        """Messages per second returned by pulls over the last minute."""
        return self.get.rate_all(now, 60.0).count_per_s

    def stats_data(self, stats_name: str, stats_key: str, now: float) -> dict[str, object] | None:
        """VIEW_BROKER_STATS_DATA (315)'s `BrokerStatsData` for one RocketMQ stats item.

        `stats_name` is TOPIC_PUT_NUMS / TOPIC_PUT_SIZE (key: topic) or GROUP_GET_NUMS /
        GROUP_GET_SIZE (key: `topic@group`); None for other names. statsMinute covers the last
        minute; statsHour and statsDay cover what is kept (the last 10 minutes, or since start):
        `sum` counted in that span, `tps` its rate, `avgpt` 0 (ferrymq times no stats item).
        """
        table: StatsTable[str] | StatsTable[tuple[str, str]]
        key: str | tuple[str, str]
        if stats_name in ("TOPIC_PUT_NUMS", "TOPIC_PUT_SIZE"):
            table, key = self.put, stats_key
        elif stats_name in ("GROUP_GET_NUMS", "GROUP_GET_SIZE"):
            topic, _, group = stats_key.partition("@")
            table, key = self.get, (topic, group)
        else:
            return None
        sizes = stats_name.endswith("_SIZE")
        out: dict[str, object] = {}
        for field, window in (("statsMinute", 60.0), ("statsHour", 3600.0), ("statsDay", 86400.0)):
            rates = table.rate(key, now, window)  # type: ignore[arg-type]
            rate = rates.bytes_per_s if sizes else rates.count_per_s
            span = min(window, table.window_s, now - self.started)
            out[field] = {"sum": round(rate * span), "tps": round(rate, 2), "avgpt": 0.0}
        return out

    def runtime_keys(self, now: float) -> dict[str, str]:
        """RocketMQ's GET_BROKER_RUNTIME_INFO throughput keys, formatted as RocketMQ does.

        The TPS keys hold three rates, over 10 s, 1 min and 10 min ("%.2f %.2f %.2f").
        """

        def three(rate: Callable[[float], float]) -> str:
            return " ".join(f"{rate(window):.2f}" for window in _WINDOWS_S)

        found = [self.pulls.rate(True, now, w).count_per_s for w in _WINDOWS_S]
        missed = [self.pulls.rate(False, now, w).count_per_s for w in _WINDOWS_S]
        return {
            "putTps": three(lambda w: self.put.rate_all(now, w).count_per_s),
            "getTransferedTps": three(lambda w: self.get.rate_all(now, w).count_per_s),
            "getFoundTps": " ".join(f"{r:.2f}" for r in found),
            "getMissTps": " ".join(f"{r:.2f}" for r in missed),
            "getTotalTps": " ".join(f"{f + m:.2f}" for f, m in zip(found, missed, strict=True)),
            "msgGetTotalTodayNow": str(self.get.grand_total()[0]),
            "putMessageTimesTotal": str(self.put.grand_total()[0]),
            "putMessageSizeTotal": str(self.put.grand_total()[1]),
        }


def _histogram(name: str, doc: str, latency: Latency, **labels: str) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), latency.cumulative(), latency.sum_s)
    return family


def collect(state: BrokerState) -> Iterator[Metric]:
    """Every metric of this broker, read now (rule 2)."""
    stats = state.stats
    store = state.store
    config = state.config
    common = {"cluster": config.broker_cluster_name, "broker": config.broker_name}
    names, values = list(common), list(common.values())

    messages_in = CounterMetricFamily(
        "rocketmq_messages_in", "Messages acknowledged to producers", labels=[*names, "topic"]
    )
    bytes_in = CounterMetricFamily(
        "rocketmq_throughput_in", "Body bytes acknowledged to producers", labels=[*names, "topic"]
    )
    for topic, count, size in stats.put.items():
        messages_in.add_metric([*values, topic], count)
        bytes_in.add_metric([*values, topic], size)
    yield messages_in
    yield bytes_in

    group_labels = [*names, "topic", "consumer_group"]
    messages_out = CounterMetricFamily(
        "rocketmq_messages_out", "Messages returned by pulls", labels=group_labels
    )
    bytes_out = CounterMetricFamily(
        "rocketmq_throughput_out", "Stored bytes returned by pulls", labels=group_labels
    )
    for (topic, group), count, size in stats.get.items():
        messages_out.add_metric([*values, topic, group], count)
        bytes_out.add_metric([*values, topic, group], size)
    yield messages_out
    yield bytes_out

    yield _histogram(
        "rocketmq_send_latency_seconds",
        "Send requests: arrival to acknowledgement (replication included)",
        stats.send_latency,
        **common,
    )
    yield _histogram(
        "rocketmq_pull_latency_seconds",
        "Pull requests: arrival to the store's answer (a long poll's hold excluded)",
        stats.pull_latency,
        **common,
    )
    yield _histogram(
        "rocketmq_storage_flush_latency_seconds",
        "Commit-log fsyncs that wrote something",
        stats.flush_latency,
        **common,
    )

    lag = GaugeMetricFamily(
        "rocketmq_consumer_lag_messages",
        "Messages a group has not committed yet, per queue (max offset - committed offset)",
        labels=[*names, "topic", "consumer_group", "queue_id"],
    )
    consumer_offset = GaugeMetricFamily(
        "rocketmq_consumer_offset",
        "A group's committed offset, per queue",
        labels=[*names, "topic", "consumer_group", "queue_id"],
    )
    for key, queues in list(state.offsets.offsets.items()):
        topic, _, group = key.rpartition("@")
        for queue_id, committed in list(queues.items()):
            high = store.max_queue_offset(topic, queue_id)
            labels = [*values, topic, group, str(queue_id)]
            lag.add_metric(labels, max(0, high - committed))
            consumer_offset.add_metric(labels, committed)
    yield lag
    yield consumer_offset

    producer_offset = GaugeMetricFamily(
        "rocketmq_producer_offset", "A queue's max offset", labels=[*names, "topic", "queue_id"]
    )
    for queue in list(store.queues):
        producer_offset.add_metric(
            [*values, queue.topic, str(queue.queue_id)], queue.max_queue_offset
        )
    yield producer_offset

    max_log = store.max_log_offset
    for name, doc, value in (
        ("rocketmq_brokeruntime_commitlog_maxoffset", "Commit log end", max_log),
        (
            "rocketmq_brokeruntime_commitlog_minoffset",
            "First commit-log offset kept",
            store.min_log_offset,
        ),
        (
            "rocketmq_storage_dispatch_behind_bytes",
            "Commit-log bytes not yet in consume queues",
            max(0, max_log - store.dispatched_log_offset),
        ),
        (
            "rocketmq_storage_flush_behind_bytes",
            "Commit-log bytes not yet fsynced",
            max(0, max_log - store.flushed_log_offset),
        ),
        (
            "rocketmq_broker_confirm_offset",
            "Commit-log offset the SyncStateSet holds",
            store.confirm_offset,
        ),
        ("rocketmq_topic_number", "Topics on this broker", len(state.topics.configs)),
        (
            "rocketmq_consumer_group_number",
            "Groups with online consumers",
            len(state.clients.consumers),
        ),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=names)
        gauge.add_metric(values, value)
        yield gauge

    try:
        usage = shutil.disk_usage(config.store_path_root_dir)
        ratio = usage.used / usage.total if usage.total else 0.0
    except OSError:
        ratio = float("nan")
    disk = GaugeMetricFamily(
        "rocketmq_brokeruntime_commitlog_disk_ratio",
        "Used fraction of the store's file system",
        labels=names,
    )
    disk.add_metric(values, ratio)
    yield disk

    role = GaugeMetricFamily(
        "rocketmq_broker_role", "1 for this broker's role", labels=[*names, "role"]
    )
    role.add_metric([*values, state.role.value], 1)
    yield role

    replication = state.replication
    members = GaugeMetricFamily(
        "rocketmq_sync_state_set_size", "Replicas in the SyncStateSet (on a master)", labels=names
    )
    slave_lag = GaugeMetricFamily(
        "rocketmq_replication_lag_bytes",
        "Master's commit-log end minus what each connected slave acknowledged",
        labels=[*names, "slave_id", "in_sync"],
    )
    slave_ack = GaugeMetricFamily(
        "rocketmq_replication_slave_ack_offset",
        "What each connected slave acknowledged",
        labels=[*names, "slave_id", "in_sync"],
    )
    if replication is not None:
        sync = replication.state
        members.add_metric(values, len(sync.members))
        for slave_id, ack in sorted(sync.acks().items()):
            labels = [*values, str(slave_id), "true" if slave_id in sync.members else "false"]
            slave_lag.add_metric(labels, max(0, max_log - ack))
            slave_ack.add_metric(labels, ack)
    yield members
    yield slave_lag
    yield slave_ack
