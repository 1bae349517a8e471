"""remediate's decisions and guards, acting on a real exclude file (the Slurm and Prometheus
paths: test_remediate_slurm.py, test_locate.py, test_remediate_e2e.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support_remediate import alert, payload

from laggard.actions.alertmanager import parse_webhook
from laggard.actions.audit import AUDIT_LOGGER
from laggard.actions.exclude_file import ExcludeFile
from laggard.actions.locate import Locator
from laggard.actions.remediator import Config, Remediator


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _remediator(tmp_path: Path, *, act: bool = True, clock: Clock | None = None,
                **config: object) -> tuple[Remediator, ExcludeFile]:
    target = ExcludeFile(tmp_path / "exclude", act=act)
    guards = Config(**{"max_job_percent": 100.0, **config})  # no Prometheus: no job share
    return Remediator(target, Locator(None), guards, clock=clock or Clock()), target


def _send(remediator: Remediator, *alerts: dict) -> list[tuple[str, str, str]]:
    return [(d.target, d.outcome, d.detail)
            for d in remediator.handle(parse_webhook(payload(*alerts)))]


def test_dry_run_by_default_decides_and_writes_nothing(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    target = ExcludeFile(tmp_path / "exclude")  # act=False: the default
    remediator = Remediator(target, Locator(None), Config(max_job_percent=100.0))
    decisions = remediator.handle(parse_webhook(payload(
        alert("LaggardGpuLost", node="n1", instance="n1:9477", gpu="1"))))
    assert [(d.action, d.target, d.outcome, d.reason) for d in decisions] == [
        ("exclude", "n1", "would_act", "laggard:gpu_lost:gpu1")]
    assert decisions[0].why == "LaggardGpuLost firing instance=n1:9477 gpu=1 node=n1"
    assert not (tmp_path / "exclude").exists()
    assert [r.getMessage() for r in caplog.records] == [decisions[0].line()]
    assert remediator.held() == {"n1": "laggard:gpu_lost:gpu1"}


def test_repeats_are_silent_and_a_second_alert_on_a_held_node_acts_not(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    remediator, target = _remediator(tmp_path)
    lost = alert("LaggardGpuLost", node="n1", gpu="1")
    assert _send(remediator, lost) == [("n1", "acted", f"add n1 to {target.path}")]
    assert _send(remediator, lost) == []  # Alertmanager's repeat of the same episode
    hung = alert("LaggardJobHung", node="n1", run="r", rank="3", kind="device")
    assert _send(remediator, lost, hung) == [
        ("n1", "skipped", "already held by laggard (laggard:gpu_lost:gpu1)")]
    assert target.excluded() == ["n1"]
    assert len(caplog.records) == 2  # one audit line per decision, none for a repeat
    # the node comes back only when the last alert holding it resolved
    assert _send(remediator, alert("LaggardGpuLost", "resolved", node="n1", gpu="1")) == [
        ("n1", "skipped", "still held by 1 other alert(s)")]
    assert target.excluded() == ["n1"]
    resolved = alert("LaggardJobHung", "resolved", node="n1", run="r", rank="3", kind="device")
    assert _send(remediator, resolved) == [("n1", "acted", f"remove n1 from {target.path}")]
    assert target.excluded() == [] and remediator.held() == {}


def test_a_critical_xid_or_corrupt_gradients_keep_the_node_out_when_resolved(
        tmp_path: Path) -> None:
    remediator, target = _remediator(tmp_path)
    xid = dict(node="n2", xid="79", gpu="0", instance="n2:9477")
    assert _send(remediator, alert("LaggardGpuXidCritical", **xid))[0][1] == "acted"
    (_, outcome, detail), = _send(remediator, alert("LaggardGpuXidCritical", "resolved", **xid))
    assert outcome == "skipped" and detail.startswith("stays out of service")
    assert target.excluded() == ["n2"]


def test_a_warning_acts_only_when_configured(tmp_path: Path) -> None:
    straggler = alert("LaggardStragglerRank", severity="warning", node="n3", run="r", rank="1")
    remediator, target = _remediator(tmp_path)
    assert _send(remediator, straggler) == [
        ("-", "skipped", "warning-severity alert: acts only with --act-on-warning")]
    assert _send(remediator, straggler) == []
    assert target.excluded() == []
    remediator, target = _remediator(tmp_path, act_on_warning=True)
    assert _send(remediator, straggler)[0][:2] == ("n3", "acted")
    assert remediator.held() == {"n3": "laggard:straggler:r/rank1"}


def test_the_per_hour_cap_counts_a_sliding_hour(tmp_path: Path) -> None:
    clock = Clock()
    remediator, target = _remediator(tmp_path, clock=clock, max_nodes_per_hour=1)
    assert _send(remediator, alert("LaggardGpuLost", node="n1", gpu="0"))[0][1] == "acted"
    clock.now += 3599
    late = alert("LaggardGpuLost", node="n2", gpu="0")
    assert _send(remediator, late) == [("n2", "skipped", "per-hour cap: 1 node(s) taken in the "
                                        "last hour (--max-nodes-per-hour 1)")]
    clock.now += 1
    # the refused episode is not remembered: Alertmanager's next notification tries again
    assert _send(remediator, late)[0][:2] == ("n2", "acted")
    assert target.excluded() == ["n1", "n2"]


def test_an_alert_that_names_no_node_is_skipped_and_tried_again(tmp_path: Path) -> None:
    remediator, _ = _remediator(tmp_path)
    lost = alert("LaggardGpuLost", instance="n1:9477", gpu="0")
    first = _send(remediator, lost)
    assert first == [("-", "skipped", "no node: no --prometheus-url: only alerts with a node "
                      "label can be placed")]
    assert _send(remediator, lost) == first


def test_a_resolved_alert_gives_back_only_what_it_took(tmp_path: Path) -> None:
    remediator, target = _remediator(tmp_path, act_on_warning=False)
    assert _send(remediator, alert("LaggardGpuLost", node="n1", gpu="0"))[0][1] == "acted"
    # a warning on the same node was never acted on: its end changes nothing
    straggler = dict(severity="warning", node="n1", run="r", rank="0")
    _send(remediator, alert("LaggardStragglerRank", **straggler))
    assert _send(remediator, alert("LaggardStragglerRank", "resolved", **straggler)) == []
    assert target.excluded() == ["n1"]
    # a restarted remediate never saw the loss fire; the file keeps no reason to match it by
    restarted = Remediator(target, Locator(None), Config(max_job_percent=100.0))
    assert restarted.handle(parse_webhook(payload(
        alert("LaggardGpuLost", "resolved", node="n1", gpu="0")))) == []
    assert target.excluded() == ["n1"]


def test_other_alerts_are_not_decided_on(tmp_path: Path) -> None:
    remediator, _ = _remediator(tmp_path)
    assert _send(remediator, alert("LaggardAgentDown", severity="warning", node="n1")) == []
