"""The endpoint's remoting side: a 4.x client sees one NameServer and one broker, the endpoint.

Owns the relay of RocketMQ remoting requests to the cluster's current masters. Routes it answers
name a single broker group, `ferryproxy`, at the endpoint's address, whose queues are the topic's
real queues in a stable order (broker group, then queue id; with one group the ids are the
same); every send, pull and offset request is forwarded with its queue id mapped to the real
group and queue, to that group's master as the NameServers name it now. When a master is gone
(connection refused, or no master in the route) the relay asks the NameServers again every 0.1 s
and forwards to the new master, within the client's patience, so a failover costs a 4.x client
about what it costs ferrymq's SDK instead of its own 30 s route refresh.

With `acl` (the brokers' `plain_acl.yml`), every request is checked as a broker checks it
(`security/aclguard.py`: the 4.x client's ACL 1.0 signature and its perms) before it is relayed
under the endpoint's own credentials; with `users` (ACL 2.0: the controllers' users and ACLs)
`Acl2Guard` checks it as an ACL 2.0 broker does.

Heartbeats go to every master through one upstream connection set per client connection, so
what the brokers push back (transaction checks, consumer-id changes) is relayed to that client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.routing import Routes, TopicRoute
from ferrymq.errors import ConnectError, FerryError, RpcError, TopicNotFoundError
from ferrymq.model import MessageQueue, format_address, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection, EncodedFrame, LaterResponse
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.security.acl2guard import Acl2Guard, AuthSource
from ferrymq.security.aclguard import AclFile, AclGuard
from ferrymq.wire.bodies import (
    BrokerData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    QueueData,
    TopicRouteData,
    decode_body,
    encode_body,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.records import peek_record_size, unpack_host

__all__ = ["PROXY_BROKER", "RemotingRelay", "virtual_queues"]

log = logging.getLogger(__name__)

PROXY_BROKER: Final = "ferryproxy"
"""The one broker group name a remoting client sees."""
_CLUSTER: Final = "ferryproxy"
_FAILOVER_WAIT_S: Final = 2.5
"""How long a request waits for a group's new master (a 4.x send times out after 3 s)."""
_POLL_S: Final = 0.05
_CALL_S: Final = 5.0
_MASTERS_TTL_S: Final = 5.0

_QUEUE_CODES: Final = frozenset(
    {
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.PULL_MESSAGE,
        RequestCode.QUERY_CONSUMER_OFFSET,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        RequestCode.GET_MAX_OFFSET,
        RequestCode.GET_MIN_OFFSET,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        RequestCode.GET_EARLIEST_MSG_STORETIME,
    }
)
"""Requests naming a topic and a queue id: forwarded to that queue's group."""
_SEND_CODES: Final = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)


def virtual_queues(route: TopicRoute) -> list[MessageQueue]:
    """The real queues behind the endpoint's queue ids 0..n-1, in a stable order."""
    real = {(q.broker_name, q.queue_id) for q in [*route.write_queues, *route.read_queues]}
    return [MessageQueue(route.topic, b, q) for b, q in sorted(real)]


@dataclass(frozen=True, slots=True)
class _Fields:
    """Where a request keeps its topic and queue id (SEND_MESSAGE_V2 uses one-letter names)."""

    topic: str
    queue_id: str


_V1: Final = _Fields("topic", "queueId")
_V2: Final = _Fields("b", "e")


