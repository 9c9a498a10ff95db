"""Exactly-once sink batches: prepared rows, a replicated winner per batch, one commit per batch.

The Spark sink (`ferrymq.spark.sink`) writes a micro-batch in three steps; this module serves
them (request codes and bodies in `wire/sink.py`):

1. SINK_PREPARE: each Spark task stores its rows as prepared records of the system topic
   `SINK_TOPIC` (one queue), tagged (sink id, batch id, transaction id) and carrying their real
   topic and queue. No consumer sees them.
2. SINK_DECIDE, on the sink's coordinator broker: the driver proposes the batch's winner (the
   transactions of the tasks Spark reported, with their rows per broker); the first proposal
   recorded for (sink id, batch id) wins and every later one gets that first winner back. So a
   batch replayed after a driver crash, whose tasks prepared new transactions, still commits the
   transactions of the first decision (some of whose rows may be visible already).
3. SINK_COMMIT, on every broker holding rows: the winner's rows there become visible (copied into
   their real queues in transaction and log order), once: a batch committed before answers
   `duplicate`; other prepared transactions of the batch are dropped.

Across a failover (a client sends a prepare, decide or commit again to the new master): a row
prepared twice under one transaction counts once (rows are keyed by their unique key), and a
commit first waits until everything the new master's log holds is committed, so it sees a
BEGIN or DONE the old master wrote and does not write the batch a second time.

Every decision is a record of `SINK_TOPIC` (decide-then-apply): handlers validate, append, and
answer once `SinkFollower` has applied the record to the `SinkTable` (it is committed and
visible); slaves and restarts rebuild the same table by reading the topic from its start. A
commit appends BEGIN, the rows and DONE with no await in between; if a crash or failover leaves a
BEGIN without DONE (a prefix of the rows), the next commit of the batch skips rows whose unique
key its topic already holds. Prepared transactions nobody commits within
`sinkPreparedTimeout` are expired (an EXPIRE record). A table entry of a committed batch is
forgotten after 64 newer batches of the same sink; batches at or below a forgotten one count
as committed.

Generations (a fencing token per writer, e.g. a Connect task's owner): a decide may carry the
writer's generation and a fence id (what its generations are recorded under; a Spark stream
numbers its batches under `<fence id>/<query id>`, so one fence id spans every checkpoint the
task ever had). The coordinator keeps, per fence id, the highest generation seen (`SinkOwner`,
never forgotten with old batches, rebuilt from the log like the rest). A decide or a fence
(SINK_FENCE: a new owner records its generation before it starts) below it is refused with
SINK_GENERATION_FENCED and records nothing; the check is made again when the record is applied,
so a zombie's decide appended just before a newer fence is void, in log order, on every replica.
A commit is never refused for its generation: it only finishes a batch already decided, whose
rows are owed (the new owner finishes the same batch: `SinkOwner.pending`, and its source
positions count it as written), so a zombie committing it too is answered `duplicate` or does
the new owner's work.

Source positions: a decide may carry the batch's source positions (topic -> broker -> queue id
-> next offset); the winner's are merged into the fence id's positions, in log order. A new
owner without a checkpoint fences, finishes the pending batches and starts reading there, so
nothing decided is read twice and nothing before it is skipped (connectors/replicator.py).
SINK_QUERY_FENCE reads a fence id's state (generation, positions, pending batches) without
recording anything: what GET /connectors/{c}/offsets shows for a replicator.
Retention deletes old segments of `SINK_TOPIC` like any other's, so the master appends every
owner's whole state again (an OWNER record, applied as a replacement) every quarter of
`fileReservedTime` (at most every 6 hours): a table rebuilt after a restart still knows every
fence id's generation and positions, however long ago its last decide was.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from ferrymq.broker.metadata import SINK_TOPIC
from ferrymq.broker.queuemap import check_send
from ferrymq.broker.send import check_unfenced, put_messages, topic_for_send
from ferrymq.broker.sinkrows import (
    BATCH,
    OWN_PROPERTIES,
    SINK,
    TXN,
    Tags,
    encode_tags,
    places,
    prepared,
    runs,
    split_row,
    uniq_key,
)
from ferrymq.broker.state import BrokerState
from ferrymq.errors import CorruptRecordError, HeaderFieldError, ProtocolError, RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.store.store import GetStatus
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import Perm, decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.properties import encode_properties, is_property_text
from ferrymq.wire.records import (
    BatchItem,
    MessageRecord,
    decode_batch,
    decode_buffers,
    decode_record,
    pack_host,
    record_log_offset,
    record_origin,
)
from ferrymq.wire.sink import (
    Positions,
    SinkBatchHeader,
    SinkCommit,
    SinkCommitResponseHeader,
    SinkFence,
    SinkFenceQueryHeader,
    SinkFenceRequestHeader,
    SinkFenceState,
    SinkPending,
    SinkPrepareRequestHeader,
    SinkWinner,
)

__all__ = [
    "SINK_CODES",
    "SINK_TOPIC",
    "Decide",
    "Fence",
    "Owner",
    "SinkOwner",
    "SinkService",
    "SinkTable",
    "decision_of",
]

log = logging.getLogger(__name__)

"""Prepared rows and decisions of exactly-once sinks (one queue)."""

SINK_CODES: Final = (
    RequestCode.SINK_PREPARE,
    RequestCode.SINK_DECIDE,
    RequestCode.SINK_COMMIT,
    RequestCode.SINK_FENCE,
    RequestCode.SINK_QUERY_FENCE,
)

_OP: Final = "FERRY_SINK_OP"
_KEEP_DONE: Final = 64
_KEEP_RUNS: Final = 16
"""Per fence id, the runs whose last decided batch a new owner finishes."""
_BORN: Final = pack_host("127.0.0.1", 0)
_APPLY_WAIT_S: Final = 10.0
_SNAPSHOT_MAX_S: Final = 6 * 3600.0


# ---------------------------------------------------------------------- records


class Decide(msgspec.Struct, tag="decide", omit_defaults=True):
    """A proposed winner of a batch (the first one applied wins, unless its generation is old)."""

    sink: str
    batch: int
    winner: dict[str, dict[str, int]]
    generation: int | None = None
    fence: str | None = None
    """The fence id (None: the sink id)."""
    positions: Positions | None = None


class Begin(msgspec.Struct, tag="begin"):
    """A commit of a batch starts: its rows follow."""

    sink: str
    batch: int
    transactions: list[str]


class Done(msgspec.Struct, tag="done"):
    """Every row of the batch is visible."""

    sink: str
    batch: int
    rows: int


class Expire(msgspec.Struct, tag="expire"):
    """The batch's prepared rows are dropped uncommitted."""

    sink: str
    batch: int


