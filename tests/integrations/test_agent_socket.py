"""The training side's sender: LAGGARD_INTAKE or the configured target (used as given), UDP on
loopback when the socket is absent, a full queue reported as BlockingIOError, and a reconnection
after the agent was restarted (a new socket at the path) or once it started (UDP until then)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from support import budget

from laggard.integrations.agent_socket import AgentSocket, check_intake_target
from laggard.wire import DEFAULT_INTAKE_ADDRESS


def _receiver(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(budget(2))
    return sock


@pytest.fixture
def udp_receiver():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(budget(2))
        yield sock


def test_the_environment_names_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    with _receiver(path) as receiver:
        sender = AgentSocket("127.0.0.1:9", environ={"LAGGARD_INTAKE": str(path)})
        assert sender.target == f"unix:{path}"
        sender.send(b"step")
        assert receiver.recv(100) == b"step"
        sender.close()


def test_a_configured_unix_target(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    with _receiver(path) as receiver:
        sender = AgentSocket(f"unix:{path}", environ={})
        sender.send(b"x")
        assert receiver.recv(10) == b"x"
        sender.close()


def test_no_socket_falls_back_to_udp(tmp_path: Path, udp_receiver: socket.socket) -> None:
    port = udp_receiver.getsockname()[1]
    sender = AgentSocket(str(tmp_path / "absent.sock"), environ={},
                         udp_fallback=f"127.0.0.1:{port}")
    assert sender.target == f"udp:127.0.0.1:{port}"
    sender.send(b"over udp")
    assert udp_receiver.recv(100) == b"over udp"
    sender.close()
    with pytest.raises(FileNotFoundError):
        AgentSocket(str(tmp_path / "absent.sock"), environ={}, udp_fallback="")


def test_an_address_is_used_as_given(tmp_path: Path) -> None:
    sender = AgentSocket(DEFAULT_INTAKE_ADDRESS, environ={})
    assert sender.target == f"udp:{DEFAULT_INTAKE_ADDRESS}"
    sender.close()


def test_the_socket_is_tried_again_after_falling_back(tmp_path: Path,
                                                      udp_receiver: socket.socket) -> None:
    # A job started before its agent: UDP on loopback until the socket appears.
    path = tmp_path / "intake.sock"
    sender = AgentSocket(str(path), environ={}, udp_fallback="127.0.0.1:9")  # nothing there
    assert sender.target == "udp:127.0.0.1:9"
    with _receiver(path) as receiver:
        # UDP reports the closed port on the next send (ECONNREFUSED): the sender then tries
        # the socket again, finds it, and sends that datagram there.
        for _ in range(50):
            time.sleep(0.01)  # for the ICMP port-unreachable to come back
            try:
                sender.send(b"x")
            except ConnectionRefusedError:
                pytest.fail("the socket was there to fall back on")
            if sender.target == f"unix:{path}":
                break
        assert sender.target == f"unix:{path}"
        assert receiver.recv(100) == b"x"
    sender.close()


def test_a_full_queue_is_blocking_io_error(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    with _receiver(path):
        sender = AgentSocket(str(path), environ={})
        with pytest.raises(BlockingIOError):
            for _ in range(100_000):  # net.unix.max_dgram_qlen, or the send buffer
                sender.send(b"x" * 512)
        sender.close()


def test_a_restarted_agent_is_reconnected_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    now = [0.0]
    first = _receiver(path)
    sender = AgentSocket(str(path), environ={}, udp_fallback="", clock=lambda: now[0])
    sender.send(b"one")
    assert first.recv(10) == b"one"
    first.close()
    os.unlink(path)
    with pytest.raises(OSError):  # nothing there: the reconnection fails, the error is raised
        sender.send(b"lost")
    with _receiver(path) as second:
        with pytest.raises(OSError):  # within the second: no new attempt
            sender.send(b"lost too")
        now[0] = 1.5
        sender.send(b"two")
        assert second.recv(10) == b"two"
        sender.send(b"three")
        assert second.recv(10) == b"three"
    sender.close()


@pytest.mark.parametrize("target", ["unix:", "nohost", "host:port", ""])
def test_bad_targets_raise(target: str) -> None:
    with pytest.raises(ValueError):
        check_intake_target(target)


def test_good_targets(tmp_path: Path) -> None:
    for target in ("/run/laggard/intake.sock", "unix:rel.sock", "127.0.0.1:9478", "[::1]:9"):
        check_intake_target(target)
