"""The admin client: topics, clusters and routes (the parts of RocketMQ's `MQAdminExt` served).

Controller mode (issue 20 section 3): topics are the controller's. The client learns whether a
cluster runs controllers from a broker's config (GET_BROKER_CONFIG: `enableControllerMode`,
`controllerAddr`), once per client; `create_topic` and `delete_topic` then go to the controller,
which decides the placement for every group (those without a master included), and wait as in
classic mode until the NameServers route what the live masters now hold. Broker-local topics
(system, retry, dead-letter) still go to the masters themselves. `topic_placement`
shows the controller's desired placement against each group's master and the routes.

Moving queues between groups (issue 20 section 4): `reassign` asks the controller to start (or
cancel, or clean up) moves and `move_progress` says where each one is, from the controller's
state: `moving` (the source seals the queue), `done` (the new segment is open, with the offset
the old one ended at) or `cancelled`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from ferrymq import clock
from ferrymq.client.consumer import decode_messages
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.credentials import Credentials, with_credentials
from ferrymq.client.fenced import FenceHolder, fence_holder, route_queue
from ferrymq.client.message import Message
from ferrymq.client.routing import TopicRoute
from ferrymq.config import ConfigError, parse_properties
from ferrymq.errors import FerryError, RemoteError, RpcError
from ferrymq.model import format_address, validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import (
    ClusterInfo,
    ConsumeMessageDirectlyResult,
    ConsumeStats,
    ConsumeStatsEntry,
    KVTable,
    TopicList,
    TopicOffsetEntry,
    TopicRouteData,
    decode_body,
    decode_consume_stats,
    decode_topic_stats,
)
from ferrymq.wire.broker import (
    ConsumeMessageDirectlyResultRequestHeader,
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueryMessageRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
    format_attribute_changes,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.namesrv import (
    AddWritePermOfBrokerRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    GetRouteInfoRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
)
from ferrymq.wire.records import unpack_host
from ferrymq.wire.topics import (
    ControllerReassignRequestHeader,
    ControllerUpdateTopicRequestHeader,
    QueueMoveBody,
    ReassignBody,
    TopicPlacement,
    is_broker_local_topic,
)

__all__ = ["AdminClient", "GroupPlacement", "MoveProgress", "TopicPlacementStatus"]


@dataclass(frozen=True, slots=True)
class MoveProgress:
    """Where one move of a queue stands."""

    move: QueueMoveBody
    state: str
    """`moving`, `done` or `cancelled` (the queue is elsewhere than the move's target)."""
    end_offset: int | None = None
    """Done: the offset the old segment ended at (the new one starts there)."""


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """One broker group of a topic in controller mode: desired against actual (write queues)."""

    broker_name: str
    desired: int | None
    """Queues the controller placed on the group (None: not placed there)."""
    master: str | None
    """The group's master, as the NameServer routes it (None: no master)."""
    on_broker: int | None
    """Queues the master holds (None: it does not hold the topic, or no master)."""
    routed: int | None
    """Queues the NameServer routes for the group (None: not routed)."""
    managed: bool = True
    """Whether the controller knows the topic (False: made before controller mode; kept)."""

    @property
    def state(self) -> str:
        """`ok`, `pending` (brokers catching up), `no master`, `to drop` or `not managed`."""
        if self.desired is None:
            if self.on_broker is None and self.routed is None:
                return "ok"
            return "to drop" if self.managed else "not managed"
        if self.master is None:
            return "no master"
        if self.on_broker == self.desired and self.routed == self.desired:
            return "ok"
        return "pending"


@dataclass(frozen=True, slots=True)
class TopicPlacementStatus:
    """A topic as the controller keeps it and as the cluster holds it (`topic_placement`)."""

    topic: str
    topic_version: int
    """The controller's topic version."""
    record: TopicPlacement | None
    """The controller's record of the topic (None: deleted, or never created through it)."""
    deleted_at: int | None
    """The version that deleted it (None: not deleted)."""
    groups: list[GroupPlacement]


class AdminClient:
    """Administration through the NameServers and brokers."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        timeout: float = 5.0,
        rpc: RpcClient | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`access_key`/`secret_key` (or `credentials`): sign every request (ACL 1.0, issue 23)."""
        self._namesrvs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        self._rpc = with_credentials(rpc, access_key, secret_key, credentials)
        self._owns_rpc = rpc is None
        self._timeout = timeout
        self._controllers: ControllerAdmin | None = None
        self._mode_known = False

    async def close(self) -> None:
        """Close connections (when this client owns them)."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _namesrv_call(self, request: RemotingCommand) -> RemotingCommand:
        last: FerryError | None = None
        for address in self._namesrvs:
            try:
                return await self._rpc.call(address, request, self._timeout)
            except FerryError as exc:
                last = exc
        raise last or FerryError("no NameServer address given")

    async def _broker_call(self, address: str, request: RemotingCommand) -> RemotingCommand:
        response = await self._rpc.call(address, request, self._timeout)
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return response

    async def cluster_info(self) -> ClusterInfo:
        """Every broker group and cluster the NameServer knows."""
        response = await self._namesrv_call(
            RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, ClusterInfo)

    async def route(self, topic: str) -> TopicRouteData | None:
        """A topic's route, or None when no NameServer knows it."""
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
        )
        response = await self._namesrv_call(request)
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, TopicRouteData)

    async def topics(self) -> list[str]:
        """Every routed topic."""
        response = await self._namesrv_call(
            RemotingCommand(code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, TopicList).topic_list

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        """Make every NameServer offer `broker_name`'s queues read-only; NameServer -> topics.

        Drains the group before maintenance: producers stop sending there, consumers read on.
        """
        header = to_ext_fields(WipeWritePermOfBrokerRequestHeader(broker_name=broker_name))
        answers = await self._every_namesrv(RequestCode.WIPE_WRITE_PERM_OF_BROKER, header)
        return {addr: int(r.ext_fields.get("wipeTopicCount", 0)) for addr, r in answers.items()}

    async def add_write_perm(self, broker_name: str) -> dict[str, int]:
        """Undo `wipe_write_perm` on every NameServer; NameServer -> topics on the group."""
        header = to_ext_fields(AddWritePermOfBrokerRequestHeader(broker_name=broker_name))
        answers = await self._every_namesrv(RequestCode.ADD_WRITE_PERM_OF_BROKER, header)
        return {addr: int(r.ext_fields.get("addTopicCount", 0)) for addr, r in answers.items()}

    async def _every_namesrv(
        self, code: int, ext_fields: dict[str, str]
    ) -> dict[str, RemotingCommand]:
        """Send one request to each NameServer (each keeps its own routes); all must say yes."""
        answers: dict[str, RemotingCommand] = {}
        for address in self._namesrvs:
            request = RemotingCommand(code=code, ext_fields=dict(ext_fields))
            response = await self._rpc.call(address, request, self._timeout)
            if response.code != ResponseCode.SUCCESS:
                raise RemoteError(response.code, f"NameServer {address}: {response.remark}")
            answers[address] = response
        return answers

    async def _masters(self, cluster: str | None, broker_name: str | None) -> dict[str, str]:
        """Broker name -> master address, for the groups of a cluster (or one group, or all)."""
        info = await self.cluster_info()
        names = set(info.broker_addr_table)
        if cluster is not None:
            names &= set(info.cluster_addr_table.get(cluster, []))
        if broker_name is not None:
            names &= {broker_name}
        found = {
            n: master
            for n in sorted(names)
            if (master := info.broker_addr_table[n].broker_addrs.get(0))
        }
        if not found:
            where = (
                f"broker {broker_name}"
                if broker_name
                else f"cluster {cluster}"
                if cluster
                else "any cluster"
            )
            raise FerryError(f"no master found in {where}")
        return found

    async def controllers(self) -> ControllerAdmin | None:
        """The controllers of a controller-mode cluster (None: classic mode).

        Learned once from the first broker that answers GET_BROKER_CONFIG (`controllerAddr`).
        """
        if self._mode_known:
            return self._controllers
        info = await self.cluster_info()
        request = RemotingCommand(code=RequestCode.GET_BROKER_CONFIG)
        for name in sorted(info.broker_addr_table):
            for _, address in sorted(info.broker_addr_table[name].broker_addrs.items()):
                try:
                    response = await self._rpc.call(address, request, self._timeout)
                    if response.code != ResponseCode.SUCCESS:
                        continue
                    config = parse_properties(response.body.decode(), "GET_BROKER_CONFIG")
                except (FerryError, ConfigError, UnicodeDecodeError):
                    continue
                controller_addr = config.get("controllerAddr", "")
                if config.get("enableControllerMode") == "true" and controller_addr.strip():
                    self._controllers = ControllerAdmin(
                        controller_addr, timeout=self._timeout, rpc=self._rpc
                    )
                self._mode_known = True
                return self._controllers
        return None

    async def create_topic(
        self,
        topic: str,
        queues: int = 8,
        *,
        cluster: str | None = None,
        broker_name: str | None = None,
        perm: int = 6,
        order: bool = False,
        fenced: bool = False,
        attributes: dict[str, str] | None = None,
    ) -> list[str]:
        """Create (or change) a topic on every master of a cluster or one broker group.

        Returns once every reachable NameServer routes the topic's new shape to each group that
        took it (masters register a change at once), so the topic can be used right away; raises
        `FerryError` naming a NameServer that answers but has not caught up within the timeout,
        or the connection error when none answers. Returns the masters that took it.

        `fenced`: a fenced topic (one queue on the one group `broker_name` names; only fenced
        appends write it, `ferrymq.client.fenced`). `attributes`: RocketMQ 5 attribute changes,
        `{"+key": "value", "-key": ""}`.

        Raises:
            ValueError: `fenced` without `broker_name`, or with more than one queue.
        """
        validate_topic(topic)
        changes = dict(attributes or {})
        if fenced:
            if broker_name is None:
                raise ValueError("a fenced topic is created on one broker group: name it")
            if queues != 1:
                raise ValueError(f"a fenced topic has exactly one queue, not {queues}")
            changes["+ferry.fenced"] = "true"
        header = CreateTopicRequestHeader(
            topic=topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=perm,
            order=order,
            attributes=format_attribute_changes(changes) or None,
        )
        controllers = None if is_broker_local_topic(topic) else await self.controllers()
        if controllers is not None:
            return await self._create_by_controller(controllers, header, cluster, broker_name)
        masters = await self._masters(cluster, broker_name)
        for address in masters.values():
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=to_ext_fields(header)
                ),
            )
        wanted = dict.fromkeys(masters, queues)
        unreachable: list[FerryError] = []
        for namesrv in self._namesrvs:
            try:
                await self._await_routed(namesrv, topic, wanted)
            except RpcError as exc:
                unreachable.append(exc)  # it learns the topic from the next registration
        if len(unreachable) == len(self._namesrvs):
            raise unreachable[-1]
        return list(masters.values())

    async def _create_by_controller(
        self,
        controllers: ControllerAdmin,
        header: CreateTopicRequestHeader,
        cluster: str | None,
        broker_name: str | None,
    ) -> list[str]:
        """Controller mode: the controller decides; wait until the live masters' groups route it.

        Groups without a master get the topic when a master returns (not waited for).
        """
        decided = await controllers.update_topic(
            ControllerUpdateTopicRequestHeader(
                topic=header.topic,
                read_queue_nums=header.read_queue_nums,
                write_queue_nums=header.write_queue_nums,
                perm=header.perm,
                order=header.order,
                attributes=header.attributes,
                cluster_name=cluster,
                broker_name=broker_name,
            )
        )
        (record,) = decided.topics
        info = await self.cluster_info()
        masters: dict[str, str] = {}
        for name, queues in sorted(record.placement.items()):
            data = info.broker_addr_table.get(name)
            master = data.broker_addrs.get(0) if data is not None else None
            if master is not None and queues.read_queue_nums == queues.write_queue_nums:
                masters[name] = master
        wanted = {name: record.placement[name].write_queue_nums for name in masters}
        unreachable: list[FerryError] = []
        for namesrv in self._namesrvs if wanted else []:
            try:
                await self._await_routed(namesrv, header.topic, wanted)
            except RpcError as exc:
                unreachable.append(exc)
        if unreachable and len(unreachable) == len(self._namesrvs):
            raise unreachable[-1]
        return list(masters.values())

    async def _await_routed(self, namesrv: str, topic: str, wanted: dict[str, int]) -> None:
        """Poll one NameServer until it routes `topic` with the wanted queue count per group.

        The permission is left out: a read-only broker narrows it in every route.
        """
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
        )
        deadline = clock.mono() + self._timeout
        while True:
            response = await self._rpc.call(namesrv, request, self._timeout)
            if response.code == ResponseCode.SUCCESS:
                routed = {
                    q.broker_name: (q.read_queue_nums, q.write_queue_nums)
                    for q in decode_body(response.body, TopicRouteData).queue_datas
                }
                if all(routed.get(name) == (n, n) for name, n in wanted.items()):
                    return
            elif response.code != ResponseCode.TOPIC_NOT_EXIST:
                raise RemoteError(response.code, response.remark)
            if clock.mono() >= deadline:
                raise FerryError(
                    f"topic {topic!r} was created on {', '.join(sorted(wanted))} but NameServer "
                    f"{namesrv} did not route it within {self._timeout:g} s; retry, or check "
                    "that the brokers reach that NameServer"
                )
            await asyncio.sleep(0.05)

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> None:
        """Delete a topic from the masters of a cluster (or all) and from the NameServers.

        Controller mode: the controller deletes it (every group, or the groups of `cluster`),
        leaving a tombstone so a broker that is down now drops it when it returns; this waits
        (up to the timeout) until the live masters no longer register it.

        Raises:
            RemoteError: NO_PERMISSION when the controller runs with deleteTopicEnable=false.
        """
        controllers = None if is_broker_local_topic(topic) else await self.controllers()
        if controllers is not None:
            await controllers.delete_topic(topic, cluster_name=cluster)
            await self._await_unrouted(topic, cluster)
        else:
            header = to_ext_fields(DeleteTopicRequestHeader(topic=topic))
            for address in (await self._masters(cluster, None)).values():
                await self._broker_call(
                    address,
                    RemotingCommand(
                        code=RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields=dict(header)
                    ),
                )
        names = to_ext_fields(
            DeleteTopicFromNamesrvRequestHeader(topic=topic, cluster_name=cluster)
        )
        for address in self._namesrvs:
            await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields=dict(names)),
                self._timeout,
            )

    async def _await_unrouted(self, topic: str, cluster: str | None) -> None:
        """Wait (up to the timeout) until no NameServer routes `topic` on a live master's group.

        Those masters drop it when the controller's push or their next heartbeat reaches them,
        and register again without it; groups without a master are removed from the routes
        with DELETE_TOPIC_IN_NAMESRV afterwards.
        """
        info = await self.cluster_info()
        groups = {name for name, data in info.broker_addr_table.items() if 0 in data.broker_addrs}
        if cluster is not None:
            groups &= set(info.cluster_addr_table.get(cluster, []))
        deadline = clock.mono() + self._timeout
        for namesrv in self._namesrvs:
            request = RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
                ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
            )
            while clock.mono() < deadline:
                try:
                    response = await self._rpc.call(namesrv, request, self._timeout)
                except RpcError:
                    break
                if response.code != ResponseCode.SUCCESS:
                    break
                routed = decode_body(response.body, TopicRouteData).queue_datas
                if not groups & {queue.broker_name for queue in routed}:
                    break
                await asyncio.sleep(0.05)

    async def topic_placement(self, topic: str) -> TopicPlacementStatus | None:
        """Controller mode: the controller's placement of a topic against what each group holds.

        None in classic mode. Every group with a master is asked (GET_TOPIC_STATS_INFO), so a
        group that still holds a deleted topic shows up as `to drop`.
        """
        controllers = await self.controllers()
        if controllers is None:
            return None
        body = await controllers.topics(topic)
        record = body.topics[0] if body.topics else None
        route = await self.route(topic)
        routed = {q.broker_name: q.write_queue_nums for q in route.queue_datas} if route else {}
        info = await self.cluster_info()
        masters = {
            name: data.broker_addrs[0]
            for name, data in info.broker_addr_table.items()
            if 0 in data.broker_addrs
        }
        held: dict[str, int] = {}
        header = to_ext_fields(GetTopicStatsInfoRequestHeader(topic=topic))
        for name, address in sorted(masters.items()):
            request = RemotingCommand(code=RequestCode.GET_TOPIC_STATS_INFO, ext_fields=header)
            try:
                response = await self._rpc.call(address, request, self._timeout)
            except RpcError:
                continue
            if response.code == ResponseCode.SUCCESS:
                held[name] = len(decode_topic_stats(response.body).offset_table)
        desired: dict[str, int] = {}
        if record is not None:  # a topic with moved queues: the physical queues each group holds
            groups = set(record.placement) | {
                s.broker_name for q in record.queues for s in q.segments
            }
            for name in groups:
                config = record.config_on(name)
                if config is not None:
                    desired[name] = config.write_queue_nums
        names = sorted(desired.keys() | routed.keys() | held.keys())
        return TopicPlacementStatus(
            topic=topic,
            topic_version=body.topic_version,
            record=record,
            deleted_at=body.deleted.get(topic),
            groups=[
                GroupPlacement(
                    broker_name=name,
                    desired=desired.get(name),
                    master=masters.get(name),
                    on_broker=held.get(name),
                    routed=routed.get(name),
                    managed=record is not None or topic in body.deleted,
                )
                for name in names
            ],
        )

    async def _controllers_for_moves(self) -> ControllerAdmin:
        controllers = await self.controllers()
        if controllers is None:
            raise FerryError(
                "moving queues between broker groups needs controller mode (the controller "
                "keeps the queue map); this cluster runs without controllers"
            )
        return controllers

    async def reassign(self, header: ControllerReassignRequestHeader) -> ReassignBody:
        """Start, cancel or clean up moves of queues (CONTROLLER_REASSIGN_QUEUES).

        Raises:
            FerryError: classic mode (no controllers).
            RemoteError: the controller refused; its remark says why.
        """
        return await (await self._controllers_for_moves()).reassign(header)

    async def topic_record(self, topic: str) -> TopicPlacement | None:
        """The controller's record of a topic (None: no such live topic)."""
        body = await (await self._controllers_for_moves()).topics(topic)
        return body.topics[0] if body.topics else None

    async def move_progress(self, moves: list[QueueMoveBody]) -> list[MoveProgress]:
        """Where each move stands now, by the controller's state."""
        controllers = await self._controllers_for_moves()
        records: dict[str, TopicPlacement | None] = {}
        progress: list[MoveProgress] = []
        for move in moves:
            if move.topic not in records:
                body = await controllers.topics(move.topic)
                records[move.topic] = body.topics[0] if body.topics else None
            record = records[move.topic]
            queue = (
                record.queue_map.logical(move.broker_name, move.queue_id)
                if record is not None
                else None
            )
            if queue is None:
                progress.append(MoveProgress(move, "cancelled"))
                continue
            target = (move.to_broker_name, move.to_queue_id)
            if queue.moving is not None and queue.moving.broker_name == move.to_broker_name:
                progress.append(MoveProgress(move, "moving"))
                continue
            ends = [s for s in queue.segments if s.physical == target]
            if ends:
                progress.append(MoveProgress(move, "done", ends[0].start_offset))
                continue
            progress.append(MoveProgress(move, "cancelled"))
        return progress

    async def fence(self, topic: str) -> FenceHolder:
        """A fenced topic's holder and live start, from its master (GET_FENCE).

        Raises:
            FencedTopicError: the topic's route is not one queue on one group.
            RemoteError: the broker refused (not a fenced topic, say).
        """
        data = await self.route(topic)
        if data is None:
            raise FerryError(f"no route for topic {topic!r}")
        route = TopicRoute.from_data(topic, data, clock.mono())
        broker_name = route_queue(route)
        address = route.any_replica(broker_name)
        if address is None:
            raise FerryError(f"broker group {broker_name} has no broker")
        return await fence_holder(self._rpc, address, topic, self._timeout)

    async def update_broker_config(self, broker_addr: str, values: dict[str, str]) -> None:
        """Change hot settings of one running broker (UPDATE_BROKER_CONFIG: `key=value` lines).

        Raises:
            RemoteError: the broker refused (a key that needs a restart, a bad value).
        """
        body = "".join(f"{key}={value}\n" for key, value in values.items()).encode()
        await self._broker_call(
            broker_addr, RemotingCommand(code=RequestCode.UPDATE_BROKER_CONFIG, body=body)
        )

    async def delete_expired_commit_log(self, broker_addr: str) -> int:
        """Run one broker's retention now (DELETE_EXPIRED_COMMITLOG); the segments deleted.

        Expired by `fileReservedTime` as the broker has it now; fenced topics' live tails are
        kept (copied forward first on a master).
        """
        response = await self._broker_call(
            broker_addr, RemotingCommand(code=RequestCode.DELETE_EXPIRED_COMMITLOG)
        )
        return int(response.ext_fields.get("deleted", "0"))

    async def _topic_masters(self, topic: str) -> dict[str, str]:
        route = await self.route(topic)
        if route is None:
            raise FerryError(f"no route for topic {topic!r}")
        return {b.broker_name: b.broker_addrs[0] for b in route.broker_datas if 0 in b.broker_addrs}

    async def topic_status(self, topic: str) -> list[TopicOffsetEntry]:
        """Every queue's min and max offsets and last store time (GET_TOPIC_STATS_INFO)."""
        header = to_ext_fields(GetTopicStatsInfoRequestHeader(topic=topic))
        entries: list[TopicOffsetEntry] = []
        for _, address in sorted((await self._topic_masters(topic)).items()):
            request = RemotingCommand(
                code=RequestCode.GET_TOPIC_STATS_INFO, ext_fields=dict(header)
            )
            response = await self._broker_call(address, request)
            entries += decode_topic_stats(response.body).offset_table
        return entries

    async def consumer_progress(
        self, group: str, topic: str | None = None
    ) -> list[ConsumeStatsEntry]:
        """A group's committed offsets against each queue's end, on every master."""
        return (await self.consume_stats(group, topic)).offset_table

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """`consumer_progress` with the group's consumeTps summed over the masters."""
        validate_group(group)
        header = to_ext_fields(GetConsumeStatsRequestHeader(consumer_group=group, topic=topic))
        info = await self.cluster_info()
        entries: list[ConsumeStatsEntry] = []
        tps = 0.0
        for name in sorted(info.broker_addr_table):
            address = info.broker_addr_table[name].broker_addrs.get(0)
            if address is None:
                continue
            request = RemotingCommand(code=RequestCode.GET_CONSUME_STATS, ext_fields=dict(header))
            response = await self._broker_call(address, request)
            stats = decode_consume_stats(response.body)
            entries += stats.offset_table
            tps += stats.consume_tps
        return ConsumeStats(entries, consume_tps=round(tps, 2))

    async def runtime_info(self, address: str) -> dict[str, str]:
        """A broker's GET_BROKER_RUNTIME_INFO table (RocketMQ's keys, string values)."""
        request = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
        response = await self._broker_call(address, request)
        return decode_body(response.body, KVTable).table

    async def reset_offsets(
        self, group: str, topic: str, *, timestamp_ms: int | None = None, to_latest: bool = False
    ) -> dict[tuple[str, int], int]:
        """Move a group's committed offsets in a topic to the earliest, latest, or a time.

        Consumers running in the group keep their own positions until they restart or lose
        the queue in a rebalance; stop them first for the reset to take effect at once.
        """
        validate_group(group)
        moved: dict[tuple[str, int], int] = {}
        for entry in await self.topic_status(topic):
            address = (await self._topic_masters(topic))[entry.broker_name]
            if timestamp_ms is not None:
                search = SearchOffsetRequestHeader(
                    topic=topic, queue_id=entry.queue_id, timestamp=timestamp_ms
                )
                request = RemotingCommand(
                    code=RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext_fields=to_ext_fields(search)
                )
                offset = int((await self._broker_call(address, request)).ext_fields["offset"])
            else:
                offset = entry.max_offset if to_latest else entry.min_offset
            update = UpdateConsumerOffsetRequestHeader(
                consumer_group=group, topic=topic, queue_id=entry.queue_id, commit_offset=offset
            )
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=to_ext_fields(update)
                ),
            )
            moved[entry.broker_name, entry.queue_id] = offset
        return moved

    async def messages_by_key(
        self, topic: str, key: str, *, max_count: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[Message]:
        """Messages of a topic whose keys (or unique key) include `key`, from every master."""
        header = QueryMessageRequestHeader(
            topic=topic, key=key, max_num=max_count, begin_timestamp=begin_ms, end_timestamp=end_ms
        )
        found: list[Message] = []
        for broker_name, address in sorted((await self._topic_masters(topic)).items()):
            response = await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.QUERY_MESSAGE, ext_fields=to_ext_fields(header)),
                self._timeout,
            )
            if response.code == ResponseCode.SUCCESS:
                found += decode_messages(response.body, broker_name)
            elif response.code != ResponseCode.QUERY_NOT_FOUND:
                raise RemoteError(response.code, response.remark)
        return found

    async def message_by_id(self, offset_msg_id: str) -> Message:
        """The message with an offset message id (it names the broker and the log offset)."""
        store_host, log_offset = decode_offset_msg_id(offset_msg_id)
        address = format_address(*unpack_host(store_host))
        header = to_ext_fields(ViewMessageRequestHeader(offset=log_offset))
        response = await self._broker_call(
            address, RemotingCommand(code=RequestCode.VIEW_MESSAGE_BY_ID, ext_fields=header)
        )
        (message,) = decode_messages(response.body, "")
        return message

    async def consume_directly(
        self, offset_msg_id: str, group: str, client_id: str
    ) -> ConsumeMessageDirectlyResult:
        """Have one client of `group` consume a stored message once more; nothing is committed.

        Mqadmin `queryMsgById -g -d`, the Dashboard's resend: CONSUME_MESSAGE_DIRECTLY to the
        broker the id names, which relays it to the client.
        """
        store_host, _ = decode_offset_msg_id(offset_msg_id)
        address = format_address(*unpack_host(store_host))
        header = ConsumeMessageDirectlyResultRequestHeader(
            consumer_group=validate_group(group), client_id=client_id, msg_id=offset_msg_id
        )
        request = RemotingCommand(
            code=RequestCode.CONSUME_MESSAGE_DIRECTLY, ext_fields=to_ext_fields(header)
        )
        # the broker gives the client its own 5 s: wait for the broker's answer past that
        response = await self._rpc.call(address, request, self._timeout + 5.0)
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, ConsumeMessageDirectlyResult)
