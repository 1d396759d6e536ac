"""Where each rank's piece of a parameter lives (ZeRO-1 dim-0 shards), and Muon's NS owners.

Pure functions and a small dataclass; no MindSpore.

Dim-0 shards. With ``S`` shards, parameter rows ``[0, d0)`` are split as ``numpy.array_split``
does: shard ``k`` holds rows ``[k*q + min(k, r), (k+1)*q + min(k+1, r))`` with
``q, r = divmod(d0, S)`` (sizes differ by at most one row; 2-D rows stay whole, so row-wise
operations such as the embedding min-norm work on a shard). A parameter with fewer rows than
shards (or a 0-d one) is *replicated*: every rank keeps its whole state and updates it
identically, so no shard is ever empty.

Ranks and shards (HSDP when ``S < W``): shard index = ``rank % S``, replica = ``rank // S``;
ranks ``0..S-1`` hold one full copy of the sharded state, and so the full value of a sharded
tensor is assembled from their pieces.

Flat packing for one collective: every rank lays its pieces out in the same order, each padded
to ``chunk * row_size`` elements (``chunk = ceil(d0 / S)``), so an all-gather of the flat
buffers has equal sizes on every rank.

Newton-Schulz cost of one piece of shape ``(..., A, B)`` with ``L = max(A, B)``,
``s = min(A, B)`` and ``batch`` = product of the leading dims (upstream's estimate, used to
balance owners):

    cost  = batch * (ns_steps * (2 * L * s^2 + s^3) + A * B)
    flops = batch * ns_steps * (4 * L * s^2 + 2 * s^3)   (X X^T, (X X^T)^2, N X; 2 flops/MAC)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["shard_rows", "ParamShard", "ShardLayout", "ns_cost", "ns_flops", "assign_owners"]


def shard_rows(d0: int, num_shards: int, index: int) -> Tuple[int, int]:
    """``(start, stop)`` rows of shard ``index`` of ``d0`` rows split into ``num_shards``."""
    if num_shards < 1 or not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} out of range for {num_shards} shards")
    q, r = divmod(int(d0), int(num_shards))
    return index * q + min(index, r), (index + 1) * q + min(index + 1, r)


@dataclass(frozen=True)
class ParamShard:
    """This rank's piece of one parameter."""
    shape: Tuple[int, ...]
    start: int            # first row held (0 when replicated)
    stop: int             # one past the last row held (d0 when replicated)
    chunk: int            # padded rows per shard in the flat buffers
    row_size: int         # elements per dim-0 row
    sharded: bool

    @property
    def shard_shape(self) -> Tuple[int, ...]:
        return (self.stop - self.start,) + tuple(self.shape[1:]) if self.shape else ()

    @property
    def padded_size(self) -> int:
        return self.chunk * self.row_size

    @property
    def numel(self) -> int:
        return int(math.prod(self.shard_shape)) if self.shape else 1


