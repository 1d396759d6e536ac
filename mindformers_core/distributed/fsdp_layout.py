"""Which parameters fully sharded data parallel splits over the data-parallel ranks.

Pure (no MindSpore). With ``S`` data-parallel ranks a parameter is split along dim 0 into
``S`` equal, contiguous row blocks (``ShardSpec(full_shape, 0, "dp", S)``; rank ``k`` of the dp
group holds rows ``[k d0/S, (k+1) d0/S)``), which are exactly its rows under the ZeRO-1 layout
(``shard_layout.shard_rows``), so the optimizer's state rows and the parameter's rows coincide.
A parameter whose first dim is not a multiple of ``S`` (or a 0-d one) stays replicated: its
gradient is all-reduced and its optimizer state sharded as ZeRO-1 does. No padding, so every
shard is a plain slice of the full tensor and ``shard_spec.unshard`` merges a checkpoint.
"""
from __future__ import annotations

from typing import Dict, Iterable, Tuple

from .shard_spec import ShardSpec

__all__ = ["FSDP_GROUP", "fsdp_specs", "row_block"]

FSDP_GROUP = "dp"


def fsdp_specs(named_shapes: Iterable[Tuple[str, Tuple[int, ...]]], num_shards: int,
               group: str = FSDP_GROUP) -> Dict[str, ShardSpec]:
    """``{name: ShardSpec}`` of the parameters split over ``num_shards`` ranks (module doc);
    the others are absent (replicated)."""
    out = {}
    if num_shards <= 1:
        return out
    for name, shape in named_shapes:
        shape = tuple(int(d) for d in shape)
        if shape and shape[0] % num_shards == 0:
            out[name] = ShardSpec(shape, 0, group, num_shards)
    return out



def row_block(spec: ShardSpec, index: int) -> Tuple[int, int, int]:
    """``(start, stop, rows)`` of block ``index`` of a dim-0 ``spec`` (``fsdp_specs``): what a
    rank of the group holds of the tensor (tp x FSDP: of its tp slice) and the tensor's rows."""
    rows = spec.full_shape[0] // spec.num_shards
    return index * rows, (index + 1) * rows, spec.full_shape[0]
