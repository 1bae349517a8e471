"""Pure readers of real formats: kernel logs, NCCL logs and tests, nvidia-smi, InfiniBand
listings, Prometheus exposition text, ``/proc/net/dev``, NCCL Inspector JSON lines and PyTorch
flight-recorder dumps.

A parser takes the text or stream handed to it and returns records; it opens no socket, talks
to no hardware and imports neither torch nor the agent. The live collectors
(:mod:`laggard.collectors`) and ``laggard analyze`` (:mod:`laggard.analyze`) both call these, so
each format is parsed in one place.
"""