class ShardLayout:
    """Dim-0 shards of a list of parameter shapes for one rank (see the module docstring)."""

    def __init__(self, shapes: Sequence[Sequence[int]], num_shards: int, rank: int,
                 world_size: int, whole: Optional[Sequence[bool]] = None):
        """``whole[i]``: keep parameter i's state whole on every rank (an expert weight: its
        ranks hold different experts, so its rows must not be spread over them)."""
        if num_shards < 1 or world_size % num_shards != 0:
            raise ValueError(f"num_shards ({num_shards}) must divide world_size ({world_size})")
        self.num_shards = int(num_shards)
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.shard_index = self.rank % self.num_shards
        self.entries: List[ParamShard] = []
        whole = list(whole) if whole is not None else [False] * len(shapes)
        for shape, keep in zip(shapes, whole):
            shape = tuple(int(d) for d in shape)
            d0 = shape[0] if shape else 1
            row = int(math.prod(shape[1:])) if shape else 1
            if keep or not shape or d0 < self.num_shards or self.num_shards == 1:
                self.entries.append(ParamShard(shape, 0, d0, d0, row, False))
            else:
                start, stop = shard_rows(d0, self.num_shards, self.shard_index)
                self.entries.append(ParamShard(shape, start, stop, -(-d0 // self.num_shards),
                                               row, True))

    def __len__(self) -> int:
        return len(self.entries)

    def is_sharded(self, i: int) -> bool:
        return self.entries[i].sharded

    def rows(self, i: int) -> Tuple[int, int]:
        e = self.entries[i]
        return e.start, e.stop

    def shard_shape(self, i: int) -> Tuple[int, ...]:
        return self.entries[i].shard_shape

    # -- flat packing ----------------------------------------------------------------------------
    def pack(self, items: Sequence[Tuple[int, np.ndarray]]) -> np.ndarray:
        """One flat fp32 buffer of this rank's pieces ``(param index, shard array)``, each
        padded to its ``padded_size``."""
        total = sum(self.entries[i].padded_size for i, _ in items)
        buf = np.zeros(total, np.float32)
        off = 0
        for i, arr in items:
            e = self.entries[i]
            flat = np.asarray(arr, np.float32).reshape(-1)
            if flat.size != e.numel:
                raise ValueError(f"piece of parameter {i} has {flat.size} elements, "
                                 f"expected {e.numel}")
            buf[off:off + flat.size] = flat
            off += e.padded_size
        return buf

    def unpack_gathered(self, gathered: np.ndarray, indices: Sequence[int]) -> List[np.ndarray]:
        """Full arrays of the parameters ``indices`` from the all-gather of :meth:`pack`
        buffers (``world_size`` buffers, rank order); pieces come from ranks ``0..S-1``."""
        per_rank = sum(self.entries[i].padded_size for i in indices)
        gathered = np.asarray(gathered, np.float32).reshape(self.world_size, per_rank)
        out = []
        off = 0
        for i in indices:
            e = self.entries[i]
            pieces = []
            for k in range(self.num_shards):
                start, stop = shard_rows(e.shape[0], self.num_shards, k)
                n = (stop - start) * e.row_size
                pieces.append(gathered[k, off:off + n])
            out.append(np.concatenate(pieces).reshape(e.shape))
            off += e.padded_size
        return out


# -- Newton-Schulz cost and owners ------------------------------------------------------------
def _dims(shape: Sequence[int]) -> Tuple[int, int, int]:
    shape = tuple(int(d) for d in shape)
    a, b = shape[-2], shape[-1]
    batch = int(math.prod(shape[:-2])) if len(shape) > 2 else 1
    return batch, a, b


def ns_cost(piece_shapes: Sequence[Sequence[int]], ns_steps: int) -> float:
    """Upstream's owner-balancing estimate, summed over the pieces of one weight."""
    total = 0.0
    for shape in piece_shapes:
        batch, a, b = _dims(shape)
        big, small = max(a, b), min(a, b)
        total += batch * (ns_steps * (2.0 * big * small ** 2 + small ** 3) + a * b)
    return total


def ns_flops(piece_shapes: Sequence[Sequence[int]], ns_steps: int) -> float:
    """Floating-point operations of Newton-Schulz on the pieces (matmuls only)."""
    total = 0.0
    for shape in piece_shapes:
        batch, a, b = _dims(shape)
        big, small = max(a, b), min(a, b)
        total += batch * ns_steps * (4.0 * big * small ** 2 + 2.0 * small ** 3)
    return total


def assign_owners(costs: Sequence[float], world_size: int) -> List[int]:
    """Greedy longest-processing-time assignment: weights by decreasing cost (ties: lower
    index first) each go to the rank with the least load so far (ties: lower rank). The
    same on every rank (pure function of the costs)."""
    load = [0.0] * int(world_size)
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda k: (-float(costs[k]), k)):
        r = min(range(world_size), key=lambda q: (load[q], q))
        owners[i] = r
        load[r] += float(costs[i])
    return owners
