"""Which rank writes which piece of a sharded checkpoint (``checkpoint.remove_redundancy``).

Pure layout math: no MindSpore, no files, no communication. A piece (``sharded_checkpoint.Piece``)
is held by every rank that differs from its holder only along the axes that replicate it
(:func:`replicated_axes`): ``tp``, ``cp`` and ``dp`` for a replicated parameter (the split axis
is dropped), ``edp`` for an expert-parallel piece, ``tp`` for FSDP rows over ``dp_cp`` (cp x
FSDP), and for ZeRO-1 rows the ZeRO replicas (:data:`ZERO_REPLICA`: the ranks of the ZeRO group
with the same row block) instead of ``dp`` and ``cp``, which the ZeRO group spans. Pipeline stages never replicate a piece.

* ``remove_redundancy: False`` (upstream's default): every rank writes every piece it holds, so
  each rank file is self-contained and a piece held by ``R`` ranks is stored ``R`` times.
* ``remove_redundancy: True``: each piece is stored once, the writers balanced over its replicas
  as upstream's balanced save does: the pieces, largest first (then by key), each go to the
  replica with the fewest bytes so far, the lowest one on a tie (:func:`balanced_assignment`).
  The members of one replica group hold the same pieces of that group, so each computes the
  same assignment on its own, and no layout has to be gathered or cached.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

from ..core.parallel_dims import replicated_over

__all__ = ["ZERO_REPLICA", "replicated_axes", "replica_member", "balanced_assignment",
           "axis_sizes", "pieces_to_write"]

#: the pseudo-axis along which the ZeRO-1 replicas of one optimizer row block lie
ZERO_REPLICA = "zero_replica"

def replicated_axes(piece) -> Tuple[str, ...]:
    """The axes along which the ranks holding ``piece`` lie (module docstring;
    ``core.parallel_dims.replicated_over`` of its group)."""
    axes = replicated_over(piece.group)
    if piece.zero_rows is not None:   # the ZeRO group spans dp, and cp under context parallel
        axes = tuple(a for a in axes if a not in ("dp", "cp")) + (ZERO_REPLICA,)
    return axes


def replica_member(axes: Sequence[str], coords: Mapping[str, int],
                   sizes: Mapping[str, int]) -> Tuple[int, int]:
    """``(this rank's index in its replica group, the group's size)`` along ``axes``; an axis
    absent from ``sizes`` has size 1. ``ValueError`` for an index outside its axis."""
    index, members = 0, 1
    for axis in axes:
        size, at = int(sizes.get(axis, 1)), int(coords.get(axis, 0))
        if not 0 <= at < size:
            raise ValueError(f"this rank's index {at} along {axis!r} is outside its size {size}")
        index += at * members
        members *= size
    return index, members


def balanced_assignment(nbytes: Sequence[Tuple[str, int]], members: int) -> Dict[str, int]:
    """``{key: member}``: the keys, largest first then by name, each to the member with the
    fewest bytes so far (the lowest member on a tie)."""
    if members < 1:
        raise ValueError(f"a replica group has at least one member, got {members}")
    load = [0] * members
    owner = {}
    for key, size in sorted(nbytes, key=lambda kv: (-int(kv[1]), kv[0])):
        member = min(range(members), key=lambda m: (load[m], m))
        owner[key] = member
        load[member] += int(size)
    return owner


def pieces_to_write(pieces: Mapping[str, object], nbytes: Mapping[str, int],
                    coords: Mapping[str, int], sizes: Mapping[str, int],
                    remove_redundancy: bool) -> List[str]:
    """The keys of ``pieces`` (this rank's, each of ``nbytes[key]`` bytes) that this rank
    writes: all of them, or with ``remove_redundancy`` its share of each replica group."""
    if not remove_redundancy:
        return sorted(pieces)
    by_axes: Dict[Tuple[str, ...], List[str]] = {}
    for key, piece in pieces.items():
        by_axes.setdefault(replicated_axes(piece), []).append(key)
    mine = []
    for axes, keys in by_axes.items():
        member, members = replica_member(axes, coords, sizes)
        owner = balanced_assignment([(k, nbytes[k]) for k in keys], members)
        mine.extend(k for k in keys if owner[k] == member)
    return sorted(mine)


def axis_sizes(all_coords: Sequence[Mapping[str, int]]) -> Dict[str, int]:
    """The size of every axis of a whole layout, from every rank's ``coords``."""
    sizes: Dict[str, int] = {}
    for coords in all_coords:
        for axis, at in coords.items():
            sizes[axis] = max(sizes.get(axis, 1), int(at) + 1)
    return sizes
