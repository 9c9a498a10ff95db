"""VIEW_BROKER_STATS_DATA (315) for the broker-wide and send-back stats rocketmq-exporter reads.

Owns the handler the broker routes 315 to: BROKER_PUT_NUMS and BROKER_GET_NUMS (RocketMQ
`BrokerStatsManager.incBrokerPutNums` / `incBrokerGetNums`: every message put or got, keyed
by the cluster name) and SNDBCK_PUT_NUMS (`incSendBackNums`: consumer send-backs stored, keyed
`topic@group` by the message's original topic), read from `BrokerStats` (`put`, `get`,
`sendbacks`); every other stats name goes to `admin.view_broker_stats`. Sums and TPS per
minute, hour and day follow `admin._stats_item`'s rule (exact while the broker is younger than
the period, else the kept window's rate times the period); `avgpt` is not kept (0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ferrymq.broker import admin
from ferrymq.broker.state import BrokerState
from ferrymq.errors import RequestError
from ferrymq.metrics.stats import Rates
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import BrokerStatsData, BrokerStatsItem
from ferrymq.wire.broker import ViewBrokerStatsDataRequestHeader
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.fastjson import encode_sorted
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields

__all__ = ["SERVED_HERE", "view_broker_stats"]

SERVED_HERE: Final = frozenset({"BROKER_PUT_NUMS", "BROKER_GET_NUMS", "SNDBCK_PUT_NUMS"})
_PERIODS_S: Final = (86400.0, 3600.0, 60.0)


def _item(
    total: int, rate: Callable[[float], Rates], window_s: float, uptime: float, period_s: float
) -> BrokerStatsItem:
    """Messages over the last `period_s` and their rate."""
    if uptime <= period_s:
        return BrokerStatsItem(sum=total, tps=round(total / max(uptime, 1.0), 2))
    per_s = rate(min(period_s, window_s)).count_per_s
    return BrokerStatsItem(sum=round(per_s * period_s), tps=round(per_s, 2))


def stats_data(state: BrokerState, name: str, key: str) -> BrokerStatsData | None:
    """The `BrokerStatsData` of one of `SERVED_HERE` (None: RocketMQ would not have the item)."""
    stats = state.stats
    now = state.clock()
    uptime = now - stats.started
    if name in ("BROKER_PUT_NUMS", "BROKER_GET_NUMS"):
        table = stats.put if name == "BROKER_PUT_NUMS" else stats.get
        if key != state.config.broker_cluster_name:
            return None
        total = table.grand_total()[0]
        window = table.window_s

        def rate(span: float) -> Rates:
            return table.rate_all(now, span)

    else:
        topic, _, group = key.partition("@")
        sendbacks = stats.sendbacks
        pair = (topic, group)
        if pair not in {k for k, _, _ in sendbacks.items()}:
            return None
        total = sendbacks.total(pair)[0]
        window = sendbacks.window_s

        def rate(span: float) -> Rates:
            return sendbacks.rate(pair, now, span)

    day, hour, minute = (_item(total, rate, window, uptime, p) for p in _PERIODS_S)
    return BrokerStatsData(stats_day=day, stats_hour=hour, stats_minute=minute)


async def view_broker_stats(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """VIEW_BROKER_STATS_DATA (315): `SERVED_HERE` here, the rest by `admin.view_broker_stats`."""
    header = from_ext_fields(ViewBrokerStatsDataRequestHeader, request.ext_fields)
    if header.stats_name not in SERVED_HERE:
        return await admin.view_broker_stats(state, conn, request)
    found = stats_data(state, header.stats_name, header.stats_key)
    if found is None:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"The stats <{header.stats_name}> <{header.stats_key}> not exist",
        )
    return request.make_response(ResponseCode.SUCCESS, body=encode_sorted(found))
