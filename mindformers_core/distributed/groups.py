"""The device mesh: which ranks form each tensor / context / data / pipeline / expert group.

Pure (no MindSpore). Megatron's rank order: tensor parallel fastest, then context, then data,
then pipeline,

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
    dp   = world // (tp * cp * pp)

so a tensor-parallel group is ``tp`` consecutive ranks (tp 2 x dp 2: tp {0,1} {2,3}, dp {0,2}
{1,3}). Expert parallel is carved out of data parallel, consecutive data-parallel ranks first:
``dp_rank = ep_rank + ep * edp_rank``; an ``ep`` group holds the ranks that differ only in
``ep_rank``, an ``edp`` group (expert data parallel: the replicas of one expert shard) those that
differ only in ``edp_rank``.

Group names are derived from the members (``tp_0_1``), so every member of a group computes the
same name without any agreement step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..core.expert_rules import check_expert_dp

__all__ = ["AXES", "Mesh", "make_mesh", "group_name"]

AXES = ("tp", "cp", "dp", "pp", "ep", "edp", "world")


def group_name(axis: str, ranks) -> str:
    """The name of the group of ``ranks`` along ``axis``: identical on every member."""
    return axis + "_" + "_".join(str(int(r)) for r in ranks)


@dataclass(frozen=True)
class Mesh:
    """Sizes of the parallel dimensions of one run (``world = tp * cp * dp * pp``)."""
    world: int
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    def coords(self, rank: int) -> Dict[str, int]:
        """This rank's index along every axis (``ep``/``edp`` split ``dp``)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the world of {self.world} ranks")
        tp_r, rest = rank % self.tp, rank // self.tp
        cp_r, rest = rest % self.cp, rest // self.cp
        dp_r, pp_r = rest % self.dp, rest // self.dp
        return {"tp": tp_r, "cp": cp_r, "dp": dp_r, "pp": pp_r,
                "ep": dp_r % self.ep, "edp": dp_r // self.ep, "world": rank}

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def size(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(f"unknown parallel axis {axis!r}; expected one of {AXES}")
        if axis == "edp":
            return self.dp // self.ep
        return self.world if axis == "world" else getattr(self, axis)

    def group_of(self, axis: str, rank: int) -> Tuple[int, ...]:
        """The ranks of ``rank``'s group along ``axis``, ascending (``rank`` included)."""
        if self.size(axis) == self.world or axis == "world":
            return tuple(range(self.world))
        c = self.coords(rank)
        out = []
        for i in range(self.size(axis)):
            k = dict(c)
            k[axis] = i
            if axis in ("ep", "edp"):
                k["dp"] = k["ep"] + self.ep * k["edp"]
            out.append(self.rank_of(k["tp"], k["cp"], k["dp"], k["pp"]))
        return tuple(sorted(out))

    def groups(self, axis: str) -> List[Tuple[int, ...]]:
        """Every group along ``axis`` (a partition of the world), ordered by its first rank."""
        seen = {self.group_of(axis, r) for r in range(self.world)}
        return sorted(seen)

    def local_rank(self, axis: str, rank: int) -> int:
        """``rank``'s index inside its group along ``axis``."""
        return self.group_of(axis, rank).index(rank)


def make_mesh(world: int, tp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1) -> Mesh:
    """The mesh of ``world`` ranks; ``dp = world // (tp * cp * pp)`` (upstream's messages)."""
    for name, v in (("world_size", world), ("tensor_parallel", tp), ("context_parallel", cp),
                    ("pipeline_parallel", pp), ("expert_parallel", ep)):
        if int(v) < 1:
            raise ValueError(f"{name} must be a positive integer, but got {v}.")
    dp = world // (tp * pp * cp)
    if dp <= 0:
        raise ValueError(f"tensor_parallel({tp}) * pipeline_parallel({pp}) * "
                         f"context_parallel({cp}) must be less than or equal to "
                         f"world_size({world}).")
    if dp * tp * pp * cp != world:
        raise ValueError(f"world_size({world}) must be divisible by tensor_parallel({tp}) * "
                         f"pipeline_parallel({pp}) * context_parallel({cp}).")
    check_expert_dp(dp, ep)
    return Mesh(world=world, tp=tp, cp=cp, dp=dp, pp=pp, ep=ep)
