"""CLONE_GROUP_OFFSET (314): one group gets the offsets another committed (cloneGroupOffset).

Owns the request header and the handler (RocketMQ `AdminBrokerProcessor.cloneGroupOffset` and
`ConsumerOffsetManager.cloneOffset`). For each topic (the named one, or every topic the source
group committed in when none is named) that exists here: unless `offline`, a source group with
online subscriptions must subscribe to it; then every queue offset the source committed is
committed for the destination, replicated like any commit. Differences from RocketMQ: with no
topic named, each topic is cloned (RocketMQ's loop clones the blank topic, so nothing); queues the
destination committed and the source did not keep their offsets (RocketMQ replaces the map).
"""

from __future__ import annotations

import logging

from ferrymq.broker.state import BrokerState
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields

__all__ = ["CloneGroupOffsetRequestHeader", "clone_group_offset"]

log = logging.getLogger(__name__)


class CloneGroupOffsetRequestHeader(CommandHeader):
    """CLONE_GROUP_OFFSET (314): RocketMQ `CloneGroupOffsetRequestHeader`."""

    src_group: str
    dest_group: str
    topic: str | None = None
    offline: bool = False


def cloned_topics(state: BrokerState, header: CloneGroupOffsetRequestHeader) -> list[str]:
    """Clone the offsets (decided and applied at once, on the loop); the topics cloned."""
    offsets = state.offsets
    committed = offsets.of_group(header.src_group)
    topics = [header.topic] if header.topic and header.topic.strip() else sorted(committed)
    group = state.clients.consumers.get(header.src_group)
    subscribed = set() if group is None else set(group.subscriptions)
    done = []
    for topic in topics:
        if topic not in state.topics.configs:
            log.warning("clone group offset: topic %s does not exist here", topic)
            continue
        if not header.offline and subscribed and topic not in subscribed:
            log.warning("clone group offset: %s does not subscribe to %s", header.src_group, topic)
            continue
        for queue_id, queue_offset in sorted(committed.get(topic, {}).items()):
            offsets.commit(topic, header.dest_group, queue_id, queue_offset)
        done.append(topic)
    return done


async def clone_group_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """CLONE_GROUP_OFFSET (314): SUCCESS once the cloned commits are replicated."""
    header = from_ext_fields(CloneGroupOffsetRequestHeader, request.ext_fields)
    if not state.is_master:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"the broker[{state.address}] is a slave: offsets are committed on the master",
        )
    done = cloned_topics(state, header)
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, "the cloned offsets were not replicated in time; clone again"
        )
    log.info(
        "offsets of %s cloned to %s in %s, asked by %s",
        header.src_group,
        header.dest_group,
        done,
        conn.peer,
    )
    return request.make_response(ResponseCode.SUCCESS)
