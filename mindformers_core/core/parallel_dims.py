"""ParallelDims: the one value that describes a run's parallel layout (pure; no MindSpore).

It is built once per run, by the config plan (``config.run_config.RunConfig.parallel_dims``)
and by the run setup (``distributed.setup``), and everything else reads it: the plan and
``--check``, the memory planner, the trainer, the communicator's groups, checkpoint layouts and
the tools.

Sizes. ``world = pp * dp * cp * tp``; ``dp = dp_replicate * dp_shard`` where ``dp_shard`` is the
number of data-parallel ranks the optimizer state (and, per ``shard_strategy``, gradients and
parameters) is sharded over (``parallelism.data_parallel_shard``); ``vpp`` virtual stages per
pipeline rank (``pipeline_parallel_interleave_num``).

Rank order is Megatron's: tensor parallel fastest, then context, then data, then pipeline::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so a tensor-parallel group is ``tp`` consecutive ranks (tp 2 x dp 2: tp {0,1} {2,3}, dp {0,2}
{1,3}).

Expert parallel follows upstream's MoE folding (Megatron's, without expert tensor parallel):
inside one pipeline stage the ``tp * cp * dp`` ranks are regrouped for the routed experts as
``ep x edp``, ep fastest::

    local   = tp_rank + tp * (cp_rank + cp * dp_rank)
    ep_rank = local % ep,   edp_rank = local // ep

so ``ep`` must divide ``tp * cp * dp``; routed experts are split over an ``ep`` group and
replicated over its ``edp`` group (the ranks that hold the same experts). Without tp and cp
this is EP carved out of data parallel, consecutive data-parallel ranks first.

Group names are derived from the members (``tp_0_1``), so every member of a group computes the
same name without any agreement step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .expert_rules import check_expert_fold

__all__ = ["AXES", "ParallelDims", "Mesh", "make_mesh", "group_name", "fsdp_ranks",
           "replicated_over"]

#: the axes every rank creates a group for (distributed/collectives.py), in creation order
AXES = ("tp", "cp", "dp", "pp", "ep", "edp", "world")


def fsdp_ranks(dp: int, dp_shard: int, cp: int = 1) -> int:
    """Ranks the FSDP strategies (optim_grads / optim_grads_params) split a weight over:
    ``dp_shard``, or when every dp rank shards under context parallel ``dp_shard * cp`` (the
    dp x cp ranks of the ``dp_cp`` group: the cp ranks of a replica hold the same weights and
    read other tokens; distributed/fsdp.py)."""
    return dp_shard * cp if dp_shard == dp else dp_shard


def ulysses_degree(method: str, cp: int, degree_in_cp: Optional[int] = None) -> int:
    """The ranks of one context-parallel all-to-all (``parallelism.context_parallel_method``):
    ``cp`` for ulysses, ``ulysses_degree_in_cp`` (default 1) for hybrid, 1 for colossal (the
    ring alone) and without cp. Each rank's attention core then runs ``heads / degree`` heads
    of ``seq_length / cp * degree`` tokens (distributed/context_parallel.py; the memory
    planner's attention core, core/memory_plan.py)."""
    if cp <= 1:
        return 1
    if method == "ulysses":
        return cp
    if method == "hybrid":
        return int(degree_in_cp or 1)
    return 1


#: the axes whose ranks hold the same piece, by the group a parameter is split over (None:
#: whole); an expert piece: only its edp group, since ep folds over tp x cp x dp (under tp x ep
#: the ranks of a tp group may hold other experts)
_REPLICATED_OVER = {None: ("tp", "cp", "dp"), "tp": ("cp", "dp"), "ep": ("edp",),
                    "dp_shard": ("tp", "cp", "dp_replicate"), "dp_cp": ("tp",)}


def replicated_over(group) -> tuple:
    """The axes along which the ranks holding the same piece of a parameter split over
    ``group`` (None: a whole one) lie: what a checkpoint writes or sends once per replica
    group (checkpoint/plan.py, distributed/pipeline_checkpoint.py)."""
    return _REPLICATED_OVER.get(group, tuple(a for a in _REPLICATED_OVER[None] if a != group))


def group_name(axis: str, ranks) -> str:
    """The name of the group of ``ranks`` along ``axis``: identical on every member."""
    return axis + "_" + "_".join(str(int(r)) for r in ranks)


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel dimensions of one run (module docstring).

    ``dp_shard`` None means every data-parallel rank (``dp``); ``shard_strategy`` is
    ``parallelism.data_parallel_shard_strategy`` (what is sharded over ``dp_shard``)."""
    world: int
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int = 1
    dp_shard: Optional[int] = None
    sequence_parallel: bool = False
    shard_strategy: str = "optim"

    def __post_init__(self):
        if self.dp_shard is None:
            object.__setattr__(self, "dp_shard", self.dp)
        for name in ("world", "tp", "cp", "dp", "pp", "ep", "vpp", "dp_shard"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, but got "
                                 f"{getattr(self, name)}.")
        if self.tp * self.cp * self.dp * self.pp != self.world:
            raise ValueError(f"world_size({self.world}) must equal tensor_parallel({self.tp}) * "
                             f"context_parallel({self.cp}) * data_parallel({self.dp}) * "
                             f"pipeline_parallel({self.pp}).")
        if self.dp % self.dp_shard:
            raise ValueError(f"data_parallel_shard({self.dp_shard}) must divide "
                             f"data_parallel({self.dp}).")
        check_expert_fold(self.tp, self.cp, self.dp, self.ep)

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def edp(self) -> int:
        """Ranks of a stage that hold the same routed experts (``tp * cp * dp / ep``)."""
        return self.tp * self.cp * self.dp // self.ep

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage (``tp * cp * dp``)."""
        return self.tp * self.cp * self.dp

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    def sizes(self) -> Dict[str, int]:
        """Every size by its upstream-ish name (plan tables, logs, checkpoints)."""
        return {"world": self.world, "tp": self.tp, "cp": self.cp, "dp": self.dp,
                "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "pp": self.pp,
                "vpp": self.vpp, "ep": self.ep, "edp": self.edp}

    def describe(self) -> str:
        sp = " (+sp)" if self.sequence_parallel and self.tp > 1 else ""
        return (f"world {self.world} = tp {self.tp}{sp} x cp {self.cp} x dp {self.dp} "
                f"(replicate {self.dp_replicate} x shard {self.dp_shard}, "
                f"{self.shard_strategy}) x pp {self.pp} (vpp {self.vpp}); "
                f"ep {self.ep} x edp {self.edp}")

    # -- coordinates -----------------------------------------------------------------------------
    def coords(self, rank: int) -> Dict[str, int]:
        """This rank's index along every axis, and ``dp_cp``: its index in its
        :meth:`dp_cp_group` (what FSDP splits over under context parallel)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the world of {self.world} ranks")
        tp_r, rest = rank % self.tp, rank // self.tp
        cp_r, rest = rest % self.cp, rest // self.cp
        dp_r, pp_r = rest % self.dp, rest // self.dp
        local = tp_r + self.tp * (cp_r + self.cp * dp_r)
        return {"tp": tp_r, "cp": cp_r, "dp": dp_r, "pp": pp_r,
                "ep": local % self.ep, "edp": local // self.ep,
                "dp_cp": cp_r + self.cp * dp_r, "world": rank}

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def _rank_of_folded(self, ep: int, edp: int, pp: int) -> int:
        local = ep + self.ep * edp
        tp_r, rest = local % self.tp, local // self.tp
        return self.rank_of(tp_r, rest % self.cp, rest // self.cp, pp)

    def size(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(f"unknown parallel axis {axis!r}; expected one of {AXES}")
        if axis == "edp":
            return self.edp
        return self.world if axis == "world" else getattr(self, axis)

    def group_of(self, axis: str, rank: int) -> Tuple[int, ...]:
        """The ranks of ``rank``'s group along ``axis``, ascending (``rank`` included)."""
        if axis == "world" or self.size(axis) == self.world:
            return tuple(range(self.world))
        c = self.coords(rank)
        out = []
        for i in range(self.size(axis)):
            k = dict(c)
            k[axis] = i
            if axis in ("ep", "edp"):
                out.append(self._rank_of_folded(k["ep"], k["edp"], k["pp"]))
            else:
                out.append(self.rank_of(k["tp"], k["cp"], k["dp"], k["pp"]))
        return tuple(sorted(out))

    def dp_cp_group(self, rank: int) -> Tuple[int, ...]:
        """The ranks that hold the same model shard and read other tokens: ``rank``'s dp x cp
        group (the same tp and pp index; Megatron's data-parallel group with context
        parallel), ascending. Gradients of a tp shard are reduced over it under cp x tp."""
        c = self.coords(rank)
        return tuple(sorted(self.rank_of(c["tp"], cp, dp, c["pp"])
                            for cp in range(self.cp) for dp in range(self.dp)))

    def groups(self, axis: str) -> List[Tuple[int, ...]]:
        """Every group along ``axis`` (a partition of the world), ordered by its first rank."""
        return sorted({self.group_of(axis, r) for r in range(self.world)})

    def local_rank(self, axis: str, rank: int) -> int:
        """``rank``'s index inside its group along ``axis``."""
        return self.group_of(axis, rank).index(rank)


#: the name the communicator and the checkpoint layouts use for the value
Mesh = ParallelDims


def make_mesh(world: int, tp: int = 1, cp: int = 1, pp: int = 1, ep: int = 1, vpp: int = 1,
              dp_shard: Optional[int] = None, sequence_parallel: bool = False,
              shard_strategy: str = "optim") -> ParallelDims:
    """The dims of ``world`` ranks; ``dp = world // (tp * cp * pp)`` (upstream's messages)."""
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
    return ParallelDims(world=world, tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, vpp=vpp,
                        dp_shard=dp_shard, sequence_parallel=sequence_parallel,
                        shard_strategy=shard_strategy)
