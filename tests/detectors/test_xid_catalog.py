"""XID catalog: NVIDIA's immediate-action buckets mapped to actions, and the per-line refinements
(NVLink5 Fatal/Nonfatal, Xid 154's named recovery action)."""

from __future__ import annotations

import pytest

from laggard.detectors.finding import Severity
from laggard.detectors.xid_catalog import Action, lookup, xid_finding


@pytest.mark.parametrize(("xid", "name", "action", "severity"), [
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", Action.RESTART_APP, Severity.WARNING),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", Action.RESTART_APP, Severity.WARNING),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", Action.IGNORE, Severity.INFO),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", Action.IGNORE, Severity.INFO),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", Action.RESET_GPU, Severity.CRITICAL),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", Action.REBOOT, Severity.CRITICAL),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", Action.RESTART_APP, Severity.WARNING),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", Action.RESET_GPU, Severity.CRITICAL),
    (119, "GSP_RPC_TIMEOUT", Action.RESET_GPU, Severity.CRITICAL),
    (61, "PMU_BREAKPOINT", Action.CONTACT_SUPPORT, Severity.CRITICAL),
])
def test_catalog_rows(xid: int, name: str, action: Action, severity: Severity) -> None:
    info = lookup(xid)
    assert (info.name, info.action, info.severity) == (name, action, severity)


def test_every_code_1_to_161_is_listed_and_unknown_codes_go_to_support() -> None:
    assert all(lookup(code).name != "UNKNOWN" for code in range(1, 162))
    unknown = lookup(999)
    assert (unknown.name, unknown.action) == ("UNKNOWN", Action.CONTACT_SUPPORT)


def test_nvlink5_fatal_token_decides_the_action() -> None:
    assert lookup(145, fatal_token="Fatal").action is Action.RESET_GPU
    assert lookup(145, fatal_token="Nonfatal").action is Action.IGNORE
    assert lookup(149).action is Action.RESET_GPU  # no token: assume the worse


@pytest.mark.parametrize(("message", "action"), [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", Action.RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Action.REBOOT),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x3 (Drain P2P)",
     Action.DRAIN_NODE),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", Action.IGNORE),
])
def test_xid154_takes_the_action_named_in_its_message(message: str, action: Action) -> None:
    assert lookup(154, message).action is action


def test_finding_carries_action_and_subject() -> None:
    finding = xid_finding(xid=79, pci_bus_id="0000:91:00", gpu=3, node="node01",
                          message="GPU has fallen off the bus.")
    doc = finding.to_dict()
    assert (doc["detector"], doc["kind"], doc["severity"], doc["gpu"]) == (
        "xid", "xid", "critical", 3)
    assert doc["evidence"]["action"] == "reboot"
    assert doc["evidence"]["catalog_action"] == "RESTART_BM"
    assert "Xid 79" in doc["message"] and "GPU 3" in doc["message"]
