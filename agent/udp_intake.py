"""The optional UDP intake: datagrams from the training ranks on a loopback UDP port.

The default transport is the agent's socket, a Unix datagram socket
(:mod:`laggard.agent.unix_intake`), which carries the sender's pid and uid from the kernel. UDP
(``--intake.address``) is the option for senders that cannot reach that socket; it carries no
sender identity, so any local process can send: it is for nodes whose users are all trusted. A
run first heard over UDP has no owner; a run a socket sender owns refuses UDP records
(``foreign_sender``, docs/agent.md, "Threat model").
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from laggard.agent.datagram_intake import DatagramIntake
from laggard.agent.run_table import RankTable
from laggard.agent.socket_drops import socket_drops
from laggard.wire import parse_address

__all__ = ["UdpIntake"]


class UdpIntake(DatagramIntake):
    """Receives datagrams on a UDP socket in a daemon thread and feeds a :class:`RankTable`.

    The receive loop (:class:`~laggard.agent.datagram_intake.DatagramIntake`, shared with the
    Unix-socket intake) survives anything a datagram or the table does (caught, counted, logged
    once); its thread is a ``RestartableThread`` for the supervisor to restart if it still
    dies. Datagrams the kernel dropped because the loop fell behind are read from /proc on each
    scrape (``laggard_intake_kernel_drops_total``). UDP carries no sender identity: datagrams
    are ingested with ``sender=None``.

    Args:
        address: ``host:port`` to bind (port 0 picks a free one; see :attr:`port`).
        table: where decoded records go.
        receive_buffer_bytes: ``SO_RCVBUF`` to ask for (the kernel caps it at
            ``net.core.rmem_max``); 0 keeps the system default.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """

    def __init__(self, address: str, table: RankTable, receive_buffer_bytes: int = 1 << 20
                 ) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        if receive_buffer_bytes:
            # A few thousand step records of headroom while the loop is busy (a scrape holds
            # the table's lock); beyond that the kernel drops, and we count what it dropped.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.2)
        self.port: int = sock.getsockname()[1]
        super().__init__(sock, table, "laggard-intake")

    def kernel_drops(self) -> int | None:
        """Datagrams the kernel dropped for this socket (receive buffer full), or None."""
        return socket_drops(self._sock)

    def collect(self) -> Iterator[Metric]:
        """``laggard_intake_kernel_drops_total`` (where /proc shows it)."""
        drops = self.kernel_drops()
        if drops is not None:
            family = CounterMetricFamily(
                "laggard_intake_kernel_drops_total",
                "Datagrams for the intake the kernel dropped before the agent read them "
                "(receive buffer full; /proc/net/udp drops).")
            family.add_metric([], drops)
            yield family
