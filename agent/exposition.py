"""The Prometheus text format (0.0.4) of a set of metric families: prometheus_client's own
writer (``generate_latest``), fed the families directly.

The collectors' families are rendered here once per collection round (``agent/sampler.py``),
not per scrape; a scrape joins the texts of the last rounds and renders only the intake's
families (``agent/web.py``). The library's writer checks every label name of every sample
(about 5 us a sample here): per round, that is a fraction of a millisecond per GPU, which is
why rendering moved to the round and the writer stayed the library's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

__all__ = ["render"]


class _Families:
    """What ``generate_latest`` reads from a registry: an object whose ``collect()`` yields
    the families (no registration, no describe)."""

    __slots__ = ("_metrics",)

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


def render(metrics: Iterable[Metric]) -> bytes:
    """Families -> the text exposition, by prometheus_client's ``generate_latest``.

    Args:
        metrics: prometheus_client metric families (consumed once).

    Returns:
        UTF-8 bytes of the text format 0.0.4.
    """
    return generate_latest(_Families(metrics))  # type: ignore[arg-type]
