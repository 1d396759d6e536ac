"""Which parameters Muon orthogonalises and which fall back to its AdamW branch (pure).

Upstream MindFormers 2.1 `_build_muon_filter`:
  - a parameter whose full name matches a glob of `adamw_include` (fnmatch only, no substring
    rule) goes to AdamW; `adamw_include` defaults to ("*word_embeddings*", "*output_layer*"),
    a bare string is one pattern, and setting it replaces the defaults;
  - otherwise 2-D weights and grouped-expert 3-D weights (`experts.weight1/2`, exact or ending in
    `.experts.weight1/2`) go to Muon; 0-D / 1-D parameters go to AdamW;
  - a 3-D `experts.weight` (exact or ending in `.experts.weight`, [E, A, B]: one matrix per
    expert) goes to Muon too, orthogonalised per expert (muon_split.py: one (E, A, B) batch), as
    upstream's master routes it (2.1.0 refuses it; its own models name them weight1/weight2);
  - any other 3-D weight, or a weight with more than 3 dimensions, is an error. Upstream reports
    it at the first step; we raise while building the groups so nothing runs first.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, List, Sequence, Tuple

DEFAULT_ADAMW_INCLUDE: Tuple[str, ...] = ("*word_embeddings*", "*output_layer*")
_EXPERT_WEIGHTS = ("experts.weight1", "experts.weight2", "experts.weight")


def normalize_adamw_include(adamw_include) -> Tuple[str, ...]:
    """None -> defaults; a str -> one pattern; a list/tuple of str -> as is."""
    if adamw_include is None:
        return DEFAULT_ADAMW_INCLUDE
    if isinstance(adamw_include, str):
        return (adamw_include,)
    if not isinstance(adamw_include, (list, tuple)) or not all(isinstance(p, str) for p in adamw_include):
        raise ValueError("adamw_include must be a list of glob strings.")
    return tuple(adamw_include)


def is_grouped_expert_weight(name: str) -> bool:
    return name in _EXPERT_WEIGHTS or any(name.endswith("." + w) for w in _EXPERT_WEIGHTS)


def routes_to_muon(name: str, shape: Sequence[int], patterns: Tuple[str, ...]) -> bool:
    """True if Muon updates this parameter; ValueError for shapes Muon cannot take."""
    if any(fnmatch.fnmatchcase(name, p) for p in patterns):
        return False
    ndim = len(shape)
    if ndim < 2:
        return False
    if ndim == 2:
        return True
    shape_t = tuple(int(s) for s in shape)
    if ndim == 3:
        if is_grouped_expert_weight(name):
            return True
        raise ValueError(
            "Muon only supports 3D weights from grouped experts (`*.experts.weight1/weight2`, "
            "`*.experts.weight`), "
            f"but got param={name!r}, shape={shape_t}")
    raise ValueError(
        f"Muon only supports 2D weights and grouped 3D expert weights, but got param={name!r}, shape={shape_t}")


def muon_routing(named_params: Iterable, adamw_include=None) -> Tuple[List[str], List[str]]:
    """Split parameter names into (muon_names, adamw_names), both in input order.

    `named_params`: (name, param) pairs or parameters with `.name`; only `.shape` is read.
    """
    patterns = normalize_adamw_include(adamw_include)
    muon_names: List[str] = []
    adamw_names: List[str] = []
    for item in named_params:
        if isinstance(item, tuple):
            name, param = item
        else:
            name, param = item.name, item
        (muon_names if routes_to_muon(name, tuple(param.shape), patterns) else adamw_names).append(name)
    return muon_names, adamw_names
