"""A node whose ranks are all slow: one finding naming the node and what its ranks share.

Eight slow ranks on one node are one fault (its host CPU, a PCIe switch, its cooling or power,
its NIC), not eight: the rank findings stay (each names its rank and cost), and this module adds
one finding for the node when every rank it holds in the window (two or more) has an active
straggler finding, from either detector (the median one, :mod:`laggard.detectors.straggler`, or
the blame one, :mod:`laggard.detectors.blame_detector`, whose leave-one-out comparison still
names the ranks of a node holding half the job). It clears when fewer than half of the node's
ranks are still named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from laggard.detectors.finding import Finding, Severity
from laggard.detectors.window import WindowRecord

__all__ = ["KIND", "NodeVerdict"]

#: ``kind`` of a node finding.
KIND = "node"
#: What ranks on one node share, in the order a reader checks them.
SHARED = ("its host CPU and memory (other processes, the CPU governor)", "its PCIe switches",
          "its cooling and power (every GPU's clock-event reasons together)", "its NIC")


class NodeVerdict:
    """Raises one ``node`` finding for a node whose ranks are all named.

    Attributes:
        active: node name -> its raised finding.
    """

    def __init__(self) -> None:
        self.active: dict[str, Finding] = {}

    def update(self, record: WindowRecord, named: Mapping[int, Finding],
               extra: Mapping[str, str] | None = None) -> list[Finding]:
        """One window.

        Args:
            record: the gathered window (its ``nodes``: None, no node verdict).
            named: global rank -> its active rank finding (any straggler kind).
            extra: node -> one phrase of what its hosts or GPUs showed this window (added to
                the message), if known.

        Returns:
            Node findings raised or cleared in this window.
        """
        if record.nodes is None:
            return []
        ranks_of: dict[str, list[int]] = {}
        for rank, node in zip(record.ranks.tolist(), record.nodes, strict=True):
            if node:
                ranks_of.setdefault(str(node), []).append(int(rank))
        found: list[Finding] = []
        for node, finding in list(self.active.items()):
            ranks = ranks_of.get(node, [])
            if 2 * sum(r in named for r in ranks) < len(ranks) or not ranks:
                del self.active[node]
                found.append(finding.clear(step=record.step, reason="recovered",
                                           message=f"{node}: its ranks are no longer all slow"))
        for node, ranks in ranks_of.items():
            if node in self.active or len(ranks) < 2 or not all(r in named for r in ranks):
                continue
            finding = _node_finding(node, sorted(ranks), named, record.step,
                                    (extra or {}).get(node))
            self.active[node] = finding
            found.append(finding)
        return found


def _node_finding(node: str, ranks: Sequence[int], named: Mapping[int, Finding], step: int,
                  extra: str | None) -> Finding:
    kinds = sorted({named[r].kind for r in ranks})
    critical = any(named[r].severity == Severity.CRITICAL for r in ranks)
    listed = ", ".join(str(r) for r in ranks)
    message = (f"{node}: all {len(ranks)} of its ranks ({listed}) are slow ({', '.join(kinds)}): "
               f"one fault of the node, not {len(ranks)}; what they share: "
               f"{'; '.join(SHARED)}")
    if extra:
        message += f"; {extra}"
    return Finding(detector="straggler", kind=KIND,
                   severity=Severity.CRITICAL if critical else Severity.WARNING,
                   message=message, node=node, step=step,
                   evidence={"ranks": list(ranks), "kinds": kinds,
                             "rank_findings": len(ranks)})
