"""A broker's side of moved queues (issue 20 section 4; the design is `wire/queuemap.py`).

The controller puts a topic's queue map in the `ferry.queueMap` attribute of each group's
TopicConfig; masters reconcile it (`topicsync.py`) and slaves get it with the topic table. Here:
- `check_send`: a physical queue the map seals (its segment closed, or its logical queue
  moving away) takes no message: NO_PERMISSION, which makes every client (ferrymq's and the
  official ones) refresh its route and send elsewhere. The check and the append run with no
  await between them (`send.py`), so once the table seals a queue nothing more lands in it.
- `open_queue_for`: a broker-side writer (delayed and timer deliveries, transaction commits)
  whose queue was sealed since it took the message in writes to another open queue of the
  topic on the group, never past a sealed queue's end. A sink batch's rows are the exception:
  the seal waits for them, so they go into their queue.
- `start_hosted_queues`: a moved queue's new physical queue begins at its segment's start
  offset (`Store.start_queue_at`), on master and slaves, whenever the table changes.
- SEAL_QUEUE (`seal_queue`): the controller's leader asks the source master where a moving
  queue ends. The master answers once its table reflects the move (the queue is sealed) and
  every record it appended is committed (the confirm offset reached the log's end as it was
  when the answer was decided), with the queue's next offset: the next segment's start. An
  exactly-once sink's prepared rows for the queue hold the seal back until their batch is
  committed (or expires), and a sealed queue takes no new prepared rows.
- PULL_MESSAGE on a sealed queue says `ferrySealed: true`; it does not long-poll while the
  queue moves, nor for ferrymq's clients (`ferryFollowsMap`); at a closed segment's end it
  long-polls others (the official clients), which would otherwise pull again at once.
- QUERY_CONSUMER_OFFSET (`committed_floor`): a group with no offset on a moved queue's new
  physical queue starts at the segment's start (what the official client then reads), not at
  its end: nothing written after the move is skipped.

Crash points for tests (`FERRYMQ_TEST_CRASH_AT=<point>`, honoured only with
`FERRYMQ_TEST_HOOKS=1`): `seal_answered_before_reply` (the source decided the end offset and
dies before the controller hears it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from typing import Final

from ferrymq.broker.state import BrokerState
from ferrymq.errors import ProtocolError, RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.store.store import Store
from ferrymq.wire.bodies import TopicConfig
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.queuemap import QUEUE_MAP_ATTRIBUTE, QueueMap, decode_queue_map
from ferrymq.wire.topics import SealQueueRequestHeader, SealQueueResponseHeader

__all__ = [
    "CRASH_POINTS",
    "SEALED_FIELD",
    "check_send",
    "committed_floor",
    "crash_point",
    "open_queue_for",
    "queue_map_of",
    "seal_queue",
    "start_hosted_queues",
]

log = logging.getLogger(__name__)

CRASH_POINTS: Final = ("seal_answered_before_reply",)
_HOOKS: Final = os.environ.get("FERRYMQ_TEST_HOOKS") == "1"
_CRASH_AT: Final = os.environ.get("FERRYMQ_TEST_CRASH_AT", "")
SEALED_FIELD: Final = "ferrySealed"
"""A pull answer's ext field: the physical queue is sealed (read it to its end, then move on)."""
_SEAL_WAIT_S: Final = 5.0
_SEAL_POLL_S: Final = 0.005


def crash_point(name: str) -> None:
    """Die here (exit 137, as kill -9) when the test hooks ask for this point."""
    if _HOOKS and name == _CRASH_AT:
        log.warning("test crash point %s reached: exiting", name)
        os._exit(137)


@functools.lru_cache(maxsize=256)
def _decode(text: str) -> QueueMap | None:
    try:
        return decode_queue_map(text)
    except ProtocolError as exc:
        log.warning("queue map ignored: %s", exc)
        return None


def queue_map_of(config: TopicConfig | None) -> QueueMap | None:
    """The topic's queue map, if the controller gave it one."""
    if config is None or not config.attributes:
        return None
    text = config.attributes.get(QUEUE_MAP_ATTRIBUTE)
    return _decode(text) if text is not None else None


def check_send(config: TopicConfig, broker_name: str, queue_id: int) -> None:
    """Refuse a send to a sealed physical queue.

    Raises:
        RequestError: NO_PERMISSION, the queue is sealed.
    """
    queue_map = queue_map_of(config)
    if queue_map is not None and queue_map.is_sealed(broker_name, queue_id):
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"queue {queue_id} of topic {config.topic_name} on {broker_name} is sealed "
            "(moved to another broker group): refresh the route",
        )


def open_queue_for(state: BrokerState, topic: str, queue_id: int) -> int:
    """The queue a broker-side writer (delayed, timer, transactional) puts into.

    `queue_id` unless the map sealed it since the message was taken in: then another open
    physical queue of the topic on this group (the next one up), so nothing lands in a sealed
    queue past its end, where readers following the map would never look.

    Raises:
        RequestError: NO_PERMISSION, every queue of the topic on this group is sealed (its
            writer keeps the message and tries again later).
    """
    config = state.topics.get(topic)
    queue_map = queue_map_of(config)
    name = state.config.broker_name
    if queue_map is None or not queue_map.is_sealed(name, queue_id):
        return queue_id
    open_ids = sorted(q for q in queue_map.physical_ids(name) if not queue_map.is_sealed(name, q))
    if not open_ids:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"queue {queue_id} of topic {topic} on {name} is sealed and the group has no open "
            "queue of it",
        )
    return next((q for q in open_ids if q > queue_id), open_ids[0])


def start_hosted_queues(store: Store, broker_name: str, config: TopicConfig) -> None:
    """Make the group's moved-in physical queues begin at their segments' starts."""
    queue_map = queue_map_of(config)
    if queue_map is None:
        return
    for queue_id, start in sorted(queue_map.hosted_starts(broker_name).items()):
        if store.start_queue_at(config.topic_name, queue_id, start):
            log.info(
                "%s queue %d of %s begins at offset %d (a moved queue)",
                broker_name,
                queue_id,
                config.topic_name,
                start,
            )


def committed_floor(state: BrokerState, topic: str, queue_id: int) -> int | None:
    """Where a group with no offset on the physical queue starts: a moved-in segment's start."""
    queue_map = queue_map_of(state.topics.get(topic))
    if queue_map is None:
        return None
    return queue_map.hosted_starts(state.config.broker_name).get(queue_id)


def _check_no_prepared_rows(
    topic: str, queue_id: int, stages_into: Callable[[str, int], bool] | None
) -> None:
    if stages_into is not None and stages_into(topic, queue_id):
        raise RequestError(
            ResponseCode.SYSTEM_BUSY,
            f"a sink batch holds prepared rows for queue {queue_id} of {topic}: "
            "the seal waits for its commit",
        )


async def seal_queue(
    state: BrokerState,
    conn: Connection,
    request: RemotingCommand,
    stages_into: Callable[[str, int], bool] | None = None,
) -> RemotingCommand:
    """SEAL_QUEUE (9246, ferrymq's own): the end offset of a moving queue, once committed.

    `stages_into(topic, queue id)`: whether an exactly-once sink batch holds prepared rows for
    the queue; the seal waits for it to be committed or expire (its rows land below the end).
    """
    header = from_ext_fields(SealQueueRequestHeader, request.ext_fields)
    state.check_writable()
    topics = state.topics
    if topics.controller_version < header.topic_version:
        raise RequestError(
            ResponseCode.SYSTEM_BUSY,
            f"topic table at controller version {topics.controller_version}, the move is at "
            f"{header.topic_version}: not sealed yet",
        )
    queue_map = queue_map_of(topics.get(header.topic))
    name = state.config.broker_name
    if queue_map is None or not queue_map.is_sealed(name, header.queue_id):
        raise RequestError(
            ResponseCode.INVALID_PARAMETER,
            f"queue {header.queue_id} of {header.topic} on {name} is not being moved",
        )
    _check_no_prepared_rows(header.topic, header.queue_id, stages_into)
    store = state.store
    target = store.max_log_offset
    deadline = state.clock() + _SEAL_WAIT_S
    while store.confirm_offset < target:
        if state.clock() >= deadline:
            raise RequestError(
                ResponseCode.SYSTEM_BUSY,
                f"records up to log offset {target} not committed within {_SEAL_WAIT_S:g} s",
            )
        await asyncio.sleep(_SEAL_POLL_S)
        state.check_writable()
    # again: a prepare appended before the seal but not committed at the first check was
    # invisible to it (the sink reads below the confirm offset); its commit would land past `end`
    _check_no_prepared_rows(header.topic, header.queue_id, stages_into)
    end = store.max_queue_offset(header.topic, header.queue_id)
    log.info("%s: queue %d of %s sealed at offset %d", name, header.queue_id, header.topic, end)
    crash_point("seal_answered_before_reply")
    return request.make_response(
        ResponseCode.SUCCESS,
        ext_fields=to_ext_fields(SealQueueResponseHeader(end_queue_offset=end)),
    )
