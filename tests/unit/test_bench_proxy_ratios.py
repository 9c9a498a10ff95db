"""`ferry bench proxy`'s ratios: each side over the SDK, with the issue's goal per mode."""

from __future__ import annotations

from ferrymq.cmd.bench_proxy import ProxyRow, ratios


def _row(system: str, mode: str, rate: float) -> ProxyRow:
    return ProxyRow(system, mode, 100, 10, rate, [rate])


def test_ratios_carry_goals_and_the_heartbeat_floor_has_none() -> None:
    rows = [
        _row("ferrymq-sdk", "send", 2000.0),
        _row("ferrymq-sdk", "receive+ack", 1000.0),
        _row("rocketmq-5.x-grpc", "send", 500.0),
        _row("rocketmq-5.x-grpc", "receive+ack", 600.0),
        _row("grpc-heartbeat-floor", "send", 1500.0),
    ]
    found = {(r["system"], r["mode"]): (r["ratio"], r["goal"]) for r in ratios(rows)}
    assert found == {
        ("rocketmq-5.x-grpc", "send"): (0.25, 0.7),
        ("rocketmq-5.x-grpc", "receive+ack"): (0.6, 0.5),
        ("grpc-heartbeat-floor", "send"): (0.75, None),
    }
