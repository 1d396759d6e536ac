"""What compiled layers (``training.jit: layer`` / ``model``) keep on top of PyNative (pure).

Measured on CPU (MindSpore 2.10, tests/core/test_memory_rss.py's GPTs and variants of its
small one, float32, AdamW, two steps, peak RSS ``VmHWM``): the peak under ``layer`` minus the
peak of the same run under ``none`` is, in MiB,

    ==========================  =====  =====================  =====
    model (b = 4)               extra  planner activations    ratio
    ==========================  =====  =====================  =====
    small  h256 L2 s256 V2048     234     84                  2.8
    small, 4 layers               446    168                  2.7
    small, b = 8                  379    168                  2.3
    small, s = 512                433    184                  2.4
    small, h = 512                415    160                  2.6
    small, V = 8192               234     84                  2.8
    medium h384 L3 s384 V4096     701    297                  2.4
    large  h512 L4 s512 V4096    1718    736                  2.3
    ==========================  =====  =====================  =====

It grows with the number of layers (4 layers: twice 2 layers' extra above a ~20 MiB constant)
and with each layer's activations (batch, sequence, width), and not with the vocabulary (the
compiled head adds nothing measurable). So every compiled layer keeps, per micro-batch in
flight, about ``COMPILED_ACTIVATION_FACTOR`` times the activations the planner counts for it:
the forward graph hands all its intermediate results to the backward graph (not only the ones
PyNative's autodiff saves) and the graphs' own buffers stay allocated between the forward and
the backward. Above a ~20 MiB constant the ratio is 2.1-2.5; 2.3 is that of the medium
and large models, where the item dominates (the constant -- graph compilation, ~70 MiB on the
64-wide model -- is part of MindSpore's own footprint, like the libraries). ``model``
measured the same within 5% (small 243, medium 730, large 1798 MiB), so one factor serves
both modes.

Applied to the parts a mode compiles (models/compiled.py): under ``layer`` a dense layer
whole, a MoE layer only its norms and attention (the experts run in PyNative); under ``model``
every layer. Recomputed layers run as Cells (``RunConfig.model_jit_mode``) and float16 compute
stays PyNative (``models.compiled.effective_mode``): nothing is added for them.

Only on CPU, where it was measured. On Ascend MindSpore plans a graph's memory statically and
reuses buffers inside it (no device was available to measure), so nothing is added there: the
Ascend estimate is that of PyNative layers.
"""
from __future__ import annotations

from typing import Dict

__all__ = ["COMPILED_ACTIVATION_FACTOR", "JIT_PLAN_MODES", "planned_jit_mode",
           "compiled_graph_bytes"]

#: extra bytes a compiled layer keeps per byte of the activations the planner counts for it
COMPILED_ACTIVATION_FACTOR = 2.3
JIT_PLAN_MODES = ("none", "layer", "model")


def planned_jit_mode(jit_mode: str, compute_dtype: str, backend: str) -> str:
    """The ``training.jit`` mode the planner models: ``jit_mode`` (``RunConfig.model_jit_mode``)
    on CPU, ``none`` for float16 compute (it runs in PyNative) and on other backends."""
    if backend != "CPU" or compute_dtype in ("float16", "fp16"):
        return "none"
    return jit_mode


def compiled_graph_bytes(parts: Dict[str, int], moe: bool, jit_mode: str) -> int:
    """Extra bytes one non-recomputed layer keeps per micro-batch when compiled under
    ``jit_mode`` (``parts``: core/memory_plan.py ``layer_activation_bytes``)."""
    if jit_mode == "none":
        return 0
    compiled = parts["boundary"] + parts["attention"] if moe and jit_mode == "layer" \
        else sum(parts.values())
    return int(COMPILED_ACTIVATION_FACTOR * compiled)
