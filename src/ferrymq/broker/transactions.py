"""Transactional messages: half messages, END_TRANSACTION, and back-checks of unresolved ones.

RocketMQ's `TransactionalMessageService` and `EndTransactionProcessor`:
- a PREPARED send is stored in RMQ_SYS_TRANS_HALF_TOPIC (queue 0) with its real topic and queue
  in properties (`send.py`); consumers cannot see it;
- END_TRANSACTION commit stores the message in its real topic (marked COMMIT, with the half
  message's log offset as prepared-transaction offset); commit and rollback both write an "op"
  record to RMQ_SYS_TRANS_OP_HALF_TOPIC whose body is the half message's queue offset;
- every `transactionCheckInterval` the broker walks half messages older than
  `transactionTimeOut` with no op record and asks a producer of their group
  (CHECK_TRANSACTION_STATE, with the half message as body). After `transactionCheckMax` checks a
  half message is given up (rolled back) and logged.

Progress (the first unresolved half message, and how far op records were read) is kept in the
consumer offset table under the group `CID_RMQ_SYS_TRANS`, so a restart resumes there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ferrymq.broker.metadata import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from ferrymq.broker.send import put_messages
from ferrymq.broker.state import BrokerState
from ferrymq.errors import CorruptRecordError, FerryError, RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.wire import properties as props
from ferrymq.wire.broker import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.msgid import offset_msg_id
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK,
    BatchItem,
    MessageRecord,
    decode_record,
)

__all__ = ["SYSTEM_GROUP", "TransactionService", "end_transaction"]

log = logging.getLogger(__name__)

SYSTEM_GROUP: Final = "CID_RMQ_SYS_TRANS"
_OP_TAG: Final = "d"
_SCAN_BATCH: Final = 256


def _op_item(half_queue_offset: int) -> BatchItem:
    return BatchItem.of(str(half_queue_offset).encode(), {props.TAGS: _OP_TAG})


async def end_transaction(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand | None:
    """END_TRANSACTION (37): commit or roll back a half message (usually sent oneway)."""
    header = from_ext_fields(EndTransactionRequestHeader, request.ext_fields)
    state.check_writable()
    decision = header.commit_or_rollback
    if decision == SYSFLAG_TRANSACTION_NOT_TYPE:
        return None  # the producer does not know yet: wait for a back-check
    if decision not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad commitOrRollback {decision}")
    try:
        half = decode_record(state.store.read_record(header.commit_log_offset))
    except CorruptRecordError as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"find prepared transaction message failed: {exc}"
        ) from None
    if half.topic != TRANS_HALF_TOPIC:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "the offset does not hold a half message")
    group = half.properties.get(props.PRODUCER_GROUP)
    if group is not None and group != header.producer_group:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "the producer group is different")
    if decision == SYSFLAG_TRANSACTION_COMMIT:
        await _commit(state, half)
    await put_messages(
        state,
        TRANS_OP_HALF_TOPIC,
        0,
        [_op_item(half.queue_offset)],
        born_host=half.born_host,
        born_timestamp_ms=state.wall_ms(),
    )
    return request.make_response(ResponseCode.SUCCESS)


async def _commit(state: BrokerState, half: MessageRecord) -> None:
    properties = dict(half.properties)
    topic = properties.pop(props.REAL_TOPIC, None)
    queue_text = properties.pop(props.REAL_QUEUE_ID, "0")
    properties.pop(props.PROPERTY_CRC32, None)
    properties.pop(props.TRANSACTION_CHECK_TIMES, None)
    if topic is None:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "the half message has no real topic")
    sys_flag = (half.sys_flag & ~SYSFLAG_TRANSACTION_ROLLBACK) | SYSFLAG_TRANSACTION_COMMIT
    await put_messages(
        state,
        topic,
        int(queue_text) if queue_text.isdigit() else 0,
        [BatchItem(half.body, encode_properties(properties), half.flag)],
        born_host=half.born_host,
        born_timestamp_ms=half.born_timestamp_ms,
        sys_flag=sys_flag,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.log_offset,
    )


class TransactionService:
    """Back-checks half messages that nobody committed or rolled back."""

    def __init__(self, state: BrokerState) -> None:
        self._state = state
        self._checks: dict[int, int] = {}
        self._resolved: set[int] = set()
        self.checks_sent = 0

    async def run(self) -> None:
        """Check unresolved transactions every `transactionCheckInterval`, forever."""
        while True:
            await asyncio.sleep(self._state.config.transaction_check_interval / 1000)
            if self._state.is_master:
                try:
                    await self.check_once()
                except FerryError as exc:
                    log.error("transaction check failed: %s", exc)

    def _read_ops(self) -> None:
        state = self._state
        offsets = state.offsets
        position = offsets.query(TRANS_OP_HALF_TOPIC, SYSTEM_GROUP, 0) or 0
        while True:
            result = state.store.get(TRANS_OP_HALF_TOPIC, 0, position, _SCAN_BATCH)
            if not result.records:
                if result.next_queue_offset > position:
                    position = result.next_queue_offset
                    continue
                break
            for raw in result.records:
                body = decode_record(raw).body
                if body.isdigit():
                    self._resolved.add(int(body))
            position = result.next_queue_offset
        offsets.commit(TRANS_OP_HALF_TOPIC, SYSTEM_GROUP, 0, position)

    async def check_once(self) -> int:
        """One pass: returns how many back-checks were sent."""
        state = self._state
        self._read_ops()
        now_ms = state.wall_ms()
        timeout_ms = state.config.transaction_timeout
        position = state.offsets.query(TRANS_HALF_TOPIC, SYSTEM_GROUP, 0) or 0
        first_unresolved: int | None = None
        sent = 0
        while True:
            result = state.store.get(TRANS_HALF_TOPIC, 0, position, _SCAN_BATCH)
            if not result.records:
                if result.next_queue_offset > position:
                    position = result.next_queue_offset
                    continue
                break
            young = False
            for queue_offset, raw in zip(result.queue_offsets, result.records, strict=True):
                if queue_offset in self._resolved:
                    continue
                half = decode_record(raw)
                if now_ms - half.store_timestamp_ms < timeout_ms:
                    young = True
                    first_unresolved = (
                        queue_offset if first_unresolved is None else first_unresolved
                    )
                    break
                checks = self._checks.get(queue_offset, 0)
                if checks >= state.config.transaction_check_max:
                    log.warning(
                        "transaction %s (%s) unresolved after %d checks: rolled back",
                        half.properties.get(props.UNIQ_KEY),
                        half.properties.get(props.REAL_TOPIC),
                        checks,
                    )
                    self._resolved.add(queue_offset)
                    self._checks.pop(queue_offset, None)
                    continue
                if first_unresolved is None:
                    first_unresolved = queue_offset
                if self._send_check(half, raw):
                    self._checks[queue_offset] = checks + 1
                    sent += 1
            if young:
                break
            position = result.next_queue_offset
        progress = first_unresolved if first_unresolved is not None else position
        state.offsets.commit(TRANS_HALF_TOPIC, SYSTEM_GROUP, 0, progress)
        self._resolved = {o for o in self._resolved if o >= progress}
        self.checks_sent += sent
        return sent

    def _send_check(self, half: MessageRecord, raw: bytes) -> bool:
        group = half.properties.get(props.PRODUCER_GROUP)
        conn = self._state.clients.producer_connection(group) if group else None
        if conn is None:
            return False
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.log_offset,
            msg_id=half.properties.get(props.UNIQ_KEY),
            transaction_id=half.properties.get(props.UNIQ_KEY),
            offset_msg_id=offset_msg_id(half.store_host, half.log_offset),
        )
        request = RemotingCommand(
            code=RequestCode.CHECK_TRANSACTION_STATE, ext_fields=to_ext_fields(header), body=raw
        )
        task = asyncio.get_running_loop().create_task(conn.oneway(request))
        task.add_done_callback(lambda t: t.exception())
        return True
