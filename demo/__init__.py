"""Demos and test rigs built on laggard: the local demo (``laggard demo``), its training worker
and model, the cluster demo (``laggard cluster-demo``) with its network-namespace harness.

Apps, not library: a training job imports :mod:`laggard.integrations`, never this package.
Tests and benchmarks reuse its model, harnesses and helpers.
"""
