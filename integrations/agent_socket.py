"""Where a training process sends its datagrams: the agent's socket (a Unix datagram socket),
or UDP where configured.

The agent's socket, its default intake, is a Unix datagram socket
(``/run/laggard/intake.sock``; in Kubernetes the DaemonSet's hostPath mounted into the training
pod), where the kernel tells the agent each sender's pid and uid. The target comes from the
``LAGGARD_INTAKE`` environment variable, else from the monitor's configuration: a socket path
(``/run/...`` or ``unix:PATH``) or a UDP ``host:port``, used as given.

A socket that cannot be reached (no agent yet, an agent restarting, a node without the socket)
is tried again with backoff (:data:`RETRY_INITIAL_SECONDS` doubling to
:data:`RETRY_MAX_SECONDS`) on later sends, and returned to as soon as it connects. Meanwhile
nothing is sent, unless a UDP fallback is configured (``MonitorConfig.udp_fallback`` or
``$LAGGARD_UDP_FALLBACK``): any local user may bind a UDP port and read what is sent there, so
there is no UDP by default. The log names each change of target (the socket path, the UDP
address, or none).

Never blocks and never raises on a send it can count: :class:`AgentSocket` is non-blocking
(``BlockingIOError`` when the agent's queue is full, as with UDP); thread-safe (the training
thread and the heartbeat thread share it).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from laggard.wire import INTAKE_ENV, parse_address

log = logging.getLogger(__name__)

#: Send errors after which the target is resolved and connected again: the agent's socket is
#: gone or was replaced (ECONNREFUSED, ENOTCONN once the kernel disconnected us), or nothing
#: listens on the UDP port yet.
_RECONNECT_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT,
                               errno.ECONNRESET})
#: Seconds before the first new try of an unreachable socket; doubled after each failed try
#: up to :data:`RETRY_MAX_SECONDS` (a restarting agent is back within a few seconds; a node
#: without one costs a ``connect`` every few seconds).
RETRY_INITIAL_SECONDS = 0.25
#: Longest wait between two tries of the socket: records return to it at most this late.
RETRY_MAX_SECONDS = 4.0
#: Environment variable naming a UDP ``host:port`` to send to while the socket is unreachable
#: (``MonitorConfig.udp_fallback``); unset: none.
UDP_FALLBACK_ENV = "LAGGARD_UDP_FALLBACK"


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
    """A non-blocking datagram socket to the agent, with what ``socket.send`` offers.

    Args:
        configured: the monitor's target (a socket path or ``host:port``); overridden by
            ``LAGGARD_INTAKE``.
        environ: the environment to read (tests pass a dict); None for ``os.environ``.
        udp_fallback: ``host:port`` sent to while a socket target cannot be reached; empty for
            none (the default); overridden by ``LAGGARD_UDP_FALLBACK``.
        clock: monotonic clock in seconds (tests pass a fake one).
        log_change: ``(key, msg, *args)`` logging each change of target at WARNING (the
            monitor's log); None: this module's logger.

    Attributes:
        wanted: the configured target: ``unix:PATH`` or ``udp:HOST:PORT``.
        target: where datagrams go now: :attr:`wanted`, ``udp:HOST:PORT`` (the fallback) or
            ``""`` (nowhere: the socket is not there and no fallback is configured).

    Raises:
        ValueError: a target or fallback neither a socket path nor ``host:port``.
        OSError: a UDP target that cannot be opened (an unknown host).
    """

    def __init__(self, configured: str, *, environ: Mapping[str, str] | None = None,
                 udp_fallback: str = "", clock: Callable[[], float] = time.monotonic,
                 log_change: Callable[..., Any] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._primary = intake_target(configured, env)
        check_intake_target(self._primary)
        fallback = env.get(UDP_FALLBACK_ENV, "").strip() or udp_fallback
        if fallback:
            parse_address(fallback)
        self._fallback = fallback if is_socket_path(self._primary) else ""
        self.wanted = _describe(self._primary)
        self._clock = clock
        self._log_change = log_change
        self._lock = threading.Lock()
        self._retry_delay = RETRY_INITIAL_SECONDS
        self._next_retry = 0.0
        self.target = ""
        self._sock: socket.socket | None = None
        self._on_primary = False
        if is_socket_path(self._primary):
            self._try_primary(clock(), first=True)
        else:
            self._switch(_open(self._primary), self._primary, primary=True, reason="")

    def send(self, payload: bytes) -> int:
        """Send one datagram to the socket (tried again when due), else to the fallback.

        Raises:
            BlockingIOError: the agent's receive queue is full (the datagram is not sent).
            OSError: no target now (``ENOTCONN``: the socket is not there, no fallback), or
                the send failed.
        """
        with self._lock:
            now = self._clock()
            if not self._on_primary and now >= self._next_retry:
                self._try_primary(now)
            if self._sock is None:
                raise OSError(errno.ENOTCONN, f"the agent's socket {self.wanted} is not there "
                              "(no UDP fallback configured)")
            try:
                return self._sock.send(payload)
            except BlockingIOError:
                raise
            except OSError as exc:
                if not self._on_primary or not is_socket_path(self._primary) \
                        or exc.errno not in _RECONNECT_ERRNOS:
                    raise
                # The agent went away; a restarted one binds a new socket at the same path,
                # which a fresh connect reaches at once.
                self._next_retry = 0.0
                self._try_primary(now, lost=exc)
                if self._sock is None:
                    raise
                return self._sock.send(payload)

    def _try_primary(self, now: float, *, first: bool = False,
                     lost: OSError | None = None) -> None:
        """Connect the socket target; on failure schedule the next try (backoff) and use the
        fallback, if any, meanwhile."""
        try:
            sock = _open(self._primary)
        except OSError as exc:
            self._next_retry = now + self._retry_delay
            self._retry_delay = min(2 * self._retry_delay, RETRY_MAX_SECONDS)
            if self._on_primary or first:
                self._leave_primary(lost or exc)
            return
        self._retry_delay = RETRY_INITIAL_SECONDS
        self._switch(sock, self._primary, primary=True,
                     reason="" if first else "it is back")

    def _leave_primary(self, exc: OSError) -> None:
        if self._fallback:
            try:
                self._switch(_open(self._fallback), self._fallback, primary=False,
                             reason=f"{self.wanted} unreachable ({exc})")
                return
            except OSError:
                pass
        if self._sock is not None:
            self._sock.close()
        self._sock, self._on_primary, self.target = None, False, ""
        self._say("laggard: the agent's socket %s is unreachable (%s): records dropped (counted) "
                  "until it is back, tried again within %g s (no UDP fallback configured)",
                  self.wanted, exc, RETRY_MAX_SECONDS)

    def _switch(self, sock: socket.socket, target: str, *, primary: bool, reason: str) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._on_primary, self.target = sock, primary, _describe(target)
        if not reason:
            log.info("laggard: sending step records to the agent at %s", self.target)
        else:
            self._say("laggard: sending step records to the agent at %s (%s)", self.target,
                      reason)

    def _say(self, msg: str, *args: Any) -> None:
        if self._log_change is not None:
            self._log_change(f"target {self.target or 'none'}", msg, *args)
        else:
            log.warning(msg, *args)

    def fileno(self) -> int:
        """The current socket's descriptor (-1 with none)."""
        sock = self._sock
        return sock.fileno() if sock is not None else -1

    def close(self) -> None:
        """Close the socket."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            self._sock, self._on_primary = None, False
            self._next_retry = float("inf")


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
