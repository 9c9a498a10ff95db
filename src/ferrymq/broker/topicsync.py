"""A controller-mode broker's topics: follow the controller's topic state (issue 20 section 3).

The controller keeps each topic's config and placement (`controller.topics`). Here:
- `reconcile` brings a master's topic table to what the controller says its group holds (a
  `GroupTopicsBody`): it creates and changes the group's topics, drops held topics the controller
  deleted or placed on other groups only (config, consume queues, consumer offsets), and records
  the controller's topic version in the table. An answer older than the version the table
  reflects is ignored; the version travels with the table to the slaves (`metalog.py`), so a new
  master never goes back behind what its predecessor applied.
- `TopicSync` asks the controller (CONTROLLER_GET_GROUP_TOPICS) while the broker registers, when a
  heartbeat answer or a NOTIFY_TOPICS_CHANGED push names a newer topic version, and when this
  broker becomes master. Only a master reconciles; slaves follow its table through the metadata
  log. It is also the broker's `TopicAuthority`: a topic admin request sent to the broker
  (UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER) and an auto-create go to the controller.

Rules:
1. Broker-local topics (`wire.topics.is_broker_local_topic`: system, retry, dead-letter topics)
   are the broker's own; topics the controller never heard of (made before controller mode) are
   kept as they are. Every other topic on a master is the controller's.
2. A broker back from downtime has fetched the controller's topics before it takes any role,
   and a new master reconciles before it leaves the fence (`Broker.on_master`), so before it
   registers with a NameServer: a topic deleted while it was down is never routed again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ferrymq.broker.controller_link import ControllerLink
from ferrymq.broker.metadata import DEFAULT_TOPIC, TopicTable
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, ProtocolError, RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import Perm, decode_body, encode_body
from ferrymq.wire.broker import CreateTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields
from ferrymq.wire.topics import (
    ControllerDeleteTopicRequestHeader,
    ControllerUpdateTopicRequestHeader,
    GetGroupTopicsRequestHeader,
    GroupTopicsBody,
    GroupTopicsRequestBody,
    NotifyTopicsChangedRequestHeader,
    TopicVersionResponseHeader,
    is_broker_local_topic,
)

if TYPE_CHECKING:
    from ferrymq.broker.broker import Broker

__all__ = [
    "Reconciled",
    "TopicSync",
    "auto_create_topic",
    "drop_topic",
    "held_topics",
    "reconcile",
]

log = logging.getLogger(__name__)

_RETRY_S: Final = 1.0


def held_topics(topics: TopicTable) -> list[str]:
    """The topics of a table the controller may keep (not broker-local ones)."""
    return sorted(name for name in topics.configs if not is_broker_local_topic(name))


def drop_topic(state: BrokerState, topic: str) -> bool:
    """Delete a topic here: config, consume queues, consumer offsets; False when not held."""
    if not state.topics.delete(topic):
        return False
    state.fences.forget(topic)
    state.store.delete_topic(topic)
    state.offsets.delete_topic(topic)
    return True


async def auto_create_topic(state: BrokerState, topic: str, default_queue_nums: int) -> None:
    """Controller mode: ask the controller for a topic a producer sends to (auto-create).

    RocketMQ's rule (`autoCreateTopicEnable` and an inheritable TBW102 template give the queue
    count and permission), decided by the controller for this group (`controller.topics` rule 6).
    Does nothing when the rule does not allow it: the send is then refused as unknown.

    Raises:
        RequestError: the controller refused (a fenced topic on another group) or did not answer.
    """
    authority = state.topic_authority
    if (
        authority is None
        or is_broker_local_topic(topic)
        or not state.config.auto_create_topic_enable
    ):
        return
    template = state.topics.get(DEFAULT_TOPIC)
    if template is None or not template.perm & Perm.INHERIT:
        return
    queues = max(1, min(default_queue_nums, template.write_queue_nums))
    header = CreateTopicRequestHeader(
        topic=topic,
        read_queue_nums=queues,
        write_queue_nums=queues,
        perm=template.perm & ~Perm.INHERIT,
    )
    await authority.put_on_group(header, auto_create=True)
    log.info("topic %s auto-created by the controller on this group", topic)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What one reconcile changed."""

    version: int
    put: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the topic table changed."""
        return bool(self.put or self.dropped)


def reconcile(state: BrokerState, body: GroupTopicsBody) -> Reconciled | None:
    """Bring the topic table to the controller's answer; None when the answer is stale."""
    topics = state.topics
    if body.topic_version < topics.controller_version:
        return None
    put = tuple(
        config.topic_name
        for config in body.topics
        if not is_broker_local_topic(config.topic_name) and topics.put(config)
    )
    dropped = tuple(
        name for name in body.drop if not is_broker_local_topic(name) and drop_topic(state, name)
    )
    topics.set_controller_version(body.topic_version)
    done = Reconciled(body.topic_version, put, dropped)
    if done.changed:
        state.on_topics_changed()
    return done


