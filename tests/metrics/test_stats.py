from ferrymq.broker.metrics import BrokerStats
from ferrymq.metrics.stats import Latency, StatsTable


def test_rates_over_the_window_and_totals() -> None:
    table: StatsTable[str] = StatsTable(0.0, window_s=60.0, sample_s=10.0)
    for second in range(60):
        table.add("T", 10, 1000)  # 10 messages a second, 100 bytes each
        table.sample(float(second + 1))
    assert table.total("T") == (600, 60_000)
    assert table.rate("T", 60.0).count_per_s == 10.0
    assert table.rate("T", 60.0, 10.0).bytes_per_s == 1000.0
    # traffic stops: the 10 s rate falls to 0 once the window is past it, the minute's later
    assert table.rate("T", 80.0, 10.0).count_per_s == 0.0
    assert 0 < table.rate("T", 80.0).count_per_s < 10.0
    assert table.rate("T", 130.0).count_per_s == 0.0
    assert table.rate("absent", 130.0).count_per_s == 0.0


def test_a_key_new_since_the_last_snapshot_counts_from_zero() -> None:
    table: StatsTable[tuple[str, str]] = StatsTable(0.0)
    table.sample(10.0)
    table.add(("T", "G"), 50, 500)
    assert table.rate(("T", "G"), 20.0).count_per_s == 2.5  # 50 since t=0, nothing before
    assert table.rate_all(20.0).bytes_per_s == 25.0
    assert table.grand_total() == (50, 500)


def test_a_forgotten_key_leaves_counts_and_snapshots_and_comes_back_from_zero() -> None:
    """A deleted topic's or group's stats (`BrokerStats.forget_topic` / `forget_group`): gone
    from the totals and every snapshot, so created again its rate is not negative."""
    stats = BrokerStats(0.0)
    stats.sent("T", 40, 400)
    stats.pulled("T", "G", 40, 400)
    stats.pulled("U", "G", 5, 50)
    stats.pulled("T", "H", 7, 70)
    stats.sample(10.0)
    stats.forget_group("G")
    assert [k for k, _, _ in stats.get.items()] == [("T", "H")]
    stats.forget_topic("T")
    assert (list(stats.put.items()), list(stats.get.items())) == ([], [])
    stats.sent("T", 10, 100)
    assert stats.put.rate("T", 20.0).count_per_s == 0.5  # 10 since t=0, the old 40 forgotten
    assert stats.put.rate_all(20.0, 10.0).count_per_s == 1.0


def test_latency_buckets_are_cumulative() -> None:
    latency = Latency((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 2.0):
        latency.observe(seconds)
    assert latency.cumulative() == [("0.001", 2.0), ("0.01", 3.0), ("+Inf", 4.0)]
    assert latency.count == 4
    assert abs(latency.sum_s - 2.0065) < 1e-9


def test_broker_stats_data_and_runtime_keys_as_rocketmq_names_them() -> None:
    stats = BrokerStats(0.0)
    stats.sent("T", 30, 3000)
    stats.pulled("T", "G", 12, 1200)
    stats.pulled("T", "G", 0, 0)  # a pull that found nothing
    data = stats.stats_data("GROUP_GET_NUMS", "T@G", 60.0)
    assert data == {
        "statsMinute": {"sum": 12, "tps": 0.2, "avgpt": 0.0},
        "statsHour": {"sum": 12, "tps": 0.2, "avgpt": 0.0},
        "statsDay": {"sum": 12, "tps": 0.2, "avgpt": 0.0},
    }
    assert stats.stats_data("TOPIC_PUT_SIZE", "T", 60.0)["statsMinute"] == {  # type: ignore[index]
        "sum": 3000,
        "tps": 50.0,
        "avgpt": 0.0,
    }
    assert stats.stats_data("SNDBCK_PUT_NUMS", "T", 60.0) is None
    keys = stats.runtime_keys(60.0)
    assert keys["putTps"] == "0.50 0.50 0.50"  # 30 in the minute since start, every window
    assert keys["getTransferedTps"] == "0.20 0.20 0.20"
    assert keys["getFoundTps"] == "0.02 0.02 0.02"
    assert keys["getTotalTps"] == "0.03 0.03 0.03"
    assert stats.consume_tps("T", "G", 60.0) == 0.2
    assert stats.consume_tps(None, "other", 60.0) == 0.0
