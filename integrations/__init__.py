"""What runs inside the training job: TrainingMonitor, DDP communication hooks, fault injectors.

Needs torch (``pip install 'laggard[torch]'``).
"""
