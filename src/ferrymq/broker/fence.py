"""Fenced topics: the exactly-one-writer rule, as a pure state machine (decide, apply, step).

Issue 18, reference/connect-anchors.md section 5 (Connect's config log is its first user). A
fenced topic has the TopicConfig attribute `ferry.fenced=true` (`+ferry.fenced=true` in RocketMQ
5's attribute syntax), one read and one write queue, on one broker group. Every record of it
carries message properties the broker checks without reading the body:

- `FERRY_FENCE_OP`: `claim`, `snapshot` or `write`;
- `FERRY_FENCE_EPOCH`: a decimal int >= 1;
- `FERRY_FENCE_WRITER`: the writer's id (1..255 characters, no property separator);
- `FERRY_FENCE_URL`: on `claim` and `snapshot`, the writer's advertised URL;
- `FERRY_FENCE_COPY` and `FERRY_FENCE_TAIL`: only on copies the broker makes (rule 7); a
  client's send may set neither.

Writing (the master decides with no await between `decide` and the append; `broker/send.py`):
1. The fence is (epoch, writer, url); (0, "", "") before the first claim.
2. A claim is accepted iff its epoch is the fence's epoch + 1 (a compare-and-set: of racing
   claims for one epoch exactly one wins); the fence becomes the claim's (epoch, writer, url).
3. A snapshot or a write is accepted iff its epoch AND its writer are the fence's. A snapshot
   also sets the fence's url: it carries the whole fence, so nothing before it is needed.
4. Anything else is refused (FENCED, naming the holder) and nothing is stored.

Reading (every reader: the broker's own rebuild, a slave, a Connect worker):
5. A record's logical offset is its `FERRY_FENCE_COPY` value, else its own queue offset. A
   reader applies a record iff its logical offset is greater than the last logical offset it
   applied, and skips the others (copies of records it has already applied).
6. The live tail starts at the latest anchor: an original snapshot, the topic's first record
   (queue offset 0), or the first copy of a whole copy block (the block's last copy names it in
   `FERRY_FENCE_TAIL`; a block cut short by a failover anchors nothing). Queue offset 0 for an
   empty topic. A reader that starts from nothing, or whose next queue offset fell below the
   queue's min offset (its records expired), starts at the live start (GET_FENCE's
   `liveStartOffset`) with the fence (0, "", "") and no logical offset applied, and follows
   rule 5 from there; it reaches the same state as a reader that read every record.
7. Retention (copy-forward, `broker/retention.py`): before a commit-log segment holding any record
   of the live tail is deleted, the master re-appends every record of [live start, end) in one
   go, each with its original properties plus `FERRY_FENCE_COPY` (a copy of a copy keeps the
   first original's logical offset) and, on the last, `FERRY_FENCE_TAIL`; it waits until the
   copies are committed and only then deletes the segment: the live start has moved to the
   block's first copy. No broker, master or slave, deletes a segment holding its committed
   live tail. The writer's snapshots keep the live tail short.

Nothing here does I/O or reads a clock; `broker/fenced.py` feeds it the stored records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ferrymq.wire import properties as props
from ferrymq.wire.bodies import TopicConfig

__all__ = [
    "COPY",
    "EPOCH",
    "FENCED_ATTRIBUTE",
    "MAX_URL_CHARS",
    "MAX_WRITER_CHARS",
    "NO_FENCE",
    "OP",
    "TAIL",
    "URL",
    "WRITER",
    "Fence",
    "FenceLog",
    "FenceOp",
    "FenceRecord",
    "InvalidFenceRecordError",
    "apply",
    "copy_properties",
    "decide",
    "is_fenced",
    "parse_record",
    "rebuild",
    "record_properties",
]

FENCED_ATTRIBUTE: Final = "ferry.fenced"
"""The TopicConfig attribute that makes a topic fenced (value `true`)."""
OP: Final = props.FENCE_OP
EPOCH: Final = props.FENCE_EPOCH
WRITER: Final = props.FENCE_WRITER
URL: Final = props.FENCE_URL
COPY: Final = props.FENCE_COPY
TAIL: Final = props.FENCE_TAIL
MAX_WRITER_CHARS: Final = props.FENCE_MAX_WRITER_CHARS
MAX_URL_CHARS: Final = props.FENCE_MAX_URL_CHARS
_MAX_EPOCH: Final = 2**63 - 1


class FenceOp(StrEnum):
    """What a fenced record does."""

    CLAIM = "claim"
    SNAPSHOT = "snapshot"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class Fence:
    """The current holder of a fenced topic: its epoch, writer id and advertised URL."""

    epoch: int = 0
    writer: str = ""
    url: str = ""


NO_FENCE: Final = Fence()


class InvalidFenceRecordError(ValueError):
    """A record's fence properties are missing or malformed (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class FenceRecord:
    """The fence properties of one record."""

    op: FenceOp
    epoch: int
    writer: str
    url: str | None = None
    copy_of: int | None = None
    """The original's logical offset, on a copy the broker made (rule 7)."""
    tail_start: int | None = None
    """On the last copy of a copy block: the queue offset of the block's first copy."""

    def logical_offset(self, queue_offset: int) -> int:
        """Rule 5: the copied original's logical offset, else the record's own queue offset."""
        return queue_offset if self.copy_of is None else self.copy_of

    def anchor(self, queue_offset: int) -> int | None:
        """Rule 6: where the live tail starts if this record (at `queue_offset`) is its anchor."""
        if self.tail_start is not None:
            return self.tail_start
        if self.copy_of is None and (self.op is FenceOp.SNAPSHOT or queue_offset == 0):
            return queue_offset
        return None


