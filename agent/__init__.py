"""The node agent (``laggard agent``): config, collector registry, sampler, exporter, the intake
(the agent's socket, a Unix datagram socket; UDP on loopback optional).

Importable on a node without torch and without a GPU. The wire format it decodes is
:mod:`laggard.wire`, shared with the training side.
"""