class TopicSync:
    """One controller-mode broker's link to the controller's topics (module docstring)."""

    def __init__(self, broker: Broker, link: ControllerLink) -> None:
        self.broker = broker
        self.link = link
        self.view: GroupTopicsBody | None = None
        """The newest answer of CONTROLLER_GET_GROUP_TOPICS."""
        self.supported = True
        """False once a controller answered REQUEST_CODE_NOT_SUPPORTED (older than topics as
        controller state): this broker then keeps its topics itself, as before."""
        self._wake = asyncio.Event()

    @property
    def version(self) -> int:
        """The controller topic version of the newest answer (-1: none yet)."""
        return self.view.topic_version if self.view is not None else -1

    def heard(self, topic_version: int | None) -> None:
        """A heartbeat answer or a push named the controller's topic version."""
        if topic_version is not None and topic_version > self.version:
            self._wake.set()

    def wake(self) -> None:
        """Ask the controller again soon (this broker became master)."""
        self._wake.set()

    async def run(self) -> None:
        """Fetch (and, on a master, reconcile) whenever woken, forever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
            except (FerryError, ProtocolError) as exc:
                log.info("could not read this group's topics from the controller: %s", exc)
                await asyncio.sleep(_RETRY_S)
                self._wake.set()

    async def fetch(self) -> GroupTopicsBody | None:
        """Ask the controller what this group should hold (keeps the newest answer).

        None when the controller does not keep topics (`supported`).

        Raises:
            FerryError: no controller leader answered, or it refused.
            ProtocolError: the answer does not decode.
        """
        if not self.supported:
            return None
        state = self.broker.state
        response = await self.link.call(
            RequestCode.CONTROLLER_GET_GROUP_TOPICS,
            GetGroupTopicsRequestHeader(broker_name=state.config.broker_name),
            encode_body(GroupTopicsRequestBody(held=held_topics(state.topics))),
        )
        if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            log.warning(
                "the controller does not keep topics (an older version): this broker keeps its "
                "own, as in classic mode, until it restarts against a newer controller"
            )
            self.supported = False
            return None
        if response.code != ResponseCode.SUCCESS:
            raise FerryError(f"CONTROLLER_GET_GROUP_TOPICS: {response.code} {response.remark}")
        body = decode_body(response.body, GroupTopicsBody)
        if body.topic_version >= self.version:
            self.view = body
        return body

    async def refresh(self) -> None:
        """Fetch, then reconcile if this broker is master."""
        await self.fetch()
        self.reconcile_now()

    def reconcile_now(self) -> None:
        """Reconcile a master's table to the newest answer (no await between check and change)."""
        state = self.broker.state
        if self.view is None or not state.is_master:
            return
        done = reconcile(state, self.view)
        if done is None:
            log.info(
                "topics at controller version %d ignored: the table reflects version %d",
                self.view.topic_version,
                state.topics.controller_version,
            )
        elif done.changed:
            log.info(
                "topics reconciled to controller version %d: set %s, dropped %s",
                done.version,
                ", ".join(done.put) or "none",
                ", ".join(done.dropped) or "none",
            )

    async def notified(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """NOTIFY_TOPICS_CHANGED (9244, ferrymq's own): the controller's topics changed."""
        header = from_ext_fields(NotifyTopicsChangedRequestHeader, request.ext_fields)
        self.heard(header.topic_version)
        return request.make_response(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------ TopicAuthority

    async def put_on_group(
        self, header: CreateTopicRequestHeader, *, auto_create: bool = False
    ) -> None:
        """Have the controller create or change the topic on this group; hold it on return."""
        config = self.broker.config
        response = await self._call(
            RequestCode.CONTROLLER_UPDATE_TOPIC,
            ControllerUpdateTopicRequestHeader(
                topic=header.topic,
                read_queue_nums=header.read_queue_nums,
                write_queue_nums=header.write_queue_nums,
                perm=header.perm,
                topic_filter_type=header.topic_filter_type,
                topic_sys_flag=header.topic_sys_flag,
                order=header.order,
                attributes=header.attributes,
                cluster_name=config.broker_cluster_name,
                broker_name=config.broker_name,
                auto_create=auto_create,
            ),
        )
        await self._caught_up(response)

    async def remove_from_group(self, topic: str) -> None:
        """Have the controller take the topic off this group; dropped here on return."""
        config = self.broker.config
        response = await self._call(
            RequestCode.CONTROLLER_DELETE_TOPIC,
            ControllerDeleteTopicRequestHeader(
                topic=topic, cluster_name=config.broker_cluster_name, broker_name=config.broker_name
            ),
        )
        await self._caught_up(response)

    async def _call(self, code: int, header: CommandHeader) -> RemotingCommand:
        try:
            return await self.link.call(code, header)
        except FerryError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"controller mode: {exc}") from None

    async def _caught_up(self, response: RemotingCommand) -> None:
        if response.code != ResponseCode.SUCCESS:
            raise RequestError(response.code, f"the controller refused: {response.remark}")
        answer = from_ext_fields(TopicVersionResponseHeader, response.ext_fields)
        try:
            await self.refresh()
        except (FerryError, ProtocolError) as exc:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"the controller decided (topic version {answer.topic_version}), but this "
                f"broker could not read it back: {exc}",
            ) from None
        if answer.topic_version is not None and self.version < answer.topic_version:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"the controller decided (topic version {answer.topic_version}) but answered "
                f"version {self.version} after it; retry",
            )
