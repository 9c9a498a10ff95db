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


def test_latency_buckets_are_cumulative() -> None:
    latency = Latency((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 2.0):
        latency.observe(seconds)
    assert latency.cumulative() == [("0.001", 2.0), ("0.01", 3.0), ("+Inf", 4.0)]
    assert latency.count == 4
    assert abs(latency.sum_s - 2.0065) < 1e-9
