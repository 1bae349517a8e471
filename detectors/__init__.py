"""Pure detection logic on records: no sockets, no files, no NVML, no torch."""

from laggard.detectors.finding import Finding, Severity

__all__ = ["Finding", "Severity"]
