"""Training loop, train state, checkpoints and metrics.

``Trainer(cfg, output_dir).train()`` runs a config; ``run_training(cfg, output_dir)`` does the
same for the CLI and returns an exit code.
"""
from .checkpoint import CheckpointError
from .run import run_training
from .trainer import Trainer

__all__ = ["Trainer", "run_training", "CheckpointError"]