def is_fenced(config: TopicConfig) -> bool:
    """Whether a topic's config makes it fenced."""
    return config.attributes.get(FENCED_ATTRIBUTE) == "true"


def _decimal(name: str, text: str, low: int) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise InvalidFenceRecordError(f"{name}={text!r} is not a decimal number")
    value = int(text)
    if not low <= value <= _MAX_EPOCH:
        raise InvalidFenceRecordError(f"{name}={text} must be >= {low}")
    return value


def parse_record(properties: Mapping[str, str], *, copy_allowed: bool = True) -> FenceRecord:
    """The fence properties of a record.

    With `copy_allowed=False` (a client's send) `FERRY_FENCE_COPY` and `FERRY_FENCE_TAIL` are
    refused: only the broker makes copies.

    Raises:
        InvalidFenceRecordError: a property is missing or malformed.
    """
    op_text = properties.get(OP)
    if op_text is None:
        raise InvalidFenceRecordError(
            f"a fenced topic takes only records carrying {OP}, {EPOCH} and {WRITER}"
        )
    try:
        op = FenceOp(op_text)
    except ValueError:
        raise InvalidFenceRecordError(
            f"{OP}={op_text!r} is not one of claim, snapshot, write"
        ) from None
    epoch_text = properties.get(EPOCH)
    if epoch_text is None:
        raise InvalidFenceRecordError(f"{EPOCH} is missing")
    epoch = _decimal(EPOCH, epoch_text, 1)
    writer = properties.get(WRITER)
    if not writer:
        raise InvalidFenceRecordError(f"{WRITER} is missing or empty")
    if len(writer) > MAX_WRITER_CHARS:
        raise InvalidFenceRecordError(f"{WRITER} is longer than {MAX_WRITER_CHARS} characters")
    url = properties.get(URL)
    if op is not FenceOp.WRITE and not url:
        raise InvalidFenceRecordError(f"a {op.value} must carry {URL}")
    if url is not None and len(url) > MAX_URL_CHARS:
        raise InvalidFenceRecordError(f"{URL} is longer than {MAX_URL_CHARS} characters")
    copy_text = properties.get(COPY)
    tail_text = properties.get(TAIL)
    if not copy_allowed and (copy_text is not None or tail_text is not None):
        raise InvalidFenceRecordError(f"{COPY} and {TAIL} are set by the broker only")
    copy_of = None if copy_text is None else _decimal(COPY, copy_text, 0)
    tail_start = None if tail_text is None else _decimal(TAIL, tail_text, 0)
    if tail_start is not None and copy_of is None:
        raise InvalidFenceRecordError(f"{TAIL} is set on copies only")
    return FenceRecord(op, epoch, writer, url, copy_of, tail_start)


