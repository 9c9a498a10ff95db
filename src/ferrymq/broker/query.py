"""Offset and message lookups (RocketMQ `AdminBrokerProcessor`, `QueryMessageProcessor`).

GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME,
QUERY_MESSAGE (by key, within a time range) and VIEW_MESSAGE_BY_ID (by log offset). Message
bodies in answers are stored records, as a pull returns them.
"""

from __future__ import annotations

from ferrymq.broker.state import BrokerState
from ferrymq.errors import CorruptRecordError, RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.wire.broker import (
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
    ViewMessageRequestHeader,
)
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

__all__ = [
    "get_earliest_store_time",
    "get_max_offset",
    "get_min_offset",
    "query_message",
    "search_offset",
    "view_message",
]


async def get_max_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_MAX_OFFSET (30): the queue offset the next message will get."""
    header = from_ext_fields(GetMaxOffsetRequestHeader, request.ext_fields)
    offset = state.store.max_queue_offset(header.topic, header.queue_id)
    return request.make_response(
        ResponseCode.SUCCESS, ext_fields=to_ext_fields(GetMaxOffsetResponseHeader(offset=offset))
    )


async def get_min_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_MIN_OFFSET (31): the first readable queue offset."""
    header = from_ext_fields(GetMinOffsetRequestHeader, request.ext_fields)
    offset = state.store.min_queue_offset(header.topic, header.queue_id)
    return request.make_response(
        ResponseCode.SUCCESS, ext_fields=to_ext_fields(GetMinOffsetResponseHeader(offset=offset))
    )


async def search_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """SEARCH_OFFSET_BY_TIMESTAMP (29): the first queue offset stored at or after a time."""
    header = from_ext_fields(SearchOffsetRequestHeader, request.ext_fields)
    offset = state.store.search_queue_offset(header.topic, header.queue_id, header.timestamp)
    return request.make_response(
        ResponseCode.SUCCESS, ext_fields=to_ext_fields(SearchOffsetResponseHeader(offset=offset))
    )


async def get_earliest_store_time(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_EARLIEST_MSG_STORETIME (32)."""
    header = from_ext_fields(GetEarliestMsgStoretimeRequestHeader, request.ext_fields)
    timestamp = state.store.earliest_store_time(header.topic, header.queue_id)
    if timestamp is None:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"{header.topic}/{header.queue_id} holds no message"
        )
    return request.make_response(
        ResponseCode.SUCCESS,
        ext_fields=to_ext_fields(GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp)),
    )


async def query_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """QUERY_MESSAGE (12): messages whose KEYS or UNIQ_KEY hold a key, within a time range."""
    header = from_ext_fields(QueryMessageRequestHeader, request.ext_fields)
    records = state.store.query_by_key(
        header.topic,
        header.key,
        max_count=max(1, min(header.max_num, 64)),
        begin_ms=header.begin_timestamp,
        end_ms=header.end_timestamp,
    )
    if not records:
        raise RequestError(
            ResponseCode.QUERY_NOT_FOUND, f"no message of {header.topic} has key {header.key}"
        )
    body = b"".join(state.store.read_record(record.log_offset) for record in records)
    index = state.store.index
    answer = QueryMessageResponseHeader(
        index_last_update_timestamp=index.files[-1].end_timestamp_ms if index.files else 0,
        index_last_update_phyoffset=index.end_log_offset,
    )
    return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(answer), body=body)


async def view_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """VIEW_MESSAGE_BY_ID (33): the record at a log offset (decoded from an offset message id)."""
    header = from_ext_fields(ViewMessageRequestHeader, request.ext_fields)
    try:
        body = state.store.read_record(header.offset)
    except CorruptRecordError as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"no message at offset {header.offset}: {exc}"
        ) from None
    return request.make_response(ResponseCode.SUCCESS, body=body)
