"""Bad flags of ``laggard healthcheck`` and ``laggard remediate`` on the real command line: the
healthcheck says UNKNOWN on stdout (node-problem-detector's message) and exits 2; remediate
refuses guards that cannot work, before it listens."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import budget

from laggard.actions.healthcheck import read_agent


def _laggard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "laggard.cli", *args], capture_output=True,
                          text=True, timeout=budget(60))


@pytest.mark.parametrize("flags", [["--bogus"], ["--timeout", "-1"], ["--timeout", "abc"],
                                   ["--xid-max-age", "-3"]])
def test_a_bad_healthcheck_flag_is_an_unknown_line_and_exit_2(flags):
    proc = _laggard("healthcheck", *flags)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.startswith("UNKNOWN: bad flag: "), proc.stdout
    assert len(proc.stdout.splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--max-job-percent", "-5"], "--max-job-percent must be in (0, 100]"),
    (["--max-job-percent", "150"], "--max-job-percent must be in (0, 100]"),
    (["--max-nodes-per-hour", "0"], "--max-nodes-per-hour must be >= 1"),
    (["--action", "exclude-file"], "--action exclude-file needs --exclude-file"),
])
def test_remediate_refuses_guards_that_cannot_work(flags, message):
    proc = _laggard("remediate", "--web.listen-address", "127.0.0.1:0", *flags)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "listening" not in proc.stdout


class _Agent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = {"/metrics": b"laggard_agent_info{node=\"n1\"} 1\n",
                "/findings": json.dumps([]).encode()}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("suffix", ["", "/", "/metrics", "/findings"])
def test_the_agent_address_may_be_given_with_its_page(suffix):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address[:2]
        samples, findings = read_agent(f"http://{host!s}:{port}{suffix}", budget(10))
    finally:
        server.shutdown()
        server.server_close()
    assert [s.name for s in samples] == ["laggard_agent_info"] and findings == []
