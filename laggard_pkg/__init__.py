"""laggard: find the straggler rank, the throttled GPU and the flipped bit in a training job.

The subpackages map onto the repository's top-level folders (see pyproject.toml and
docs/architecture.md, "Packages"): ``laggard.parsers``, ``laggard.detectors``,
``laggard.collectors``, ``laggard.agent``, ``laggard.analyze``, ``laggard.integrations``,
``laggard.demo`` and ``laggard.dashboards``; ``laggard.cli`` is the ``laggard`` command and
``laggard.wire`` the training-to-agent format.
"""

__version__ = "0.1.0"
