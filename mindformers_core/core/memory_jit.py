"""What compiled layers (``training.jit: layer`` / ``model``) keep on top of PyNative (pure).

Measured on CPU (MindSpore 2.10, tests/core/test_memory_rss.py's GPTs, float32, AdamW, two
steps, peak RSS ``VmHWM``, each run's framework baseline under its own mode): the peak under
``layer`` minus the peak of the same run under ``none`` is, in MiB,

    ==========================  ========  ========  =====================
    model (b = 4)               bytecode  ast       planner activations
    ==========================  ========  ========  =====================
    small  h256 L2 s256 V2048      98       234        84
    medium h384 L3 s384 V4096     215       701       297
    large  h512 L4 s512 V4096     367      1718       736
    ==========================  ========  ========  =====================

The graphs are built from bytecode (``jit_capture_mode`` below, used by models/compiled.py;
ast where the interpreter is too new for it). Every compiled layer keeps, per micro-batch in flight, more
than PyNative's autodiff saves for its backward: the forward graph hands its intermediate
results to the backward graph and the graphs' buffers stay allocated in between -- about
``COMPILED_ACTIVATION_FACTOR`` times the activations the planner counts for the layer under
bytecode graphs (0.4-0.5 above a ~60 MiB constant; 0.6 keeps all three sizes within 25% of
the measurement with the constant folded in), 2.3 under ast graphs. The constant (graph
compilation) is part of MindSpore's own footprint, like the libraries.

Applied to the parts a mode compiles (models/compiled.py): under ``layer`` a dense layer
whole, a MoE layer only its norms and attention (the experts run in PyNative); under ``model``
every layer. Recomputed layers run as Cells (``RunConfig.model_jit_mode``), and float16 compute and the
CPU blockwise attention stay PyNative (``models.compiled.effective_mode``): nothing is added
for them.

Only on CPU, where it was measured. On Ascend MindSpore plans a graph's memory statically and
reuses buffers inside it (no device was available to measure), so nothing is added there: the
Ascend estimate is that of PyNative layers.
"""
from __future__ import annotations

import sys
from typing import Dict, Tuple

__all__ = ["COMPILED_ACTIVATION_FACTOR", "AST_ACTIVATION_FACTOR", "JIT_PLAN_MODES",
           "jit_capture_mode", "planned_jit_mode", "compiled_graph_bytes"]

#: extra bytes a compiled (bytecode-built) layer keeps per byte of the activations the planner
#: counts for it
COMPILED_ACTIVATION_FACTOR = 0.6
#: the same for graphs built from source (``capture_mode="ast"``)
AST_ACTIVATION_FACTOR = 2.3
JIT_PLAN_MODES = ("none", "layer", "model")


def jit_capture_mode(version: Tuple[int, ...] = tuple(sys.version_info[:2])) -> str:
    """``mindspore.jit``'s capture mode of the compiled layers on Python ``version``: bytecode
    (the lower-memory graphs) below 3.12, where MindSpore 2.10 supports it, else ast."""
    return "bytecode" if tuple(version) < (3, 12) else "ast"


def planned_jit_mode(jit_mode: str, compute_dtype: str, backend: str) -> str:
    """The ``training.jit`` mode the planner models: ``jit_mode`` (``RunConfig.model_jit_mode``)
    on CPU, ``none`` for float16 compute (it runs in PyNative) and on other backends."""
    if backend != "CPU" or compute_dtype in ("float16", "fp16"):
        return "none"
    return jit_mode


def compiled_graph_bytes(parts: Dict[str, int], moe: bool, jit_mode: str,
                         capture: str = jit_capture_mode()) -> int:
    """Extra bytes one non-recomputed layer keeps per micro-batch when compiled under
    ``jit_mode`` from ``capture`` (``parts``: core/memory_plan.py ``layer_activation_bytes``)."""
    if jit_mode == "none":
        return 0
    compiled = parts["boundary"] + parts["attention"] if moe and jit_mode == "layer" \
        else sum(parts.values())
    factor = COMPILED_ACTIVATION_FACTOR if capture == "bytecode" else AST_ACTIVATION_FACTOR
    return int(factor * compiled)
