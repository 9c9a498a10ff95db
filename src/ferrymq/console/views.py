"""What the console remembers between reads: sampled series and observed master changes (pure).

Rules: nothing here reads a clock, a socket or a file. Samples come in with the time they were
taken (`at`: monotonic seconds, for rates; `wall_ms`: epoch milliseconds, for the charts' axis).
A counter that goes down between two samples (a queue deleted, a new master still catching up in
its answers) gives a rate of 0 for that step, never a negative one. Histories are bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["CounterSeries", "Election", "ElectionLog", "GaugeSeries", "SeriesHistory"]

KEEP_SAMPLES: Final = 120
"""Samples kept per series (two minutes at the default one-second interval)."""
KEEP_ELECTIONS: Final = 50


@dataclass(frozen=True, slots=True)
class SeriesHistory:
    """A series as the charts read it: one time axis, one list of values per key."""

    wall_ms: list[int]
    values: dict[str, list[float | None]]
    """Per key, one value per time on the axis (None: the key was not in that sample)."""


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    wall_ms: int
    values: Mapping[str, float]


class GaugeSeries:
    """Values read at each sample (consumer lag), kept for the charts."""

    def __init__(self, keep: int = KEEP_SAMPLES) -> None:
        self._samples: deque[_Sample] = deque(maxlen=keep)

    def add(self, at: float, wall_ms: int, values: Mapping[str, float]) -> None:
        """Record one reading of every key."""
        self._samples.append(_Sample(at, wall_ms, dict(values)))

    @property
    def latest(self) -> dict[str, float]:
        """The last reading (empty before the first)."""
        return dict(self._samples[-1].values) if self._samples else {}

    def history(self) -> SeriesHistory:
        """Every kept reading, aligned on one time axis."""
        samples = list(self._samples)
        keys = sorted({key for sample in samples for key in sample.values})
        return SeriesHistory(
            wall_ms=[sample.wall_ms for sample in samples],
            values={key: [sample.values.get(key) for sample in samples] for key in keys},
        )


class CounterSeries:
    """Counters read at each sample (messages stored, messages consumed), kept as rates per second.

    >>> series = CounterSeries()
    >>> series.add(0.0, 0, {"t": 10})
    >>> series.add(2.0, 2000, {"t": 30})
    >>> series.rates
    {'t': 10.0}
    """

    def __init__(self, keep: int = KEEP_SAMPLES) -> None:
        self._last: _Sample | None = None
        self._rates = GaugeSeries(keep)

    def add(self, at: float, wall_ms: int, counts: Mapping[str, int]) -> None:
        """Record one reading; the rate of each key is taken against the previous reading."""
        sample = _Sample(at, wall_ms, {key: float(value) for key, value in counts.items()})
        last = self._last
        if last is not None and at <= last.at:
            return  # no time passed: no rate to take
        self._last = sample
        if last is None:
            return
        elapsed = at - last.at
        rates = {
            key: max(0.0, value - last.values[key]) / elapsed
            for key, value in sample.values.items()
            if key in last.values
        }
        self._rates.add(at, wall_ms, rates)

    @property
    def rates(self) -> dict[str, float]:
        """Per key, messages per second between the last two readings."""
        return self._rates.latest

    def history(self) -> SeriesHistory:
        """The rates of every kept step."""
        return self._rates.history()


@dataclass(frozen=True, slots=True)
class Election:
    """A master change the console observed in the controller's answers."""

    wall_ms: int
    broker_name: str
    old_master_id: int | None
    old_master_address: str | None
    new_master_id: int | None
    new_master_address: str | None
    master_epoch: int


@dataclass(frozen=True, slots=True)
class _Master:
    broker_id: int | None
    address: str | None
    epoch: int


class ElectionLog:
    """Master changes seen between readings of each group's master and epoch.

    The first reading of a group is where watching starts, not an election. A newer epoch, or
    another master at the same epoch, is one; an older epoch (a lagging controller) is ignored.
    """

    def __init__(self, keep: int = KEEP_ELECTIONS) -> None:
        self._masters: dict[str, _Master] = {}
        self._elections: deque[Election] = deque(maxlen=keep)

    def observe(
        self,
        wall_ms: int,
        broker_name: str,
        master_id: int | None,
        master_address: str | None,
        master_epoch: int,
    ) -> Election | None:
        """Take one reading of a group; returns the election it shows, if any."""
        now = _Master(master_id, master_address, master_epoch)
        before = self._masters.get(broker_name)
        if before is not None and master_epoch < before.epoch:
            return None
        self._masters[broker_name] = now
        if before is None or (before.epoch, before.broker_id) == (now.epoch, now.broker_id):
            return None
        election = Election(
            wall_ms=wall_ms,
            broker_name=broker_name,
            old_master_id=before.broker_id,
            old_master_address=before.address,
            new_master_id=master_id,
            new_master_address=master_address,
            master_epoch=master_epoch,
        )
        self._elections.append(election)
        return election

    @property
    def elections(self) -> list[Election]:
        """Observed elections, newest first."""
        return list(reversed(self._elections))