class Fence(msgspec.Struct, tag="fence", omit_defaults=True):
    """A new owner of a fence id starts with this generation (`SinkFence` says the rest)."""

    fence: str
    generation: int
    change: str | None = None
    start: Positions | None = None
    replace: bool = False


class Owner(msgspec.Struct, tag="owner", omit_defaults=True):
    """A fence id's whole `SinkOwner` state, appended again before retention deletes its records."""

    fence: str
    generation: int
    positions: Positions | None = None
    run: str | None = None
    change: str | None = None
    pending: list[SinkPending] = msgspec.field(default_factory=list)


Op = Decide | Begin | Done | Expire | Fence | Owner
_encode_op = msgspec.json.Encoder().encode
_decode_op = msgspec.json.Decoder(Op).decode


def decision_of(record: MessageRecord) -> Op | None:
    """The decision a `SINK_TOPIC` record holds; None for a prepared row.

    Raises:
        msgspec.ValidationError: the record is marked a decision but its body is not one.
    """
    return _decode_op(record.body) if _OP in record.properties else None


# ---------------------------------------------------------------------- the table (pure)


@dataclass
class BatchState:
    """What this broker knows of one batch of one sink."""

    staged: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """transaction id -> row key (its unique key) -> (log offset, size) of its first prepared
    record, in log order: a prepare sent again (after a failover) adds no second copy."""
    last_staged_ms: int = 0
    winner: dict[str, dict[str, int]] | None = None
    begun: bool = False
    done: bool = False
    rows: int = 0


