"""The MessagingService v2 handlers: each RPC relayed to the cluster through ferrymq's SDK.

Owns the per-RPC behaviour of the endpoint and the only state it keeps, which is soft: the Telemetry
sessions of connected clients (to answer their settings and to relay transaction checks to the
producer that sent the half message, else to any producer of the topic), one transaction relay per
topic (a `TransactionProducer` that heartbeats as that topic's producer group, so the brokers send
it their checks) and one consumer per group; those tables are bounded (`proxy/pool.py`: idle expiry
and an LRU cap). A group whose subscription config says `consumeMessageOrderly` (FIFO) is popped
orderly. Routes come from the NameServers and follow failovers as the SDK does; every route names
this endpoint. A consumer's settings and heartbeats are relayed to the masters of its topics as its
own HEART_BEAT (the brokers list it in its group, as a RocketMQ broker with its proxy in local mode
does), and its NotifyClientTermination as UNREGISTER_CLIENT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.client.transaction import TransactionProducer, TransactionState
from ferrymq.errors import FerryError, InvalidMessageError, ProtocolError, RemoteError
from ferrymq.model import MessageQueue, format_address, validate_group, validate_topic
from ferrymq.proxy.auth import GrpcGuard, needs, settings_needs
from ferrymq.proxy.convert import (
    MAX_BODY,
    TX_CLIENT_ID,
    TxHandle,
    error_code,
    fifo_queue,
    fill_message,
    message_properties,
    timestamp_ms,
)
from ferrymq.proxy.metrics import ProxyStats
from ferrymq.proxy.pool import Pool
from ferrymq.proxy.stubs import SERVICE, V2
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from ferrymq.wire.broker import (
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
    UnregisterClientRequestHeader,
)
from ferrymq.wire.codes import LanguageCode, RequestCode, ResponseCode
from ferrymq.wire.fastjson import loads
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.pop import ReceiptHandle, pop_retry_topic
from ferrymq.wire.records import unpack_host

__all__ = ["MessagingService"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

_TX_GROUP_PREFIX: Final = "ferryproxy_tx_"
"""Producer group of a topic's transaction relay (every endpoint uses the same name)."""
_DEFAULT_INVISIBLE_S: Final = 30.0
"""Invisible time of a received message when the request names none."""
_MAX_BATCH: Final = 32
_MAX_POLL_S: Final = 20.0
"""Longest long poll held at the broker for one ReceiveMessage."""
_ACKS_IN_FLIGHT: Final = 64
"""ACK_MESSAGE requests of one AckMessage in flight at once."""
_SESSION_QUEUE: Final = 256
"""Commands waiting for one client's Telemetry stream; more are dropped (the broker asks again)."""
_RELAY_CAP: Final = 256
"""Transaction relays (topics) open at once; each heartbeats and holds its own connections."""
_GROUP_CAP: Final = 1024
"""Consumer groups (and, apart, pull consumer groups) with a client open at once."""
_IDLE_S: Final = 600.0
"""A relay or consumer no call used for this long is closed (a relay named by a connected
producer's settings is kept)."""
_FIFO_TTL_S: Final = 30.0
"""How long a group's FIFO setting is trusted before it is read from the broker again."""


@dataclass(slots=True)
class GroupClients:
    """One consumer group's POP clients (plain and orderly) and whether the group is FIFO."""

    plain: SimpleConsumer
    orderly: SimpleConsumer
    fifo: bool = False
    fifo_read_at: float = float("-inf")


@dataclass(slots=True)
class Session:
    """One client's Telemetry stream: what it said it is, and commands waiting for it."""

    client_id: str
    client_type: int = 0
    topics: set[str] = field(default_factory=set)
    group: str = ""
    filters: list[SubscriptionData] = field(default_factory=list)
    """A consumer's subscriptions, as the brokers' consumer table keeps them."""
    language: LanguageCode = LanguageCode.JAVA
    outbox: asyncio.Queue[Any] = field(default_factory=lambda: asyncio.Queue(_SESSION_QUEUE))


@dataclass(frozen=True, slots=True)
class _Malformed:
    """A request that did not parse as its type (answered BAD_REQUEST, never raised)."""

    reason: str


def _metadata(context: Context, key: str) -> str:
    for item in context.invocation_metadata() or ():
        if item[0] == key:
            value = item[1]
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


