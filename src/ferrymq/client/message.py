"""Messages as SDK users see them, and what a send returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.model import MessageQueue
from ferrymq.wire import properties as props
from ferrymq.wire.msgid import offset_msg_id
from ferrymq.wire.records import MessageRecord

__all__ = ["Message", "SendResult"]


@dataclass(slots=True)
class Message:
    """A message: what a producer sends, and (with the stored fields set) what a consumer gets."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = -1
    queue_offset: int = -1
    broker_name: str = ""
    msg_id: str = ""
    """The unique key the producer gave the message (RocketMQ UNIQ_KEY)."""
    offset_msg_id: str = ""
    """The broker's id of the stored record (store host and log offset)."""
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    reconsume_times: int = 0
    log_offset: int = -1
    transaction_id: str = ""
    """A transactional message's transaction id (its unique key)."""

    @property
    def queue(self) -> MessageQueue:
        """The queue the message was stored in."""
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @classmethod
    def from_record(cls, record: MessageRecord, broker_name: str) -> Message:
        """A consumed message from its stored record."""
        properties = {k: v for k, v in record.properties.items() if k != props.PROPERTY_CRC32}
        topic = (
            properties.get(props.RETRY_TOPIC, record.topic)
            if record.topic.startswith("%RETRY%")
            else record.topic
        )
        return cls(
            topic=topic,
            body=record.body,
            tags=properties.get(props.TAGS),
            keys=record.keys,
            properties=properties,
            queue_id=record.queue_id,
            queue_offset=record.queue_offset,
            broker_name=broker_name,
            msg_id=properties.get(props.UNIQ_KEY, ""),
            offset_msg_id=offset_msg_id(record.store_host, record.log_offset),
            born_timestamp_ms=record.born_timestamp_ms,
            store_timestamp_ms=record.store_timestamp_ms,
            reconsume_times=record.reconsume_times,
            log_offset=record.log_offset,
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message was stored."""

    msg_id: str
    """The message's unique key."""
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
