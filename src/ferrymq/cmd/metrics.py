"""The metrics endpoint of a server process: its flags, and serving its collectors.

The broker takes RocketMQ's keys (`metricsExporterType`, `metricsPromExporterHost`,
`metricsPromExporterPort`) like its other keys; the NameServer, controller and Connect worker
take the same names as flags (`--metrics-exporter-type PROM --metrics-prom-exporter-port N`).
Port 0 takes a free port; the ready file then names it (`"metrics": "host:port"`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import click
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from ferrymq.metrics.exporter import (
    DEFAULT_PROM_PORT,
    FuncCollector,
    MetricsExporterType,
    MetricsServer,
)

__all__ = ["metrics_endpoint", "metrics_options"]


def metrics_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the flags `--metrics-exporter-type`, `--metrics-prom-exporter-host` and `-port`."""
    for decorator in (
        click.option(
            "--metrics-prom-exporter-port",
            type=click.IntRange(0, 65535),
            default=DEFAULT_PROM_PORT,
            show_default=True,
            help="metricsPromExporterPort: where Prometheus scrapes /metrics (0: a free port).",
        ),
        click.option(
            "--metrics-prom-exporter-host",
            default="",
            help="metricsPromExporterHost [default: the listen host].",
        ),
        click.option(
            "--metrics-exporter-type",
            type=click.Choice([t.value for t in MetricsExporterType], case_sensitive=False),
            default=MetricsExporterType.DISABLE.value,
            show_default=True,
            help="metricsExporterType: PROM serves Prometheus metrics (docs/metrics.md).",
        ),
    ):
        command = decorator(command)
    return command


@contextlib.asynccontextmanager
async def metrics_endpoint(
    exporter_type: str,
    host: str,
    port: int,
    collectors: Iterable[Callable[[], Iterable[Metric]]],
) -> AsyncIterator[MetricsServer | None]:
    """Serve `collectors` on one registry when `exporter_type` is PROM (else yield None)."""
    if MetricsExporterType(exporter_type.upper()) is not MetricsExporterType.PROM:
        yield None
        return
    registry = CollectorRegistry(auto_describe=False)
    for collect in collectors:
        registry.register(FuncCollector(collect))
    async with MetricsServer(registry, host, port) as server:
        yield server
