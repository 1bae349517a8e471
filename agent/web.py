"""The agent's HTTP side: ``/metrics``, ``/findings``, a landing page at ``/``, 404 elsewhere.

Paths follow node_exporter: a short HTML page at ``/`` linking to what is served, ``/metrics``
for Prometheus, and 404 for anything else (a typo in a scrape config should fail loudly, not
scrape the metrics page under another path). The listen address may be IPv4 or IPv6; the address
family is chosen as prometheus_client's ``start_http_server`` does.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from laggard import __version__
from laggard.agent.context import FindingLog

_LANDING_PAGE = f"""<!DOCTYPE html>
<html><head><title>laggard agent</title></head>
<body><h1>laggard agent {__version__}</h1>
<p>Straggler and GPU health metrics of this node.</p>
<ul><li><a href="metrics">metrics</a></li><li><a href="findings">findings</a> (JSON)</li></ul>
</body></html>
""".encode()


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, for RFC 8259 JSON.

    ``json.dumps`` writes NaN and Infinity as bare ``NaN`` / ``Infinity``, which strict parsers
    (browsers, jq, Go) reject; evidence from the wire may hold them.

    Args:
        value: a JSON-like structure (dicts, lists, scalars).

    Returns:
        A copy in which NaN, inf and -inf are None.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def make_app(registry: CollectorRegistry, findings: FindingLog
             ) -> Callable[..., Iterable[bytes]]:
    """The WSGI application of the agent.

    Args:
        registry: what ``/metrics`` serves.
        findings: what ``/findings`` serves: :meth:`FindingLog.recent` as a JSON list (one
            entry per finding with its ``first_seen``, ``last_seen`` and ``count``).

    Returns:
        A WSGI callable.
    """
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/findings":
            body = json.dumps(strict_json(findings.recent()), default=str,
                              allow_nan=False).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path in ("/", ""):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [_LANDING_PAGE]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"404 page not found\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _ThreadingWSGIServer(WSGIServer):
    # One thread per request, as prometheus_client's own server does: a slow client cannot hold
    # up Prometheus' scrape.
    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        threading.Thread(target=self._handle, args=(request, client_address),
                         daemon=True).start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)


def make_http_server(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> WSGIServer:
    """Bind a threading WSGI server on ``host:port``, IPv4 or IPv6 as the host says.

    The family is the first that ``getaddrinfo`` gives for the host, as prometheus_client's
    ``start_http_server`` chooses it (``::1`` and ``::`` bind IPv6, names resolve).

    Args:
        host: address or name to bind (``0.0.0.0``, ``::``, ``127.0.0.1``, ``::1``...).
        port: TCP port; 0 picks a free one.
        app: the WSGI application.

    Returns:
        The bound server (call ``serve_forever`` to run it).

    Raises:
        OSError: the address cannot be resolved or bound.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Server(_ThreadingWSGIServer):
        address_family = family

    return make_server(str(sockaddr[0]), port, app, Server, _QuietHandler)
