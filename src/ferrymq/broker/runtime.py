"""The GET_BROKER_RUNTIME_INFO keys rocketmq-exporter reads beyond the basic ones.

Owns `runtime_keys` (RocketMQ `AdminBrokerProcessor.prepareRuntimeInfo` and
`StoreStatsService.getRuntimeInfo`, in their text formats: the exporter's `BrokerRuntimeStats`
parses every one of them and drops the whole table when one is missing) and `DailyTotals`
(RocketMQ `BrokerStats`: the put and get totals at the last two local midnights).

Rules:
1. Every value comes from the broker's own state: store offsets and files, `BrokerStats`,
   the boot time. Where ferrymq has no such thing (thread pools, a transient store pool, a
   dispatch buffer), the value is RocketMQ's own answer for "none" (docs/operations.md).
2. Pure formatting (`distribute_text`, `human_bytes`, `format_runtime`) is separate from
   reading the state, so the formats are tested without a broker.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ferrymq.broker.metadata import SCHEDULE_TOPIC
from ferrymq.errors import FerryError
from ferrymq.metrics.stats import Latency
from ferrymq.wire.frame import ROCKETMQ_VERSION

if TYPE_CHECKING:
    from ferrymq.broker.state import BrokerState

__all__ = [
    "DISTRIBUTE_BOUNDS_S",
    "DailyTotals",
    "distribute_text",
    "format_runtime",
    "human_bytes",
    "roll_days",
    "runtime_keys",
]

DISTRIBUTE_BOUNDS_S: Final = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0)
"""RocketMQ `StoreStatsService`'s put-latency buckets (upper bounds; +Inf last): the send
latency histogram has each of these among its bounds."""
_DISTRIBUTE_NAMES: Final = (
    "[<=0ms]",
    "[0~10ms]",
    "[10~50ms]",
    "[50~100ms]",
    "[100~200ms]",
    "[200~500ms]",
    "[500ms~1s]",
    "[1~2s]",
    "[2~3s]",
    "[3~4s]",
    "[4~5s]",
    "[5~10s]",
    "[10s~]",
)
_NO_TRANSIENT_POOL: Final = 2**31 - 1
"""`remainTransientStoreBufferNumbs` without a transient store pool (Integer.MAX_VALUE)."""
_NO_POOL: Final = "0"
"""Size, capacity and head wait of a thread pool ferrymq does not have (one event loop)."""


def _count_at(latency: Latency, bound: float) -> int:
    """Observations at or below `bound`, which must be one of the histogram's bounds."""
    index = latency.bounds.index(bound)
    return sum(latency.counts[: index + 1])


def distribute_text(latency: Latency) -> str:
    """`putMessageDistributeTime`: "[<=0ms]:N [0~10ms]:N ... [10s~]:N " (13 buckets).

    `latency` must have every `DISTRIBUTE_BOUNDS_S` among its bounds (ValueError otherwise).
    """
    below = [_count_at(latency, bound) for bound in DISTRIBUTE_BOUNDS_S]
    counts = [below[0]] + [b - a for a, b in itertools.pairwise(below)]
    counts.append(sum(latency.counts) - below[-1])
    return "".join(f"{name}:{n} " for name, n in zip(_DISTRIBUTE_NAMES, counts, strict=True))


