"""The exactly-once sink protocol's headers and bodies (ferrymq's own requests; `broker/sink.py`).

- SINK_PREPARE: body = a SEND_BATCH_MESSAGE body of rows for one queue; stored prepared
  (invisible) under (sink id, batch id, transaction id).
- SINK_DECIDE (to the sink's coordinator broker): body = the proposed winner `SinkWinner`; the
  answer is the winner recorded for (sink id, batch id): the proposal if it is the first, else
  the one recorded before. Optional header fields: `generation`, the writer's fencing generation
  (a decide whose generation is below the highest one recorded for its fence id is refused with
  SINK_GENERATION_FENCED, and nothing is recorded), and `fenceId`, the id generations and source
  positions are recorded under (default: the sink id; a Spark stream numbers its batches under
  `<fence id>/<query id>`, so the fence outlives a checkpoint). The proposal may carry the batch's
  source `positions` (topic -> broker -> queue id -> the next offset after the batch); the
  winner's are merged into the fence id's positions. Old clients send neither field: their
  decides are neither fenced nor fence anyone.
- SINK_COMMIT (to every broker holding rows of the batch): body = `SinkCommit`, the winner's
  transactions on that broker with their row counts; their rows become visible once, and every
  other prepared transaction of the batch is dropped. Answer fields: `rows` made visible,
  `duplicate` when the batch was committed before. The header may carry `generation` and
  `fenceId` (logged; a commit only finishes a decision, so it is never refused for them).
- SINK_FENCE (to the coordinator): header `SinkFenceRequestHeader` (fence id, generation, an
  offsets change id), body `SinkFence` (where a first start or the change starts). Records the
  generation (refused with SINK_GENERATION_FENCED below the highest one) and answers
  `SinkFenceState`: the fence id's source positions, the run (batch namespace) of its last
  winning decision, and the last decided batch of each recent run, for the new owner to finish.
- SINK_QUERY_FENCE (to the coordinator; read-only): header `SinkFenceQueryHeader` (fence id).
  Answers the same `SinkFenceState` as SINK_FENCE (generation, positions, run, last change,
  pending batches) as the coordinator's applied log has it, and records nothing: GET
  /connectors/{c}/offsets reads a replicator's positions with it. A fence id the coordinator
  has no record of is refused with SINK_FENCE_NOT_FOUND.
"""

from __future__ import annotations

import msgspec

from ferrymq.wire.headers import I64, CommandHeader

__all__ = [
    "Positions",
    "SinkBatchHeader",
    "SinkCommit",
    "SinkCommitResponseHeader",
    "SinkFence",
    "SinkFenceQueryHeader",
    "SinkFenceRequestHeader",
    "SinkFenceState",
    "SinkPending",
    "SinkPrepareRequestHeader",
    "SinkWinner",
]

Positions = dict[str, dict[str, dict[str, int]]]
"""Source positions: topic -> broker name -> queue id (text) -> the next offset to read."""


class SinkBatchHeader(CommandHeader):
    """SINK_DECIDE and SINK_COMMIT: which batch of which sink, and who asks."""

    sink_id: str
    batch_id: I64
    generation: I64 | None = None
    """The writer's fencing generation (none: an unfenced writer, or an old client)."""
    fence_id: str | None = None
    """What generations and positions are recorded under (none: `sink_id`)."""


class SinkPrepareRequestHeader(CommandHeader):
    """SINK_PREPARE: where the rows go once committed, and the batch they belong to."""

    sink_id: str
    batch_id: I64
    transaction_id: str
    topic: str
    queue_id: int
    producer_group: str = "ferrymq-spark-sink"


class SinkCommitResponseHeader(CommandHeader):
    """SINK_COMMIT's answer."""

    rows: I64
    duplicate: bool = False


class SinkWinner(msgspec.Struct, forbid_unknown_fields=False):
    """The transactions of a batch that count: transaction id -> broker name -> rows."""

    transactions: dict[str, dict[str, int]]
    positions: Positions | None = None
    """The batch's source positions (what its rows were read from), when the writer knows them."""


class SinkCommit(msgspec.Struct, forbid_unknown_fields=False):
    """The winner's transactions on one broker: transaction id -> rows."""

    transactions: dict[str, int]


class SinkFenceRequestHeader(CommandHeader):
    """SINK_FENCE: a new owner of a fence id starts."""

    fence_id: str
    generation: I64
    change: str | None = None
    """An offsets change the owner starts from (applied once per fence id)."""


class SinkFenceQueryHeader(CommandHeader):
    """SINK_QUERY_FENCE: whose recorded state to answer (nothing is recorded)."""

    fence_id: str


class SinkFence(msgspec.Struct, forbid_unknown_fields=False):
    """SINK_FENCE's body: where to start.

    Without `change` (or a change applied before): `start` becomes the positions only if the
    fence id has none yet (its very first start, e.g. `latest` pinned). With a new change:
    `start` replaces the positions (`replace`, a reset) or is merged into them (an alter).
    """

    start: Positions | None = None
    replace: bool = False


class SinkPending(msgspec.Struct, forbid_unknown_fields=False):
    """The last decided batch of one run: perhaps not committed everywhere yet."""

    sink_id: str
    batch_id: int
    transactions: dict[str, dict[str, int]]


class SinkFenceState(msgspec.Struct, forbid_unknown_fields=False):
    """SINK_FENCE's answer (once the fence is recorded) and SINK_QUERY_FENCE's."""

    generation: int
    positions: Positions | None = None
    """None: nothing recorded yet."""
    run: str | None = None
    """The sink id (batch namespace) of the last winning decision."""
    change: str | None = None
    """The last offsets change applied."""
    pending: list[SinkPending] = msgspec.field(default_factory=list)
