"""The node agent: CLI, config, daemon loop, exporter, UDP intake, record formats.

Importable on a node without torch and without a GPU.
"""
