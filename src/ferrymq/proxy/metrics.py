"""The endpoint's Prometheus metrics: calls per RPC and v2 status, their latency, messages relayed.

Owns the counting (`ProxyStats`, observed by the gRPC handlers' wrapper in `service.py`) and the
scrape-time collector (`collect`). Labels are bounded: the RPC names of MessagingService v2 and
the v2 status codes, never a client, topic or group (an endpoint serves any of them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from ferrymq.metrics.stats import Latency

__all__ = ["ProxyStats", "collect"]


class ProxyStats:
    """What the endpoint served since it started."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        """(RPC, v2 status code name) -> calls answered."""
        self.latency: dict[str, Latency] = {}
        """RPC -> time from the request parsed to the answer (a stream: to its end)."""
        self.messages_sent = 0
        """Messages SendMessage relayed into the cluster (acknowledged by it)."""
        self.messages_received = 0
        """Messages ReceiveMessage and PullMessage handed to clients."""

    def observe(self, rpc: str, code: str, seconds: float) -> None:
        """One answered call."""
        self.calls[(rpc, code)] += 1
        latency = self.latency.get(rpc)
        if latency is None:
            latency = self.latency[rpc] = Latency()
        latency.observe(seconds)


def collect(stats: ProxyStats) -> Iterator[Metric]:
    """Every metric of the endpoint, read now."""
    calls = CounterMetricFamily(
        "rocketmq_proxy_rpc_calls",
        "gRPC calls answered, by RPC and v2 status",
        labels=["rpc", "code"],
    )
    for (rpc, code), count in sorted(stats.calls.items()):
        calls.add_metric([rpc, code], count)
    yield calls
    latency = HistogramMetricFamily(
        "rocketmq_proxy_rpc_latency_seconds", "Time to answer a call", labels=["rpc"]
    )
    for rpc, observed in sorted(stats.latency.items()):
        latency.add_metric([rpc], observed.cumulative(), observed.sum_s)
    yield latency
    sent = CounterMetricFamily(
        "rocketmq_proxy_messages_sent", "Messages relayed into the cluster by SendMessage"
    )
    sent.add_metric([], stats.messages_sent)
    yield sent
    received = CounterMetricFamily(
        "rocketmq_proxy_messages_received", "Messages handed to clients by Receive/PullMessage"
    )
    received.add_metric([], stats.messages_received)
    yield received
