"""Network partitions as nftables rules on the private loopback (reference §2.3 A).

Every process binds its own 127.0.0.x address, so a rule on source and destination address
cuts exactly the links between two nodes. The whole rule set is one table, replaced atomically
with `nft -f`; healing deletes the table. Only ever run inside the harness's network namespace:
the host's tables are never touched.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterable, Sequence

__all__ = ["Net", "nft_available"]

_TABLE = "ferrymq_chaos"


def nft_available() -> bool:
    """Whether the `nft` command is installed."""
    return shutil.which("nft") is not None


def _rules(pairs: Iterable[tuple[str, str]]) -> str:
    lines = [f"table inet {_TABLE}", f"delete table inet {_TABLE}", f"table inet {_TABLE} {{"]
    lines.append("  chain input { type filter hook input priority 0; policy accept;")
    lines += [f"    ip saddr {src} ip daddr {dst} drop" for src, dst in pairs]
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


class Net:
    """Cuts and heals links between addresses."""

    def __init__(self) -> None:
        self.dropped: set[tuple[str, str]] = set()

    def _apply(self) -> None:
        if not self.dropped:
            self.heal()
            return
        subprocess.run(["nft", "-f", "-"], input=_rules(sorted(self.dropped)).encode(), check=True)

    def drop(self, src: str, dst: str) -> None:
        """Drop packets from `src` to `dst`.

        One way only for established streams; new connections break both ways (the SYN-ACK is
        lost).
        """
        self.dropped.add((src, dst))
        self._apply()

    def partition(self, sides: Sequence[Iterable[str]]) -> None:
        """Cut every link between addresses on different sides, both ways."""
        groups = [set(side) for side in sides]
        for a, b in itertools.permutations(range(len(groups)), 2):
            self.dropped |= {(x, y) for x in groups[a] for y in groups[b]}
        self._apply()

    def isolate(self, ip: str, others: Iterable[str]) -> None:
        """Cut `ip` off from every address in `others`."""
        self.partition([[ip], [o for o in others if o != ip]])

    def heal(self) -> None:
        """Remove every rule."""
        self.dropped.clear()
        subprocess.run(
            ["nft", "-f", "-"],
            input=f"table inet {_TABLE}\ndelete table inet {_TABLE}\n".encode(),
            check=True,
        )
