"""Collectors: one file per source, each degrading cleanly when its hardware is absent.

Each collector file declares its flags (:class:`~laggard.collectors.base.Flag`) at its top and
registers itself at its end (``COLLECTOR = CollectorSpec(...)``); ``laggard.agent.registry``
finds them. To change one collector's flag, open ``collectors/NAME.py``.
"""

from laggard.collectors.base import Collector, NoDataError

__all__ = ["Collector", "NoDataError"]
