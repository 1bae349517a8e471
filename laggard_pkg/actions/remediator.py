"""`laggard remediate`'s decisions: from Alertmanager's alerts to one action per node, within
the guards.

For a firing alert of :data:`~laggard.actions.alert_actions.ALERT_ACTIONS`:

1. a warning-level alert acts only with ``act_on_warning``;
2. its node(s) are found (:class:`~laggard.actions.locate.Locator`);
3. a node laggard holds already is not acted on again (a repeat notification, or a second alert
   about the same node: deduplicated; the alert joins the node's holders);
4. the per-hour cap and the share of each of the node's jobs are checked;
5. the node action (drain, cordon, exclude) runs, or in a dry run says what it would run.

For a resolved alert: the node is given back when the last alert holding it resolved, every
holder's action allows it (``release_on_resolve``), and the node action finds its own reason on
the node (a node drained by someone else is never resumed).

Every decision is one audit line (:mod:`laggard.actions.audit`); a repeat notification of an
episode already decided writes none. State (who holds which node, the hour's count) lives in
memory: after a restart a node laggard took out is recognised by its reason
(:meth:`~laggard.actions.node_actions.NodeAction.held_reason`) and counted as held again; a
resolved alert this process never saw fire gives a node back only when the node carries the
very reason that alert would have written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from laggard.actions.alert_actions import ALERT_ACTIONS, AlertAction
from laggard.actions.alertmanager import Alert
from laggard.actions.audit import Decision, record
from laggard.actions.guards import HourlyCap, job_share_allows
from laggard.actions.locate import LocateError, Locator
from laggard.actions.node_actions import NodeAction
from laggard.actions.slurm import drain_reason


@dataclass(frozen=True, slots=True)
class Config:
    """The guards.

    Attributes:
        max_nodes_per_hour: most nodes taken out (or, in a dry run, that would have been) in
            any sliding hour.
        max_job_percent: most of one job's nodes laggard holds at once, in percent (at least
            one node: :func:`~laggard.actions.guards.job_share_allows`).
        act_on_warning: act on warning-level alerts (``LaggardStragglerRank``) too; by default
            only critical ones act.
    """

    max_nodes_per_hour: int = 2
    max_job_percent: float = 10.0
    act_on_warning: bool = False


@dataclass(slots=True)
class _Hold:
    reason: str
    alerts: set[str] = field(default_factory=set)
    release_on_resolve: bool = True


class Remediator:
    """Decide and act on Alertmanager notifications; thread-safe (one lock around a decision).

    Args:
        action: what is done to a node.
        locator: finds an alert's nodes and a node's jobs.
        config: the guards.
        clock: monotonic seconds, for the per-hour cap.
        log: the audit logger; ``laggard.audit`` when None.
    """

    def __init__(self, action: NodeAction, locator: Locator, config: Config | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None) -> None:
        self.action = action
        self.locator = locator
        self.config = config or Config()
        self.cap = HourlyCap(self.config.max_nodes_per_hour, clock)
        self.log = log
        self._lock = threading.Lock()
        self._held: dict[str, _Hold] = {}
        #: episode (alert key + startsAt) -> nodes it was decided for; a repeat is silent
        self._episodes: dict[tuple[str, str], list[str]] = {}
        #: alert key -> the nodes it holds (for its resolution, whose labels may no longer
        #: locate anything: a hung job's ranks are gone from laggard_rank_info)
        self._alert_nodes: dict[str, list[str]] = {}

    def held(self) -> dict[str, str]:
        """node -> the reason laggard holds it with."""
        with self._lock:
            return {node: hold.reason for node, hold in self._held.items()}

    def handle(self, alerts: Iterable[Alert]) -> list[Decision]:
        """Decide on every alert of one notification, in its order.

        Returns:
            The decisions taken (each already recorded as its audit line); none for a repeat.
        """
        out: list[Decision] = []
        with self._lock:
            for alert in alerts:
                action = ALERT_ACTIONS.get(alert.name)
                if action is None:
                    continue  # not an alert remediate acts on (Alertmanager routes it here too)
                if alert.firing:
                    out += self._fire(alert, action)
                else:
                    out += self._resolve(alert, action)
        return out

    def _record(self, alert: Alert, target: str, outcome: str, detail: str,
                reason: str = "", action: str | None = None) -> Decision:
        return record(Decision(action=action or self.action.name, target=target,
                               outcome=outcome, why=_why(alert), reason=reason, detail=detail,
                               source="remediate"), log=self.log)

    def _fire(self, alert: Alert, action: AlertAction) -> list[Decision]:
        episode = (alert.key, alert.starts_at)
        if episode in self._episodes:
            return []
        if alert.severity != "critical" and not self.config.act_on_warning:
            self._episodes[episode] = []
            return [self._record(alert, "-", "skipped", f"{alert.severity or 'no'}-severity "
                                 "alert: acts only with --act-on-warning")]
        try:
            targets = self.locator.targets(action, alert.labels)
        except LocateError as exc:
            # not remembered: the next notification of the episode tries again
            return [self._record(alert, "-", "skipped", f"no node: {exc}")]
        out, done = [], []
        for target in targets:
            node = target.node
            reason = drain_reason(action.kind,
                                  action.subject({**alert.labels, **target.labels}))
            hold = self._held.get(node)
            if hold is None:
                ours = self.action.held_reason(node)
                if ours:
                    # laggard's reason on the node (from before a restart, or laggard
                    # healthcheck's drain): held, not taken again
                    hold = self._held[node] = _Hold(ours,
                                                    release_on_resolve=action.release_on_resolve)
            if hold is not None:
                if alert.key not in hold.alerts:
                    hold.alerts.add(alert.key)
                    hold.release_on_resolve &= action.release_on_resolve
                    out.append(self._record(alert, node, "skipped",
                                            f"already held by laggard ({hold.reason})", reason))
                done.append(node)
                continue
            refusal = self._guard(node, target.labels.get("run") or alert.labels.get("run"))
            if refusal is not None:
                out.append(self._record(alert, node, "skipped", refusal, reason))
                continue
            decision = self.action.quarantine(node, reason, why=_why(alert))
            out.append(decision)
            if decision.outcome in ("acted", "would_act"):
                self.cap.take()
                self._held[node] = _Hold(reason, {alert.key}, action.release_on_resolve)
                done.append(node)
            elif decision.outcome == "skipped":
                done.append(node)  # drained by someone else, or laggard's already: decided
        if done and len(done) == len(targets):
            self._episodes[episode] = done
        if done:
            self._alert_nodes.setdefault(alert.key, [])
            self._alert_nodes[alert.key] += [n for n in done
                                              if n not in self._alert_nodes[alert.key]]
        return out

    def _guard(self, node: str, alert_run: str | None) -> str | None:
        """Why the guards refuse to take ``node`` now, or None."""
        if not self.cap.allows():
            return (f"per-hour cap: {self.cap.used()} node(s) taken in the last hour "
                    f"(--max-nodes-per-hour {self.config.max_nodes_per_hour})")
        if self.config.max_job_percent >= 100:
            return None
        try:
            runs = self.locator.node_runs(node) | ({alert_run} if alert_run else set())
            for run in sorted(runs):
                nodes = self.locator.run_nodes(run) | {node}
                held = len(nodes & self._held.keys())
                if not job_share_allows(len(nodes), held, self.config.max_job_percent):
                    return (f"job share: laggard holds {held} of run {run}'s {len(nodes)} "
                            f"node(s) (--max-job-percent {self.config.max_job_percent:g})")
        except LocateError as exc:
            return (f"cannot count the run's nodes for the job share (--max-job-percent 100 "
                    f"to go without it): {exc}")
        return None

    def _resolve(self, alert: Alert, action: AlertAction) -> list[Decision]:
        nodes = self._alert_nodes.pop(alert.key, None)
        self._episodes = {e: n for e, n in self._episodes.items() if e[0] != alert.key}
        if nodes is None:
            return self._resolve_unknown(alert, action)
        out = []
        for node in nodes:
            hold = self._held.get(node)
            if hold is None or alert.key not in hold.alerts:
                # its firing found the node drained by someone else (or was refused)
                out.append(self._record(alert, node, "skipped", "not taken out for this alert: "
                                        "left as it is", action=self.action.release_name))
                continue
            hold.alerts.discard(alert.key)
            if hold.alerts:
                out.append(self._record(alert, node, "skipped", f"still held by "
                                        f"{len(hold.alerts)} other alert(s)", hold.reason,
                                        action=self.action.release_name))
                continue
            del self._held[node]
            if not hold.release_on_resolve:
                out.append(self._record(alert, node, "skipped", "stays out of service: "
                                        f"{alert.name} resolving does not make the node well "
                                        "(an operator resumes it)", hold.reason,
                                        action=self.action.release_name))
                continue
            out.append(self.action.release(node, why=_why(alert)))
        return out

    def _resolve_unknown(self, alert: Alert, action: AlertAction) -> list[Decision]:
        """An alert this process never saw fire (it fired before a restart): its node is given
        back only when the reason on the node is the one this alert would have written."""
        if not action.release_on_resolve:
            return []
        try:
            targets = self.locator.targets(action, alert.labels)
        except LocateError:
            return []  # nothing laggard holds can be named: nothing to give back
        out = []
        for target in targets:
            reason = drain_reason(action.kind,
                                  action.subject({**alert.labels, **target.labels}))
            hold = self._held.get(target.node)
            if hold is None and self.action.held_reason(target.node) != reason \
                    or hold is not None and hold.reason != reason:
                continue  # not this alert's quarantine: no decision to take
            if hold is not None:
                if hold.alerts:  # alerts that fired since the restart hold it too
                    out.append(self._record(alert, target.node, "skipped", f"still held by "
                                            f"{len(hold.alerts)} other alert(s)", hold.reason,
                                            action=self.action.release_name))
                    continue
                del self._held[target.node]
            out.append(self.action.release(target.node, why=_why(alert)))
        return out


def _why(alert: Alert) -> str:
    """The alert in one line: name, status and its identifying labels."""
    keys = ("instance", "gpu", "pci_bus_id", "xid", "run", "rank", "kind", "node")
    labels = " ".join(f"{k}={alert.labels[k]}" for k in keys if alert.labels.get(k))
    return f"{alert.name} {alert.status} {labels}".strip()
