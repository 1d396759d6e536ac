"""A pipeline rank keeps only its stage's parameters in memory.

Every rank builds the whole model with the seeded initialisation of one process (so a stage's
weights are the single-process ones), then :func:`release_foreign_parameters` drops what the
stage does not read: each parameter no virtual stage of this rank holds
(core/pipeline_split.py ``StageSplit.holders``) is frozen and its data replaced by an empty
placeholder of the same dtype (``Parameter.set_data``; the old buffer is freed with its last
reference). The Parameter object and its name stay, so the model's structure, the checkpoint
names and the stage map are unchanged; nothing on this rank reads a released parameter (the
stage runs only its layers, the optimizer and the gradient norm take the stage's parameters,
the checkpoint takes each entry from its owner stage: distributed/pipeline_checkpoint.py).

The whole model's shapes are returned and kept by the pipeline reducer, for what describes the whole
model rather than this rank: the parameter counts of the run log, the checkpoint-size
estimate of rank 0 (which writes every stage's entries).
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

__all__ = ["release_foreign_parameters", "held_parameter_bytes", "parameter_bytes"]


def parameter_bytes(param) -> int:
    """Bytes the data of ``param`` occupies now."""
    return int(np.prod(param.shape, dtype=np.int64)) * int(param.itemsize)


def held_parameter_bytes(model) -> int:
    """Bytes of parameter data the process holds for ``model`` (placeholders count 0)."""
    return sum(parameter_bytes(p) for p in model.get_parameters())


def release_foreign_parameters(model, split, stage: int) -> Dict[str, Tuple[int, ...]]:
    """Freeze and empty every parameter of ``model`` that ``stage`` does not hold; returns the
    whole model's shapes (parameter name -> shape, model order) from before the release."""
    import mindspore as ms
    shapes = {}
    for p in model.get_parameters():
        shapes[p.name] = tuple(p.shape)
        if stage not in split.holders(p.name):
            p.requires_grad = False
            p.set_data(ms.Tensor(np.zeros((0,), np.float32)).astype(p.dtype))
    return shapes
