"""How one parameter is split across the ranks of a group (tensor / expert parallel, dp_shard).

Pure (numpy only). A :class:`ShardSpec` records the parameter's *full* (logical) shape, the dim
it is split along (``None``: replicated, every rank holds the whole tensor) and the group it is
split over with that group's size. Shard ``k`` of ``S`` holds the ``k``-th of ``S`` equal,
contiguous blocks of the split dim (Megatron: the dim must be divisible by ``S``):

    local_shape[d] = full_shape[d] // S  for d = split_dim, else full_shape[d]
    rows of shard k along split_dim: [k * full_shape[d] // S, (k + 1) * full_shape[d] // S)

and ``unshard`` concatenates the shards in group order along the split dim.

A *blocked* spec (``blocks``: a partition of the split dim into consecutive blocks, e.g. the
q | k | v row blocks of a fused qkv weight) splits every block that way: shard ``k`` holds the
``k``-th of ``S`` equal pieces of each block, in block order (each block must be divisible by
``S``). With one block it is the plain split.

The global gradient norm over sharded parameters. With ``g_p`` the local gradient of parameter
``p`` on this rank (already reduced over data parallel, so replicated values agree on every
rank), ``R`` the replicated parameters and ``P_G`` those split over group ``G``:

    ||g||^2 = sum_{p in R} ||g_p||^2  +  sum_G  AllReduce_G( sum_{p in P_G} ||g_p||^2 )

Replicated parameters count once (their gradient is the same on every rank of the group, so
summing it over the group would count it ``S`` times); a sharded parameter's squared norm is the
sum of its shards' squared norms, which is the group sum of the local ones. The groups are
reduced in the order of their names, identical on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (Callable, Dict, Iterable, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

import numpy as np

from .grad_route import combine_sq_norms

__all__ = ["ShardedCell", "ShardedModel", "RowShardedModel", "model_rows", "whole_shape",
           "model_specs", "collect_shard_specs", "ShardSpec", "replicated", "local_shape",
           "local_indices", "local_slice", "shard", "unshard", "spec_norm_group",
           "global_sq_norm", "param_of"]


@dataclass(frozen=True)
class ShardSpec:
    """A parameter's full shape, split dim (``None`` = replicated) and group (name, size)."""
    full_shape: Tuple[int, ...]
    split_dim: Optional[int] = None
    group: Optional[str] = None
    num_shards: int = 1
    blocks: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        object.__setattr__(self, "full_shape", tuple(int(d) for d in self.full_shape))
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(int(b) for b in self.blocks))
        if self.split_dim is None:
            if self.blocks is not None:
                raise ValueError("a replicated parameter has no blocks")
            if self.group is not None or self.num_shards != 1:
                raise ValueError(f"a replicated parameter has no group and 1 shard, but got "
                                 f"group={self.group!r}, num_shards={self.num_shards}")
            return
        nd = len(self.full_shape)
        if not 0 <= self.split_dim < nd:
            raise ValueError(f"split_dim {self.split_dim} is out of range for shape "
                             f"{self.full_shape}")
        if not self.group:
            raise ValueError(f"a parameter split along dim {self.split_dim} needs a group "
                             f"name (tp, ep or dp_shard)")
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, but got {self.num_shards}")
        if self.full_shape[self.split_dim] % self.num_shards:
            raise ValueError(f"dim {self.split_dim} of shape {self.full_shape} "
                             f"({self.full_shape[self.split_dim]}) is not divisible by the "
                             f"{self.group} group size {self.num_shards}")
        if self.blocks is not None:
            if sum(self.blocks) != self.full_shape[self.split_dim] or min(self.blocks) < 1:
                raise ValueError(f"blocks {self.blocks} must be positive and sum to dim "
                                 f"{self.split_dim} of shape {self.full_shape}")
            bad = [b for b in self.blocks if b % self.num_shards]
            if bad:
                raise ValueError(f"block sizes {bad} of {self.blocks} are not divisible by the "
                                 f"{self.group} group size {self.num_shards}")

    @property
    def is_sharded(self) -> bool:
        return self.split_dim is not None


@runtime_checkable
class ShardedCell(Protocol):
    """A Cell whose own parameters are split across ranks (tensor / expert parallel layers)."""

    def sharded_params(self) -> Dict[str, "ShardSpec"]:
        """Parameter name -> ShardSpec of its split parameters (replicated ones absent)."""


@runtime_checkable
class ShardedModel(Protocol):
    """A model with sharded parameters: ``{param name: ShardSpec}`` (absent = replicated)."""

    def shard_specs(self) -> Dict[str, "ShardSpec"]: ...


@runtime_checkable
class RowShardedModel(Protocol):
    """A model storing some parameters as dim-0 rows of their (tp) slice (tp x FSDP):
    ``{param name: (start, stop, rows of the slice)}``."""

    def row_shards(self) -> Dict[str, Tuple[int, int, int]]: ...


def model_rows(model) -> Dict[str, Tuple[int, int, int]]:
    """``model.row_shards()`` of a :class:`RowShardedModel`; {} otherwise."""
    return dict(model.row_shards()) if isinstance(model, RowShardedModel) else {}


def whole_shape(name: str, shape: Sequence[int], specs: Dict[str, "ShardSpec"],
                rows: Dict[str, Tuple[int, int, int]]) -> Tuple[int, ...]:
    """The whole model's shape of parameter ``name`` stored here with ``shape``: its spec's
    full shape; else, stored as dp rows of a replicated weight (``rows``, tp x FSDP), the
    rows' whole; else its own."""
    if name in specs:
        return tuple(specs[name].full_shape)
    if name in rows:
        return (int(rows[name][2]),) + tuple(int(d) for d in shape)[1:]
    return tuple(int(d) for d in shape)


