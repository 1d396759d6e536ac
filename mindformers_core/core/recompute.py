"""Activation recompute (upstream's ``recompute:`` section: ``mode``, ``full_recompute_layer``):
which decoder layers to recompute, as pure functions (the config layer validates with them;
``models.language_model.GPTModel.set_recompute`` applies the result).

A recomputed decoder layer keeps only its input between forward and backward; the backward
runs its forward again. This uses MindSpore's own ``Cell.recompute()``, which works in PyNative
(and keeps the gradients bit-identical, tests/models/test_model_recompute.py), so it applies to
the layers that run as Cells: ``training.jit: none``.

Side effect to know: the second forward also runs the MoE routing statistics, so during
training a recomputed MoE layer counts each token twice in ``tokens_per_expert``. The
aux-loss-free expert-bias update reads only sign(mean(load) - load_e), which is unchanged by
that factor, so training is identical.

``mode: selective`` (upstream: recompute parts of a layer) is not implemented: this model's
attention and MLP run as pure functions inside the layer, which ``Cell.recompute`` cannot wrap.
"""
from __future__ import annotations

from typing import Any, List, Optional

_MODES = ("full", "selective", "None", None)


def parse_layer_selection(spec: Any, num_layers: int) -> List[int]:
    """Layer indices of ``full_recompute_layer``: True = all; an int n = the first n layers;
    a list of indices and ``"a-b"`` ranges (inclusive, upstream's ``[0-3]``); a string of those
    separated by commas, with or without brackets. ValueError names the bad entry."""
    if spec is True:
        return list(range(num_layers))
    if spec is None or spec is False:
        return []
    if isinstance(spec, int):
        if not 0 <= spec <= num_layers:
            raise ValueError(f"a layer count must be in [0, {num_layers}], got {spec}")
        return list(range(spec))
    if isinstance(spec, str):
        spec = [x for x in spec.strip().strip("[]").split(",") if x.strip()]
    if not isinstance(spec, (list, tuple)):
        raise ValueError(f"must be a bool, a layer count or a list of layers / ranges such as "
                         f"[0-3], got {spec!r}")
    out: List[int] = []
    for item in spec:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ValueError(f"cannot read layer entry {item!r} (use an index or a range "
                             f"such as 0-3)")
        if isinstance(item, int):
            lo = hi = item
        else:
            parts = item.strip().split("-")
            try:
                lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
            except ValueError:
                lo = hi = None
            if lo is None or lo > hi:
                raise ValueError(f"cannot read layer entry {item!r} (use an index or a range "
                                 f"such as 0-3)")
        for i in range(lo, hi + 1):
            if not 0 <= i < num_layers:
                raise ValueError(f"layer {i} is out of range [0, {num_layers})")
            if i not in out:
                out.append(i)
    return sorted(out)


def recompute_layers(mode: Optional[str], full_recompute_layer: Any, num_layers: int) -> List[int]:
    """The decoder layers to recompute: none unless ``mode`` is "full"; then those of
    ``full_recompute_layer`` (None = all layers). ValueError for a mode that is not
    implemented."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of 'full', 'selective', 'None', got {mode!r}")
    if mode == "selective":
        raise ValueError("mode 'selective' is not implemented (use 'full' with "
                         "full_recompute_layer)")
    if mode != "full":
        return []
    if full_recompute_layer is None:
        return list(range(num_layers))
    return parse_layer_selection(full_recompute_layer, num_layers)
