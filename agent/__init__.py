"""The node agent (``laggard agent``): config, collector registry, sampler, exporter, UDP intake.

Importable on a node without torch and without a GPU. The wire format it decodes is
:mod:`laggard.wire`, shared with the training side.
"""
