"""``laggard.nvml``: NVML for both sides of laggard, the node agent and the training job.

:mod:`laggard.nvml.library` is the one module that imports ``pynvml`` (``NvmlLibrary``: lazy init,
per-field error handling, ``GpuIsLost`` as :class:`~laggard.nvml.library.GpuLostError`);
:mod:`laggard.nvml.fake` is the fake NVML module behind ``laggard agent --collector.nvml.fake-gpus``
and the tests. It sits below the collectors and the training side (the ``Layers`` contract in
``.importlinter``) and imports neither, nor torch, so the agent's collectors and the job's GPU-state
participant (:mod:`laggard.integrations.gpu_state`) share one wrapper.
"""
