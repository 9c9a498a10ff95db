"""GET_BROKER_RUNTIME_INFO's text formats (broker/runtime.py) against RocketMQ's and the parse
rocketmq-exporter applies to them; the midnight totals of `DailyTotals`."""

import datetime

from ferrymq.broker.runtime import (
    DISTRIBUTE_BOUNDS_S,
    DailyTotals,
    distribute_text,
    format_runtime,
    human_bytes,
)
from ferrymq.metrics.stats import DEFAULT_LATENCY_BUCKETS_S, Latency

EXPORTER_KEYS = (
    # rocketmq-exporter src/main/java/org/apache/rocketmq/exporter/model/BrokerRuntimeStats.java
    # (commit e1ab2dd5, 2025-06-05): the constructor's kvTable.getTable().get(...) without a
    # default; the first missing one throws and the exporter drops all broker-runtime metrics.
    "msgPutTotalTodayNow",
    "putMessageDistributeTime",
    "putTps",
    "getMissTps",
    "getTransferedTps",  # or getTransferredTps when present
    "getTotalTps",
    "getFoundTps",
    "commitLogDirCapacity",
    "sendThreadPoolQueueHeadWaitTimeMills",
    "queryThreadPoolQueueHeadWaitTimeMills",
    "remainHowManyDataToFlush",
    "msgGetTotalTodayNow",
    "queryThreadPoolQueueSize",
    "bootTimestamp",
    "msgPutTotalYesterdayMorning",
    "msgGetTotalYesterdayMorning",
    "pullThreadPoolQueueSize",
    "commitLogMinOffset",
    "pullThreadPoolQueueHeadWaitTimeMills",
    "runtime",
    "dispatchMaxBuffer",
    "brokerVersion",
    "consumeQueueDiskRatio",
    "pageCacheLockTimeMills",
    "commitLogDiskRatio",
    "commitLogMaxOffset",
    "getMessageEntireTimeMax",
    "msgPutTotalTodayMorning",
    "putMessageTimesTotal",
    "msgGetTotalTodayMorning",
    "brokerVersionDesc",
    "sendThreadPoolQueueSize",
    "startAcceptSendRequestTimeStamp",
    "putMessageEntireTimeMax",
    "earliestMessageTimeStamp",
    "remainTransientStoreBufferNumbs",
    "queryThreadPoolQueueCapacity",
    "putMessageAverageSize",
    "dispatchBehindBytes",
    "putMessageSizeTotal",
    "sendThreadPoolQueueCapacity",
    "pullThreadPoolQueueCapacity",
)
_LONGS = {
    "msgPutTotalTodayNow", "sendThreadPoolQueueHeadWaitTimeMills",
    "queryThreadPoolQueueHeadWaitTimeMills", "msgGetTotalTodayNow", "queryThreadPoolQueueSize",
    "bootTimestamp", "msgPutTotalYesterdayMorning", "msgGetTotalYesterdayMorning",
    "pullThreadPoolQueueSize", "commitLogMinOffset", "pullThreadPoolQueueHeadWaitTimeMills",
    "dispatchMaxBuffer", "brokerVersion", "pageCacheLockTimeMills", "commitLogMaxOffset",
    "getMessageEntireTimeMax", "msgPutTotalTodayMorning", "putMessageTimesTotal",
    "msgGetTotalTodayMorning", "sendThreadPoolQueueSize", "startAcceptSendRequestTimeStamp",
    "putMessageEntireTimeMax", "earliestMessageTimeStamp", "remainTransientStoreBufferNumbs",
    "queryThreadPoolQueueCapacity", "dispatchBehindBytes", "putMessageSizeTotal",
    "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity",
}  # fmt: skip
"""Keys the exporter reads with Long.parseLong / Integer.parseInt."""
_DOUBLES = {"consumeQueueDiskRatio", "commitLogDiskRatio", "putMessageAverageSize"}
_TPS = {"putTps", "getMissTps", "getTransferedTps", "getTotalTps", "getFoundTps"}


def _java_long(text: str) -> int:
    assert text.lstrip("-").isdigit(), text  # Long.parseLong takes an optional '-' and digits
    return int(text)


def _machine_bytes(human: str) -> float:
    """The exporter's `Utils.machineReadableByteCount`."""
    value, unit = human.split(" ")
    exp = 0 if unit == "B" else "KMGTPE".index(unit[0]) + 1
    return float(value) * float(1024**exp)


