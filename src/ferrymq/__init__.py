"""ferrymq: a highly available, RocketMQ-compatible message queue in Python, and its SDK.

The SDK is asyncio first; `ferrymq.sync` has the same clients as blocking calls. Start with
`docs/sdk.md`. What this package exports:

- `Producer`: send messages (sync, batch, ordered by queue, delayed or at a delivery time);
  `TransactionProducer`: transactional messages with a local transaction and a check listener.
- `PushConsumer`: a consumer group member that calls a listener per message; `PullConsumer`:
  reads queues by offset (ranges, commits); `SimpleConsumer`: POP (receive, ack, change the
  invisible time; `ReceivedMessage`); `AdminClient`: topics, clusters, progress, offsets.
- Values: `Message`, `MessageQueue`, `SendResult`, `PullResult`, `TransactionSendResult` and the
  enums `TransactionState`, `PullStatus`, `MessageModel`, `ConsumeFrom`.
- Errors: every failure is a `FerryError`. A send either surely failed (`SendFailedError`, of
  which `InvalidMessageError` is one) or may have been stored (`SendOutcomeUnknownError`, of
  which `NotCommittedError` is one); never both, never neither.

Servers and local clusters live in `ferrymq.broker`, `ferrymq.namesrv` and `ferrymq.testing`.
"""

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullResult, PullStatus
from ferrymq.client.message import Message, SendResult
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, MessageModel, PushConsumer
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.client.transaction import (
    TransactionProducer,
    TransactionSendResult,
    TransactionState,
)
from ferrymq.errors import (
    ConnectError,
    FerryError,
    InvalidMessageError,
    InvalidNameError,
    MessageTooLargeError,
    NotCommittedError,
    RemoteError,
    RpcError,
    SendFailedError,
    SendOutcomeUnknownError,
    TopicNotFoundError,
)
from ferrymq.model import MessageQueue

__all__ = [
    "AdminClient",
    "ConnectError",
    "ConsumeFrom",
    "FerryError",
    "InvalidMessageError",
    "InvalidNameError",
    "Message",
    "MessageModel",
    "MessageQueue",
    "MessageTooLargeError",
    "NotCommittedError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "ReceivedMessage",
    "RemoteError",
    "RpcError",
    "SendFailedError",
    "SendOutcomeUnknownError",
    "SendResult",
    "SimpleConsumer",
    "TopicNotFoundError",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "__version__",
]

__version__ = "0.1.0"
