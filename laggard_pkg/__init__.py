"""laggard: find the straggler rank, the throttled GPU and the flipped bit in a training job.

The subpackages map onto the repository's top-level folders (see pyproject.toml):
``laggard.agent``, ``laggard.collectors``, ``laggard.detectors``, ``laggard.dashboards`` and
``laggard.integrations``.
"""

__version__ = "0.1.0"
