"""Shared pytest fixtures; plain helpers live in ``support.py``."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from support import AgentProcess, budget, start_agent, stop_agent

#: Fixtures that start a real server process: a test using one is ``slow`` (it runs a real
#: ``laggard agent``), whether or not its own file marks it.
SERVER_FIXTURES = frozenset({"agent_factory"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts a real agent through a shared fixture, so that
    ``-m "not slow"`` (``make test-fast``) runs no server process."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> object:
    """Pytest-timeout's limit (``timeout`` in pyproject, or a test's ``timeout`` mark) is
    idle-machine seconds: arm pytest-timeout's own timer with it ``budget``-ed by the load when
    the test starts, so a loaded machine does not fail a test that passes alone."""
    import pytest_timeout

    scaled = settings._replace(timeout=budget(settings.timeout))  # type: ignore[attr-defined]
    return pytest_timeout.pytest_timeout_set_timer(item=item, settings=scaled)


@pytest.fixture
def agent_factory() -> Iterator[object]:
    """Start agents with given flags; every one is stopped at teardown."""
    started: list[AgentProcess] = []

    def factory(*extra: str) -> AgentProcess:
        agent = start_agent(*extra)
        started.append(agent)
        return agent

    yield factory
    for agent in started:
        stop_agent(agent)


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    """A UDP socket on loopback standing in for the agent's intake (a receive timeout of
    ``budget(5)`` s: a ceiling against a datagram that never comes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(budget(5))
    yield sock
    sock.close()
