"""Collectors: one file per source, each degrading cleanly when its hardware is absent."""

from laggard.collectors.base import Collector, NoDataError

__all__ = ["Collector", "NoDataError"]
