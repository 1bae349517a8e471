"""Re-export of :mod:`laggard.nvml.fake`, the fake NVML, for imports of its old path."""

from laggard.nvml.fake import PERIOD, SCENARIOS, FakeNvml, parse_scenario

__all__ = ["PERIOD", "SCENARIOS", "FakeNvml", "parse_scenario"]
