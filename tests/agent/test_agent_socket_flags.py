"""``laggard agent``'s intake flags on the real process: the Unix socket at the path and mode the
flags say, fed by the training side's sender; a path that is not a socket, or a UDP intake on a
non-loopback address without ``--intake.udp-allow-remote``, stops it with exit status 2."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import budget, wait_for

from laggard.agent.config import AgentConfig
from laggard.integrations.agent_socket import AgentSocket
from laggard.wire import StepRecord


def _value(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _run_agent(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "laggard.cli", "agent", "--web.listen-address",
                           "127.0.0.1:0", "--no-collector.host", *flags],
                          capture_output=True, text=True, timeout=budget(30))


def test_the_socket_has_the_flags_mode_and_takes_the_senders_records(agent_factory,
                                                                     tmp_path: Path) -> None:
    path = tmp_path / "run" / "intake.sock"
    # --intake.rank-histograms: the checks here read each rank's counters and progress
    # (laggard_steps_total...), outside the default series set since issue 34
    agent = agent_factory("--intake.rank-histograms",
                          "--intake.socket", str(path), "--intake.socket-mode", "0620",
                          "--intake.allow-uids", f"{os.getuid()}")
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o620
    sender = AgentSocket("127.0.0.1:9", environ={"LAGGARD_INTAKE": str(path)})
    for step in range(3):
        sender.send(StepRecord(rank=0, world_size=1, step=step).encode())
    sender.close()
    assert wait_for(lambda: _value(agent.scrape(), "laggard_steps_total", {"rank": "0"}) == 3)
    text = agent.scrape()
    # the sender's cgroup was read once, then cached
    assert _value(text, "laggard_intake_sender_lookups_total", {"result": "read"}) == 1
    assert _value(text, "laggard_intake_sender_lookups_total", {"result": "cached"}) == 2
    # none refused: the reason's series appears with its first count
    assert _value(text, "laggard_intake_rejected_total", {"reason": "sender_not_allowed"}) is None


def test_a_non_socket_at_the_path_stops_the_agent(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    path.write_text("not a socket")
    result = _run_agent("--intake.socket", str(path))
    assert result.returncode == 2
    assert "not a socket" in result.stderr
    assert path.read_text() == "not a socket"


def test_udp_on_a_non_loopback_address_needs_its_flag(tmp_path: Path) -> None:
    result = _run_agent("--intake.socket", "", "--intake.address", "0.0.0.0:0")
    assert result.returncode == 2
    assert "--intake.udp-allow-remote" in result.stderr
    with pytest.raises(ValueError, match="not a loopback"):
        AgentConfig(intake_address="[::]:9478")
    for address in ("127.0.0.1:9478", "[::1]:9478", "localhost:9478", "127.0.0.2:1"):
        AgentConfig(intake_address=address)
    AgentConfig(intake_address="0.0.0.0:9478", intake_udp_remote=True)


def test_a_bad_mode_or_id_list_is_a_usage_error() -> None:
    for flags in (("--intake.socket-mode", "rw"), ("--intake.socket-mode", "1777"),
                  ("--intake.allow-uids", "root")):
        result = _run_agent("--intake.socket", "", *flags)
        assert result.returncode == 2, flags
