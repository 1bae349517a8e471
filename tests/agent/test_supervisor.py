"""The supervisor restarts an agent thread that died, on a real UDP socket."""

import socket

import pytest
from prometheus_client import CollectorRegistry
from support import wait_for

from laggard.agent.context import FindingLog
from laggard.agent.run_table import RankTable
from laggard.agent.supervisor import Supervisor
from laggard.agent.udp_intake import UdpIntake
from laggard.wire import StepRecord


class _Escapes(BaseException):
    """Not an Exception: nothing in the intake loop catches it, as with a library's own."""


class _TableDyingOnce(RankTable):
    def __init__(self):
        super().__init__(max_ranks=8, findings=FindingLog(), default_node="n0")
        self.died = False

    def ingest(self, payload, sender=None):
        if not self.died:
            self.died = True
            raise _Escapes()
        super().ingest(payload, sender)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_intake_thread_is_restarted_and_counted():
    table = _TableDyingOnce()
    intake = UdpIntake("127.0.0.1:0", table)
    supervisor = Supervisor(interval=0.05)
    intake.start()
    supervisor.watch(intake.thread)
    registry = CollectorRegistry()
    registry.register(supervisor)
    supervisor.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"kills the thread", ("127.0.0.1", intake.port))
            assert wait_for(lambda: registry.get_sample_value(
                "laggard_agent_thread_restarts_total", {"thread": "laggard-intake"}) == 1)
            s.sendto(StepRecord(rank=0, world_size=1, step=0).encode(), ("127.0.0.1", intake.port))
            assert wait_for(lambda: table.accepted == 1)
        assert intake.thread.is_alive()
    finally:
        supervisor.stop()
        intake.stop()


def test_threads_not_started_or_still_alive_are_left_alone():
    supervisor = Supervisor()
    table = RankTable(max_ranks=1, findings=FindingLog(), default_node="n0")
    intake = UdpIntake("127.0.0.1:0", table)
    supervisor.watch(intake.thread)
    assert supervisor.check_once() == []  # never started: not "dead"
    intake.start()
    try:
        assert supervisor.check_once() == []
    finally:
        intake.stop()
