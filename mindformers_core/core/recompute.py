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

``mode: select`` (upstream's name; ``selective`` is read the same) recomputes parts of layers:
``select_module`` maps module patterns (shell globs on ``layers.<i>.<part>``, upstream's
``"layers.*.self_attention.*"``) to the layers they apply to (the same lists / ranges as
``full_recompute_layer``). The parts this model runs as Cells, so that ``Cell.recompute``
can wrap them, are :data:`SELECTIVE_PARTS`:

* ``self_attention``: the whole attention (projections, RoPE, core); only its input is kept;
* ``self_attention.core_attention``: scores, softmax and context (Megatron's "selective"
  granularity): the S x S probabilities are not kept, the projections' outputs are;
* ``mlp``: the whole MLP (or MoE block).

A pattern ending in ``.*`` ("everything inside X") also selects X itself, and a part inside a
selected part is not recomputed again (the outer one already recomputes it), so
``"layers.*.self_attention.*"`` recomputes the whole attention.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Optional, Tuple

_MODES = ("full", "select", "selective", "None", None)
SELECT_MODES = ("select", "selective")

#: the parts of decoder layer i that ``mode: select`` can recompute, as ``layers.<i>.<part>``
SELECTIVE_PARTS = ("self_attention", "self_attention.core_attention", "mlp")


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


def check_mode(mode: Optional[str]) -> None:
    """``mode``: "full", "select" (or "selective"), "None" or null."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of 'full', 'select', 'selective', 'None', "
                         f"got {mode!r}")


def _selects(pattern: str, path: str) -> bool:
    """``pattern`` names ``path``, or everything inside it (``X.*`` selects X)."""
    return fnmatch.fnmatchcase(path, pattern) or (
        pattern.endswith(".*") and fnmatch.fnmatchcase(path, pattern[:-2]))


def _outermost(parts) -> Tuple[str, ...]:
    """The selected parts without those inside another selected part, in SELECTIVE_PARTS
    order."""
    return tuple(p for p in SELECTIVE_PARTS if p in parts
                 and not any(p.startswith(q + ".") for q in parts))


def selected_modules(mode: Optional[str], select_module: Any,
                     num_layers: int) -> Dict[int, Tuple[str, ...]]:
    """``{layer: parts}`` that ``mode: select`` recomputes (empty for the other modes).

    ``select_module``: ``{pattern: layers}`` (layers as ``full_recompute_layer``). ValueError
    for a missing or malformed mapping, a pattern that selects no part of any of its layers
    (the message lists the parts there are) and a bad layer entry (naming the pattern)."""
    check_mode(mode)
    if mode not in SELECT_MODES:
        return {}
    if not isinstance(select_module, dict) or not select_module:
        raise ValueError(f"mode {mode!r} needs select_module: a mapping of module patterns to "
                         f"layers, e.g. {{'layers.*.self_attention.*': ['0-3']}}, got "
                         f"{select_module!r}")
    chosen: Dict[int, set] = {}
    for pattern, layers in select_module.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"a module pattern must be a non-empty string, got {pattern!r}")
        try:
            indices = parse_layer_selection(layers, num_layers)
        except ValueError as exc:
            raise ValueError(f"{pattern!r}: {exc}") from None
        hit = False
        for i in indices:
            parts = {p for p in SELECTIVE_PARTS if _selects(pattern, f"layers.{i}.{p}")}
            hit = hit or bool(parts)
            chosen.setdefault(i, set()).update(parts)
        if not hit:
            raise ValueError(f"{pattern!r} selects no recomputable part of layers {indices}; "
                             f"a decoder layer's parts are "
                             f"{['layers.<i>.' + p for p in SELECTIVE_PARTS]}")
    return {i: _outermost(parts) for i, parts in sorted(chosen.items()) if parts}


def recompute_layers(mode: Optional[str], full_recompute_layer: Any, num_layers: int) -> List[int]:
    """The decoder layers to recompute: none unless ``mode`` is "full"; then those of
    ``full_recompute_layer`` (None = all layers). ValueError for a mode that is not
    implemented."""
    check_mode(mode)
    if mode != "full":
        return []
    if full_recompute_layer is None:
        return list(range(num_layers))
    return parse_layer_selection(full_recompute_layer, num_layers)