def record_properties(
    op: FenceOp, epoch: int, writer: str, url: str | None = None
) -> dict[str, str]:
    """The properties a writer sends (without checks: the broker decides)."""
    properties = {OP: op.value, EPOCH: str(epoch), WRITER: writer}
    if url is not None:
        properties[URL] = url
    return properties


def copy_properties(
    properties: Mapping[str, str], queue_offset: int, tail_start: int | None = None
) -> dict[str, str]:
    """A copy's properties (rule 7).

    The original's (stored at `queue_offset`) with `FERRY_FENCE_COPY` set once, and
    `FERRY_FENCE_TAIL` only when given (the last copy of a block names the block's first).
    """
    copied = {k: v for k, v in properties.items() if k != TAIL}
    copied.setdefault(COPY, str(queue_offset))
    if tail_start is not None:
        copied[TAIL] = str(tail_start)
    return copied


def decide(fence: Fence, record: FenceRecord) -> str | None:
    """Why the master must refuse `record` under `fence` (rules 2-4); None: accept it."""
    if record.op is FenceOp.CLAIM:
        if record.epoch == fence.epoch + 1:
            return None
        return (
            f"claim of epoch {record.epoch} refused: the current epoch is {fence.epoch}, "
            f"a claim must name {fence.epoch + 1}"
        )
    if fence.epoch >= 1 and record.epoch == fence.epoch and record.writer == fence.writer:
        return None
    return (
        f"{record.op.value} by {record.writer!r} at epoch {record.epoch} refused: epoch "
        f"{fence.epoch} is held by {fence.writer!r}"
    )


def apply(fence: Fence, record: FenceRecord) -> Fence:
    """The fence after an accepted record."""
    if record.op is FenceOp.WRITE:
        return fence
    return Fence(record.epoch, record.writer, record.url or "")


@dataclass(frozen=True, slots=True)
class FenceLog:
    """What a reader of a fenced topic keeps: the fence, its progress and the live start."""

    fence: Fence = NO_FENCE
    last_logical_offset: int = -1
    live_start_queue_offset: int = 0

    def step(self, queue_offset: int, record: FenceRecord) -> FenceLog:
        """Read the stored record at `queue_offset` (rules 5 and 6)."""
        anchor = record.anchor(queue_offset)
        live_start = self.live_start_queue_offset if anchor is None else anchor
        logical = record.logical_offset(queue_offset)
        if logical <= self.last_logical_offset:
            if live_start == self.live_start_queue_offset:
                return self
            return FenceLog(self.fence, self.last_logical_offset, live_start)
        return FenceLog(apply(self.fence, record), logical, live_start)


def rebuild(records: Sequence[tuple[int, FenceRecord]]) -> FenceLog:
    """The reader state of a topic's stored records, read from scratch (rule 6, then rule 5).

    `records` are (queue offset, record) in queue order; a prefix may have expired. With no
    anchor left (retention cut the log without copy-forward), every record is read, from the
    first.
    """
    if not records:
        return FenceLog()
    first = records[0][0]
    live_start = first
    for queue_offset, record in reversed(records):
        anchor = record.anchor(queue_offset)
        if anchor is not None:
            live_start = max(anchor, first)
            break
    log = FenceLog(live_start_queue_offset=live_start)
    for queue_offset, record in records:
        if queue_offset >= live_start:
            log = log.step(queue_offset, record)
    return log