def model_specs(model) -> Dict[str, "ShardSpec"]:
    """``model.shard_specs()`` of a :class:`ShardedModel`; {} for a model without shards."""
    return dict(model.shard_specs()) if isinstance(model, ShardedModel) else {}


def collect_shard_specs(cell) -> Dict[str, "ShardSpec"]:
    """``model.shard_specs()``: the specs of every :class:`ShardedCell` inside ``cell`` (a
    MindSpore Cell; its ``cells_and_names``), keyed by parameter name."""
    out: Dict[str, ShardSpec] = {}
    for _, sub in cell.cells_and_names():
        if isinstance(sub, ShardedCell):
            out.update(sub.sharded_params())
    return out


def replicated(full_shape: Sequence[int]) -> ShardSpec:
    return ShardSpec(tuple(full_shape))


def local_shape(spec: ShardSpec) -> Tuple[int, ...]:
    """The shape every shard has."""
    if not spec.is_sharded:
        return spec.full_shape
    out = list(spec.full_shape)
    out[spec.split_dim] //= spec.num_shards
    return tuple(out)


def local_indices(spec: ShardSpec, index: int) -> np.ndarray:
    """The indices along the split dim that shard ``index`` holds, in its order."""
    if not spec.is_sharded:
        raise ValueError("a replicated parameter has no split dim")
    if not 0 <= index < spec.num_shards:
        raise ValueError(f"shard index {index} is out of range for {spec.num_shards} shards")
    blocks = spec.blocks or (spec.full_shape[spec.split_dim],)
    out, start = [], 0
    for b in blocks:
        piece = b // spec.num_shards
        out.append(np.arange(start + index * piece, start + (index + 1) * piece))
        start += b
    return np.concatenate(out)


def local_slice(spec: ShardSpec, index: int) -> Tuple[slice, ...]:
    """Where shard ``index`` (the rank's index in the group) lies in the full tensor (a spec
    with several blocks is not one slice: use :func:`local_indices` / :func:`shard`)."""
    if spec.blocks is not None and len(spec.blocks) > 1:
        raise ValueError(f"a blocked spec (blocks {spec.blocks}) is not one slice")
    if not spec.is_sharded:
        return tuple(slice(0, d) for d in spec.full_shape)
    if not 0 <= index < spec.num_shards:
        raise ValueError(f"shard index {index} is out of range for {spec.num_shards} shards")
    size = local_shape(spec)[spec.split_dim]
    return tuple(slice(index * size, (index + 1) * size) if d == spec.split_dim
                 else slice(0, n) for d, n in enumerate(spec.full_shape))


def shard(spec: ShardSpec, full: np.ndarray, index: int) -> np.ndarray:
    """Shard ``index`` of the full tensor (a copy)."""
    full = np.asarray(full)
    if full.shape != spec.full_shape:
        raise ValueError(f"expected the full shape {spec.full_shape}, but got {full.shape}")
    if not spec.is_sharded:
        return full.copy()
    return np.take(full, local_indices(spec, index), axis=spec.split_dim)


def unshard(spec: ShardSpec, shards: Sequence[np.ndarray]) -> np.ndarray:
    """The full tensor from all shards in group order (replicated: the one tensor)."""
    want = 1 if not spec.is_sharded else spec.num_shards
    if len(shards) != want:
        raise ValueError(f"expected {want} shards, but got {len(shards)}")
    shape = local_shape(spec)
    for k, s in enumerate(shards):
        if np.shape(s) != shape:
            raise ValueError(f"shard {k} has shape {np.shape(s)}, expected {shape}")
    if not spec.is_sharded:
        return np.array(shards[0], copy=True)
    out = np.empty(spec.full_shape, np.result_type(*[np.asarray(s) for s in shards]))
    for k, s in enumerate(shards):
        idx = [slice(None)] * len(spec.full_shape)
        idx[spec.split_dim] = local_indices(spec, k)
        out[tuple(idx)] = np.asarray(s)
    return out


def spec_norm_group(spec: Optional[ShardSpec]) -> Optional[str]:
    """The group a gradient of layout ``spec`` has its squared norm summed over (its pieces
    lie on the ranks of that group); None for a whole, replicated one (module docstring)."""
    if spec is not None and spec.is_sharded and spec.num_shards > 1:
        return spec.group
    return None


def global_sq_norm(local: Iterable[Tuple[ShardSpec, float]],
                   group_sum: Callable[[str, float], float]) -> float:
    """The global squared gradient norm (module docstring) from this rank's ``(layout,
    local squared norm)`` pairs; ``group_sum(group, x)`` is the sum of ``x`` over the ranks of
    this rank's ``group`` (``grad_route.combine_sq_norms``, the one combination)."""
    return combine_sq_norms([(spec_norm_group(s), sq) for s, sq in local], group_sum)


def param_of(key: str) -> Optional[str]:
    """The parameter a checkpoint payload key belongs to (``model.x``, ``optim.adam_m.x`` ->
    ``x``), so a shard's optimizer slots follow its parameter's spec; None for other keys
    (``rng.*``)."""
    if key.startswith("model."):
        return key[len("model."):]
    if key.startswith("optim."):
        parts = key.split(".", 2)
        return parts[2] if len(parts) == 3 else None
    return None
