"""Alertmanager's webhook payload, version 4, read into alerts; anything else refused."""

from __future__ import annotations

import json

import pytest
from support_remediate import alert, payload

from laggard.actions.alertmanager import PayloadError, parse_webhook


def test_a_notification_is_read_alert_by_alert() -> None:
    body = payload(alert("LaggardGpuLost", instance="n1:9477", gpu="1"),
                   alert("LaggardJobHung", "resolved", run="r", rank="3"))
    lost, hung = parse_webhook(body)
    assert (lost.name, lost.status, lost.firing, lost.severity) == (
        "LaggardGpuLost", "firing", True, "critical")
    assert lost.labels["gpu"] == "1" and lost.starts_at == "2026-12-02T10:00:00Z"
    assert not hung.firing and hung.labels["rank"] == "3"
    assert lost.key != hung.key and len(lost.fingerprint) == 16


def test_an_alert_without_fingerprint_is_keyed_by_its_labels() -> None:
    doc = json.loads(payload(alert("LaggardGpuLost", gpu="1")))
    del doc["alerts"][0]["fingerprint"]
    again = json.loads(json.dumps(doc))
    assert parse_webhook(json.dumps(doc).encode())[0].key == \
        parse_webhook(json.dumps(again).encode())[0].key


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (json.dumps({"version": "3", "alerts": []}).encode(), "payload version '3'"),
    (json.dumps({"version": "4"}).encode(), "no 'alerts' list"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {}}]}).encode(),
     "no alertname"),
    (json.dumps({"version": "4", "alerts": [
        {"status": "pending", "labels": {"alertname": "x"}}]}).encode(), "status 'pending'"),
    (b"\xff\xfe", "not JSON"),
])
def test_what_is_not_a_version_4_payload_is_refused(body: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        parse_webhook(body)
