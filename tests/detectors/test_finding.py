"""One Finding convention: raised once, cleared once by Finding.clear, one JSON form."""

import json

from laggard.detectors.finding import (
    JOB_FINDING_KINDS,
    Detector,
    Finding,
    Severity,
    split_cleared,
)
from laggard.detectors.integrity import IntegrityDetector
from laggard.detectors.link import LinkDetector
from laggard.detectors.straggler import StragglerDetector
from laggard.detectors.throttle import ThrottleDetector


def _raised() -> Finding:
    return Finding(detector="straggler", kind="compute", severity=Severity.WARNING,
                   message="rank 3 slow", rank=3, node="node07", step=119,
                   evidence={"slowdown": 0.12})


def test_a_raised_findings_dict_has_no_cleared_key_and_round_trips_through_json():
    doc = _raised().to_dict()
    assert "cleared" not in doc and "subject" not in doc  # analyze --json's schema unchanged
    assert json.loads(json.dumps(doc)) == doc
    assert doc["severity"] == "warning"


def test_clear_keeps_the_subject_and_says_why_and_when_it_was_raised():
    raised = _raised()
    cleared = raised.clear(step=239, reason="recovered", message="rank 3: cleared",
                           severity=Severity.INFO)
    assert cleared.cleared and not raised.cleared
    assert (cleared.detector, cleared.kind, cleared.rank, cleared.node) == (
        "straggler", "compute", 3, "node07")
    assert cleared.step == 239 and cleared.severity is Severity.INFO
    assert cleared.evidence == {"slowdown": 0.12, "reason": "recovered", "raised_step": 119}
    assert cleared.to_dict()["cleared"] is True
    assert split_cleared([raised, cleared, raised]) == ([raised, raised], [cleared])


def test_every_detector_has_the_one_protocol_and_reports_under_its_own_name():
    detectors = [StragglerDetector(), LinkDetector(), IntegrityDetector(), ThrottleDetector()]
    assert [d.name for d in detectors] == ["straggler", "link", "integrity", "throttle"]
    assert all(isinstance(d, Detector) for d in detectors)
    assert not isinstance(object(), Detector)
    # the in-job detectors' names are the agent's vocabulary of detector labels
    assert {"straggler", "link", "integrity"} == set(JOB_FINDING_KINDS)
    assert "link" not in JOB_FINDING_KINDS["straggler"]
