"""The console's sampled series and observed elections (pure)."""

from ferrymq.console.sampler import IDLE_AFTER_S, pause_after_sample
from ferrymq.console.views import CounterSeries, ElectionLog, GaugeSeries


def test_counter_rates_are_per_second_between_readings_and_never_negative() -> None:
    series = CounterSeries(keep=3)
    series.add(10.0, 1000, {"a": 5, "b": 100})
    assert series.rates == {}
    series.add(12.0, 3000, {"a": 25, "b": 90, "c": 1})
    assert series.rates == {"a": 10.0, "b": 0.0}
    series.add(12.0, 3000, {"a": 99})  # same instant: no step
    series.add(13.0, 4000, {"a": 30, "c": 4})
    assert series.rates == {"a": 5.0, "c": 3.0}
    history = series.history()
    assert history.wall_ms == [3000, 4000]
    assert history.values == {"a": [10.0, 5.0], "b": [0.0, None], "c": [None, 3.0]}


def test_gauge_history_is_bounded() -> None:
    gauge = GaugeSeries(keep=2)
    for step in range(4):
        gauge.add(float(step), step * 1000, {"g": step})
    assert gauge.latest == {"g": 3}
    assert gauge.history().wall_ms == [2000, 3000]


def test_elections_are_master_or_epoch_changes_after_the_first_reading() -> None:
    log = ElectionLog()
    assert log.observe(1, "broker-a", 1, "127.0.0.1:1", 1) is None
    assert log.observe(2, "broker-a", 1, "127.0.0.1:1", 1) is None
    assert log.observe(3, "broker-a", None, None, 1) is not None  # master lost, same epoch
    elected = log.observe(4, "broker-a", 2, "127.0.0.1:2", 2)
    assert elected is not None
    assert (elected.old_master_id, elected.new_master_id, elected.master_epoch) == (None, 2, 2)
    assert log.observe(5, "broker-a", 1, "127.0.0.1:1", 1) is None  # an older epoch: ignored
    assert log.observe(6, "broker-b", 1, "127.0.0.1:3", 7) is None
    assert [e.wall_ms for e in log.elections] == [4, 3]


def test_sampling_slows_down_while_no_one_reads_the_api() -> None:
    assert pause_after_sample(1.0, 500.0, 500.0 - IDLE_AFTER_S + 1) == 1.0
    assert pause_after_sample(1.0, 500.0, 500.0 - IDLE_AFTER_S) == 10.0
    assert pause_after_sample(0.5, 500.0, None) == 5.0
