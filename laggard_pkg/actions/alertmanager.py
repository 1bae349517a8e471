"""Alertmanager's webhook payload (version 4), read into :class:`Alert` records.

Alertmanager's ``webhook_config`` POSTs one JSON document per notification of an alert group
(prometheus.io/docs/alerting/latest/configuration/#webhook_config): ``version`` ("4"),
``groupKey``, ``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts``, a list of objects with ``status``
("firing" or "resolved"), ``labels``, ``annotations``, ``startsAt``, ``endsAt``
(RFC 3339), ``generatorURL`` and ``fingerprint``. Every notification of a group carries all of
the group's alerts again (a repeat, a new member, a resolved one), so the receiver must be
idempotent: :mod:`laggard.actions.remediator` is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The payload version this module reads (Alertmanager 0.x has sent "4" since 2017).
PAYLOAD_VERSION = "4"


class PayloadError(ValueError):
    """The body is not an Alertmanager webhook payload of version 4 (the message says why)."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert of a notification.

    Attributes:
        name: the ``alertname`` label.
        status: ``firing`` or ``resolved``.
        labels: every label, ``alertname`` and ``severity`` included.
        starts_at: ``startsAt``, RFC 3339: with :attr:`fingerprint` it names one episode of
            the alert (a later firing of the same labels starts anew).
        fingerprint: Alertmanager's hash of the labels ("" from a sender that leaves it out).
    """

    name: str
    status: str
    labels: Mapping[str, str] = field(default_factory=dict)
    starts_at: str = ""
    fingerprint: str = ""

    @property
    def firing(self) -> bool:
        """True while the alert fires, False once resolved."""
        return self.status == "firing"

    @property
    def severity(self) -> str:
        """The ``severity`` label (laggard's rules set ``critical`` or ``warning``), or ""."""
        return self.labels.get("severity", "")

    @property
    def key(self) -> str:
        """What identifies the alert across notifications: its fingerprint, else its labels."""
        if self.fingerprint:
            return self.fingerprint
        return json.dumps(sorted(self.labels.items()))


def parse_webhook(body: bytes) -> list[Alert]:
    """Read one webhook POST body.

    Args:
        body: the request body, UTF-8 JSON.

    Returns:
        The notification's alerts, in its order.

    Raises:
        PayloadError: not JSON, not an object, ``version`` other than "4", ``alerts`` missing
            or not a list, or an alert without a string ``alertname`` label or ``status``.
    """
    try:
        doc: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PayloadError("not a JSON object")
    if str(doc.get("version")) != PAYLOAD_VERSION:
        raise PayloadError(f"payload version {doc.get('version')!r}, expected "
                           f"{PAYLOAD_VERSION!r}")
    items = doc.get("alerts")
    if not isinstance(items, list):
        raise PayloadError("no 'alerts' list")
    return [_alert(item, i) for i, item in enumerate(items)]


def _alert(item: Any, index: int) -> Alert:
    if not isinstance(item, dict):
        raise PayloadError(f"alert {index} is not an object")
    labels = item.get("labels")
    status = item.get("status")
    if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
        raise PayloadError(f"alert {index} has no alertname label")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"alert {index} has status {status!r}")
    return Alert(name=labels["alertname"], status=status,
                 labels={str(k): str(v) for k, v in labels.items()},
                 starts_at=str(item.get("startsAt", "")),
                 fingerprint=str(item.get("fingerprint", "")))