class RemotingRelay:
    """The remoting port of an endpoint; use `start`/`close`."""

    def __init__(
        self,
        namesrv: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        acl: AclFile | None = None,
        users: AuthSource | None = None,
        authorization: bool = True,
    ) -> None:
        """`acl`: ACL 1.0; `users`: ACL 2.0 (the controllers' users, `Acl2Guard`)."""
        self.namesrv = namesrv
        self.rpc = RpcClient()
        self.routes = Routes(self.rpc, [a.strip() for a in namesrv.split(";") if a.strip()])
        self.admin = AdminClient(namesrv, rpc=self.rpc)
        router = Router("proxy")
        router.add(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route)
        for code in _QUEUE_CODES:
            router.add(code, self._queue_request)
        router.add(RequestCode.HEART_BEAT, self._heartbeat)
        router.add(RequestCode.UNREGISTER_CLIENT, self._to_every_master)
        router.add(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self._to_any_master)
        router.add(RequestCode.CONSUMER_SEND_MSG_BACK, self._to_any_master)
        router.add(RequestCode.END_TRANSACTION, self._end_transaction)
        router.add(RequestCode.LOCK_BATCH_MQ, self._lock_batch)
        router.add(RequestCode.UNLOCK_BATCH_MQ, self._lock_batch)
        self._router = router
        self.guard = AclGuard(router, acl, "proxy") if acl is not None else None
        self.guard2 = (
            Acl2Guard(router, users, authorization=authorization, server_name="proxy")
            if users is not None and acl is None
            else None
        )
        self._handle = self.guard or self.guard2 or router
        self.server = RpcServer(self._serve, host=host, port=port, on_close=self._closed)
        self.sessions: dict[Connection, RpcClient] = {}
        self._masters: tuple[float, list[str]] = (0.0, [])
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """`host:port` of the remoting port (once started)."""
        return self.server.address

    async def start(self) -> None:
        """Listen (port 0: a free one)."""
        await self.server.start()

    async def close(self) -> None:
        """Stop listening; close every upstream connection."""
        await self.server.close()
        for session in list(self.sessions.values()):
            await session.close()
        self.sessions.clear()
        await self.rpc.close()

    async def _serve(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
        # into a task first: connections start handlers eagerly, outside any task, and the
        # relay's upstream calls need one (asyncio.timeout)
        await asyncio.sleep(0)
        return await self._handle(conn, request)

    # ------------------------------------------------------------------ routes

    async def _route(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic = request.ext_fields.get("topic", "")
        try:
            route = await self.routes.get(validate_topic(topic))
        except TopicNotFoundError:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST, remark=f"no topic route info of {topic}"
            )
        count = len(virtual_queues(route))
        data = TopicRouteData(
            queue_datas=[
                QueueData(
                    broker_name=PROXY_BROKER, read_queue_nums=count, write_queue_nums=count, perm=6
                )
            ],
            broker_datas=[
                BrokerData(
                    cluster=_CLUSTER, broker_name=PROXY_BROKER, broker_addrs={0: self.address}
                )
            ],
        )
        return request.make_response(ResponseCode.SUCCESS, body=encode_body(data))

    # ------------------------------------------------------------------ forwarding

    async def _master(self, topic: str, broker_name: str, deadline: float) -> str | None:
        """The group's master now, waiting (until `deadline`) while the route names none."""
        while True:
            route = await self.routes.get(topic)
            address = route.master(broker_name)
            if address is not None or time.monotonic() >= deadline:
                return address
            self.routes.invalidate(topic)
            await asyncio.sleep(_POLL_S)

    async def _forward(
        self, topic: str, broker_name: str, request: RemotingCommand, timeout: float
    ) -> RemotingCommand:
        """Send `request` to the group's master, waiting out a dead one.

        A request that may have arrived is never sent again: an unknown outcome is the client's
        to retry.
        """
        deadline = time.monotonic() + _FAILOVER_WAIT_S
        waited = False
        while True:
            address = await self._master(topic, broker_name, deadline)
            if address is None:
                raise ConnectError(broker_name, "the broker group has no master")
            try:
                answer = await self.rpc.call(address, request, timeout)
                if waited:
                    log.info(
                        "%s: %s's master is %s now (waited %.2f s)",
                        request.code,
                        broker_name,
                        address,
                        time.monotonic() - (deadline - _FAILOVER_WAIT_S),
                    )
                return answer
            except ConnectError:
                waited = True
                self.routes.mark_failed(broker_name)
                self.routes.invalidate(topic)
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(_POLL_S)
            except RpcError:
                self.routes.invalidate(topic)
                raise

    async def _queue_request(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
        names = _V2 if _V2.topic in request.ext_fields else _V1
        topic = request.ext_fields.get(names.topic, "")
        try:
            virtual = int(request.ext_fields.get(names.queue_id, ""))
            route = await self.routes.get(validate_topic(topic))
        except TopicNotFoundError:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, remark=f"no topic {topic}")
        except ValueError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        queues = virtual_queues(route)
        if not 0 <= virtual < len(queues):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, remark=f"queue {virtual} of {topic} does not exist"
            )
        real = queues[virtual]
        fields = dict(request.ext_fields)
        fields[names.queue_id] = str(real.queue_id)
        timeout = _CALL_S
        if request.code == RequestCode.PULL_MESSAGE:
            with contextlib.suppress(ValueError):
                timeout += int(fields.get("suspendTimeoutMillis", "0")) / 1000
        upstream = RemotingCommand(code=request.code, ext_fields=fields, body=request.body)
        try:
            answer = await self._forward(topic, real.broker_name, upstream, timeout)
        except FerryError as exc:
            code = (
                ResponseCode.SYSTEM_BUSY
                if request.code in _SEND_CODES
                else ResponseCode.SYSTEM_ERROR
            )
            return request.make_response(code, remark=f"proxy: {exc}")
        out = dict(answer.ext_fields)
        if "queueId" in out:
            out["queueId"] = str(virtual)
        body = answer.body
        if request.code == RequestCode.PULL_MESSAGE:
            out["suggestWhichBrokerId"] = "0"
            if body and real.queue_id != virtual:
                body = _with_queue_id(body, virtual)
        return request.make_response(answer.code, remark=answer.remark, ext_fields=out, body=body)

    async def _masters_now(self) -> list[str]:
        at, masters = self._masters
        if time.monotonic() - at < _MASTERS_TTL_S and masters:
            return masters
        info = await self.admin.cluster_info()
        masters = sorted(
            address
            for data in info.broker_addr_table.values()
            if (address := data.broker_addrs.get(0)) is not None
        )
        self._masters = (time.monotonic(), masters)
        return masters

    async def _to_any_master(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        failure = "no master"
        for address in await self._masters_now():
            try:
                answer = await self.rpc.call(
                    address,
                    RemotingCommand(
                        code=request.code, ext_fields=request.ext_fields, body=request.body
                    ),
                    _CALL_S,
                )
            except RpcError as exc:
                failure = str(exc)
                continue
            return request.make_response(
                answer.code, remark=answer.remark, ext_fields=answer.ext_fields, body=answer.body
            )
        self._masters = (0.0, [])
        return request.make_response(ResponseCode.SYSTEM_ERROR, remark=f"proxy: {failure}")

    def _session(self, conn: Connection) -> RpcClient:
        session = self.sessions.get(conn)
        if session is None:

            async def relay(upstream: Connection, pushed: RemotingCommand) -> None:
                # a broker's push (transaction check, consumer ids changed) for this client
                with contextlib.suppress(FerryError):
                    await conn.oneway(
                        RemotingCommand(
                            code=pushed.code, ext_fields=pushed.ext_fields, body=pushed.body
                        )
                    )

            session = RpcClient(relay)
            self.sessions[conn] = session
        return session

    def _closed(self, conn: Connection) -> None:
        session = self.sessions.pop(conn, None)
        if session is not None:
            task = asyncio.get_running_loop().create_task(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _to_every_master(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        session = self._session(conn)
        answered = False
        for address in await self._masters_now():
            try:
                await session.call(
                    address,
                    RemotingCommand(
                        code=request.code, ext_fields=request.ext_fields, body=request.body
                    ),
                    _CALL_S,
                )
                answered = True
            except RpcError as exc:
                log.info("%s to %s failed: %s", request.code, address, exc)
                self._masters = (0.0, [])
        code = ResponseCode.SUCCESS if answered else ResponseCode.SYSTEM_ERROR
        return request.make_response(code)

    async def _heartbeat(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return await self._to_every_master(conn, request)

    async def _lock_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ of orderly consumers, per real group.

        Each group's master locks (unlocks) its queues; the answer names the client's queue ids.
        """
        try:
            body = decode_body(request.body, LockBatchRequestBody)
            route_of = {
                topic: await self.routes.get(validate_topic(topic))
                for topic in {q.topic for q in body.mq_set}
            }
        except (FerryError, ValueError) as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=f"proxy: {exc}")
        locked: list[MessageQueueBody] = []
        deadline = time.monotonic() + _FAILOVER_WAIT_S
        for broker_name, pairs in sorted(_real_queues(route_of, body).items()):
            upstream = LockBatchRequestBody(
                consumer_group=body.consumer_group,
                client_id=body.client_id,
                only_this_broker=True,
                mq_set=[
                    MessageQueueBody(topic=r.topic, broker_name=r.broker_name, queue_id=r.queue_id)
                    for _, r in pairs
                ],
            )
            try:
                address = await self._master(pairs[0][1].topic, broker_name, deadline)
                if address is None:
                    continue
                answer = await self._session(conn).call(
                    address,
                    RemotingCommand(code=request.code, body=encode_body(upstream)),
                    _CALL_S,
                )
            except FerryError as exc:
                log.info("%s on %s failed: %s", request.code, broker_name, exc)
                continue
            if request.code != RequestCode.LOCK_BATCH_MQ or answer.code != ResponseCode.SUCCESS:
                continue
            granted = {
                (q.topic, q.queue_id)
                for q in decode_body(answer.body, LockBatchResponseBody).lock_o_k_m_q_set
            }
            locked += [asked for asked, real in pairs if (real.topic, real.queue_id) in granted]
        if request.code == RequestCode.UNLOCK_BATCH_MQ:
            return request.make_response(ResponseCode.SUCCESS)
        return request.make_response(
            ResponseCode.SUCCESS, body=encode_body(LockBatchResponseBody(lock_o_k_m_q_set=locked))
        )

    async def _end_transaction(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        """To the master holding the half message (by the store host in its offset msg id)."""
        target: str | None = None
        with contextlib.suppress(FerryError, ValueError):
            packed, _ = decode_offset_msg_id(request.ext_fields.get("msgId", ""))
            target = format_address(*unpack_host(packed))
        masters = await self._masters_now()
        address = target if target in masters else masters[0] if masters else None
        if address is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark="proxy: no master")
        upstream = RemotingCommand(code=request.code, ext_fields=request.ext_fields)
        try:
            answer = await self._session(conn).call(address, upstream, _CALL_S)
        except RpcError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=f"proxy: {exc}")
        if request.is_oneway:
            return None
        return request.make_response(answer.code, remark=answer.remark)


def _real_queues(
    route_of: dict[str, TopicRoute], body: LockBatchRequestBody
) -> dict[str, list[tuple[MessageQueueBody, MessageQueue]]]:
    """The client's (virtual) queues of a lock request by the real group holding each."""
    groups: dict[str, list[tuple[MessageQueueBody, MessageQueue]]] = {}
    for asked in body.mq_set:
        route = route_of.get(asked.topic)
        queues = virtual_queues(route) if route is not None else []
        if 0 <= asked.queue_id < len(queues):
            real = queues[asked.queue_id]
            groups.setdefault(real.broker_name, []).append((asked, real))
    return groups


def _with_queue_id(body: bytes, queue_id: int) -> bytes:
    """Pulled records with their queue id field (bytes 12..16 of each) set to `queue_id`."""
    out = bytearray(body)
    position = 0
    while position < len(out):
        size, _ = peek_record_size(out, position)
        out[position + 12 : position + 16] = queue_id.to_bytes(4, "big", signed=True)
        position += size
    return bytes(out)
