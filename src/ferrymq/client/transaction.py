"""The transactional producer: half messages, the local transaction, and the broker's back-checks.

RocketMQ's `TransactionMQProducer` and `TransactionListener`:
1. `send_in_transaction` sends a half message (sys flag PREPARED): the broker stores it where no
   consumer sees it. A half send that surely failed raises and runs nothing; one whose outcome is
   unknown raises `SendOutcomeUnknownError` and runs nothing either (if the half was stored, the
   check listener resolves it, so it must answer ROLLBACK for a transaction it never ran).
2. Then the caller's local transaction runs and says COMMIT, ROLLBACK or UNKNOWN (raising counts as
   UNKNOWN, as in RocketMQ), and the producer sends END_TRANSACTION with that decision. A commit
   makes the message visible in its topic; a rollback drops it; UNKNOWN leaves it to a check.
3. The broker asks a producer of the group about half messages left undecided for
   `transactionTimeOut` (CHECK_TRANSACTION_STATE, pushed on the producer's heartbeat connection).
   The producer calls the check listener and answers END_TRANSACTION on that connection. Any
   producer of the group may be asked, so a restarted one answers for its predecessor.

The producer heartbeats (HEART_BEAT with its producer group) to every master the NameServers list,
at start and every `heartbeat_interval`, so the brokers know where to send checks before it has
sent anything; it unregisters on close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.message import Message, SendResult
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.model import MessageQueue, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import HeartbeatData, ProducerData, encode_body
from ferrymq.wire.broker import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    UnregisterClientRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageRecord,
    decode_record,
)

__all__ = [
    "CheckListener",
    "LocalTransaction",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
]

log = logging.getLogger(__name__)

_MAX_CHECKS_IN_FLIGHT: Final = 64
"""Checks answered at once; more wait in the connection's backlog (the broker asks again)."""


class TransactionState(Enum):
    """What a local transaction (or a check of one) decided (RocketMQ `LocalTransactionState`)."""

    COMMIT = SYSFLAG_TRANSACTION_COMMIT
    ROLLBACK = SYSFLAG_TRANSACTION_ROLLBACK
    UNKNOWN = SYSFLAG_TRANSACTION_NOT_TYPE


LocalTransaction = Callable[[Message], Awaitable[TransactionState]]
"""Runs the local transaction of a half message that the broker stored."""

CheckListener = Callable[[Message], Awaitable[TransactionState]]
"""Says what became of the local transaction of an undecided half message."""


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """A half message's send result and what the local transaction decided."""

    send_result: SendResult
    state: TransactionState
    end_sent: bool
    """Whether the broker acknowledged the decision (else a check will ask for it again)."""

    @property
    def msg_id(self) -> str:
        """The message's unique key, which is also its transaction id."""
        return self.send_result.msg_id


