"""Which of laggard's alerts `laggard remediate` acts on, how each names its node, and whether
its end gives the node back.

One :class:`AlertAction` per alert name of ``dashboards/rules/laggard-alerts.yml``. The node is
found in one of three ways (:mod:`laggard.actions.locate` does it):

- ``instance``: a node-level alert (a GPU's) carries the agent's ``instance``;
  ``laggard_agent_info{instance}`` names that agent's node;
- ``rank``: a rank-level alert carries ``run`` and ``rank``; ``laggard_rank_info{run, rank}``
  names the rank's node;
- ``integrity``: ``LaggardGradientsCorrupt`` carries the reporting agent's ``instance`` and the
  finding's ``kind``; that agent's ``/findings`` names the corrupt rank and run (the counter has
  no rank label), then as ``rank``.

An alert that already carries a ``node`` label is taken at its word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class AlertAction:
    """What an alert asks for.

    Attributes:
        kind: the ``<kind>`` of the structured reason ``laggard:<kind>:<subject>``.
        locate: ``instance``, ``rank`` or ``integrity`` (see the module's docstring).
        subject: the reason's ``<subject>`` from the alert's labels (for ``integrity``, with
            the ``run`` and ``rank`` that ``/findings`` named).
        release_on_resolve: a resolved alert gives the node back. False where the end of the
            alert does not mean the node is well: a critical XID's alert ends 5 minutes after
            the event, a corrupt-gradient alert 15 minutes after the finding, while the GPU
            still needs its reset or diagnostics (an operator resumes those nodes).
    """

    kind: str
    locate: str
    subject: Callable[[Labels], str]
    release_on_resolve: bool


def _gpu(labels: Labels) -> str:
    gpu = labels.get("gpu", "")
    return f"gpu{gpu}" if gpu else labels.get("pci_bus_id", "") or "gpu"


def _rank(labels: Labels) -> str:
    return f"{labels.get('run', '')}/rank{labels.get('rank', '')}"


#: alert name -> its action; every other alert is recorded as skipped ("not an alert remediate
#: acts on"). The names are those of dashboards/rules/laggard-alerts.yml
#: (tests/actions/test_alert_actions.py checks that each exists).
ALERT_ACTIONS: dict[str, AlertAction] = {
    "LaggardGpuLost": AlertAction("gpu_lost", "instance", _gpu, release_on_resolve=True),
    "LaggardGpuXidCritical": AlertAction(
        "xid", "instance", lambda lb: f"{lb.get('xid', '')}/{_gpu(lb)}",
        release_on_resolve=False),
    "LaggardStragglerRank": AlertAction("straggler", "rank", _rank, release_on_resolve=True),
    "LaggardJobHung": AlertAction(
        "hung", "rank", lambda lb: f"{_rank(lb)}/{lb.get('kind', '')}", release_on_resolve=True),
    "LaggardGradientsCorrupt": AlertAction(
        "sdc", "integrity", lambda lb: f"{_rank(lb)}/{lb.get('kind', '')}",
        release_on_resolve=False),
}
