"""A NameServer's Prometheus metrics, read at scrape time from its route table."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ferrymq.namesrv.routes import RouteTable

__all__ = ["collect"]


def collect(routes: RouteTable) -> Iterator[Metric]:
    """Brokers registered per cluster and topics routed."""
    info = routes.cluster_info()
    brokers = GaugeMetricFamily(
        "rocketmq_namesrv_brokers", "Live broker replicas registered", labels=["cluster"]
    )
    for cluster, names in sorted(info.cluster_addr_table.items()):
        count = sum(
            len(info.broker_addr_table[name].broker_addrs)
            for name in names
            if name in info.broker_addr_table
        )
        brokers.add_metric([cluster], count)
    yield brokers
    topics = GaugeMetricFamily("rocketmq_namesrv_topics", "Topics with a route")
    topics.add_metric([], len(routes.topics()))
    yield topics
