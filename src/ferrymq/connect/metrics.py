"""A Connect worker's Prometheus metrics: its tasks' states and their queries' progress.

Read at scrape time from the task manager and the runner's last progress figures (what the
worker already reports in the status log): rows per second in and processed, and the lag (messages
the sources hold beyond the last batch). Labels: connector and task index (bounded by config).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ferrymq.connect.tasks import TaskManager

__all__ = ["collect"]


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def collect(tasks: TaskManager) -> Iterator[Metric]:
    """Every task of this worker, with its last progress."""
    labels = ["worker", "connector", "task"]
    state = GaugeMetricFamily(
        "ferrymq_connect_task_state", "1 for the task's state", labels=[*labels, "state"]
    )
    rows_in = GaugeMetricFamily(
        "ferrymq_connect_task_input_rows_per_second",
        "Rows per second the task's query read (last batch)",
        labels=labels,
    )
    rows_done = GaugeMetricFamily(
        "ferrymq_connect_task_processed_rows_per_second",
        "Rows per second the task's query processed (last batch)",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        "ferrymq_connect_task_lag_messages",
        "Messages the task's sources hold beyond its last batch",
        labels=labels,
    )
    batch = GaugeMetricFamily(
        "ferrymq_connect_task_batch_id", "The task's last batch id", labels=labels
    )
    for key, run in sorted(tasks.runs.items()):
        connector, _, index = key
        values = [tasks.worker_id, connector, str(index)]
        state.add_metric([*values, run.state.value], 1)
        figures = tasks.runner.metrics(key)
        if figures.get("batch_id") is None:
            continue  # no batch has run yet: no progress to show
        rows_in.add_metric(values, _number(figures.get("input_rows_per_second")))
        rows_done.add_metric(values, _number(figures.get("processed_rows_per_second")))
        lag.add_metric(values, _number(figures.get("lag")))
        batch.add_metric(values, _number(figures.get("batch_id")))
    yield state
    yield rows_in
    yield rows_done
    yield lag
    yield batch