class MessagingService:
    """The handlers, one per RPC, and the generic handler grpcio serves them through."""

    def __init__(
        self,
        v2: V2,
        namesrv: str,
        advertised: tuple[str, int],
        guard: GrpcGuard | None = None,
    ) -> None:
        self.v2 = v2
        self.guard = guard
        """ACL 1.0: every call is checked against the client's credentials (None: open)."""
        self.namesrv = namesrv
        self.advertised = advertised
        self.rpc = RpcClient()
        self.producer = Producer(namesrv, "ferryproxy", rpc=self.rpc)
        self.sessions: dict[str, Session] = {}
        self.relays: Pool[TransactionProducer] = Pool(
            "transaction relay",
            self._open_relay,
            TransactionProducer.close,
            cap=_RELAY_CAP,
            idle_s=_IDLE_S,
            pinned=self._producer_connected,
        )
        self.consumers: Pool[GroupClients] = Pool(
            "consumer", self._open_consumer, _close_group, cap=_GROUP_CAP, idle_s=_IDLE_S
        )
        self.pullers: Pool[PullConsumer] = Pool(
            "pull consumer", self._open_puller, PullConsumer.close, cap=_GROUP_CAP, idle_s=_IDLE_S
        )
        self.querier = PullConsumer(namesrv, "ferryproxy_query", rpc=self.rpc)
        self.stats = ProxyStats()
        codes = v2.pool.FindEnumTypeByName("apache.rocketmq.v2.Code")
        self._code_names: dict[int, str] = {v.number: v.name for v in codes.values}

    async def close(self) -> None:
        """Stop the transaction relays and close every connection to the cluster."""
        await self.relays.close()
        await self.consumers.close()
        await self.pullers.close()
        await self.producer.close()
        await self.rpc.close()

    # ------------------------------------------------------------------ plumbing

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """Every served RPC, with its request and response classes."""
        v2 = self.v2

        def parser(request_class: Any) -> Any:
            def parse(data: bytes) -> Any:
                try:
                    return request_class.FromString(data)
                except DecodeError as exc:  # answered BAD_REQUEST by the handler's wrapper
                    return _Malformed(f"not a {request_class.DESCRIPTOR.name}: {exc}")

            return parse

        def unary(name: str, fn: Any) -> Any:
            method = v2.service.methods_by_name[name]
            request_class = getattr(v2, method.input_type.name)
            response_class = getattr(v2, method.output_type.name)

            async def handler(request: Any, context: Context) -> Any:
                started = time.monotonic()
                if isinstance(request, _Malformed):
                    response = response_class()
                    self._status(response, "BAD_REQUEST", request.reason)
                elif (refused := self._refused(name, request, context)) is not None:
                    response = response_class()
                    self._status(response, *refused)
                else:
                    response = await fn(request, context)
                code = self._code_names.get(response.status.code, str(response.status.code))
                self.stats.observe(name, code, time.monotonic() - started)
                return response

            return grpc.unary_unary_rpc_method_handler(
                handler,
                request_deserializer=parser(request_class),
                response_serializer=response_class.SerializeToString,
            )

        def stream(name: str, fn: Any) -> Any:
            method = v2.service.methods_by_name[name]
            request_class = getattr(v2, method.input_type.name)
            response_class = getattr(v2, method.output_type.name)

            async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
                started = time.monotonic()
                if isinstance(request, _Malformed):
                    response = response_class()
                    self._status(response, "BAD_REQUEST", request.reason)
                    self.stats.observe(name, "BAD_REQUEST", time.monotonic() - started)
                    yield response
                    return
                refused = self._refused(name, request, context)
                if refused is not None:
                    response = response_class()
                    self._status(response, *refused)
                    self.stats.observe(name, refused[0], time.monotonic() - started)
                    yield response
                    return
                code = "OK"
                async for response in fn(request, context):
                    if response.HasField("message"):
                        self.stats.messages_received += 1
                    elif response.HasField("status") and response.status.code:
                        code = self._code_names.get(response.status.code, code)
                    yield response
                self.stats.observe(name, code, time.monotonic() - started)

            return grpc.unary_stream_rpc_method_handler(
                handler,
                request_deserializer=parser(request_class),
                response_serializer=response_class.SerializeToString,
            )

        handlers = {
            "QueryRoute": unary("QueryRoute", self.query_route),
            "Heartbeat": unary("Heartbeat", self.heartbeat),
            "SendMessage": unary("SendMessage", self.send_message),
            "QueryAssignment": unary("QueryAssignment", self.query_assignment),
            "EndTransaction": unary("EndTransaction", self.end_transaction),
            "NotifyClientTermination": unary(
                "NotifyClientTermination", self.notify_client_termination
            ),
            "ReceiveMessage": stream("ReceiveMessage", self.receive_message),
            "AckMessage": unary("AckMessage", self.ack_message),
            "ChangeInvisibleDuration": unary(
                "ChangeInvisibleDuration", self.change_invisible_duration
            ),
            "Telemetry": grpc.stream_stream_rpc_method_handler(
                self.telemetry,
                request_deserializer=parser(v2.TelemetryCommand),
                response_serializer=v2.TelemetryCommand.SerializeToString,
            ),
        }
        handlers["ForwardMessageToDeadLetterQueue"] = unary(
            "ForwardMessageToDeadLetterQueue", self.forward_to_dlq
        )
        handlers["UpdateOffset"] = unary("UpdateOffset", self.update_offset)
        handlers["GetOffset"] = unary("GetOffset", self.get_offset)
        handlers["QueryOffset"] = unary("QueryOffset", self.query_offset)
        handlers["PullMessage"] = stream("PullMessage", self.pull_message)
        for name in ("RecallMessage", "SyncLiteSubscription"):
            handlers[name] = unary(name, self._not_implemented(name))
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _refused(
        self, name: str, request: Any, context: Context, settings: Any = None
    ) -> tuple[str, str] | None:
        """(v2 status, message) when ACL refuses the call (or a Telemetry settings command)."""
        if self.guard is None:
            return None
        wanted = needs(name, request) if settings is None else settings_needs(settings)
        refusal = self.guard.check(name, context.invocation_metadata(), context.peer(), wanted)
        return None if refusal is None else (refusal.status, refusal.message)

    def _status(self, out: Any, code: str, message: str = "") -> None:
        out.status.code = self.v2.code(code)
        out.status.message = message

    def _failed(self, response_class: Any, exc: BaseException) -> Any:
        response = response_class()
        self._status(response, error_code(exc), str(exc))
        return response

    def _not_implemented(self, name: str) -> Any:
        method = self.v2.service.methods_by_name[name]
        response_class = getattr(self.v2, method.output_type.name)

        async def handler(request: Any, context: Context) -> Any:
            response = response_class()
            self._status(response, "NOT_IMPLEMENTED", f"{name} is not served by this endpoint yet")
            return response

        return handler

    def _endpoints(self, out: Any) -> None:
        out.scheme = self.v2.enum("AddressScheme", "IPv4")
        address = out.addresses.add()
        address.host, address.port = self.advertised

    # ------------------------------------------------------------------ routes and liveness

    async def query_route(self, request: Any, context: Context) -> Any:
        """The topic's queues as the NameServers list them, every one served here."""
        response = self.v2.QueryRouteResponse()
        try:
            topic = validate_topic(request.topic.name)
            route = await self.producer.routes.get(topic)
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.QueryRouteResponse, exc)
        writable = {(q.broker_name, q.queue_id) for q in route.write_queues}
        readable = {(q.broker_name, q.queue_id) for q in route.read_queues}
        types = [self.v2.enum("MessageType", n) for n in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")]
        for broker_name, queue_id in sorted(writable | readable):
            queue = response.message_queues.add()
            queue.topic.name = topic
            queue.topic.resource_namespace = request.topic.resource_namespace
            queue.id = queue_id
            both = (broker_name, queue_id) in writable and (broker_name, queue_id) in readable
            perm = (
                "READ_WRITE" if both else "WRITE" if (broker_name, queue_id) in writable else "READ"
            )
            queue.permission = self.v2.enum("Permission", perm)
            queue.broker.name = broker_name
            queue.broker.id = 0
            self._endpoints(queue.broker.endpoints)
            queue.accept_message_types.extend(types)
        self._status(response, "OK")
        return response

    async def heartbeat(self, request: Any, context: Context) -> Any:
        """A consumer's heartbeat goes on to the masters of its topics (`_member`)."""
        session = self.sessions.get(_metadata(context, "x-mq-client-id"))
        if session is not None and session.group:
            await self._member(session, RequestCode.HEART_BEAT)
        response = self.v2.HeartbeatResponse()
        self._status(response, "OK")
        return response

    async def notify_client_termination(self, request: Any, context: Context) -> Any:
        """Forget the client at once, as RocketMQ's proxy does (not left to expire).

        Its Telemetry session goes (a producer is asked no more transaction checks) and, a
        consumer, its membership of the group at the masters of its topics (UNREGISTER_CLIENT).
        """
        session = self.sessions.pop(_metadata(context, "x-mq-client-id"), None)
        if session is not None and session.group:
            await self._member(session, RequestCode.UNREGISTER_CLIENT)
        response = self.v2.NotifyClientTerminationResponse()
        self._status(response, "OK")
        return response

    async def _member(self, session: Session, code: RequestCode) -> None:
        """HEART_BEAT or UNREGISTER_CLIENT as the session's consumer, to its topics' masters.

        The brokers then list the client in its group (consumerConnection) as they list a
        remoting consumer; it leaves on UNREGISTER_CLIENT, or by expiry when its heartbeats stop.
        Best effort: a master that cannot be reached is skipped (the next heartbeat tries again).
        """
        simple = session.client_type == self.v2.enum("ClientType", "SIMPLE_CONSUMER")
        if code == RequestCode.HEART_BEAT:
            data = HeartbeatData(
                client_id=session.client_id,
                consumer_data_set=[
                    ConsumerData(
                        group_name=session.group,
                        consume_type="CONSUME_ACTIVELY" if simple else "CONSUME_PASSIVELY",
                        subscription_data_set=session.filters,
                    )
                ],
            )
            command = RemotingCommand(code=code, language=session.language, body=encode_body(data))
        else:
            header = UnregisterClientRequestHeader(
                client_i_d=session.client_id, consumer_group=session.group
            )
            command = RemotingCommand(
                code=code, language=session.language, ext_fields=to_ext_fields(header)
            )
        masters: set[str] = set()
        for topic in sorted(session.topics):
            try:
                route = await self.producer.routes.get(validate_topic(topic))
            except (FerryError, ValueError) as exc:
                log.info("%s of %s: no route of %s: %s", code.name, session.client_id, topic, exc)
                continue
            masters |= {a for n in route.brokers if (a := route.master(n)) is not None}

        async def call(address: str) -> None:
            try:
                answer = await self.rpc.call(address, command, 5.0)
            except FerryError as exc:
                log.info("%s of %s to %s: %s", code.name, session.client_id, address, exc)
                return
            if answer.code != ResponseCode.SUCCESS:
                log.info(
                    "%s of %s refused by %s: %s",
                    code.name,
                    session.client_id,
                    address,
                    answer.remark,
                )

        await asyncio.gather(*(call(a) for a in sorted(masters)))

    async def query_assignment(self, request: Any, context: Context) -> Any:
        """One assignment per broker group holding readable queues of the topic."""
        response = self.v2.QueryAssignmentResponse()
        try:
            topic = validate_topic(request.topic.name)
            route = await self.producer.routes.get(topic)
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.QueryAssignmentResponse, exc)
        for broker_name in sorted({q.broker_name for q in route.read_queues}):
            queue = response.assignments.add().message_queue
            queue.topic.CopyFrom(request.topic)
            queue.id = -1
            queue.permission = self.v2.enum("Permission", "READ_WRITE")
            queue.broker.name = broker_name
            self._endpoints(queue.broker.endpoints)
        self._status(response, "OK")
        return response

    # ------------------------------------------------------------------ telemetry

    async def telemetry(self, requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        """The settings exchange, then commands (transaction checks) pushed to the client."""
        refused = self._refused("Telemetry", None, context)  # who it is, before any session
        if refused is not None:
            answer = self.v2.TelemetryCommand()
            self._status(answer, *refused)
            yield answer
            return
        client_id = _metadata(context, "x-mq-client-id")
        session = Session(client_id, language=_language(_metadata(context, "x-mq-language")))
        if client_id:
            self.sessions[client_id] = session
        done = object()

        async def read() -> None:
            try:
                async for command in requests:
                    if not isinstance(command, _Malformed) and command.HasField("settings"):
                        refused = self._refused("Telemetry", command, context, command.settings)
                        if refused is not None:  # answered, then the stream ends
                            answer = self.v2.TelemetryCommand()
                            self._status(answer, *refused)
                            with contextlib.suppress(asyncio.QueueFull):
                                session.outbox.put_nowait(answer)
                            return
                        await self._settings(session, command.settings)
            except (asyncio.CancelledError, grpc.RpcError):
                pass
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    session.outbox.put_nowait(done)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await session.outbox.get()
                if item is done:
                    return
                yield item
        finally:
            reader.cancel()
            if self.sessions.get(client_id) is session:
                del self.sessions[client_id]

    async def _settings(self, session: Session, settings: Any) -> None:
        session.client_type = int(settings.client_type)
        answer = self.v2.TelemetryCommand()
        answer.settings.CopyFrom(settings)
        reply = answer.settings
        reply.backoff_policy.max_attempts = 3
        reply.backoff_policy.exponential_backoff.initial.FromMilliseconds(10)
        reply.backoff_policy.exponential_backoff.max.FromMilliseconds(1000)
        reply.backoff_policy.exponential_backoff.multiplier = 2.0
        reply.metric.on = False
        if settings.HasField("publishing"):
            session.topics = {t.name for t in settings.publishing.topics}
            reply.publishing.max_body_size = MAX_BODY
            reply.publishing.validate_message_type = False
        if settings.HasField("subscription"):
            session.group = settings.subscription.group.name
            session.topics = {e.topic.name for e in settings.subscription.subscriptions}
            sql = self.v2.enum("FilterType", "SQL")
            session.filters = [
                SubscriptionData(
                    topic=e.topic.name,
                    sub_string=e.expression.expression or "*",
                    expression_type="SQL92" if e.expression.type == sql else "TAG",
                )
                for e in settings.subscription.subscriptions
            ]
            reply.subscription.receive_batch_size = 32
            reply.subscription.long_polling_timeout.FromSeconds(20)
            if session.group and session.topics:
                with contextlib.suppress(FerryError, ValueError):
                    group = validate_group(session.group)
                    async with self.consumers.use(group) as clients:
                        topic = validate_topic(min(session.topics))
                        reply.subscription.fifo = await self._fifo(clients, topic)
        self._status(answer, "OK")
        with contextlib.suppress(asyncio.QueueFull):
            session.outbox.put_nowait(answer)
        if session.group and session.topics:
            await self._member(session, RequestCode.HEART_BEAT)  # listed from the start
        if session.client_type == self.v2.enum("ClientType", "PRODUCER"):
            for topic in sorted(session.topics)[:_RELAY_CAP]:
                with contextlib.suppress(FerryError, ValueError):
                    async with self.relays.use(validate_topic(topic)):
                        pass  # started now, so the brokers' checks find it

    # ------------------------------------------------------------------ sending

    async def send_message(self, request: Any, context: Context) -> Any:
        """Store each message (normal, FIFO, delayed or a transactional half) and say where."""
        response = self.v2.SendMessageResponse()
        failed: BaseException | None = None
        client_id = _metadata(context, "x-mq-client-id")
        for message in request.messages:
            entry = response.entries.add()
            try:
                await self._send_one(message, entry, client_id)
            except (FerryError, ValueError) as exc:
                failed = failed or exc
                entry.status.code = self.v2.code(error_code(exc))
                entry.status.message = str(exc)
                entry.message_id = message.system_properties.message_id
            else:
                entry.status.code = self.v2.code("OK")
                self.stats.messages_sent += 1
        if failed is None:
            self._status(response, "OK")
        elif len(request.messages) == 1:
            self._status(response, error_code(failed), str(failed))
        else:
            self._status(response, "MULTIPLE_RESULTS", str(failed))
        if not request.messages:
            self._status(response, "BAD_REQUEST", "no message")
        return response

    async def _send_one(self, message: Any, entry: Any, client_id: str) -> None:
        topic = validate_topic(message.topic.name)
        body = bytes(message.body)
        if not body:
            raise InvalidMessageError("message body is empty")
        if len(body) > MAX_BODY:
            raise InvalidMessageError(f"message body of {len(body)} bytes exceeds {MAX_BODY}")
        kind = int(message.system_properties.message_type)
        transactional = kind == self.v2.enum("MessageType", "TRANSACTION")
        properties = message_properties(message, transactional=transactional)
        if not properties.get(props.UNIQ_KEY):
            properties[props.UNIQ_KEY] = self.producer.new_msg_id()
        entry.message_id = properties[props.UNIQ_KEY]
        if transactional:

            async def execute(_: Message) -> TransactionState:
                return TransactionState.UNKNOWN  # the client's EndTransaction decides

            tags = properties.pop(props.TAGS, None)
            keys = properties.pop(props.KEYS, None)
            if client_id:  # its checks go back to this client while it is connected here
                properties[TX_CLIENT_ID] = client_id
            async with self.relays.use(topic) as relay:
                sent = (
                    await relay.send_in_transaction(
                        topic, body, execute, tags=tags, keys=keys, properties=properties
                    )
                ).send_result
            _, log_offset = decode_offset_msg_id(sent.offset_msg_id)
            handle = TxHandle(sent.queue.broker_name, log_offset, sent.queue_offset, sent.msg_id)
            entry.transaction_id = handle.encode()
            entry.offset = sent.queue_offset
            return
        queue: MessageQueue | None = None
        group = properties.get(props.SHARDING_KEY)
        if group:
            queues = await self.producer.queues(topic)
            queue = fifo_queue(queues, group) if queues else None
        deliver = properties.pop(props.TIMER_DELIVER_MS, None)
        deliver_at = int(deliver) if deliver is not None else None
        if deliver_at is not None and deliver_at <= time.time() * 1000:
            deliver_at = None  # due already: a normal message
        tags = properties.pop(props.TAGS, None)
        keys = properties.pop(props.KEYS, None)
        result = await self.producer.send(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            queue=queue,
            deliver_at_ms=deliver_at,
        )
        entry.offset = result.queue_offset

    # ------------------------------------------------------------------ transactions

    async def _open_relay(self, topic: str) -> TransactionProducer:
        """A topic's transaction relay, started (it heartbeats until closed)."""
        relay = TransactionProducer(self.namesrv, (_TX_GROUP_PREFIX + topic)[:120], self._check)
        try:
            await relay.start()
        except BaseException:
            await relay.close()
            raise
        return relay

    def _producer_connected(self, topic: str) -> bool:
        """Whether a connected producer named the topic (its relay is kept however idle)."""
        producer = self.v2.enum("ClientType", "PRODUCER")
        return any(s.client_type == producer and topic in s.topics for s in self.sessions.values())

    async def _check(self, message: Message) -> TransactionState:
        """A broker asks about a half message: relay it to a producer of its topic, if any.

        The relay is held meanwhile (a relay closed under a check would cancel it).
        """
        if message.topic not in self.relays:
            return await self._relay_check(message)
        async with self.relays.use(message.topic):
            return await self._relay_check(message)

    def _checked_session(self, message: Message) -> Session | None:
        """Who is asked about a half message (None: nobody).

        The client that sent it (`TX_CLIENT_ID`) if it is connected here as a producer of the
        topic, else any producer of the topic here (the owner may be gone or connected to another
        endpoint).
        """
        producer = self.v2.enum("ClientType", "PRODUCER")
        owner = message.properties.get(TX_CLIENT_ID, "")
        session = self.sessions.get(owner) if owner else None
        if (
            session is not None
            and session.client_type == producer
            and message.topic in session.topics
        ):
            log.debug("check of %s to its owner %s", message.msg_id, owner)
            return session
        sessions = [
            s
            for s in self.sessions.values()
            if s.client_type == producer and message.topic in s.topics
        ]
        if not sessions:
            log.info(
                "no producer of %s connected for the check of %s", message.topic, message.msg_id
            )
            return None
        session = sessions[hash(message.msg_id) % len(sessions)]
        log.debug(
            "check of %s to %s (its owner %r is not a producer of %s here)",
            message.msg_id,
            session.client_id,
            owner,
            message.topic,
        )
        return session

    async def _relay_check(self, message: Message) -> TransactionState:
        session = self._checked_session(message)
        if session is None:
            return TransactionState.UNKNOWN
        broker_name = await self._broker_of(message)
        if broker_name is None:
            return TransactionState.UNKNOWN
        command = self.v2.TelemetryCommand()
        recover = command.recover_orphaned_transaction_command
        handle = TxHandle(broker_name, message.log_offset, message.queue_offset, message.msg_id)
        recover.transaction_id = handle.encode()
        fill_message(
            recover.message,
            topic=message.topic,
            body=message.body,
            properties=message.properties,
            queue_id=max(message.queue_id, 0),
            queue_offset=max(message.queue_offset, 0),
            born_ms=message.born_timestamp_ms,
            store_ms=message.store_timestamp_ms,
            attempt=1,
            message_type=self.v2.enum("MessageType", "TRANSACTION"),
        )
        with contextlib.suppress(asyncio.QueueFull):
            session.outbox.put_nowait(command)
        return TransactionState.UNKNOWN  # the producer answers with EndTransaction

    async def _broker_of(self, message: Message) -> str | None:
        """The broker group a checked half message is stored in (by its store address)."""
        try:
            packed, _ = decode_offset_msg_id(message.offset_msg_id)
            store_host = format_address(*unpack_host(packed))
            route = await self.producer.routes.get(message.topic)
        except (FerryError, ValueError) as exc:
            log.info("check of %s: no route to name its broker: %s", message.msg_id, exc)
            return None
        for name, addresses in route.brokers.items():
            if store_host in addresses.values():
                return name
        if len(route.brokers) == 1:
            return next(iter(route.brokers))
        log.info("check of %s: no broker group at %s", message.msg_id, store_host)
        return None

    async def end_transaction(self, request: Any, context: Context) -> Any:
        """Commit or roll back a half message (END_TRANSACTION to its group's master).

        As RocketMQ's proxy: an empty transaction id is INVALID_TRANSACTION_ID, one that names no
        half message of this cluster INTERNAL_SERVER_ERROR. No resolution (UNSPECIFIED: a check
        callback that answered UNKNOWN) is OK and leaves the half message to later checks.
        """
        response = self.v2.EndTransactionResponse()
        if not request.transaction_id:
            self._status(response, "INVALID_TRANSACTION_ID", "transaction id cannot be empty")
            return response
        try:
            handle = TxHandle.decode(request.transaction_id)
        except ValueError as exc:
            self._status(response, "INTERNAL_SERVER_ERROR", f"cannot find transaction data: {exc}")
            return response
        resolution = int(request.resolution)
        if resolution == self.v2.enum("TransactionResolution", "COMMIT"):
            state = TransactionState.COMMIT
        elif resolution == self.v2.enum("TransactionResolution", "ROLLBACK"):
            state = TransactionState.ROLLBACK
        else:
            log.debug("end of %s left unresolved: it will be checked again", handle.msg_id)
            self._status(response, "OK")
            return response
        try:
            topic = validate_topic(request.topic.name)
            route = await self.producer.routes.get(topic)
            address = route.master(handle.broker_name)
            if address is None:
                route = await self.producer.routes.get(topic, refresh=True)
                address = route.master(handle.broker_name)
            if address is None:
                self._status(response, "HA_NOT_AVAILABLE", f"{handle.broker_name} has no master")
                return response
            header = EndTransactionRequestHeader(
                producer_group=(_TX_GROUP_PREFIX + topic)[:120],
                tran_state_table_offset=handle.queue_offset,
                commit_log_offset=handle.log_offset,
                commit_or_rollback=state.value,
                from_transaction_check=int(request.source)
                == self.v2.enum("TransactionSource", "SOURCE_SERVER_CHECK"),
                msg_id=request.message_id or handle.msg_id,
                transaction_id=handle.msg_id,
            )
            answer = await self.rpc.call(
                address,
                RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=to_ext_fields(header)),
                5.0,
            )
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.EndTransactionResponse, exc)
        if answer.code != ResponseCode.SUCCESS:
            self._status(response, "INTERNAL_SERVER_ERROR", answer.remark or str(answer.code))
            return response
        self._status(response, "OK")
        return response

    # ------------------------------------------------------------------ consuming

    async def _open_consumer(self, group: str) -> GroupClients:
        return GroupClients(
            SimpleConsumer(self.namesrv, group, rpc=self.rpc),
            SimpleConsumer(self.namesrv, group, rpc=self.rpc, fifo=True),
        )

    async def _fifo(self, clients: GroupClients, topic: str) -> bool:
        """Whether the group is FIFO (`consumeMessageOrderly`, read from a master of `topic`).

        Read again after `_FIFO_TTL_S`; when the broker cannot say, the last answer stands.
        """
        now = time.monotonic()
        if now - clients.fifo_read_at < _FIFO_TTL_S:
            return clients.fifo
        header = GetSubscriptionGroupConfigRequestHeader(group=clients.plain.group)
        try:
            route = await self.producer.routes.get(topic)
            masters = [a for n in sorted(route.brokers) if (a := route.master(n)) is not None]
            if not masters:
                return clients.fifo
            answer = await self.rpc.call(
                masters[0],
                RemotingCommand(
                    code=RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, ext_fields=to_ext_fields(header)
                ),
                5.0,
            )
        except FerryError as exc:
            log.info("FIFO setting of %s not read: %s", clients.plain.group, exc)
            return clients.fifo
        if answer.code == ResponseCode.SUCCESS:
            config = loads(answer.body or b"{}")
            clients.fifo = isinstance(config, dict) and config.get("consumeMessageOrderly") is True
        elif answer.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
            clients.fifo = False
        else:
            return clients.fifo
        clients.fifo_read_at = now
        return clients.fifo

    def _v2_message(self, out: Any, received: ReceivedMessage) -> None:
        message = received.message
        kind = (
            "FIFO"
            if props.SHARDING_KEY in message.properties
            else "DELAY"
            if props.TIMER_DELIVER_MS in message.properties
            else "NORMAL"
        )
        fill_message(
            out,
            topic=message.topic,
            body=message.body,
            properties=message.properties,
            queue_id=message.queue_id,
            queue_offset=message.queue_offset,
            born_ms=message.born_timestamp_ms,
            store_ms=message.store_timestamp_ms,
            attempt=received.delivery_attempt,
            message_type=self.v2.enum("MessageType", kind),
            receipt_handle=received.receipt_handle,
        )

    async def receive_message(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """POP from the cluster: the messages, the delivery-timestamp element, then a status."""
        v2 = self.v2
        expression = request.filter_expression
        if expression.type == v2.enum("FilterType", "SQL"):
            response = v2.ReceiveMessageResponse()
            self._status(response, "ILLEGAL_FILTER_EXPRESSION", "SQL92 filters are not served")
            yield response
            return
        invisible = request.invisible_duration.ToMilliseconds() / 1000 or _DEFAULT_INVISIBLE_S
        wait = request.long_polling_timeout.ToMilliseconds() / 1000
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client's deadline
            wait = min(wait, max(remaining - 2.0, 0.0))
        try:
            topic = validate_topic(request.message_queue.topic.name)
            async with self.consumers.use(validate_group(request.group.name)) as clients:
                fifo = await self._fifo(clients, topic)
                received = await (clients.orderly if fifo else clients.plain).receive(
                    topic,
                    max_messages=max(1, min(request.batch_size or 16, _MAX_BATCH)),
                    invisible_duration=invisible,
                    wait=min(wait, _MAX_POLL_S),
                    expression=expression.expression or "*",
                )
        except (FerryError, ValueError) as exc:
            yield self._failed(v2.ReceiveMessageResponse, exc)
            return
        for item in received:
            response = v2.ReceiveMessageResponse()
            self._v2_message(response.message, item)
            yield response
        stamp = v2.ReceiveMessageResponse()
        stamp.delivery_timestamp.GetCurrentTime()  # the 5.x push consumer needs it
        yield stamp
        done = v2.ReceiveMessageResponse()
        self._status(done, "OK" if received else "MESSAGE_NOT_FOUND")
        yield done

    def _handle(self, receipt_handle: str, topic: str) -> ReceivedMessage:
        """A received message as the SDK knows it, from its receipt handle alone."""
        ReceiptHandle.parse(receipt_handle)  # ProtocolError: not one of ours
        return ReceivedMessage(Message(topic, b""), receipt_handle, 0, topic)

    async def ack_message(self, request: Any, context: Context) -> Any:
        """Acknowledge each entry by its receipt handle (ACK_MESSAGE to its group's master).

        The entries' acks go out together, up to `_ACKS_IN_FLIGHT` at once (a batch costs about one
        broker round trip, not one per entry).
        """
        response = self.v2.AckMessageResponse()
        failed: BaseException | None = None
        try:
            group = validate_group(request.group.name)
            topic = validate_topic(request.topic.name)
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.AckMessageResponse, exc)
        window = asyncio.Semaphore(_ACKS_IN_FLIGHT)

        async def ack(consumer: SimpleConsumer, receipt_handle: str) -> BaseException | None:
            async with window:
                try:
                    await consumer.ack(self._handle(receipt_handle, topic))
                except (FerryError, ValueError) as exc:
                    return exc
                return None

        async with self.consumers.use(group) as clients:
            outcomes = await asyncio.gather(
                *(ack(clients.plain, e.receipt_handle) for e in request.entries)
            )
        for entry, outcome in zip(request.entries, outcomes, strict=True):
            result = response.entries.add()
            result.message_id = entry.message_id
            result.receipt_handle = entry.receipt_handle
            if outcome is not None:
                failed = failed or outcome
                result.status.code = self.v2.code(_consume_error(outcome))
                result.status.message = str(outcome)
            else:
                result.status.code = self.v2.code("OK")
        if failed is None:
            self._status(response, "OK")
        elif len(request.entries) == 1:
            self._status(response, _consume_error(failed), str(failed))
        else:
            self._status(response, "MULTIPLE_RESULTS", str(failed))
        return response

    async def change_invisible_duration(self, request: Any, context: Context) -> Any:
        """New invisible time from now, and the new receipt handle."""
        response = self.v2.ChangeInvisibleDurationResponse()
        try:
            received = self._handle(request.receipt_handle, validate_topic(request.topic.name))
            duration = request.invisible_duration.ToMilliseconds() / 1000
            async with self.consumers.use(validate_group(request.group.name)) as clients:
                await clients.plain.change_invisible_duration(received, duration)
        except (FerryError, ValueError) as exc:
            self._status(response, _consume_error(exc), str(exc))
            return response
        response.receipt_handle = received.receipt_handle
        self._status(response, "OK")
        return response

    # ------------------------------------------------------------------ pull consumers

    async def _open_puller(self, group: str) -> PullConsumer:
        return PullConsumer(self.namesrv, group, rpc=self.rpc)

    async def pull_message(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """PULL_MESSAGE: a status, the messages, then the next offset."""
        v2 = self.v2
        if request.filter_expression.type == v2.enum("FilterType", "SQL"):
            response = v2.PullMessageResponse()
            self._status(response, "ILLEGAL_FILTER_EXPRESSION", "SQL92 filters are not served")
            yield response
            return
        wait = min(request.long_polling_timeout.ToMilliseconds() / 1000, _MAX_POLL_S)
        try:
            queue = _queue(request.message_queue)
            async with self.pullers.use(validate_group(request.group.name)) as puller:
                result = await puller.pull(
                    queue,
                    request.offset,
                    max_messages=max(1, min(request.batch_size or 32, _MAX_BATCH)),
                    expression=request.filter_expression.expression or "*",
                    wait=wait,
                )
        except (FerryError, ValueError) as exc:
            yield self._failed(v2.PullMessageResponse, exc)
            return
        status = v2.PullMessageResponse()
        self._status(status, "OK" if result.messages else "MESSAGE_NOT_FOUND")
        yield status
        for message in result.messages:
            response = v2.PullMessageResponse()
            self._v2_message(response.message, ReceivedMessage(message, "", 1, queue.topic))
            yield response
        tail = v2.PullMessageResponse()
        tail.next_offset = result.next_offset
        yield tail

    async def update_offset(self, request: Any, context: Context) -> Any:
        """Commit the group's offset of a queue."""
        response = self.v2.UpdateOffsetResponse()
        try:
            async with self.pullers.use(validate_group(request.group.name)) as puller:
                await puller.commit(_queue(request.message_queue), request.offset)
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.UpdateOffsetResponse, exc)
        self._status(response, "OK")
        return response

    async def get_offset(self, request: Any, context: Context) -> Any:
        """The group's committed offset of a queue (OFFSET_NOT_FOUND: none yet)."""
        response = self.v2.GetOffsetResponse()
        try:
            async with self.pullers.use(validate_group(request.group.name)) as puller:
                offset = await puller.committed(_queue(request.message_queue))
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.GetOffsetResponse, exc)
        if offset is None:
            self._status(response, "OFFSET_NOT_FOUND", "the group committed no offset here")
            return response
        response.offset = offset
        self._status(response, "OK")
        return response

    async def query_offset(self, request: Any, context: Context) -> Any:
        """A queue's first or next offset, or the first stored at or after a time."""
        response = self.v2.QueryOffsetResponse()
        policy = int(request.query_offset_policy)
        try:
            consumer = self.querier
            queue = _queue(request.message_queue)
            if policy == self.v2.enum("QueryOffsetPolicy", "BEGINNING"):
                response.offset = await consumer.min_offset(queue)
            elif policy == self.v2.enum("QueryOffsetPolicy", "END"):
                response.offset = await consumer.max_offset(queue)
            else:
                response.offset = await consumer.offset_for_time(
                    queue, timestamp_ms(request.timestamp)
                )
        except (FerryError, ValueError) as exc:
            return self._failed(self.v2.QueryOffsetResponse, exc)
        self._status(response, "OK")
        return response

    async def forward_to_dlq(self, request: Any, context: Context) -> Any:
        """Move a received message to its group's DLQ, then ack its receipt handle.

        CONSUMER_SEND_MSG_BACK with delay level -1 to its group's master.
        """
        response = self.v2.ForwardMessageToDeadLetterQueueResponse()
        try:
            group = validate_group(request.group.name)
            topic = validate_topic(request.topic.name)
            handle = ReceiptHandle.parse(request.receipt_handle)
            stored = pop_retry_topic(group, topic) if handle.retry else topic
            queue = MessageQueue(stored, handle.broker_name, handle.queue_id)
            async with self.pullers.use(group) as puller:
                found = await puller.pull(queue, handle.queue_offset, max_messages=1)
            message = next(
                (m for m in found.messages if m.queue_offset == handle.queue_offset), None
            )
            if message is None:
                self._status(response, "MESSAGE_NOT_FOUND", "no message at that receipt handle")
                return response
            route = await self.producer.routes.get(stored)
            address = route.master(handle.broker_name)
            if address is None:
                self._status(response, "HA_NOT_AVAILABLE", f"{handle.broker_name} has no master")
                return response
            header = ConsumerSendMsgBackRequestHeader(
                offset=message.log_offset,
                group=group,
                delay_level=-1,
                origin_msg_id=message.msg_id,
                origin_topic=topic,
                max_reconsume_times=request.max_delivery_attempts or None,
            )
            answer = await self.rpc.call(
                address,
                RemotingCommand(
                    code=RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=to_ext_fields(header)
                ),
                5.0,
            )
            if answer.code != ResponseCode.SUCCESS:
                raise RemoteError(answer.code, answer.remark)
            async with self.consumers.use(group) as clients:
                await clients.plain.ack(self._handle(request.receipt_handle, topic))
        except (FerryError, ValueError) as exc:
            self._status(response, _consume_error(exc), str(exc))
            return response
        self._status(response, "OK")
        return response


def _language(name: str) -> LanguageCode:
    """The remoting language of a gRPC client's `x-mq-language` (JAVA when not one)."""
    try:
        return LanguageCode[name.upper()]
    except KeyError:
        return LanguageCode.JAVA


def _queue(message_queue: Any) -> MessageQueue:
    """The real queue a v2 `MessageQueue` names (routes name the real groups and ids)."""
    return MessageQueue(
        validate_topic(message_queue.topic.name), message_queue.broker.name, message_queue.id
    )


async def _close_group(clients: GroupClients) -> None:
    await clients.plain.close()
    await clients.orderly.close()


def _consume_error(exc: BaseException) -> str:
    """The v2 code for a failed ack or change of invisible time."""
    if isinstance(exc, ProtocolError):
        return "INVALID_RECEIPT_HANDLE"
    if isinstance(exc, RemoteError) and exc.code == ResponseCode.NO_MESSAGE:
        return "INVALID_RECEIPT_HANDLE"
    return error_code(exc)
