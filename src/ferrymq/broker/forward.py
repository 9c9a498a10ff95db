"""Broker-side deliveries whose queue moved off this group (issue 20 section 4).

A delayed or timer message waits on the group that took it in; when it falls due, its queue
may have moved to another group and this one may have no open queue of the topic left (`ferry
admin broker drain`). Such a delivery (`deliver_elsewhere`):
1. goes to the logical queue's open segment on its other group as a client send would
   (`Forwarder`: the group's master from a NameServer's route, then SEND_MESSAGE);
2. while the queue is still moving (no open segment elsewhere yet), or the forward fails,
   is retried later (NO_PERMISSION to the caller), for at most `FORWARD_PATIENCE_S` per message;
3. after that, is set aside (logged) in `ASIDE_TOPIC` on this group, with its real topic and
   queue in properties, so the delay level or timer moves on: one message that cannot be
   delivered never holds up every other one behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from ferrymq.broker.queuemap import queue_map_of
from ferrymq.broker.send import put_messages
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, RequestError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import TopicRouteData, decode_body
from ferrymq.wire.broker import SendMessageRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import GetRouteInfoRequestHeader
from ferrymq.wire.properties import decode_properties, encode_properties
from ferrymq.wire.queuemap import QueueSegment
from ferrymq.wire.records import BatchItem

__all__ = ["ASIDE_TOPIC", "FORWARD_PATIENCE_S", "Forwarder", "deliver_elsewhere"]

log = logging.getLogger(__name__)

ASIDE_TOPIC: Final = "rmq_sys_ferry_undelivered"
"""Where a broker-side delivery that could go nowhere is kept (queue 0; REAL_TOPIC/REAL_QID)."""
FORWARD_PATIENCE_S: Final = 30.0
"""How long one message's delivery may keep failing before it is set aside."""
_TIMEOUT_S: Final = 5.0
_STORED: Final = frozenset(
    {
        ResponseCode.SUCCESS,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    }
)
_PRODUCER_GROUP: Final = "FERRY_FORWARD_PRODUCER"


class Forwarder:
    """Sends one message to a physical queue of another group, as a producer would."""

    def __init__(self, rpc: RpcClient, namesrv_addrs: Sequence[str]) -> None:
        self._rpc = rpc
        self._namesrv_addrs = list(namesrv_addrs)

    async def _master_of(self, topic: str, broker_name: str) -> str:
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
        )
        reasons = []
        for address in self._namesrv_addrs:
            try:
                response = await self._rpc.call(address, request, _TIMEOUT_S)
            except FerryError as exc:
                reasons.append(f"{address}: {exc}")
                continue
            if response.code != ResponseCode.SUCCESS:
                reasons.append(f"{address}: {response.remark}")
                continue
            route = decode_body(response.body, TopicRouteData)
            for data in route.broker_datas:
                if data.broker_name == broker_name and 0 in data.broker_addrs:
                    return data.broker_addrs[0]
            reasons.append(f"{address}: no master of {broker_name} for {topic}")
        raise RequestError(ResponseCode.SYSTEM_BUSY, "; ".join(reasons) or "no NameServer")

    async def send(
        self, topic: str, segment: QueueSegment, item: BatchItem, *, born_timestamp_ms: int
    ) -> None:
        """SEND_MESSAGE of `item` to the segment's physical queue, on its group's master.

        Raises:
            FerryError: the message was not stored (or the answer was lost).
        """
        address = await self._master_of(topic, segment.broker_name)
        header = SendMessageRequestHeader(
            producer_group=_PRODUCER_GROUP,
            topic=topic,
            default_topic="TBW102",
            default_topic_queue_nums=4,
            queue_id=segment.queue_id,
            sys_flag=0,
            born_timestamp=born_timestamp_ms,
            flag=item.flag,
            properties=item.properties.decode(),
        )
        request = RemotingCommand(
            code=RequestCode.SEND_MESSAGE, ext_fields=to_ext_fields(header), body=item.body
        )
        response = await self._rpc.call(address, request, _TIMEOUT_S)
        if response.code not in _STORED:
            raise RequestError(response.code, response.remark or "refused")


def _target(state: BrokerState, topic: str, queue_id: int) -> QueueSegment | None:
    """The open segment on another group of the logical queue (None: none, or still moving)."""
    queue_map = queue_map_of(state.topics.get(topic))
    found = queue_map.owner(state.config.broker_name, queue_id) if queue_map else None
    if found is None:
        return None
    logical, _ = found
    current = logical.current
    if logical.moving is not None or current.broker_name == state.config.broker_name:
        return None
    return current


async def deliver_elsewhere(
    state: BrokerState,
    forwarder: Forwarder | None,
    topic: str,
    queue_id: int,
    item: BatchItem,
    *,
    born_host: bytes,
    born_timestamp_ms: int,
    failing_since: float,
) -> None:
    """Deliver a message the group has no open queue for (module docstring).

    `failing_since`: when this message's delivery first failed (the caller's clock).

    Raises:
        RequestError: NO_PERMISSION, not delivered and not set aside yet: try again later.
    """
    target = _target(state, topic, queue_id)
    reason = "the queue is still moving" if target is None else "no forwarder"
    if target is not None and forwarder is not None:
        try:
            await forwarder.send(topic, target, item, born_timestamp_ms=born_timestamp_ms)
        except FerryError as exc:
            reason = f"forward to {target.broker_name} queue {target.queue_id}: {exc}"
        else:
            log.info(
                "a message for %s queue %d (moved off %s) forwarded to %s queue %d",
                topic,
                queue_id,
                state.config.broker_name,
                target.broker_name,
                target.queue_id,
            )
            return
    if state.clock() - failing_since < FORWARD_PATIENCE_S:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"queue {queue_id} of {topic} is sealed and the group has no open queue of it: "
            f"{reason}",
        )
    properties = decode_properties(item.properties)
    properties[props.REAL_TOPIC] = topic
    properties[props.REAL_QUEUE_ID] = str(queue_id)
    result, _ = await put_messages(
        state,
        ASIDE_TOPIC,
        0,
        [BatchItem(item.body, encode_properties(properties), item.flag)],
        born_host=born_host,
        born_timestamp_ms=born_timestamp_ms,
        wait_flush=False,
    )
    log.error(
        "a message for %s queue %d could not be delivered for %g s (%s): set aside in %s at "
        "log offset %d",
        topic,
        queue_id,
        FORWARD_PATIENCE_S,
        reason,
        ASIDE_TOPIC,
        result.log_offsets[0],
    )
