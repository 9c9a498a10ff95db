"""The ferrymq error tree: every failure a caller can meet has a type here.

Rules:
1. `ProtocolError` means a peer sent bytes that do not decode. The connection that carried them
   is closed; the process keeps running. Every decoder raises it, and nothing else, on bad input.
2. `StoreError` and its children come from the storage engine; they never mean a peer is at fault.
3. Errors carry what a user needs to act on them (the field, the offset, the limit) as attributes,
   and their message states it in one line.
"""

from __future__ import annotations

# Response codes the Raft errors answer with. errors.py is the bottom layer and cannot import
# wire.codes; tests/unit/raft/test_errors.py checks these against ResponseCode.
_CONTROLLER_NOT_LEADER = 2007
_CONTROLLER_JRAFT_INTERNAL_ERROR = 2015

__all__ = [
    "ConnectError",
    "ConnectionClosedError",
    "CorruptRecordError",
    "FencedError",
    "FencedTopicError",
    "FerryError",
    "FrameTooLargeError",
    "HeaderFieldError",
    "InvalidMessageError",
    "InvalidNameError",
    "MessageTooLargeError",
    "NotCommittedError",
    "NotLeaderError",
    "ProposalDroppedError",
    "ProposalOutcomeUnknownError",
    "ProtocolError",
    "RaftTimeoutError",
    "RemoteError",
    "RequestError",
    "RequestTimeoutError",
    "RpcError",
    "SendFailedError",
    "SendOutcomeUnknownError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "TopicNotFoundError",
]


class FerryError(Exception):
    """Base class of every error ferrymq raises on purpose."""


class ProtocolError(FerryError):
    """A peer sent bytes that do not decode: close that connection, keep serving others."""


class FrameTooLargeError(ProtocolError):
    """A remoting frame announced a length above the configured limit."""

    def __init__(self, frame_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"frame of {frame_bytes} bytes exceeds the limit of {limit_bytes} bytes")
        self.frame_bytes = frame_bytes
        self.limit_bytes = limit_bytes


class HeaderFieldError(ProtocolError):
    """A request header field is missing or has a value of the wrong type."""

    def __init__(self, header: str, field: str, reason: str) -> None:
        super().__init__(f"{header}.{field}: {reason}")
        self.header = header
        self.field = field
        self.reason = reason


class InvalidNameError(FerryError, ValueError):
    """A topic or group name breaks RocketMQ's naming rules (charset, length)."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        super().__init__(f"invalid {kind} name {name!r}: {reason}")
        self.kind = kind
        self.name = name
        self.reason = reason


class MessageTooLargeError(FerryError, ValueError):
    """A message body or record exceeds the configured maximum size."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"message of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class StoreError(FerryError):
    """The storage engine could not do what was asked."""


class StoreLockedError(StoreError):
    """Another process holds the store directory's lock file."""


class StoreClosedError(StoreError):
    """The store was used after close()."""


class CorruptRecordError(StoreError):
    """A stored record failed its checks (magic, size or body CRC) and must not be served."""

    def __init__(self, log_offset: int, reason: str) -> None:
        super().__init__(f"corrupt record at log offset {log_offset}: {reason}")
        self.log_offset = log_offset
        self.reason = reason


class RemoteError(FerryError):
    """A server answered with a non-success response code."""

    def __init__(self, code: int, remark: str | None, *, code_name: str | None = None) -> None:
        name = code_name or str(code)
        super().__init__(f"{name}: {remark}" if remark else name)
        self.code = code
        self.remark = remark or ""


class RequestError(FerryError):
    """Raised by a request handler to answer with a specific response code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class RpcError(FerryError):
    """A request could not be completed over the network.

    `request_sent` says whether the request may have reached the server: when True, its effect
    (a send, a commit) is unknown, not absent.
    """

    request_sent: bool = False


class ConnectError(RpcError):
    """No connection to the address could be made; the request was never sent."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot connect to {address}: {reason}")
        self.address = address


class ConnectionClosedError(RpcError):
    """The connection closed while the request was outstanding; its outcome is unknown."""

    request_sent = True

    def __init__(self, address: str, reason: str = "connection closed") -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address


