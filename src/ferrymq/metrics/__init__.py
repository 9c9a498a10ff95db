"""Metrics of every ferrymq server: throughput accounting and the Prometheus endpoint.

- `stats`: pure counters and windowed rates (RocketMQ `BrokerStatsManager`) and cheap latency
  histograms; the TPS figures of the admin answers come from here.
- `exporter`: `GET /metrics` on the server's own loop (`metricsExporterType=PROM`).

Each server builds its collectors (`broker.metrics`, `namesrv`, `controller`, `connect`) from its
own state at scrape time; names and labels are in docs/metrics.md.
"""

from ferrymq.metrics.exporter import (
    DEFAULT_PROM_PORT,
    FuncCollector,
    MetricsExporterType,
    MetricsServer,
    serve,
)
from ferrymq.metrics.stats import DEFAULT_LATENCY_BUCKETS_S, Latency, Rates, StatsTable

__all__ = [
    "DEFAULT_LATENCY_BUCKETS_S",
    "DEFAULT_PROM_PORT",
    "FuncCollector",
    "Latency",
    "MetricsExporterType",
    "MetricsServer",
    "Rates",
    "StatsTable",
    "serve",
]
