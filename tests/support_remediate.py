"""Alertmanager webhook payloads (version 4) for the remediate tests, in the form Alertmanager
0.25 sends (prometheus.io/docs/alerting/latest/configuration/#webhook_config)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def alert(name: str, status: str = "firing", *, severity: str = "critical",
          starts_at: str = "2026-12-02T10:00:00Z", **labels: str) -> dict[str, Any]:
    """One alert of a notification; its fingerprint hashes its labels, as Alertmanager's."""
    all_labels = {"alertname": name, "severity": severity, **labels}
    fingerprint = hashlib.sha256(json.dumps(sorted(all_labels.items())).encode()).hexdigest()
    return {"status": status, "labels": all_labels, "annotations": {"summary": name},
            "startsAt": starts_at,
            "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-02T10:05:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint[:16]}


def payload(*alerts: dict[str, Any]) -> bytes:
    """A notification of ``alerts`` (one group), as the webhook's POST body."""
    firing = any(a["status"] == "firing" for a in alerts)
    return json.dumps({
        "version": "4", "groupKey": '{}:{alertname="x"}', "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved", "receiver": "laggard",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}).encode()
