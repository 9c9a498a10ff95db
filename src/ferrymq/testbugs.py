"""Test-only bug switches: deliberate safety bugs that `ferry chaos` must catch (issue 8).

A harness that cannot fail proves nothing. `FERRYMQ_TEST_BUG=name[,name...]` in a server's
environment turns on the named bugs for that process; unset (always, outside the chaos tests),
every switch is off and costs one attribute read. Names:

- `ack-before-replication`: a master answers a send as soon as it is in the page cache, without
  waiting for the fsync or the SyncStateSet;
- `skip-truncation`: a slave keeps the bytes its master's handshake tells it to cut;
- `skip-crc-on-recovery`: crash recovery accepts records whose CRC does not match;
- `elect-outside-sync-state-set`: the controller elects among every live replica, not only the
  SyncStateSet members (a lagging slave can become master and lose acknowledged writes).
"""

from __future__ import annotations

import os
from typing import Final

__all__ = [
    "ACK_BEFORE_REPLICATION",
    "BUGS",
    "ELECT_OUTSIDE_SYNC_STATE_SET",
    "SKIP_CRC_ON_RECOVERY",
    "SKIP_TRUNCATION",
]

BUGS: Final = (
    "ack-before-replication",
    "skip-truncation",
    "skip-crc-on-recovery",
    "elect-outside-sync-state-set",
)

_ENABLED: Final = frozenset(
    name.strip() for name in os.environ.get("FERRYMQ_TEST_BUG", "").split(",") if name.strip()
)

ACK_BEFORE_REPLICATION: Final = "ack-before-replication" in _ENABLED
SKIP_TRUNCATION: Final = "skip-truncation" in _ENABLED
SKIP_CRC_ON_RECOVERY: Final = "skip-crc-on-recovery" in _ENABLED
ELECT_OUTSIDE_SYNC_STATE_SET: Final = "elect-outside-sync-state-set" in _ENABLED