class TransactionProducer(Producer):
    """A producer of transactional messages for one producer group; an async context manager."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        check_listener: CheckListener,
        *,
        send_timeout: float = 3.0,
        retries: int = 2,
        heartbeat_interval: float = 10.0,
        check_timeout: float = 10.0,
        client_id: str | None = None,
    ) -> None:
        super().__init__(
            namesrv_addr,
            group,
            send_timeout=send_timeout,
            retries=retries,
            rpc=RpcClient(self._on_push),
        )
        self._owns_rpc = True
        self.check_listener = check_listener
        self.client_id = client_id or f"127.0.0.1@{os.getpid()}#{random.getrandbits(32):08x}"
        self._admin = AdminClient(namesrv_addr, rpc=self._rpc)
        self._heartbeat_interval = heartbeat_interval
        self._check_timeout = check_timeout
        self._brokers: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._checking: set[int] = set()
        self._heartbeats: asyncio.Task[None] | None = None
        self.checks_answered = 0
        """Back-checks answered with COMMIT or ROLLBACK."""

    async def start(self) -> None:
        """Tell every master that this client produces for the group (so checks reach it)."""
        await self.heartbeat()
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def close(self) -> None:
        """Stop answering checks, unregister from the brokers, close connections."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
            self._heartbeats = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        header = to_ext_fields(
            UnregisterClientRequestHeader(client_i_d=self.client_id, producer_group=self.group)
        )
        for address in sorted(self._brokers):
            with contextlib.suppress(FerryError):
                await self._rpc.call(
                    address,
                    RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields=dict(header)),
                    2.0,
                )
        await super().close()

    # ------------------------------------------------------------------ heartbeats

    async def heartbeat(self) -> None:
        """HEART_BEAT to every master the NameServers know, now."""
        try:
            info = await self._admin.cluster_info()
        except FerryError as exc:
            log.warning("no cluster info for the heartbeat of %s: %s", self.group, exc)
        else:
            self._brokers |= {
                address
                for data in info.broker_addr_table.values()
                if (address := data.broker_addrs.get(0)) is not None
            }
        body = encode_body(
            HeartbeatData(client_id=self.client_id, producer_data_set=[ProducerData(self.group)])
        )
        for address in sorted(self._brokers):
            try:
                await self._rpc.call(
                    address, RemotingCommand(code=RequestCode.HEART_BEAT, body=body), 5.0
                )
            except FerryError as exc:
                log.warning("heartbeat to %s failed: %s", address, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_interval)
            await self.heartbeat()

    # ------------------------------------------------------------------ sending

    async def send_in_transaction(
        self,
        topic: str,
        body: bytes,
        execute: LocalTransaction,
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
        queue: MessageQueue | None = None,
    ) -> TransactionSendResult:
        """Send a half message, run `execute` on it, and commit or roll back as it says.

        Raises:
            SendFailedError: the half message was surely not stored; `execute` did not run.
            SendOutcomeUnknownError: the half message may be stored; `execute` did not run.
            TopicNotFoundError: the topic has no route.
        """
        validate_topic(topic)
        message_properties = self._properties(tags, keys, properties, 0)
        message_properties[props.TRANSACTION_PREPARED] = "true"
        message_properties[props.PRODUCER_GROUP] = self.group
        msg_id = message_properties[props.UNIQ_KEY]
        sent = await self._send(
            topic,
            RequestCode.SEND_MESSAGE_V2,
            body,
            encode_properties(message_properties),
            msg_id,
            queue,
            sys_flag=SYSFLAG_TRANSACTION_PREPARED,
        )
        message = Message(
            topic=topic,
            body=body,
            tags=tags,
            keys=props.keys_of(message_properties),
            properties=message_properties,
            queue_id=sent.queue.queue_id,
            broker_name=sent.queue.broker_name,
            msg_id=msg_id,
            transaction_id=sent.transaction_id or msg_id,
        )
        try:
            state = await execute(message)
        except Exception:  # RocketMQ: a failing local transaction is UNKNOW
            log.exception("local transaction of %s failed: left to the check listener", msg_id)
            state = TransactionState.UNKNOWN
        end_sent = await self._end(sent, message, state)
        return TransactionSendResult(sent, state, end_sent)

    async def _end(self, sent: SendResult, message: Message, state: TransactionState) -> bool:
        if state is TransactionState.UNKNOWN:
            return False
        address = self.routes.master_of(sent.queue.broker_name)
        if address is None:
            log.warning("no master of %s to end %s", sent.queue.broker_name, message.msg_id)
            return False
        _, log_offset = decode_offset_msg_id(sent.offset_msg_id)
        header = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=sent.queue_offset,
            commit_log_offset=log_offset,
            commit_or_rollback=state.value,
            from_transaction_check=False,
            msg_id=message.msg_id,
            transaction_id=message.transaction_id,
        )
        request = RemotingCommand(
            code=RequestCode.END_TRANSACTION, ext_fields=to_ext_fields(header)
        )
        try:
            response = await self._rpc.call(address, request, self._send_timeout)
        except FerryError as exc:
            log.warning("END_TRANSACTION of %s failed (a check will ask): %s", message.msg_id, exc)
            return False
        if response.code != ResponseCode.SUCCESS:
            log.warning(
                "END_TRANSACTION of %s refused (a check will ask): %s",
                message.msg_id,
                response.remark,
            )
            return False
        return True

    # ------------------------------------------------------------------ back-checks

    async def _on_push(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if request.code != RequestCode.CHECK_TRANSACTION_STATE:
            return request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark="not served by a producer"
            )
        if len(self._tasks) >= _MAX_CHECKS_IN_FLIGHT:
            return None  # the broker asks again next round
        try:
            header = from_ext_fields(CheckTransactionStateRequestHeader, request.ext_fields)
            record = decode_record(request.body)
        except ProtocolError as exc:
            log.warning("unreadable CHECK_TRANSACTION_STATE from %s: %s", conn.peer, exc)
            return None
        if header.commit_log_offset in self._checking:
            return None
        self._checking.add(header.commit_log_offset)
        task = asyncio.get_running_loop().create_task(self._check(conn, header, record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def _check(
        self,
        conn: Connection,
        header: CheckTransactionStateRequestHeader,
        record: MessageRecord,
    ) -> None:
        try:
            message = Message.from_record(record, "")
            message.topic = record.properties.get(props.REAL_TOPIC, message.topic)
            queue_text = record.properties.get(props.REAL_QUEUE_ID, "")
            message.queue_id = int(queue_text) if queue_text.isdigit() else -1
            message.queue_offset = -1
            message.transaction_id = header.transaction_id or message.msg_id
            try:
                async with asyncio.timeout(self._check_timeout):
                    state = await self.check_listener(message)
            except Exception:  # an unanswered check is asked again later
                log.exception("check listener failed on %s", message.msg_id)
                return
            if state is TransactionState.UNKNOWN:
                return
            end = EndTransactionRequestHeader(
                producer_group=self.group,
                tran_state_table_offset=header.tran_state_table_offset,
                commit_log_offset=header.commit_log_offset,
                commit_or_rollback=state.value,
                from_transaction_check=True,
                msg_id=header.msg_id or message.msg_id,
                transaction_id=message.transaction_id,
            )
            try:
                await conn.oneway(
                    RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields=to_ext_fields(end))
                )
            except FerryError as exc:
                log.warning("could not answer the check of %s: %s", message.msg_id, exc)
                return
            self.checks_answered += 1
        finally:
            self._checking.discard(header.commit_log_offset)
