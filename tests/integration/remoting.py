"""Raw remoting requests the broker tests send (before the SDK, and to send what it never would)."""

from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import (
    CreateTopicRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, to_ext_fields
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import MessageRecord, decode_record


def command(code: int, header: CommandHeader | None = None, body: bytes = b"") -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields=to_ext_fields(header) if header else {}, body=body)


async def create_topic(client: RpcClient, addr: str, topic: str, queues: int = 4) -> None:
    header = CreateTopicRequestHeader(topic=topic, read_queue_nums=queues, write_queue_nums=queues)
    response = await client.call(addr, command(RequestCode.UPDATE_AND_CREATE_TOPIC, header), 5)
    assert response.code == 0, response.remark


async def send(
    client: RpcClient,
    addr: str,
    topic: str,
    body: bytes,
    queue_id: int = 0,
    properties: dict[str, str] | None = None,
    sys_flag: int = 0,
    reconsume_times: int | None = None,
    producer_group: str = "PG",
) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group=producer_group,
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties=encode_properties(properties or {}).decode(),
        reconsume_times=reconsume_times,
    )
    return await client.call(addr, command(RequestCode.SEND_MESSAGE, header, body), 10)


async def send_batch(client: RpcClient, addr: str, topic: str, body: bytes) -> RemotingCommand:
    """A SEND_BATCH_MESSAGE of `body` (an encoded batch, or whatever a test sends as one)."""
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1,
        flag=0,
        batch=True,
    )
    return await client.call(addr, command(RequestCode.SEND_BATCH_MESSAGE, header, body), 10)


async def pull(
    client: RpcClient,
    addr: str,
    topic: str,
    queue_id: int,
    queue_offset: int,
    *,
    group: str = "G",
    expression: str = "*",
    max_msgs: int = 32,
    suspend_ms: int = 0,
    commit_offset: int = -1,
) -> tuple[RemotingCommand, list[MessageRecord]]:
    sys_flag = 4 | (2 if suspend_ms else 0) | (1 if commit_offset >= 0 else 0)
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        max_msg_nums=max_msgs,
        sys_flag=sys_flag,
        commit_offset=max(commit_offset, 0),
        suspend_timeout_millis=suspend_ms,
        subscription=expression,
    )
    response = await client.call(
        addr, command(RequestCode.PULL_MESSAGE, header), 10 + suspend_ms / 1000
    )
    records = []
    body = response.body
    position = 0
    while position < len(body):
        record = decode_record(body, position)
        records.append(record)
        position += int.from_bytes(body[position : position + 4], "big")
    return response, records
