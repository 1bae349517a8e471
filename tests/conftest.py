"""Shared pytest fixtures; plain helpers live in ``support.py``."""

from __future__ import annotations

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
