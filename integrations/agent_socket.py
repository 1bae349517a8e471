"""Where a training process sends its datagrams: the agent's socket (a Unix datagram socket),
else UDP on loopback.

The agent's socket, its default intake, is a Unix datagram socket
(``/run/laggard/intake.sock``; in Kubernetes the DaemonSet's hostPath mounted into the training
pod), where the kernel tells the agent each sender's pid and uid. The target comes from the
``LAGGARD_INTAKE`` environment variable, else from the monitor's configuration: a socket path
(``/run/...`` or ``unix:PATH``) or a UDP ``host:port``, used as given. A socket that cannot be
connected (no agent yet, a node without the socket) falls back to UDP on loopback, and the
socket is tried again on later sends.

Never blocks and never raises on a send it can count: :class:`AgentSocket` is non-blocking
(``BlockingIOError`` when the agent's queue is full, as with UDP) and reconnects, at most once a
second, after the agent went away (a restarted agent binds a new socket: a Unix datagram socket
connected to the old one would fail for good).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from laggard.wire import DEFAULT_INTAKE_ADDRESS, INTAKE_ENV, parse_address

log = logging.getLogger(__name__)

#: Send errors after which the target is resolved and connected again: the agent's socket is
#: gone or was replaced (ECONNREFUSED, ENOTCONN once the kernel disconnected us), or nothing
#: listens on the UDP port yet.
_RECONNECT_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT,
                               errno.ECONNRESET})
#: Seconds between two reconnection attempts.
RECONNECT_INTERVAL_SECONDS = 1.0


def is_socket_path(target: str) -> bool:
    """Whether an intake target names a Unix socket (``/path`` or ``unix:PATH``), not UDP."""
    return target.startswith(("/", "unix:"))


def socket_path(target: str) -> str:
    """The file system path of a Unix socket target (``unix:`` removed)."""
    return target.removeprefix("unix:")


def check_intake_target(target: str) -> None:
    """Validate an intake target: a socket path or ``host:port``.

    Raises:
        ValueError: neither (a ``unix:`` with no path, a host without a port).
    """
    if is_socket_path(target):
        if not socket_path(target):
            raise ValueError(f"intake {target!r}: no socket path")
    else:
        parse_address(target)


def intake_target(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """The target to send to: ``LAGGARD_INTAKE`` when set and non-empty, else ``configured``."""
    env = os.environ if environ is None else environ
    return env.get(INTAKE_ENV, "").strip() or configured


class AgentSocket:
    """A non-blocking datagram socket connected to the agent, with what ``socket.send`` offers.

    Args:
        configured: the monitor's target (a socket path or ``host:port``); overridden by
            ``LAGGARD_INTAKE``.
        environ: the environment to read (tests pass a dict); None for ``os.environ``.
        udp_fallback: ``host:port`` tried when a socket target cannot be connected (no agent
            there yet, a node without the socket); empty for none.
        clock: monotonic clock in seconds (tests pass a fake one).

    Attributes:
        target: what it is connected to now: ``unix:PATH`` or ``udp:HOST:PORT``.

    Raises:
        ValueError: the target is neither a socket path nor ``host:port``.
        OSError: nothing could be connected (no socket, no fallback).
    """

    def __init__(self, configured: str, *, environ: Mapping[str, str] | None = None,
                 udp_fallback: str = DEFAULT_INTAKE_ADDRESS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        wanted = intake_target(configured, environ)
        check_intake_target(wanted)
        self._candidates = [wanted]
        if is_socket_path(wanted) and udp_fallback:
            self._candidates.append(udp_fallback)
        self._clock = clock
        self._next_reconnect = 0.0
        self.target = ""
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        """The first candidate that connects (the last one's error raised if none does)."""
        error: OSError | None = None
        for candidate in self._candidates:
            try:
                sock = _open(candidate)
            except OSError as exc:
                error = exc
                continue
            if self.target != _describe(candidate):
                self.target = _describe(candidate)
                log.info("laggard: sending step records to the agent at %s", self.target)
            return sock
        assert error is not None
        raise error

    def send(self, payload: bytes) -> int:
        """Send one datagram; reconnects (once a second at most) if the agent went away.

        Raises:
            BlockingIOError: the agent's receive queue is full (the datagram is dropped).
            OSError: the agent is not there (``ECONNREFUSED``...), after one reconnection.
        """
        try:
            return self._sock.send(payload)
        except BlockingIOError:
            raise
        except OSError as exc:
            if exc.errno not in _RECONNECT_ERRNOS or self._clock() < self._next_reconnect:
                raise
            self._next_reconnect = self._clock() + RECONNECT_INTERVAL_SECONDS
            try:
                sock = self._connect()
            except OSError:
                raise exc from None
            self._sock.close()
            self._sock = sock
            return self._sock.send(payload)

    def fileno(self) -> int:
        """The current socket's descriptor."""
        return self._sock.fileno()

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()


def _describe(target: str) -> str:
    return f"unix:{socket_path(target)}" if is_socket_path(target) else f"udp:{target}"


def _open(target: str) -> socket.socket:
    """A non-blocking datagram socket connected to ``target``."""
    if is_socket_path(target):
        family: socket.AddressFamily = socket.AF_UNIX
        address: str | tuple[str, int] = socket_path(target)
    else:
        host, port = parse_address(target)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = (host, port)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        # connect() fixes the peer: a Unix socket that is absent or has no receiver fails here
        # (ENOENT, ECONNREFUSED, EACCES); a UDP one reports a closed port on a later send.
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock
