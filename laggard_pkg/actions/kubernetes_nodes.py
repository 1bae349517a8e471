"""Cordon and taint a Kubernetes node with the official ``kubernetes`` client (``pip install
'laggard[kubernetes]'``), and undo only what laggard did.

Quarantine is one ``CoreV1Api.patch_node`` (a strategic-merge patch): ``spec.unschedulable``
true (what ``kubectl cordon`` sets), the taint ``laggard.io/quarantine=<kind>:NoSchedule``
added to the node's taints (the list is replaced whole by a patch, so the node's other taints
are read first and kept), and the annotation ``laggard.io/reason`` holding the structured reason.
NoSchedule, not NoExecute: running pods are not evicted (draining them is the operator's call,
``kubectl drain``); new ones do not land there. The annotation is how laggard knows the
quarantine is its own: release removes only laggard's taint and annotation, and uncordons only a
node laggard cordoned. A node cordoned by someone else is left alone.

In dry-run the exact call is written on the audit line (``would_act``) and nothing is sent but
the read of the node (with no cluster configuration at all, the node is not read and the body
shows laggard's taint alone).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from laggard.actions.audit import Decision, record
from laggard.actions.slurm import is_laggard_reason

TAINT_KEY = "laggard.io/quarantine"
REASON_ANNOTATION = "laggard.io/reason"
#: The taint's value must be a label value (63 characters of [A-Za-z0-9_.-]).
_TAINT_VALUE_CHARS = 63


def load_api() -> Any:
    """A ``kubernetes.client.CoreV1Api`` from the in-cluster service account, else the
    kubeconfig (``KUBECONFIG``, ``~/.kube/config``).

    Raises:
        ImportError: the ``kubernetes`` package is not installed.
        kubernetes.config.ConfigException: neither configuration is there.
    """
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def _taint_value(reason: str) -> str:
    kind = reason.split(":")[1] if reason.count(":") >= 1 else "quarantine"
    clean = "".join(c if c.isalnum() or c in "_.-" else "_" for c in kind)
    return clean[:_TAINT_VALUE_CHARS].strip("_.-") or "quarantine"


class KubernetesNodes:
    """Cordon + taint (quarantine) and uncordon + untaint (release) through the API server.

    Args:
        act: send the patches; False (the default) records the exact call, sends nothing.
        api: a ``CoreV1Api``; None: :func:`load_api` on first use (in a dry run, a missing
            configuration is not an error: the node is simply not read).
        source: written on each audit line.
        log: the audit logger; ``laggard.audit`` when None.
    """

    name = "cordon"
    release_name = "uncordon"

    def __init__(self, *, act: bool = False, api: Any = None, source: str = "remediate",
                 log: logging.Logger | None = None) -> None:
        self.act = act
        self._api = api
        self.source = source
        self.log = log

    def _client(self) -> Any:
        if self._api is None:
            self._api = load_api()
        return self._api

    def _read(self, node: str) -> tuple[bool, list[dict[str, Any]], str] | None:
        """(unschedulable, taints, laggard's annotation) of the node; None in a dry run
        without a cluster configuration. Raises what the client raises otherwise."""
        try:
            api = self._client()
        except Exception:
            if self.act:
                raise
            return None
        obj = api.read_node(node)
        taints = [api.api_client.sanitize_for_serialization(t) for t in (obj.spec.taints or [])]
        annotations = obj.metadata.annotations or {}
        return bool(obj.spec.unschedulable), taints, annotations.get(REASON_ANNOTATION, "")

    def _decide(self, action: str, node: str, why: str, reason: str,
                body: dict[str, Any] | None, skip: str | None, note: str = "") -> Decision:
        def decision(outcome: str, detail: str) -> Decision:
            return record(Decision(action=action, target=node, outcome=outcome, why=why,
                                   reason=reason, detail=detail, source=self.source),
                          log=self.log)

        if skip is not None or body is None:
            return decision("skipped", skip or "")
        call = f"CoreV1Api.patch_node(name={node!r}, body={json.dumps(body, sort_keys=True)})"
        if not self.act:
            return decision("would_act", call + note)
        try:
            self._client().patch_node(node, body)
        except Exception as exc:  # ApiException, urllib3 errors: recorded, never raised
            return decision("failed", f"{call}: {exc}".replace("\n", " "))
        return decision("acted", call)

    def quarantine(self, node: str, reason: str, *, why: str) -> Decision:
        """Cordon ``node``, add laggard's taint and reason; skipped when laggard holds it
        already or someone else cordoned it. Never raises."""
        try:
            state = self._read(node)
        except Exception as exc:
            return self._fail("cordon", node, why, reason, exc)
        note, skip = "", None
        taints: list[dict[str, Any]] = []
        if state is None:
            note = " (node not read: no cluster configuration; its other taints would be kept)"
        else:
            unschedulable, taints, ours = state
            if is_laggard_reason(ours):
                skip = f"already quarantined by laggard ({ours})"
            elif unschedulable:
                skip = "cordoned by someone else: left alone"
        taint = {"key": TAINT_KEY, "value": _taint_value(reason), "effect": "NoSchedule"}
        body = {"metadata": {"annotations": {REASON_ANNOTATION: reason}},
                "spec": {"unschedulable": True,
                         "taints": [t for t in taints if t.get("key") != TAINT_KEY] + [taint]}}
        return self._decide("cordon", node, why, reason, body, skip, note)

    def release(self, node: str, *, why: str) -> Decision:
        """Remove laggard's taint and annotation and uncordon ``node``, only if laggard's
        annotation is on it. Never raises."""
        try:
            state = self._read(node)
        except Exception as exc:
            return self._fail("uncordon", node, why, "", exc)
        if state is None:
            return self._decide("uncordon", node, why, "", None,
                                "node not read (no cluster configuration): cannot tell "
                                "whether laggard quarantined it")
        _, taints, ours = state
        if not is_laggard_reason(ours):
            return self._decide("uncordon", node, why, "", None,
                                "not quarantined by laggard (no laggard.io/reason annotation)")
        body = {"metadata": {"annotations": {REASON_ANNOTATION: None}},
                "spec": {"unschedulable": False,
                         "taints": [t for t in taints if t.get("key") != TAINT_KEY]}}
        return self._decide("uncordon", node, why, ours, body, None)

    def held_reason(self, node: str) -> str:
        """laggard's ``laggard.io/reason`` annotation on the node ("" when absent or the node
        cannot be read)."""
        try:
            state = self._read(node)
        except Exception:
            return ""
        return state[2] if state is not None and is_laggard_reason(state[2]) else ""

    def _fail(self, action: str, node: str, why: str, reason: str, exc: Exception) -> Decision:
        return record(Decision(action=action, target=node, outcome="failed", why=why,
                               reason=reason, detail=f"read_node: {exc}".replace("\n", " "),
                               source=self.source), log=self.log)
