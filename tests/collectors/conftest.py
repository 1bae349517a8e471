"""Fixtures for the collector tests: exposition text of one collector, promtool, golden files."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import FIXTURES, budget


class _Adapter:
    """Registers a laggard collector (``collect()`` returning families) with prometheus_client."""

    def __init__(self, collector: object) -> None:
        self.collector = collector

    def collect(self) -> object:
        return self.collector.collect()  # type: ignore[attr-defined]


@pytest.fixture
def expose() -> Callable[[object], str]:
    """Text exposition (prometheus_client format) of one collector's current round."""

    def render(collector: object) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Adapter(collector))  # type: ignore[arg-type]
        return generate_latest(registry).decode()

    return render


@pytest.fixture
def promtool() -> Callable[[str], None]:
    """Assert that ``promtool check metrics`` accepts an exposition (lint warnings included)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (scripts/ensure-prometheus.sh installs it)")

    def check(text: str) -> None:
        result = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                                capture_output=True, timeout=budget(30))
        assert result.returncode == 0, result.stdout + result.stderr

    return check


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare a whole exposition with ``tests/fixtures/<name>``; ``LAGGARD_UPDATE_GOLDEN=1``
    rewrites the file instead (then read its diff: every changed line is a changed exposition)."""

    def compare(name: str, text: str) -> None:
        path = Path(FIXTURES) / name
        if os.environ.get("LAGGARD_UPDATE_GOLDEN") == "1":
            path.write_text(text, encoding="utf-8")
        expected = path.read_text(encoding="utf-8")
        assert text == expected, f"exposition differs from golden file {name}"

    return compare


def series_value(text: str, series: str) -> float | None:
    """The value of one series, given as its exact name and label set as exposed
    (``'laggard_gpu_lost{gpu="1"}'``), in an exposition text; None when absent."""
    for line in text.splitlines():
        name, _, number = line.rpartition(" ")
        if name == series:
            return float(number)
    return None


@pytest.fixture
def value() -> Callable[[str, str], float | None]:
    """:func:`series_value` as a fixture."""
    return series_value
