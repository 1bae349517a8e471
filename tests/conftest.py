"""Shared pytest fixtures; plain helpers live in ``support.py``."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from support import AgentProcess, start_agent, stop_agent


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
    """A UDP socket on loopback standing in for the agent's intake (5 s receive timeout)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()
