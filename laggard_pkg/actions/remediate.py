"""``laggard remediate``: an Alertmanager webhook receiver that takes the nodes laggard's
alerts name out of service, dry-run unless ``--act``.

The HTTP side is the standard library's :class:`http.server.ThreadingHTTPServer`:

- ``POST /alerts`` (or ``/``): one webhook notification (payload version 4,
  :mod:`laggard.actions.alertmanager`); answers 200 with the decisions as JSON, 400 when the body
  is not such a payload (Alertmanager logs it; a retry would not help), 401 without the bearer
  token of ``--web.bearer-token-file`` (RFC 6750) when one is set, 500 when deciding failed
  (Alertmanager retries);
- ``GET /held``: the nodes laggard holds and why, as JSON; ``GET /-/healthy``: 200.

What is decided is :mod:`laggard.actions.remediator`'s; each decision is one audit line on the
``laggard.audit`` logger (stderr, and ``--audit-log``).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import sys
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from laggard.actions.alertmanager import PayloadError, parse_webhook
from laggard.actions.audit import AUDIT_LOGGER
from laggard.actions.exclude_file import ExcludeFile
from laggard.actions.kubernetes_nodes import KubernetesNodes
from laggard.actions.locate import Locator
from laggard.actions.node_actions import NodeAction, SlurmNodes
from laggard.actions.remediator import Config, Remediator
from laggard.actions.slurm import Slurm

_log = logging.getLogger(__name__)
#: Largest webhook body read, in bytes (Alertmanager's groups are far smaller).
MAX_BODY_BYTES = 4 << 20


def make_handler(remediator: Remediator,
                 token: str | None = None) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``remediator``; with ``token``, a POST must carry
    ``Authorization: Bearer <token>`` (compared in constant time)."""
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        server_version = "laggard-remediate"

        def _reply(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path not in ("/", "/alerts"):
                self._reply(404, {"error": "POST /alerts"})
                return
            given = self.headers.get("Authorization", "").encode()
            if expected is not None and not hmac.compare_digest(given, expected):
                _log.warning("remediate: refused a webhook from %s: no valid bearer token",
                             self.client_address[0])
                self._reply(401, {"error": "a bearer token is required"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._reply(413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
                return
            try:
                alerts = parse_webhook(self.rfile.read(length))
            except PayloadError as exc:
                _log.warning("remediate: refused a webhook body: %s", exc)
                self._reply(400, {"error": str(exc)})
                return
            try:
                decisions = remediator.handle(alerts)
            except Exception as exc:  # a bug must not take the receiver down
                _log.exception("remediate: deciding failed")
                self._reply(500, {"error": str(exc)})
                return
            self._reply(200, {"decisions": [asdict(d) for d in decisions]})

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/-/healthy":
                self._reply(200, {"status": "ok"})
            elif self.path == "/held":
                self._reply(200, remediator.held())
            else:
                self._reply(404, {"error": "GET /held or /-/healthy"})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            _log.debug("remediate: %s", format % args)

    return Handler


def build_action(args: argparse.Namespace) -> NodeAction:
    """The node action the flags chose.

    Raises:
        SystemExit: ``--action exclude-file`` without ``--exclude-file``.
    """
    if args.action == "kubernetes":
        return KubernetesNodes(act=args.act)
    if args.action == "exclude-file":
        if not args.exclude_file:
            raise SystemExit("laggard remediate: --action exclude-file needs --exclude-file")
        return ExcludeFile(Path(args.exclude_file), act=args.act,
                           hosts=Path(args.hosts) if args.hosts else None,
                           hostfile=Path(args.hostfile) if args.hostfile else None)
    return SlurmNodes(Slurm(act=args.act, scontrol=args.scontrol, source="remediate"))


def _setup_audit_log(path: str | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if path:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger(AUDIT_LOGGER).addHandler(handler)


def serve(remediator: Remediator, host: str, port: int,
          token: str | None = None) -> ThreadingHTTPServer:
    """Bind the receiver (port 0: a free one) and serve it on a daemon thread."""
    server = ThreadingHTTPServer((host, port), make_handler(remediator, token))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="remediate-http", daemon=True).start()
    return server


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit status (2 on a bad flag or address)."""
    _setup_audit_log(args.audit_log)
    if args.max_nodes_per_hour < 1:
        print(f"laggard remediate: --max-nodes-per-hour must be >= 1, not "
              f"{args.max_nodes_per_hour}", file=sys.stderr)
        return 2
    if not 0 < args.max_job_percent <= 100:
        print(f"laggard remediate: --max-job-percent must be in (0, 100], not "
              f"{args.max_job_percent:g}", file=sys.stderr)
        return 2
    if args.action == "exclude-file" and not args.exclude_file:
        print("laggard remediate: --action exclude-file needs --exclude-file", file=sys.stderr)
        return 2
    host, _, port_text = args.listen_address.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        print(f"laggard remediate: --web.listen-address {args.listen_address}: not HOST:PORT",
              file=sys.stderr)
        return 2
    token = None
    if args.bearer_token_file:
        try:
            token = Path(args.bearer_token_file).read_text().strip()
        except OSError as exc:
            print(f"laggard remediate: --web.bearer-token-file: {exc}", file=sys.stderr)
            return 2
        if not token:
            print(f"laggard remediate: --web.bearer-token-file {args.bearer_token_file} is "
                  "empty", file=sys.stderr)
            return 2
    remediator = Remediator(
        build_action(args), Locator(args.prometheus_url),
        Config(max_nodes_per_hour=args.max_nodes_per_hour,
               max_job_percent=args.max_job_percent, act_on_warning=args.act_on_warning))
    try:
        server = serve(remediator, host.strip("[]") or "127.0.0.1", port, token)
    except OSError as exc:
        print(f"laggard remediate: --web.listen-address {args.listen_address}: {exc}",
              file=sys.stderr)
        return 2
    if args.prometheus_url is None and args.max_job_percent < 100:
        # without Prometheus neither a run's nodes nor an alert's rank can be looked up
        print("laggard remediate: warning: no --prometheus-url: the job-share guard cannot "
              "count a run's nodes, so every decision is skipped (give --prometheus-url, or "
              "--max-job-percent 100 to go without the guard)", file=sys.stderr, flush=True)
    bound_host, bound_port = server.server_address[:2]
    print(f"laggard remediate: listening on http://{bound_host!s}:{bound_port}/alerts "
          f"({args.action}, {'ACTING' if args.act else 'dry run'})", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0