class RequestTimeoutError(RpcError):
    """No response came in time; the request was sent, so its outcome is unknown."""

    request_sent = True

    def __init__(self, address: str, code: int, timeout: float) -> None:
        super().__init__(f"{address}: no response to request code {code} within {timeout:g} s")
        self.address = address
        self.code = code
        self.timeout = timeout


class TopicNotFoundError(FerryError):
    """No NameServer knows a route for the topic."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"no route for topic {topic!r}: create it, or enable auto-creation")
        self.topic = topic


class SendFailedError(FerryError):
    """The message was surely not stored (refused, or never sent); sending again is safe."""


class InvalidMessageError(SendFailedError, ValueError):
    """A message that cannot be sent as given (a bad delivery time, say); it was not stored.

    Raised by the SDK before sending, and for a broker's MESSAGE_ILLEGAL answer.
    """


class FencedError(SendFailedError):
    """A fenced topic refused the record: nothing was stored.

    Carries the topic's current holder as the broker knows it (its epoch, writer id and
    advertised URL) and the broker's reason; a writer that lost its epoch steps down.
    """

    def __init__(self, topic: str, epoch: int, writer: str, url: str, reason: str) -> None:
        holder = f"epoch {epoch} held by {writer!r} ({url})" if writer else "no holder yet"
        super().__init__(f"fenced topic {topic}: {reason}; {holder}")
        self.topic = topic
        self.epoch = epoch
        self.writer = writer
        self.url = url
        self.reason = reason


class FencedTopicError(FerryError, ValueError):
    """A topic used as a fenced topic is not one: its route has several queues or broker groups."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"{topic} is not a fenced topic: {reason}")
        self.topic = topic
        self.reason = reason


class SendOutcomeUnknownError(FerryError):
    """The request left but no answer came: the message may or may not be stored.

    Sending it again may duplicate it; its unique key (`msg_id`) lets consumers deduplicate.
    """

    def __init__(self, message: str, msg_id: str) -> None:
        super().__init__(f"{message} (message {msg_id}: outcome unknown)")
        self.msg_id = msg_id


class NotCommittedError(SendOutcomeUnknownError):
    """The broker stored the message but could not make it durable as asked in time.

    FLUSH_SLAVE_TIMEOUT (its SyncStateSet did not all get it), FLUSH_DISK_TIMEOUT (the fsync
    did not finish) or SLAVE_NOT_AVAILABLE: consumers see it once it is committed, and a
    failover before that may lose it; sending it again may duplicate it.
    """

    def __init__(self, message: str, msg_id: str, status: str) -> None:
        super().__init__(message, msg_id)
        self.status = status


class NotLeaderError(RequestError):
    """This controller is not the Raft leader: ask `leader_addr` (None when no leader is known).

    Answers CONTROLLER_NOT_LEADER (2007), as RocketMQ's controllers do.
    """

    def __init__(
        self, leader_id: str | None, leader_addr: str | None, reason: str = "not the leader"
    ) -> None:
        where = f"leader is {leader_id} at {leader_addr}" if leader_id else "no leader known"
        super().__init__(_CONTROLLER_NOT_LEADER, f"{reason}; {where}")
        self.leader_id = leader_id
        self.leader_addr = leader_addr


class ProposalDroppedError(RequestError):
    """A Raft proposal was surely not applied (refused, or replaced by another leader's entry).

    Proposing it again is safe. Answers CONTROLLER_JRAFT_INTERNAL_ERROR (2015), RocketMQ's code
    for a failure inside the controller's Raft.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(_CONTROLLER_JRAFT_INTERNAL_ERROR, f"proposal dropped: {reason}")


class ProposalOutcomeUnknownError(RequestError):
    """A Raft proposal was appended but its fate is unknown: it may still be applied, or not.

    Raised on a timeout, on shutdown, and when a snapshot replaced the entries it waited for.
    Answers CONTROLLER_JRAFT_INTERNAL_ERROR (2015).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(_CONTROLLER_JRAFT_INTERNAL_ERROR, f"proposal outcome unknown: {reason}")


class RaftTimeoutError(RequestError):
    """A Raft read barrier or leadership transfer did not finish in time; nothing was changed.

    Answers CONTROLLER_JRAFT_INTERNAL_ERROR (2015).
    """

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(_CONTROLLER_JRAFT_INTERNAL_ERROR, f"{what}: not done within {timeout:g} s")
        self.timeout = timeout