def exporter_parse(table: dict[str, str]) -> dict[str, object]:
    """What `BrokerRuntimeStats(kvTable)` does with the table: raises where Java would throw."""
    parsed: dict[str, object] = {
        key: tuple(_java_long(part) for part in text.split(",")[:2])  # loadScheduleMessageOffsets
        for key, text in table.items()
        if key.startswith("scheduleMessageOffset")
    }
    for key in EXPORTER_KEYS:
        text = table[key]  # a missing key is a NullPointerException there
        if key in _LONGS:
            parsed[key] = _java_long(text)
        elif key in _DOUBLES:
            parsed[key] = float(text)
        elif key in _TPS:
            parsed[key] = [float(part) for part in text.split(" ")[:3]]
        elif key == "remainHowManyDataToFlush":
            parsed[key] = float(text.split(" ")[0])
        elif key == "commitLogDirCapacity":
            arr = text.split(" ")
            parsed[key] = (
                _machine_bytes(f"{arr[2]} {arr[3][:-1]}"),
                _machine_bytes(f"{arr[6]} {arr[7][:-1]}"),
            )
        elif key == "putMessageDistributeTime":
            buckets = {}
            for part in text.split(" "):
                pair = part.split(":")
                if len(pair) >= 2:  # the trailing "" is skipped with a warning
                    buckets[pair[0].replace("[", "").replace("]", "")] = int(pair[1])
            parsed[key] = buckets
        else:
            parsed[key] = text
    return parsed


def test_formats_are_rocketmqs() -> None:
    # MixAll.humanReadableByteCount(bytes, false)
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 1024**3)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 GiB",
    ]
    # StoreStatsService.getFormatRuntime's MessageFormat
    elapsed = ((2 * 24 + 3) * 3600 + 4 * 60 + 5) * 1000 + 999
    assert format_runtime(elapsed) == "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"
    latency = Latency(sorted({*DEFAULT_LATENCY_BUCKETS_S, *DISTRIBUTE_BOUNDS_S}))
    for seconds in (0.0002, 0.003, 0.004, 0.15, 2.5, 60.0):
        latency.observe(seconds)
    text = distribute_text(latency)
    assert latency.max_s == 60.0  # putMessageEntireTimeMax: 60000
    assert text == (
        "[<=0ms]:1 [0~10ms]:2 [10~50ms]:0 [50~100ms]:0 [100~200ms]:1 [200~500ms]:0 "
        "[500ms~1s]:0 [1~2s]:0 [2~3s]:1 [3~4s]:0 [4~5s]:0 [5~10s]:0 [10s~]:1 "
    )
    parsed = exporter_parse(
        dict.fromkeys(EXPORTER_KEYS, "0")
        | dict.fromkeys(_TPS, "0.00 0.00 0.00")
        | {
            "putMessageDistributeTime": text,
            "commitLogDirCapacity": f"Total : {human_bytes(3 * 1024**4)}, Free : 512 B.",
            "remainHowManyDataToFlush": human_bytes(100),
        }
    )
    assert parsed["commitLogDirCapacity"] == (3.0 * 1024**4, 512.0)
    assert parsed["putMessageDistributeTime"] == {
        "<=0ms": 1, "0~10ms": 2, "10~50ms": 0, "50~100ms": 0, "100~200ms": 1, "200~500ms": 0,
        "500ms~1s": 0, "1~2s": 0, "2~3s": 1, "3~4s": 0, "4~5s": 0, "5~10s": 0, "10s~": 1,
    }  # fmt: skip
    assert parsed["remainHowManyDataToFlush"] == 100.0


def test_morning_totals_roll_at_local_midnight() -> None:
    noon = datetime.datetime(2026, 11, 26, 12, 0)
    ms = int(noon.timestamp() * 1000)  # local time, as RocketMQ's BrokerStats.record
    days = DailyTotals()
    days.observe(ms, put_total=100, get_total=0)  # at start: "today" counts from here
    days.observe(ms + 3_600_000, put_total=130, get_total=20)
    assert (days.put_today, days.put_yesterday, days.get_today, days.get_yesterday) == (
        100,
        100,
        0,
        0,
    )
    days.observe(ms + 12 * 3_600_000 + 1000, put_total=150, get_total=25)  # just after midnight
    days.observe(ms + 13 * 3_600_000, put_total=170, get_total=30)
    assert (days.put_today, days.put_yesterday, days.get_today, days.get_yesterday) == (
        150,
        100,
        25,
        0,
    )
    days.observe(ms + 36 * 3_600_000 + 1000, put_total=200, get_total=40)
    assert (days.put_today, days.put_yesterday, days.get_today, days.get_yesterday) == (
        200,
        150,
        40,
        25,
    )
