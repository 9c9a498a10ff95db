"""The exactly-once sink protocol's headers and bodies (ferrymq's own requests; `broker/sink.py`).

- SINK_PREPARE: body = a SEND_BATCH_MESSAGE body of rows for one queue; stored prepared
  (invisible) under (sink id, batch id, transaction id).
- SINK_DECIDE (to the sink's coordinator broker): body = the proposed winner `SinkWinner`; the
  answer is the winner recorded for (sink id, batch id): the proposal if it is the first, else
  the one recorded before.
- SINK_COMMIT (to every broker holding rows of the batch): body = `SinkCommit`, the winner's
  transactions on that broker with their row counts; their rows become visible once, and every
  other prepared transaction of the batch is dropped. Answer fields: `rows` made visible,
  `duplicate` when the batch was committed before.
"""

from __future__ import annotations

import msgspec

from ferrymq.wire.headers import I64, CommandHeader

__all__ = [
    "SinkBatchHeader",
    "SinkCommit",
    "SinkCommitResponseHeader",
    "SinkPrepareRequestHeader",
    "SinkWinner",
]


class SinkBatchHeader(CommandHeader):
    """SINK_DECIDE and SINK_COMMIT: which batch of which sink."""

    sink_id: str
    batch_id: I64


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


class SinkCommit(msgspec.Struct, forbid_unknown_fields=False):
    """The winner's transactions on one broker: transaction id -> rows."""

    transactions: dict[str, int]