def human_bytes(count: int) -> str:
    """RocketMQ `MixAll.humanReadableByteCount(bytes, false)`: "512 B", "1.5 GiB"."""
    if count < 1024:
        return f"{count} B"
    exp = min(int(math.log(count) / math.log(1024)), 6)
    return f"{count / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def format_runtime(elapsed_ms: int) -> str:
    """`runtime`: "[ d days, h hours, m minutes, s seconds ]" (Java MessageFormat's grouping)."""
    seconds, _ = divmod(max(elapsed_ms, 0), 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"[ {days:,} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def _used_ratio(path: Path) -> float:
    """RocketMQ `UtilAll.getDiskPartitionSpaceUsedPercent`: used / (used + usable).

    Rounded up to a hundredth; -1 when the path does not exist.
    """
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire <= 0:
        return -1.0
    return math.ceil(used * 100 / entire) / 100


def _capacity(path: Path) -> str | None:
    """`commitLogDirCapacity`: "Total : X GiB, Free : Y GiB." (None: no such directory)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    total = human_bytes(st.f_blocks * st.f_frsize)
    free = human_bytes(st.f_bfree * st.f_frsize)
    return f"Total : {total}, Free : {free}."


@dataclass
class DailyTotals:
    """RocketMQ `BrokerStats`: messages put and got, as totals at the last two local midnights.

    The first observation (at start) sets both mornings to the totals then, so "today" counts
    from the start until the first midnight passes, as RocketMQ's counters (0 at its start) do.
    """

    day: datetime.date | None = None
    put_today: int = 0
    put_yesterday: int = 0
    get_today: int = 0
    get_yesterday: int = 0

    def observe(self, wall_ms: int, put_total: int, get_total: int) -> None:
        """Roll the mornings if the local date changed since the last observation."""
        today = datetime.datetime.fromtimestamp(wall_ms / 1000).date()
        if self.day is None:
            self.put_today = self.put_yesterday = put_total
            self.get_today = self.get_yesterday = get_total
        elif today != self.day:
            self.put_yesterday, self.get_yesterday = self.put_today, self.get_today
            self.put_today, self.get_today = put_total, get_total
        self.day = today


def _put_total(state: BrokerState) -> int:
    """Messages stored in every queue (`msgPutTotalTodayNow`)."""
    return sum(q.max_queue_offset for q in state.store.queues)


def roll_days(state: BrokerState) -> None:
    """Observe the totals now (the broker's stats loop calls this every few seconds)."""
    state.days.observe(state.wall_ms(), _put_total(state), state.stats.get.grand_total()[0])


def _earliest_ms(state: BrokerState) -> int:
    """The store time of the oldest record kept (-1: none), as `getEarliestMessageTime`."""
    store = state.store
    try:
        found = store.store_timestamp_at(store.min_log_offset)
    except (OSError, FerryError, ValueError):
        return -1
    return -1 if found is None or store.max_log_offset <= store.min_log_offset else found


def runtime_keys(state: BrokerState) -> dict[str, str]:
    """The runtime keys RocketMQ's store and broker add to GET_BROKER_RUNTIME_INFO (rule 1)."""
    roll_days(state)
    store = state.store
    stats = state.stats
    days = state.days
    now_ms = state.wall_ms()
    puts, put_bytes = stats.put.grand_total()
    max_log = store.max_log_offset
    root = store.config.root_dir
    table = {
        "bootTimestamp": str(state.boot_ms),
        "runtime": format_runtime(now_ms - state.boot_ms),
        "brokerVersion": str(ROCKETMQ_VERSION),
        "putMessageDistributeTime": distribute_text(stats.send_latency),
        "putMessageEntireTimeMax": str(int(stats.send_latency.max_s * 1000)),  # whole ms
        "getMessageEntireTimeMax": str(int(stats.pull_latency.max_s * 1000)),
        "putMessageAverageSize": repr(put_bytes / max(puts, 1)),
        "msgPutTotalTodayMorning": str(days.put_today),
        "msgPutTotalYesterdayMorning": str(days.put_yesterday),
        "msgGetTotalTodayMorning": str(days.get_today),
        "msgGetTotalYesterdayMorning": str(days.get_yesterday),
        "dispatchBehindBytes": str(max(0, max_log - store.dispatched_log_offset)),
        "remainHowManyDataToFlush": human_bytes(max(0, max_log - store.flushed_log_offset)),
        "dispatchMaxBuffer": "0",
        "pageCacheLockTimeMills": "0",
        "earliestMessageTimeStamp": str(_earliest_ms(state)),
        "startAcceptSendRequestTimeStamp": "0",
        "remainTransientStoreBufferNumbs": str(_NO_TRANSIENT_POOL),
        "commitLogDiskRatio": repr(_used_ratio(store.config.commitlog_path)),
        "consumeQueueDiskRatio": repr(_used_ratio(store.config.root_dir / "consumequeue")),
    }
    capacity = _capacity(root)
    if capacity is not None:
        table["commitLogDirCapacity"] = capacity
    for level, delivered in sorted(state.delay_offsets.offsets.items()):
        # ScheduleMessageService.buildRunningStats: "<delivered offset>,<max offset>" per level
        high = store.max_queue_offset(SCHEDULE_TOPIC, level - 1)
        table[f"scheduleMessageOffset_{level}"] = f"{delivered},{high}"
    for pool in ("send", "pull", "query"):
        for what in ("Size", "Capacity", "HeadWaitTimeMills"):
            table[f"{pool}ThreadPoolQueue{what}"] = _NO_POOL
    return table
