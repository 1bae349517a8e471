"""The receive loop both intakes share (the agent's socket, a Unix datagram socket,
``agent/unix_intake.py``; the optional UDP intake, ``agent/udp_intake.py``): one bounded read per
datagram, oversized ones counted, stale ranks expired once a second even without scrapes, and
nothing a datagram does stops the loop.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Protocol

from laggard.agent.sender import SenderIdentity
from laggard.agent.supervisor import RestartableThread
from laggard.wire import MAX_DATAGRAM_BYTES

log = logging.getLogger(__name__)


class DatagramSink(Protocol):
    """Where an intake puts what it reads: :class:`laggard.agent.run_table.RankTable`."""

    def ingest(self, payload: bytes, sender: SenderIdentity | None = None) -> None: ...

    def reject(self, reason: str) -> None: ...

    def expire(self) -> None: ...


class DatagramIntake:
    """A socket read in a :class:`RestartableThread`, each datagram handed to a table.

    Subclasses open ``self._sock`` (with a timeout, so that :meth:`stop` is seen) and override
    :meth:`_receive`; the loop does the rest.

    Args:
        sock: a bound datagram socket with a timeout.
        table: where datagrams go.
        thread_name: name of the receiving thread (``laggard_agent_thread_restarts_total``).
    """

    def __init__(self, sock: socket.socket, table: DatagramSink, thread_name: str) -> None:
        self._sock = sock
        self._table = table
        self._stop = threading.Event()
        self.thread = RestartableThread(self._run, thread_name)

    def start(self) -> None:
        """Start receiving."""
        self.thread.start()

    def _receive(self, bufsize: int) -> tuple[bytes, SenderIdentity | None] | None:
        """One datagram of at most ``bufsize`` bytes and who sent it; None to skip it (already
        counted by the subclass). Raises what ``socket.recv`` raises."""
        return self._sock.recv(bufsize), None

    def _run(self) -> None:
        # One byte more than the limit tells an oversized datagram from one that just fits.
        bufsize = MAX_DATAGRAM_BYTES + 1
        next_expiry = time.monotonic() + 1.0
        while not self._stop.is_set():
            if time.monotonic() >= next_expiry:
                # Stale ranks go even when no scrape comes (the scrape expires them too).
                self._table.expire()
                next_expiry = time.monotonic() + 1.0
            try:
                received = self._receive(bufsize)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("intake receive failed: %s", exc)
                time.sleep(0.1)
                continue
            if received is None:
                continue
            payload, sender = received
            if len(payload) > MAX_DATAGRAM_BYTES:
                self._table.reject("oversized")
                continue
            self._table.ingest(payload, sender)

    def stop(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        self.thread.join(timeout=2)
        self._sock.close()
