"""The layout advisor's search: every layout the package accepts for a config on N devices, its
per-rank memory (core/memory_plan.py) and predicted step time (core/layout_cost.py), ranked.

No hand-kept list of what runs: a candidate is kept when ``make_mesh`` builds its
ParallelDims and ``config/layout.py``'s ``check_layout`` accepts them, and, before it is
reported, when the config with the candidate's ``parallelism:`` / ``recompute:`` /
``local_batch_size`` loads with the launcher's world size set to N (every rule of
``RunConfig.validate``: heads vs tp, layers per stage, micro-batches vs pp, experts vs ep...).
So the advisor proposes more layouts as ``check_layout`` accepts more.

Enumerated: tp, cp, pp (each a divisor of N), interleave ``vpp`` (``pp * vpp <=`` layers), an
even split or, when the layers do not divide, two ``pipeline_parallel_layers_per_stage`` lists
(the extra layers on the first stages or on the last), ep (a divisor of the routed experts),
every ``data_parallel_shard_strategy`` (state sharded over all of dp), sequence parallel with
tp; with ``vary``: the micro-batch (every divisor of global batch / dp) and the recompute mode.
The global batch stays the config's.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from ..config import ConfigError, load_config
from ..config.layout import check_layout
from ..core.device_profiles import DeviceProfile
from ..core.layout_cost import StepCost, bubble_from_busy, step_cost
from ..core.memory_plan import (SHARD_STRATEGIES, Layout, MemoryPlan, ParamCounts,
                                estimate_memory, param_counts, plan_backend,
                                settings_from_config)
from ..core.parallel_dims import make_mesh
from ..core.pipeline_split import StageSplit, pipeline_stages
from ..distributed.pipeline_schedule import (FORWARD, check_schedule_args, schedule,
                                             virtual_stage)

__all__ = ["Candidate", "Evaluated", "enumerate_candidates", "evaluate", "search",
           "schedule_bubble", "layers_per_stage_lists", "candidate_overrides", "RECOMPUTE_YAML"]

RECOMPUTE_MODES = ("none", "selective", "full")
#: the ``recompute:`` section of each mode (config/recompute.py)
RECOMPUTE_YAML = {"none": {"mode": "None"}, "full": {"mode": "full"},
                  "selective": {"mode": "select",
                                "select_module": ["layers.*.self_attention.core_attention"]}}


@dataclass(frozen=True)
class Candidate:
    tp: int
    cp: int
    pp: int
    vpp: int
    ep: int
    dp: int
    strategy: str
    sequence_parallel: bool
    layers_per_stage: Optional[Tuple[str, ...]]   # None: "auto"
    recompute: str
    micro_batch: int

    def parallelism(self) -> dict:
        """The ``parallelism:`` section (upstream's keys)."""
        return {"tensor_parallel": self.tp, "pipeline_parallel": self.pp,
                "expert_parallel": self.ep, "context_parallel": self.cp,
                "data_parallel_shard": self.dp, "data_parallel_shard_strategy": self.strategy,
                "sequence_parallel": self.sequence_parallel,
                "pipeline_parallel_interleave_num": self.vpp,
                "pipeline_parallel_layers_per_stage":
                    "auto" if self.layers_per_stage is None else list(self.layers_per_stage)}

    def describe(self) -> str:
        parts = [f"tp{self.tp}" + ("+sp" if self.sequence_parallel else ""),
                 f"pp{self.pp}" + (f"x{self.vpp}" if self.vpp > 1 else ""), f"ep{self.ep}",
                 f"cp{self.cp}", f"dp{self.dp} {self.strategy}"]
        if self.layers_per_stage is not None:
            parts.append("uneven split")
        return " ".join(parts)


@dataclass
class Evaluated:
    candidate: Candidate
    memory: MemoryPlan
    memory_bytes: int          # planner total + the process baseline
    cost: Optional[StepCost]   # None: not timed (it does not fit and no one asked)
    checked: bool = False      # the candidate config loaded (phase 2)

    def to_json(self) -> dict:
        c = self.candidate
        return {"parallelism": c.parallelism(), "recompute": c.recompute,
                "local_batch_size": c.micro_batch, "memory_bytes_per_rank": self.memory_bytes,
                "step_time_s": self.cost.step_s, "bubble_s": self.cost.bubble_s,
                "exposed_comm_s": self.cost.exposed_comm_s,
                "comm_s": dict(self.cost.comm_s), "compute_s": self.cost.compute_s,
                "mfu": self.cost.mfu}


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layers_per_stage_lists(num_layers: int, pp: int, vpp: int) -> List[Optional[Tuple[str, ...]]]:
    """``[None]`` ("auto") when ``pp * vpp`` divides the layers, else two lists of ``pp``
    strings (core/pipeline_split.py's form): the extra layers on the first virtual stages
    (``pipeline_stages``) or on the last."""
    total = pp * vpp
    if num_layers % total == 0:
        return [None]
    front = pipeline_stages(num_layers, total)
    sizes = [len(r) for r in front]
    out = []
    for order in (sizes, sizes[::-1]):
        ranges, start = [], 0
        for n in order:
            ranges.append(f"{start}-{start + n - 1}")
            start += n
        out.append(tuple(",".join(ranges[c * pp + s] for c in range(vpp)) for s in range(pp)))
    return out


def enumerate_candidates(cfg, world: int, vary: Iterable[str] = (),
                         node: Optional[int] = None) -> Iterator[Candidate]:
    """Every combination (module docstring); tp and cp stay inside a node of ``node`` devices
    (their per-layer collectives over the inter-node link never win; docs/plan_layout.md)."""
    m, gb = cfg.model, cfg.training.global_batch_size
    node = world if node is None else node
    vary = set(vary)
    base_recompute = settings_from_config(cfg, Layout()).recompute
    experts = m.n_routed_experts if m.model_type == "deepseek_v3" else 0
    for tp in _divisors(world):
        if tp > m.num_attention_heads or tp > node:
            continue
        for cp in _divisors(world // tp):
            if m.seq_length % cp or tp * cp > node:
                continue
            for pp in _divisors(world // (tp * cp)):
                if pp > m.num_layers:
                    continue
                dp = world // (tp * cp * pp)
                vpps = [1] + [v for v in (2, 3, 4) if pp > 1 and pp * v <= m.num_layers]
                mbs = [cfg.training.local_batch_size] if "micro_batch" not in vary else \
                    [b for b in _divisors(gb // dp)] if gb % dp == 0 else []
                eps = [e for e in _divisors(experts) if (tp * cp * dp) % e == 0] \
                    if experts else [1]
                for vpp in vpps:
                    for lps in layers_per_stage_lists(m.num_layers, pp, vpp):
                        for ep in eps:
                            # one data-parallel rank: nothing to shard, one strategy
                            for strategy in (SHARD_STRATEGIES if dp > 1 else ("optim",)):
                                for sp in ((False, True) if tp > 1 else (False,)):
                                    for rc in (RECOMPUTE_MODES if "recompute" in vary
                                               else (base_recompute,)):
                                        for mb in mbs:
                                            yield Candidate(tp, cp, pp, vpp, ep, dp, strategy,
                                                            sp, lps, rc, mb)


#: forward and backward time of one chunk in the timed replay (a backward computes two
#: matmuls per forward matmul: core/flops.py's 2N + 4N)
FORWARD_COST, BACKWARD_COST = 1.0, 2.0


def check_schedule(pp: int, vpp: int, num_micro: int, name: str = "1f1b") -> None:
    """ValueError when distributed/pipeline_schedule.py's ``schedule`` refuses the pipeline
    (what :func:`schedule_bubble` would raise, without the replay)."""
    if pp > 1:
        check_schedule_args(pp, num_micro, vpp, name)


@lru_cache(maxsize=None)
def schedule_bubble(pp: int, vpp: int, num_micro: int, name: str = "1f1b") -> float:
    """Idle fraction of a stage under the schedule the pipeline runs (distributed/
    pipeline_schedule.py's ``schedule``: the actions of each stage, in order), replayed with
    a backward twice as long as a forward, each action starting when its stage is free and
    its producer (the previous virtual stage's forward, the next one's backward) finished.
    ValueError for a schedule ``schedule`` refuses."""
    if pp == 1:
        return 0.0
    schedules = {s: schedule(name, pp, s, num_micro, vpp) for s in range(pp)}
    finish: Dict[tuple, float] = {}
    free = {s: 0.0 for s in schedules}
    pos = {s: 0 for s in schedules}
    last = pp * vpp - 1
    while any(pos[s] < len(schedules[s]) for s in schedules):
        for s in schedules:
            while pos[s] < len(schedules[s]):
                a = schedules[s][pos[s]]
                v = virtual_stage(pp, a.stage, a.chunk)
                if a.kind == FORWARD:
                    need = (v - 1, a.micro, FORWARD) if v > 0 else None
                else:
                    need = (v, a.micro, FORWARD) if v == last else (v + 1, a.micro, a.kind)
                if need is not None and need not in finish:
                    break
                start = max(free[s], finish[need] if need is not None else 0.0)
                free[s] = start + (FORWARD_COST if a.kind == FORWARD else BACKWARD_COST)
                finish[(v, a.micro, a.kind)] = free[s]
                pos[s] += 1
    busy = num_micro * vpp * (FORWARD_COST + BACKWARD_COST)
    return bubble_from_busy(busy, max(free.values()))


def _settings(cfg, layout: Layout, cand: Candidate, num_micro: int, backend: str):
    s = settings_from_config(cfg, layout, backend)
    recompute = "full" if layout.shard("params") > 1 else cand.recompute
    return replace(s, micro_batch=cand.micro_batch, num_micro_batches=num_micro,
                   recompute=recompute,
                   recompute_layers=s.recompute_layers if recompute == s.recompute else None,
                   jit=s.jit if recompute == "none" else "none")


def evaluate(cfg, cand: Candidate, world: int, profile: DeviceProfile, *,
             counts: Optional[ParamCounts] = None, backend: Optional[str] = None,
             time_above: Optional[float] = None) -> Optional[Evaluated]:
    """Memory and time of ``cand`` on ``cfg`` (None when make_mesh, check_layout, the split or
    the schedule refuse it); ``counts`` / ``backend``: ``param_counts(cfg.model)`` and
    ``plan_backend(cfg.context)`` when the caller has them (one search, many candidates);
    ``time_above``: a memory (bytes) above which the step is not timed (``cost`` None: the
    schedule replay and the cost model are most of an evaluation)."""
    counts = param_counts(cfg.model) if counts is None else counts
    backend = plan_backend(cfg.context) if backend is None else backend
    gb = cfg.training.global_batch_size
    if gb % (cand.dp * cand.micro_batch):
        return None
    num_micro = gb // (cand.dp * cand.micro_batch)
    try:
        dims = make_mesh(world, tp=cand.tp, cp=cand.cp, pp=cand.pp, ep=cand.ep, vpp=cand.vpp,
                         dp_shard=cand.dp, sequence_parallel=cand.sequence_parallel,
                         shard_strategy=cand.strategy)
        check_layout(dims)
        split = StageSplit.build(cfg.model.num_layers, cand.pp, cand.vpp,
                                 None if cand.layers_per_stage is None
                                 else list(cand.layers_per_stage))
        check_schedule(cand.pp, cand.vpp, num_micro, cfg.parallelism.pipeline_parallel_schedule)
    except (ConfigError, ValueError):
        return None
    layout = Layout.from_dims(dims)
    settings = _settings(cfg, layout, cand, num_micro, backend)
    cand = replace(cand, recompute=settings.recompute)   # FSDP units are recomputed
    try:
        memory = estimate_memory(cfg, layout, settings, split=split, counts=counts)
    except ValueError:
        return None
    total = int(memory.total + profile.baseline_bytes)
    if time_above is not None and total > time_above:
        return Evaluated(cand, memory, total, None)
    bubble = schedule_bubble(cand.pp, cand.vpp, num_micro,
                             cfg.parallelism.pipeline_parallel_schedule)
    cost = step_cost(cfg.model, counts, layout, split, settings, profile, bubble, gb)
    return Evaluated(cand, memory, total, cost)


def candidate_overrides(cand: Candidate) -> List[str]:
    """``--set`` overrides that turn the config into the candidate."""
    import json
    out = [f"parallelism.{k}={json.dumps(v, separators=(',', ':'))}"
           for k, v in cand.parallelism().items()]
    out += [f"recompute.{k}={json.dumps(v, separators=(',', ':'))}"
            for k, v in RECOMPUTE_YAML[cand.recompute].items()]
    if cand.recompute != "selective":
        out.append("recompute.select_module=null")
    if cand.recompute != "full":
        out.append("recompute.full_recompute_layer=null")
    out.append(f"training.local_batch_size={cand.micro_batch}")
    return out


@contextmanager
def _launcher_world(world: int):
    """The launcher's world size as the config sees it (launch_env.env_world_size reads
    MS_WORKER_NUM, as ``MS_WORKER_NUM=8 run_mindformer.py --check`` does)."""
    old = os.environ.get("MS_WORKER_NUM")
    os.environ["MS_WORKER_NUM"] = str(world)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MS_WORKER_NUM", None)
        else:
            os.environ["MS_WORKER_NUM"] = old


def config_check(source, overrides: List[str], cand: Candidate, world: int):
    """The candidate's RunConfig (every config rule at world ``world``), or the ConfigError."""
    with _launcher_world(world):
        try:
            return load_config(source, overrides=list(overrides) + candidate_overrides(cand))
        except ConfigError as exc:
            return exc


def search(cfg, world: int, profile: DeviceProfile, limit: float, *, source=None,
           overrides: Iterable[str] = (), vary: Iterable[str] = (), top: int = 10,
           time_unfit: bool = True) -> Tuple[List[Evaluated], Dict[str, object]]:
    """(the ``top`` fitting layouts, best first; facts for the explanation: ``accepted`` count,
    ``smallest`` (least memory of all accepted), ``faster_unfit`` (the fastest that does not
    fit, when faster than the best; only with ``time_unfit``: without it the layouts that do
    not fit are not timed, the same fitting layouts in less time))."""
    seen, evaluated = set(), []
    counts, backend = param_counts(cfg.model), plan_backend(cfg.context)
    time_above = None if time_unfit else limit
    for c in enumerate_candidates(cfg, world, vary, profile.devices_per_node):
        e = evaluate(cfg, c, world, profile, counts=counts, backend=backend,
                     time_above=time_above)
        if e is not None and e.candidate not in seen:
            seen.add(e.candidate)
            evaluated.append(e)
    evaluated.sort(key=lambda e: (math.inf if e.cost is None else e.cost.step_s,
                                  e.memory_bytes))
    facts: Dict[str, object] = {"accepted": len(evaluated),
                                "smallest": min(evaluated, key=lambda e: e.memory_bytes,
                                                default=None)}
    out: List[Evaluated] = []
    for e in evaluated:
        if e.memory_bytes > limit:
            facts.setdefault("faster_unfit", e)
            continue
        if source is not None:
            checked = config_check(source, list(overrides), e.candidate, world)
            if isinstance(checked, ConfigError):
                continue
            e.checked = True
        out.append(e)
        if len(out) >= top:
            break
    return out, facts
