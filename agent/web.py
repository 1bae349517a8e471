"""The agent's HTTP side: ``/metrics``, ``/findings``, a landing page at ``/``, 404 elsewhere.

Paths follow node_exporter: a short HTML page at ``/`` linking to what is served, ``/metrics``
for Prometheus, and 404 for anything else (a typo in a scrape config should fail loudly, not
scrape the metrics page under another path). The HTTP server is prometheus_client's own
(``ThreadingWSGIServer`` with its silent handler, the address family chosen as its
``start_wsgi_server`` does); laggard adds only a WSGI application that dispatches by path, with
the library's ``make_wsgi_app`` at ``/metrics``.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, make_wsgi_app

# The library's own server pieces, as its start_wsgi_server puts them together (two are private
# names, in every release this package accepts, >=0.17: tests/agent/test_web.py would fail).
from prometheus_client.exposition import (
    ThreadingWSGIServer,
    _get_best_family,
    _SilentHandler,
)

from laggard import __version__
from laggard.agent.context import FindingLog
from laggard.agent.exposition import render

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


def make_app(registry: CollectorRegistry, findings: FindingLog,
             prebuilt: Callable[[], bytes] | None = None) -> Callable[..., Iterable[bytes]]:
    """The WSGI application of the agent.

    Args:
        registry: what ``/metrics`` serves.
        findings: what ``/findings`` serves: :meth:`FindingLog.recent` as a JSON list (one
            entry per finding with its ``first_seen``, ``last_seen`` and ``count``).
        prebuilt: text exposition rendered before the scrape (the collectors' last rounds),
            served ahead of the registry's; with it ``/metrics`` always answers in the text
            format 0.0.4 (as node_exporter does by default), which Prometheus accepts whatever
            it asks first.

    Returns:
        A WSGI callable.
    """
    metrics_app = make_wsgi_app(registry) if prebuilt is None else _text_app(registry, prebuilt)

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


def _text_app(registry: CollectorRegistry, prebuilt: Callable[[], bytes]
              ) -> Callable[..., Iterable[bytes]]:
    """``/metrics`` as prebuilt text followed by the registry's, gzipped when the client
    accepts it (level 1: Prometheus asks for gzip on every scrape, and level 1 costs a fraction
    of the library's default 9 for a few percent more bytes on loopback-sized bodies)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = prebuilt() + render(registry.collect())
        headers = [("Content-Type", CONTENT_TYPE_LATEST)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


def make_http_server(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> WSGIServer:
    """Bind prometheus_client's threading WSGI server on ``host:port``, IPv4 or IPv6 as the host
    says.

    The server, its silent request handler and the choice of address family are the library's
    own, as ``prometheus_client.start_wsgi_server`` puts them together (one thread per request,
    so a slow client cannot hold up Prometheus' scrape; no request log): the first family
    ``getaddrinfo`` gives for the host (``::1`` and ``::`` bind IPv6, names resolve). Only the
    application differs: :func:`make_app` mounts ``/findings`` and ``/`` beside ``/metrics``.

    Args:
        host: address or name to bind (``0.0.0.0``, ``::``, ``127.0.0.1``, ``::1``...).
        port: TCP port; 0 picks a free one.
        app: the WSGI application.

    Returns:
        The bound server (call ``serve_forever`` to run it).

    Raises:
        OSError: the address cannot be resolved or bound.
    """

    class Server(ThreadingWSGIServer):
        """prometheus_client's server with this host's address family (a class attribute)."""

    Server.address_family, address = _get_best_family(host, port)
    return make_server(str(address), port, app, Server, handler_class=_SilentHandler)
