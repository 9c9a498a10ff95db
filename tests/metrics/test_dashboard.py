"""docs/grafana/ferrymq.json and docs/prometheus.yml against the metrics ferrymq exports."""

import json
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client.metrics_core import Metric

from ferrymq.broker import metrics as broker_metrics
from ferrymq.connect import metrics as connect_metrics
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.tasks import TaskManager
from ferrymq.connectors.runtime import SparkTaskRunner
from ferrymq.controller import metrics as controller_metrics
from ferrymq.controller.server import ControllerStateMachine
from ferrymq.controller.state import ControllerState
from ferrymq.namesrv import metrics as namesrv_metrics
from ferrymq.namesrv.routes import RouteTable
from ferrymq.proxy import metrics as proxy_metrics
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.driver import RaftDriver
from ferrymq.testing import LocalCluster

DOCS = Path(__file__).resolve().parents[2] / "docs"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
_NAME = re.compile(r"\b(?:rocketmq|ferrymq)_[a-z0-9_]+")


def _names(families: Iterable[Metric]) -> dict[str, str]:
    """Every series name a scrape can hold -> its family's name."""
    return {
        family.name + suffix: family.name
        for family in families
        for suffix in _SUFFIXES[family.type]
    }


async def _exported(tmp_path: Path) -> dict[str, str]:
    """What every server's collectors export, read from real (idle) server objects."""
    async with LocalCluster(tmp_path / "broker") as cluster:
        names = _names(broker_metrics.collect(cluster.broker.state))
    names |= _names(namesrv_metrics.collect(RouteTable()))
    names |= _names(proxy_metrics.collect(proxy_metrics.ProxyStats()))
    state_machine = ControllerStateMachine(ControllerState())
    raft = RaftDriver("n1", {"n1": "127.0.0.1:1"}, tmp_path / "raft", state_machine, RaftConfig())
    names |= _names(controller_metrics.collect(raft, state_machine.state))
    runner = SparkTaskRunner(
        Plugins(), cluster_id="c", namesrv_addr="127.0.0.1:1", state_dir=tmp_path / "connect"
    )
    try:
        tasks = TaskManager("w1", runner, lambda status: None, lambda: 0, "run-1")
        names |= _names(connect_metrics.collect(tasks))
    finally:
        await runner.close()
    return names


async def test_every_dashboard_expression_names_an_exported_metric(tmp_path: Path) -> None:
    exported = await _exported(tmp_path)
    dashboard = json.loads((DOCS / "grafana" / "ferrymq.json").read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert len(expressions) >= 20
    used: set[str] = set()
    for expression in expressions:
        names = _NAME.findall(expression)
        assert names, f"no ferrymq metric in {expression!r}"
        unknown = [name for name in names if name not in exported]
        assert not unknown, f"{expression!r} names {unknown}, not exported"
        used |= {exported[name] for name in names}
    # and docs/metrics.md documents every family a server exports
    documented = (DOCS / "metrics.md").read_text()
    missing = sorted(family for family in set(exported.values()) if family not in documented)
    assert not missing, missing
    assert used >= {
        "rocketmq_messages_in",
        "rocketmq_consumer_lag_messages",
        "rocketmq_send_latency_seconds",
        "rocketmq_replication_lag_bytes",
        "rocketmq_controller_raft_term",
        "ferrymq_connect_task_lag_messages",
        "rocketmq_proxy_rpc_calls",
        "rocketmq_proxy_messages_sent",
    }


def test_prometheus_config_scrapes_every_kind_of_server() -> None:
    config = yaml.safe_load((DOCS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"ferrymq-broker", "ferrymq-namesrv", "ferrymq-controller", "ferrymq-connect"} <= set(
        jobs
    )
    assert jobs["ferrymq-broker"]["static_configs"][0]["targets"] == ["127.0.0.1:5557"]
    assert jobs["ferrymq"]["file_sd_configs"][0]["files"] == ["ferrymq-targets.json"]
