"""Training loop and metrics (checkpoints: mindformers_core/checkpoint/).

``Trainer(cfg, output_dir).train()`` runs a config; ``run_training(cfg, output_dir)`` does the
same for the CLI and returns an exit code.

Names are resolved lazily (PEP 562): importing a light submodule (``trainer.signals``) must not
import numpy, whose thread pool would otherwise start before SIGINT is routed.
"""
import importlib

__all__ = ["Trainer", "run_training", "CheckpointError"]

_HOME = {"Trainer": ".trainer", "run_training": ".run", "CheckpointError": "..checkpoint.file_io"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