@dataclass
class SinkOwner:
    """What the coordinator knows of one fence id: its generation, positions and open runs."""

    generation: int = -1
    """The highest generation recorded (-1: none yet)."""
    positions: Positions | None = None
    """Where the source stands after every decided batch (None: nothing recorded)."""
    run: str | None = None
    """The sink id (batch namespace) of the last winning decide."""
    change: str | None = None
    """The last offsets change a fence applied."""
    pending: dict[str, tuple[int, dict[str, dict[str, int]]]] = field(default_factory=dict)
    """Per run (sink id), its last decided batch and winner, oldest first: the one batch of the
    run that may not be committed everywhere (a run decides batch n + 1 only after it committed
    batch n)."""

    def fenced(self, generation: int | None) -> bool:
        """Whether a writer of `generation` is older than the recorded owner."""
        return generation is not None and generation < self.generation

    def snapshot(self, fence: str) -> Owner:
        """This state as an OWNER record of `fence`."""
        state = self.state()
        return Owner(
            fence, state.generation, state.positions, state.run, state.change, state.pending
        )

    def state(self) -> SinkFenceState:
        """SINK_FENCE's answer."""
        return SinkFenceState(
            generation=self.generation,
            positions=_copy(self.positions) if self.positions is not None else None,
            run=self.run,
            change=self.change,
            pending=[SinkPending(run, b, w) for run, (b, w) in self.pending.items()],
        )


def _copy(positions: Positions) -> Positions:
    return {t: {b: dict(q) for b, q in brokers.items()} for t, brokers in positions.items()}


def merge_positions(into: Positions | None, more: Positions) -> Positions:
    """`into` with every queue of `more` set to `more`'s offset (a new dict)."""
    merged = _copy(into) if into is not None else {}
    for topic, brokers in more.items():
        for broker, queues in brokers.items():
            merged.setdefault(topic, {}).setdefault(broker, {}).update(queues)
    return merged


class SinkTable:
    """Batches by (sink id, batch id); changed only by applying `SINK_TOPIC` records in order."""

    def __init__(self) -> None:
        self.batches: dict[tuple[str, int], BatchState] = {}
        self.forgotten_upto: dict[str, int] = {}
        """Per sink, the highest batch id whose entry was forgotten (it counts as committed)."""
        self.owners: dict[str, SinkOwner] = {}
        """Per fence id (only of writers that send a generation, a fence id or positions)."""

    def fenced(self, fence: str, generation: int | None) -> int | None:
        """The recorded generation that fences a writer of `generation` out, else None."""
        owner = self.owners.get(fence)
        return owner.generation if owner is not None and owner.fenced(generation) else None

    def is_done(self, sink: str, batch: int) -> bool:
        """Whether the batch was committed here."""
        state = self.batches.get((sink, batch))
        if state is not None:
            return state.done
        return batch <= self.forgotten_upto.get(sink, -1)

    def stage(
        self, sink: str, batch: int, txn: str, row: str, log_offset: int, size: int, ms: int
    ) -> None:
        """A prepared record was applied (`row`: its unique key; a second copy is ignored)."""
        if self.is_done(sink, batch):
            return
        state = self.batches.setdefault((sink, batch), BatchState())
        state.staged.setdefault(txn, {}).setdefault(row, (log_offset, size))
        state.last_staged_ms = max(state.last_staged_ms, ms)

    def apply(self, op: Op) -> None:
        """Apply one decision record."""
        if isinstance(op, Fence):
            self._fence(op)
            return
        if isinstance(op, Owner):  # the state at this point of the log: a replacement
            self.owners[op.fence] = SinkOwner(
                op.generation,
                _copy(op.positions) if op.positions is not None else None,
                op.run,
                op.change,
                {p.sink_id: (p.batch_id, p.transactions) for p in op.pending},
            )
            return
        key = (op.sink, op.batch)
        if isinstance(op, Decide):
            self._decide(op)
        elif isinstance(op, Begin):
            if not self.is_done(*key):
                self.batches.setdefault(key, BatchState()).begun = True
        elif isinstance(op, Done):
            state = self.batches.setdefault(key, BatchState())
            state.done, state.rows, state.staged = True, op.rows, {}
            self._forget_old(op.sink)
        else:
            expired = self.batches.get(key)
            if expired is not None and not expired.done:
                expired.staged = {}

    def _decide(self, op: Decide) -> None:
        fence = op.fence or op.sink
        owned = op.generation is not None or op.fence is not None or op.positions is not None
        owner = self.owners.setdefault(fence, SinkOwner()) if owned else None
        if owner is not None and op.generation is not None:
            if owner.fenced(op.generation):
                return  # a zombie's decide, appended before a newer generation was recorded
            owner.generation = op.generation
        if op.batch <= self.forgotten_upto.get(op.sink, -1):
            return
        state = self.batches.setdefault((op.sink, op.batch), BatchState())
        if state.winner is not None:
            return
        state.winner = op.winner
        if owner is not None:
            owner.run = op.sink
            if op.positions:
                owner.positions = merge_positions(owner.positions, op.positions)
            owner.pending.pop(op.sink, None)
            owner.pending[op.sink] = (op.batch, op.winner)
            while len(owner.pending) > _KEEP_RUNS:
                del owner.pending[next(iter(owner.pending))]

    def _fence(self, op: Fence) -> None:
        owner = self.owners.setdefault(op.fence, SinkOwner())
        if owner.fenced(op.generation):
            return
        owner.generation = op.generation
        if op.change is not None and op.change != owner.change:
            owner.change = op.change
            start = op.start or {}
            owner.positions = (
                _copy(start) if op.replace else merge_positions(owner.positions, start)
            )
        elif owner.positions is None and op.start is not None:
            owner.positions = _copy(op.start)

    def _forget_old(self, sink: str) -> None:
        done = sorted(b for (s, b), st in self.batches.items() if s == sink and st.done)
        for batch in done[:-_KEEP_DONE]:
            del self.batches[(sink, batch)]
            self.forgotten_upto[sink] = max(self.forgotten_upto.get(sink, -1), batch)

    def expired(self, now_ms: int, timeout_ms: int) -> list[tuple[str, int]]:
        """Batches with prepared rows, no commit begun, untouched for `timeout_ms`."""
        return [
            key
            for key, state in self.batches.items()
            if state.staged
            and not (state.done or state.begun)
            and now_ms - state.last_staged_ms > timeout_ms
        ]


