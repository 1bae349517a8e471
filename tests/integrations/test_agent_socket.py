"""The training side's sender: LAGGARD_INTAKE or the configured target (used as given), no UDP
unless configured (Config or LAGGARD_UDP_FALLBACK), a full queue reported as BlockingIOError, and
the socket tried again with backoff and returned to after the agent was restarted (a new socket
at the path) or once it started (the configured UDP until then)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from support import budget, wait_for

from laggard.integrations.agent_socket import (
    RETRY_INITIAL_SECONDS,
    RETRY_MAX_SECONDS,
    UDP_FALLBACK_ENV,
    AgentSocket,
    check_intake_target,
)
from laggard.wire import DEFAULT_INTAKE_ADDRESS, parse_address


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


def test_no_socket_falls_back_to_a_configured_udp(tmp_path: Path,
                                                  udp_receiver: socket.socket) -> None:
    port = udp_receiver.getsockname()[1]
    for kwargs, environ in (({"udp_fallback": f"127.0.0.1:{port}"}, {}),
                            ({}, {UDP_FALLBACK_ENV: f"127.0.0.1:{port}"})):
        sender = AgentSocket(str(tmp_path / "absent.sock"), environ=environ, **kwargs)
        assert sender.target == f"udp:127.0.0.1:{port}"
        sender.send(b"over udp")
        assert udp_receiver.recv(100) == b"over udp"
        sender.close()


def test_no_udp_unless_configured(tmp_path: Path) -> None:
    # A listener where the old default fallback sent (any local user may bind it), else on a
    # free port: nothing reaches it, and the send says the socket is not there.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        try:
            listener.bind(parse_address(DEFAULT_INTAKE_ADDRESS))
        except OSError:
            listener.bind(("127.0.0.1", 0))
        listener.settimeout(0.3)
        logged: list[tuple[str, str]] = []
        sender = AgentSocket(str(tmp_path / "absent.sock"), environ={},
                             log_change=lambda key, msg, *a: logged.append((key, msg % a)))
        assert sender.target == "" and sender.wanted == f"unix:{tmp_path / 'absent.sock'}"
        for _ in range(3):
            with pytest.raises(OSError) as info:
                sender.send(b"secret")
            assert info.value.errno == errno.ENOTCONN
        with pytest.raises(TimeoutError):
            listener.recv(100)
        sender.close()
    # the log names the socket it wanted and that nothing is sent elsewhere
    assert len(logged) == 1 and str(tmp_path / "absent.sock") in logged[0][1]
    assert "no UDP fallback" in logged[0][1]


def test_an_address_is_used_as_given(tmp_path: Path) -> None:
    sender = AgentSocket(DEFAULT_INTAKE_ADDRESS, environ={})
    assert sender.target == f"udp:{DEFAULT_INTAKE_ADDRESS}"
    sender.close()


def test_the_socket_is_returned_to_from_the_configured_udp(tmp_path: Path,
                                                           udp_receiver: socket.socket) -> None:
    # A job started before its agent: the configured UDP until the socket appears, then back.
    path = tmp_path / "intake.sock"
    port = udp_receiver.getsockname()[1]
    now = [0.0]
    logged: list[str] = []
    sender = AgentSocket(str(path), environ={}, udp_fallback=f"127.0.0.1:{port}",
                         clock=lambda: now[0], log_change=lambda k, msg, *a: logged.append(msg % a))
    assert sender.target == f"udp:127.0.0.1:{port}"
    sender.send(b"before")
    assert udp_receiver.recv(100) == b"before"
    with _receiver(path) as receiver:
        now[0] += RETRY_INITIAL_SECONDS  # the next try is due: the socket is there
        sender.send(b"x")
        assert sender.target == f"unix:{path}"
        assert receiver.recv(100) == b"x"
    assert f"udp:127.0.0.1:{port}" in logged[0] and f"unix:{path}" in logged[-1]
    sender.close()


def test_a_full_queue_is_blocking_io_error(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    with _receiver(path):
        sender = AgentSocket(str(path), environ={})
        with pytest.raises(BlockingIOError):
            for _ in range(100_000):  # net.unix.max_dgram_qlen, or the send buffer
                sender.send(b"x" * 512)
        sender.close()


def test_a_restarted_agent_is_reconnected_with_backoff(tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    now = [0.0]
    first = _receiver(path)
    sender = AgentSocket(str(path), environ={}, clock=lambda: now[0])
    sender.send(b"one")
    assert first.recv(10) == b"one"
    first.close()
    os.unlink(path)
    with pytest.raises(OSError):  # nothing there: the reconnection fails, the error is raised
        sender.send(b"lost")
    assert sender.target == ""
    # Each failed try doubles the wait, up to RETRY_MAX_SECONDS.
    tries = []
    scheduled = sender._next_retry
    while now[0] < 30:
        now[0] = round(now[0] + 0.05, 2)
        with pytest.raises(OSError):
            sender.send(b"lost too")
        if sender._next_retry != scheduled:  # a try was made now
            tries.append(now[0])
            scheduled = sender._next_retry
    delays = [round(b - a, 2) for a, b in zip(tries, tries[1:], strict=False)]
    assert delays == sorted(delays) and delays[0] < 1
    assert max(delays) <= RETRY_MAX_SECONDS + 0.05 and delays[-1] >= RETRY_MAX_SECONDS - 0.05
    with _receiver(path) as second:
        with pytest.raises(OSError):  # not yet due: no new attempt
            sender.send(b"lost too")
        now[0] += RETRY_MAX_SECONDS  # back within the longest backoff
        sender.send(b"two")
        assert sender.target == f"unix:{path}"
        assert second.recv(10) == b"two"
        sender.send(b"three")
        assert second.recv(10) == b"three"
        # a restart: a new socket at the same path is reached at once, without waiting
        second.close()
        os.unlink(path)
        with _receiver(path) as third:
            sender.send(b"four")
            assert third.recv(10) == b"four"
    sender.close()


@pytest.mark.parametrize("target", ["unix:", "nohost", "host:port", ""])
def test_bad_targets_raise(target: str) -> None:
    with pytest.raises(ValueError):
        check_intake_target(target)


def test_good_targets(tmp_path: Path) -> None:
    for target in ("/run/laggard/intake.sock", "unix:rel.sock", "127.0.0.1:9478", "[::1]:9"):
        check_intake_target(target)


def test_a_removed_socket_sends_nothing_to_udp_and_is_returned_to_within_the_backoff(
        tmp_path: Path) -> None:
    path = tmp_path / "intake.sock"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        try:  # where the old default fallback sent, else any loopback port
            listener.bind(parse_address(DEFAULT_INTAKE_ADDRESS))
        except OSError:
            listener.bind(("127.0.0.1", 0))
        first = _receiver(path)
        sender = AgentSocket(str(path), environ={})  # the real clock
        sender.send(b"a")
        assert first.recv(10) == b"a"
        first.close()
        os.unlink(path)  # the agent went away
        for _ in range(5):
            with pytest.raises(OSError):
                sender.send(b"secret")
        listener.settimeout(0.3)
        with pytest.raises(TimeoutError):
            listener.recv(100)

        def sent() -> bool:
            try:
                sender.send(b"b")
            except OSError:
                return False
            return True

        with _receiver(path) as second:  # the agent is back
            assert wait_for(sent, timeout=RETRY_MAX_SECONDS + 1)
            assert sender.target == f"unix:{path}" and second.recv(10) == b"b"
        sender.close()