# ---------------------------------------------------------------------- the service


class SinkService:
    """The broker side of exactly-once sinks: the follower of `SINK_TOPIC` and the handlers."""

    def __init__(self, state: BrokerState, *, prepared_timeout_ms: int) -> None:
        self._state = state
        self.table = SinkTable()
        self.applied_queue_offset = 0
        self.prepared_timeout_ms = prepared_timeout_ms
        self._committing: set[tuple[str, int]] = set()

    # -------------------------------------------------------------- follower

    def catch_up(self) -> None:
        """Apply every visible `SINK_TOPIC` record not applied yet (no await: one loop turn)."""
        store = self._state.store
        for _ in range(1_000_000):
            result = store.get(SINK_TOPIC, 0, self.applied_queue_offset, 256, max_bytes=1 << 22)
            if result.status is GetStatus.FOUND:
                self._apply_records(result.queue_offsets, result.records)
            moved = result.next_queue_offset > self.applied_queue_offset
            self.applied_queue_offset = max(self.applied_queue_offset, result.next_queue_offset)
            if result.status is not GetStatus.FOUND and not moved:
                return

    def _apply_records(self, queue_offsets: list[int], records: list[bytes]) -> None:
        """Apply records in order: prepared rows read from C-decoded columns, the rest whole."""
        try:
            columns = decode_buffers(b"".join(records))
        except ProtocolError:  # one is unreadable: apply them one by one, each says why
            for queue_offset, raw in zip(queue_offsets, records, strict=True):
                self._apply_record(queue_offset, raw)
            return
        ends = memoryview(columns.property_ends).cast("i")
        stored_ms = memoryview(columns.store_timestamps_ms).cast("q")
        for i, raw in enumerate(records):
            split = split_row(columns.properties[ends[i] : ends[i + 1]])
            if split is None:
                self._apply_record(queue_offsets[i], raw)
                continue
            own, tags = split
            log_offset = record_log_offset(raw)
            row = uniq_key(own) or f"@{log_offset}"
            self.table.stage(
                tags.sink, tags.batch, tags.txn, row, log_offset, len(raw), stored_ms[i]
            )

    def _apply_record(self, queue_offset: int, raw: bytes) -> None:
        try:
            record = decode_record(raw)
        except ProtocolError as exc:
            log.error("%s offset %d: unreadable record skipped: %s", SINK_TOPIC, queue_offset, exc)
            return
        try:
            op = decision_of(record)
        except msgspec.ValidationError as exc:
            log.error("%s offset %d: unreadable decision: %s", SINK_TOPIC, queue_offset, exc)
            return
        if op is not None:
            self.table.apply(op)
            if isinstance(op, Done):
                self._committing.discard((op.sink, op.batch))
            return
        properties = record.properties
        batch = properties.get(BATCH, "")
        if SINK in properties and TXN in properties and batch.lstrip("-").isdigit():
            self.table.stage(
                properties[SINK],
                int(batch),
                properties[TXN],
                properties.get(props.UNIQ_KEY) or f"@{record.log_offset}",
                record.log_offset,
                len(raw),
                record.store_timestamp_ms,
            )

    def _snapshot_period_s(self) -> float:
        reserved_s = self._state.config.file_reserved_time * 3600
        return max(60.0, min(_SNAPSHOT_MAX_S, reserved_s / 4))

    async def snapshot_owners(self) -> int:
        """Append every fence id's state again (retention must never take the last copy)."""
        owners = sorted(self.table.owners.items())
        for fence, owner in owners:
            await self._append_op(owner.snapshot(fence), wait=False)
        return len(owners)

    async def run(self) -> None:
        """Follow `SINK_TOPIC`; as master expire old prepared batches and snapshot owners."""
        state = self._state
        next_expiry = time.monotonic()
        next_snapshot = time.monotonic() + self._snapshot_period_s()
        period = max(1.0, min(60.0, self.prepared_timeout_ms / 4000))
        while True:
            self.catch_up()
            if state.is_master and time.monotonic() >= next_snapshot:
                next_snapshot = time.monotonic() + self._snapshot_period_s()
                await self.snapshot_owners()
            if state.is_master and time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + period
                for sink, batch in self.table.expired(state.wall_ms(), self.prepared_timeout_ms):
                    log.warning(
                        "sink %s batch %d: prepared rows expired uncommitted after %d ms",
                        sink,
                        batch,
                        self.prepared_timeout_ms,
                    )
                    await self._append_op(Expire(sink, batch), wait=False)
            await state.longpoll.wait(SINK_TOPIC, 0, self.applied_queue_offset, period)

    async def _wait_applied(self, queue_offset: int) -> None:
        deadline = time.monotonic() + _APPLY_WAIT_S
        while True:
            self.catch_up()
            if self.applied_queue_offset > queue_offset:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestError(
                    ResponseCode.SYSTEM_BUSY,
                    f"the decision at {SINK_TOPIC} offset {queue_offset} is not committed yet",
                )
            await self._state.longpoll.wait(
                SINK_TOPIC, 0, self.applied_queue_offset, min(remaining, 1.0)
            )

    async def _wait_log_committed(self) -> None:
        """Wait until every record in the log now is committed (SYSTEM_BUSY after a while)."""
        store = self._state.store
        end = store.max_log_offset
        deadline = time.monotonic() + _APPLY_WAIT_S
        while store.confirm_offset < end:
            if time.monotonic() >= deadline:
                raise RequestError(
                    ResponseCode.SYSTEM_BUSY,
                    f"the log up to {end} is not committed yet (confirm offset "
                    f"{store.confirm_offset}): retry the commit",
                )
            await asyncio.sleep(0.02)

    async def _append_op(self, op: Op, *, wait: bool) -> tuple[int, int]:
        """Append a decision; returns its queue offset and the response code of the append."""
        result, code = await put_messages(
            self._state,
            SINK_TOPIC,
            0,
            [BatchItem.of(_encode_op(op), {_OP: type(op).__name__.lower()})],
            born_host=_BORN,
            born_timestamp_ms=self._state.wall_ms(),
            wait_flush=wait,
        )
        return result.first_queue_offset, code

    # -------------------------------------------------------------- handlers

    async def handle(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """Serve SINK_PREPARE, SINK_DECIDE, SINK_COMMIT, SINK_FENCE or SINK_QUERY_FENCE."""
        self._state.check_writable()  # a query too: only the master's table is up to date
        if request.code == RequestCode.SINK_QUERY_FENCE:
            return self._query_fence(request)
        if request.code == RequestCode.SINK_PREPARE:
            return await self._prepare(conn, request)
        if request.code == RequestCode.SINK_DECIDE:
            return await self._decide(request)
        if request.code == RequestCode.SINK_FENCE:
            return await self._fence(request)
        return await self._commit(request)

    def _check_generation(self, fence: str, generation: int | None, what: str) -> None:
        """Refuse a writer older than the fence id's recorded generation.

        Raises:
            RequestError: SINK_GENERATION_FENCED.
        """
        newer = self.table.fenced(fence, generation)
        if newer is not None:
            raise RequestError(
                ResponseCode.SINK_GENERATION_FENCED,
                f"sink {fence}: {what} of generation {generation} refused: generation {newer} "
                "owns the sink now (this writer is a zombie; stop it)",
            )

    async def _prepare(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        state = self._state
        header = from_ext_fields(SinkPrepareRequestHeader, request.ext_fields)
        topic = header.topic
        if topic.startswith(("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC")):
            raise RequestError(ResponseCode.NO_PERMISSION, f"a sink may not write {topic}")
        config = topic_for_send(state, topic, state.config.default_topic_queue_nums)
        if not config.perm & Perm.WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] is not writable")
        check_unfenced(state, topic)  # its rows carry no fence
        if config.attributes:
            check_send(config, state.config.broker_name, header.queue_id)  # a moved queue
        if not 0 <= header.queue_id < config.write_queue_nums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal: {topic} has "
                f"{config.write_queue_nums} write queues",
            )
        self.catch_up()
        if self.table.is_done(header.sink_id, header.batch_id):
            # a replay of a batch committed here: its winner's rows are visible; drop these
            return request.make_response(
                ResponseCode.SUCCESS, remark="the batch is committed already: rows dropped"
            )
        try:
            items = decode_batch(request.body)
        except ProtocolError as exc:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if not items:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "no rows to prepare")
        for name, value in (("sinkId", header.sink_id), ("transactionId", header.transaction_id)):
            if not is_property_text(value):
                raise HeaderFieldError(
                    "SinkPrepareRequestHeader", name, "holds a property separator"
                )
        tags = encode_tags(
            Tags(header.sink_id, header.batch_id, header.transaction_id, topic, header.queue_id)
        )
        _, code = await put_messages(
            state,
            SINK_TOPIC,
            0,
            [prepared(item, tags) for item in items],
            born_host=state.born_host(conn),
            born_timestamp_ms=state.wall_ms(),
        )
        return request.make_response(code)

    async def _decide(self, request: RemotingCommand) -> RemotingCommand:
        header = from_ext_fields(SinkBatchHeader, request.ext_fields)
        proposal = decode_body(request.body, SinkWinner)
        key = (header.sink_id, header.batch_id)
        fence = header.fence_id or header.sink_id
        what = f"the decide of batch {header.batch_id} ({header.sink_id})"
        self.catch_up()
        self._check_generation(fence, header.generation, what)
        batch = self.table.batches.get(key)
        owner = self.table.owners.get(fence)
        newer = header.generation is not None and (
            owner is None or header.generation > owner.generation
        )
        if batch is None or batch.winner is None or newer:
            # no winner yet, or a newer generation finishing one: its generation is recorded
            if (batch is None or batch.winner is None) and header.batch_id <= (
                self.table.forgotten_upto.get(header.sink_id, -1)
            ):
                raise RequestError(
                    ResponseCode.TRANSACTION_FAILED,
                    f"sink {header.sink_id} batch {header.batch_id} is older than the batches "
                    "this broker remembers (committed long ago)",
                )
            op = Decide(
                header.sink_id,
                header.batch_id,
                proposal.transactions,
                generation=header.generation,
                fence=header.fence_id,
                positions=proposal.positions,
            )
            queue_offset, code = await self._append_op(op, wait=True)
            if code != ResponseCode.SUCCESS:
                return request.make_response(code, remark="the decision is not committed yet")
            await self._wait_applied(queue_offset)
            # a newer generation recorded meanwhile voided this decide (or fences the answer)
            self._check_generation(fence, header.generation, what)
            batch = self.table.batches.get(key)
            if batch is None or batch.winner is None:
                raise RequestError(  # forgotten meanwhile: committed long ago
                    ResponseCode.TRANSACTION_FAILED,
                    f"sink {header.sink_id} batch {header.batch_id} was not decided",
                )
        return request.make_response(
            ResponseCode.SUCCESS, body=encode_body(SinkWinner(batch.winner))
        )

    async def _fence(self, request: RemotingCommand) -> RemotingCommand:
        header = from_ext_fields(SinkFenceRequestHeader, request.ext_fields)
        body = decode_body(request.body, SinkFence) if request.body else SinkFence()
        fence = header.fence_id
        self.catch_up()
        self._check_generation(fence, header.generation, "the fence")
        op = Fence(fence, header.generation, header.change, body.start, body.replace)
        queue_offset, code = await self._append_op(op, wait=True)
        if code != ResponseCode.SUCCESS:
            return request.make_response(code, remark="the fence is not committed yet")
        await self._wait_applied(queue_offset)
        self._check_generation(fence, header.generation, "the fence")
        state = self.table.owners[fence].state()
        return request.make_response(ResponseCode.SUCCESS, body=encode_body(state))

    def _query_fence(self, request: RemotingCommand) -> RemotingCommand:
        """SINK_QUERY_FENCE: the fence id's state as applied so far; nothing is recorded.

        Raises:
            RequestError: SINK_FENCE_NOT_FOUND for a fence id with no record here.
        """
        header = from_ext_fields(SinkFenceQueryHeader, request.ext_fields)
        self.catch_up()
        owner = self.table.owners.get(header.fence_id)
        if owner is None:
            raise RequestError(
                ResponseCode.SINK_FENCE_NOT_FOUND,
                f"sink fence {header.fence_id} has no record at this coordinator (never fenced, "
                "nor named by a decide with a generation or positions)",
            )
        return request.make_response(ResponseCode.SUCCESS, body=encode_body(owner.state()))

    async def _commit(self, request: RemotingCommand) -> RemotingCommand:
        header = from_ext_fields(SinkBatchHeader, request.ext_fields)
        wanted = decode_body(request.body, SinkCommit).transactions
        sink, batch_id = header.sink_id, header.batch_id
        key = (sink, batch_id)
        self.catch_up()
        newer = self.table.fenced(header.fence_id or sink, header.generation)
        if newer is not None:
            # never refused: the batch is decided and its rows are owed (module docstring)
            log.info(
                "sink %s batch %d: a commit of generation %s after generation %d was recorded "
                "(finishing a decided batch)",
                sink,
                batch_id,
                header.generation,
                newer,
            )
        if not self.table.is_done(sink, batch_id):
            # a failover can leave a commit's BEGIN, rows or DONE in this log uncommitted yet:
            # decide on them only once they are committed (else a retried commit writes twice)
            await self._wait_log_committed()
            self.catch_up()
        if self.table.is_done(sink, batch_id):
            done = self.table.batches.get(key)
            fields = SinkCommitResponseHeader(rows=done.rows if done else 0, duplicate=True)
            return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(fields))
        if key in self._committing:
            raise RequestError(
                ResponseCode.SYSTEM_BUSY, f"sink {sink} batch {batch_id}: a commit is under way"
            )
        batch = self.table.batches.get(key, BatchState())
        for txn, rows in sorted(wanted.items()):
            have = len(batch.staged.get(txn, []))
            if have != rows:
                raise RequestError(
                    ResponseCode.TRANSACTION_FAILED,
                    f"sink {sink} batch {batch_id}: transaction {txn} has {have} of its {rows} "
                    f"prepared rows here (expired after {self.prepared_timeout_ms} ms, or lost)",
                )
        self._committing.add(key)
        try:
            queue_offset, code, rows = await self._write_batch(sink, batch_id, wanted, batch)
        except BaseException:
            self._committing.discard(key)
            raise
        if code != ResponseCode.SUCCESS:
            return request.make_response(code, remark="the commit is not durable yet")
        await self._wait_applied(queue_offset)
        fields = SinkCommitResponseHeader(rows=rows)
        return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(fields))

    def stages_into(self, topic: str, queue_id: int) -> bool:
        """Whether a batch not done yet holds prepared rows for the queue (a seal waits)."""
        self.catch_up()
        for batch in list(self.table.batches.values()):
            if batch.done or not batch.staged:
                continue
            for staged in batch.staged.values():
                for row_topic, row_queue, *_ in self._staged_rows(staged):
                    if row_topic == topic and row_queue == queue_id:
                        return True
        return False

    def _staged_rows(
        self, staged: dict[str, tuple[int, int]]
    ) -> Iterator[tuple[str, int, BatchItem, bytes, int]]:
        """(topic, queue id, row, born host, born ms) of a transaction's prepared rows.

        In log order; each run of back-to-back records is read at once and decoded in C.

        Raises:
            RequestError: SYSTEM_ERROR when a prepared row cannot be read back.
        """
        store = self._state.store
        for start, sizes in runs(staged.values()):
            span = store.read_log(start, sum(sizes))
            try:
                if len(span) != sum(sizes):
                    raise ProtocolError("the rows cross a segment's end")
                columns = decode_buffers(span)
            except ProtocolError:  # one by one: the error names the row that is bad
                for log_offset, size in places(start, sizes):
                    yield self._staged_row(log_offset, size)
                continue
            bodies = columns.bodies
            body_ends = memoryview(columns.body_ends).cast("i")
            property_ends = memoryview(columns.property_ends).cast("i")
            born_ms = memoryview(columns.born_timestamps_ms).cast("q")
            for i, (log_offset, size) in enumerate(places(start, sizes)):
                split = split_row(columns.properties[property_ends[i] : property_ends[i + 1]])
                if split is None:
                    yield self._staged_row(log_offset, size)
                    continue
                own, tags = split
                flag, born_host = record_origin(span, log_offset - start)
                item = BatchItem(bodies[body_ends[i] : body_ends[i + 1]], own, flag)
                yield tags.topic, tags.queue_id, item, born_host, born_ms[i]

    def _staged_row(self, log_offset: int, size: int) -> tuple[str, int, BatchItem, bytes, int]:
        """One prepared row read back and decoded whole (any layout)."""
        try:
            record = decode_record(self._state.store.read_record(log_offset, size))
            properties = {k: v for k, v in record.properties.items() if k not in OWN_PROPERTIES}
            topic = record.properties[props.REAL_TOPIC]
            queue_id = int(record.properties[props.REAL_QUEUE_ID])
        except (CorruptRecordError, ProtocolError, KeyError, ValueError) as exc:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"prepared row at {log_offset}: {exc!r}"
            ) from None
        item = BatchItem(record.body, encode_properties(properties), record.flag)
        return topic, queue_id, item, record.born_host, record.born_timestamp_ms

    async def _write_batch(
        self, sink: str, batch_id: int, wanted: dict[str, int], batch: BatchState
    ) -> tuple[int, int, int]:
        """BEGIN, the rows, DONE, with no await until DONE is appended (one loop turn)."""
        state = self._state
        rows: list[tuple[str, int, BatchItem, bytes, int]] = []
        for txn in sorted(wanted):
            staged = batch.staged.get(txn, {})  # none only for a transaction of no rows
            for topic, queue_id, item, born_host, born_ms in self._staged_rows(staged):
                if batch.begun and _stored_already(state, topic, uniq_key(item.properties)):
                    continue  # an earlier commit wrote it before a crash or failover cut it short
                rows.append((topic, queue_id, item, born_host, born_ms))
        for topic in sorted({row[0] for row in rows}):
            check_unfenced(state, topic)  # fenced after the rows were prepared: nothing written
        await self._append_op(Begin(sink, batch_id, sorted(wanted)), wait=False)
        for (topic, queue_id, born_host, born_ms), group in itertools.groupby(
            rows, key=lambda row: (row[0], row[1], row[3], row[4])
        ):
            await put_messages(
                state,
                topic,
                queue_id,
                [row[2] for row in group],
                born_host=born_host,
                born_timestamp_ms=born_ms,
                wait_flush=False,
                sealed_ok=True,  # a moving queue's seal waits for these rows (queuemap.py)
            )
        queue_offset, code = await self._append_op(
            Done(sink, batch_id, sum(wanted.values())), wait=True
        )
        return queue_offset, code, len(rows)


def _stored_already(state: BrokerState, topic: str, uniq_key: str | None) -> bool:
    return uniq_key is not None and bool(state.store.query_by_key(topic, uniq_key, max_count=1))
