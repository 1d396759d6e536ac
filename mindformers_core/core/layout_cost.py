"""Predicted step time of a parallel layout (pure): compute, pipeline bubble, communication.

The layout advisor's time model (tools/plan_layout.py; formulas and blind spots in
docs/plan_layout.md). Notation: ``b`` micro-batch, ``s`` sequence, ``T = b s / cp`` tokens of
one micro-batch on a rank, ``h`` hidden, ``c`` bytes of the compute dtype, ``M`` micro-batches
per step, ``alpha`` / ``B`` a link's latency and bandwidth (core/device_profiles.py).

* compute: FLOPs of the busiest pipeline stage per micro-batch (core/flops.py's count, per
  rank: matrices / tp, routed experts as run: every local expert on every token with the
  dense form of ep 1, ``k`` experts per token with the all-to-all of ep > 1; attention
  ``6 (w_qk + w_v) s / tp`` per token), times 8/6 with full recompute (the forward again) or
  plus the attention core's forward with selective, over the worker's sustained rate
  (oversubscribed CPU workers share the cores), plus on a CPU the fixed PyNative cost of each
  layer's ops;
* pipeline: ``M`` micro-batches of the busiest stage stretched by the bubble fraction ``f`` of
  the schedule (the caller simulates it: distributed/pipeline_schedule.py), ``/ (1 - f)``;
* communication per step, each collective ``steps * alpha + bytes / B`` on the link its group
  spans (Megatron rank order, core/parallel_dims.py):
  tp: 4 all-reduces of ``T h c`` per layer and micro-batch (6 with full recompute), sequence
  parallel's gather / scatter pairs move the same bytes; cp: ring attention passes the K/V
  chunk ``cp - 1`` times forward and twice that backward; ep: 4 all-to-alls of ``k T h c`` per
  MoE layer and micro-batch, ``(ep - 1) / ep`` of it leaves the rank; dp: float32 gradients
  over the data-parallel group once per step (routed experts over their edp group), by
  strategy (table in docs/plan_layout.md), one collective per decoder layer (+ embedding and
  output); pp: one activation forward and one gradient backward of ``T h c`` per micro-batch
  and model chunk.

Nothing is overlapped: every byte is exposed (a blind spot for layouts whose reduction would
hide behind the backward).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from .device_profiles import DeviceProfile
from .flops import attention_widths, flops_per_token
from .memory_plan import DTYPE_BYTES, ActivationSettings, LayerParams, Layout, ParamCounts
from .pipeline_split import StageSplit

__all__ = ["StepCost", "layer_flops_per_token", "stage_flops_per_micro", "ring_all_reduce",
           "ring_gather", "all_to_all", "p2p", "dp_comm_seconds", "step_cost",
           "model_flops_per_token", "bubble_from_busy"]

GRAD_BYTES = 4   # this package reduces float32 gradients (trainer/accumulate.py)


@dataclass
class StepCost:
    compute_s: float                 # the busiest stage's M micro-batches, no bubble
    bubble_s: float
    comm_s: Dict[str, float] = field(default_factory=dict)   # seconds per step, by axis
    step_s: float = 0.0
    bubble_fraction: float = 0.0
    mfu: float = 0.0

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.comm_s.values())


# -- FLOPs ------------------------------------------------------------------------------------
def _expert_params_run(lp: LayerParams, layout: Layout, settings: ActivationSettings,
                       top_k: int) -> float:
    """Routed-expert parameters one token multiplies with on a rank: every local expert with
    the dense form (models/mlp.py), ``k`` experts with the all-to-all dispatch."""
    if lp.num_experts == 0:
        return 0.0
    if settings.moe_dispatch == "dense":
        return lp.experts / layout.ep
    return lp.experts / lp.num_experts * top_k


def layer_flops_per_token(model_cfg, lp: LayerParams, layout: Layout,
                          settings: ActivationSettings) -> float:
    """Training FLOPs (forward + backward, recompute included) of one layer per local token."""
    qk, v = attention_widths(model_cfg)
    tp = layout.tp
    matrices = (lp.attention - lp.attention_replicated) / tp + lp.attention_replicated \
        + lp.mlp / tp + lp.router + _expert_params_run(lp, layout, settings,
                                                       model_cfg.num_experts_per_tok)
    attention = (qk + v) * model_cfg.seq_length / tp
    flops = 6.0 * matrices + 6.0 * attention
    if settings.recompute == "full":
        flops += 2.0 * matrices + 2.0 * attention
    elif settings.recompute == "selective":
        flops += 2.0 * attention
    return flops


def stage_flops_per_micro(model_cfg, counts: ParamCounts, layout: Layout, split: StageSplit,
                          settings: ActivationSettings, stage: int,
                          per_layer: Optional[Dict[int, float]] = None) -> float:
    """FLOPs of one micro-batch on ``stage`` (``per_layer``: layer index -> FLOPs per token,
    filled as computed, shared by the stages of one candidate)."""
    tokens = settings.micro_batch * model_cfg.seq_length / layout.cp
    per_layer = {} if per_layer is None else per_layer
    flops = 0.0
    for i in split.stage_layers(stage):
        if i not in per_layer:
            per_layer[i] = layer_flops_per_token(model_cfg, counts.layers[i], layout, settings)
        flops += per_layer[i]
    if stage == split.pp - 1:   # the output layer (the tied embedding's matrix when tied)
        flops += 6.0 * model_cfg.vocab_size * model_cfg.hidden_size / layout.tp
    return flops * tokens


def model_flops_per_token(model_cfg, counts: ParamCounts) -> float:
    """core/flops.py's count (the trainer's MFU), with the routed experts a token uses."""
    k = model_cfg.num_experts_per_tok
    matrices = sum(lp.total - lp.norms - lp.experts
                   + (lp.experts / lp.num_experts * k if lp.num_experts else 0)
                   for lp in counts.layers)
    readout = counts.output or counts.embedding
    return flops_per_token({"non_embedding": matrices, "output_layer": readout},
                           model_cfg.num_layers, model_cfg.hidden_size, model_cfg.seq_length,
                           model_cfg.vocab_size, False, attention_widths(model_cfg))


# -- collectives (seconds) --------------------------------------------------------------------
def ring_all_reduce(nbytes: float, n: int, bw: float, alpha: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks: 2 (n-1) steps, 2 (n-1)/n bytes."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * nbytes / bw


def ring_gather(nbytes: float, n: int, bw: float, alpha: float) -> float:
    """All-gather (or reduce-scatter) of a ``nbytes`` whole: n-1 steps, (n-1)/n bytes."""
    if n <= 1:
        return 0.0
    return (n - 1) * alpha + (n - 1) / n * nbytes / bw


def all_to_all(nbytes: float, n: int, bw: float, alpha: float) -> float:
    """All-to-all of ``nbytes`` per rank: (n-1)/n of it leaves, n-1 peers."""
    return ring_gather(nbytes, n, bw, alpha)


def p2p(nbytes: float, bw: float, alpha: float) -> float:
    return alpha + nbytes / bw


def dp_comm_seconds(strategy: str, n_params: float, n: int, param_bytes: int, units: int,
                    num_micro: int, bw: float, alpha: float) -> float:
    """Per step: reducing ``n_params`` float32 gradients over ``n`` ranks under ``strategy``
    (docs/plan_layout.md), ``units`` collectives of each kind."""
    if n <= 1 or n_params <= 0:
        return 0.0
    g, p = n_params * GRAD_BYTES, n_params * param_bytes

    def coll(fn, nbytes):   # one collective per unit, the bytes split over the units
        return units * fn(nbytes / units, n, bw, alpha)
    if strategy == "no_shard":
        return coll(ring_all_reduce, g)
    if strategy == "optim":         # all-reduce, update a shard, gather the parameters
        return coll(ring_all_reduce, g) + coll(ring_gather, p)
    if strategy == "optim_grads":   # reduce-scatter, update, gather
        return coll(ring_gather, g) + coll(ring_gather, p)
    # optim_grads_params: gathered for the forward and again for the backward, gradients
    # reduce-scattered, per micro-batch
    return num_micro * (2 * coll(ring_gather, p) + coll(ring_gather, g))


# -- the step ---------------------------------------------------------------------------------
def step_cost(model_cfg, counts: ParamCounts, layout: Layout, split: StageSplit,
              settings: ActivationSettings, profile: DeviceProfile,
              bubble_fraction: float, global_batch: int) -> StepCost:
    """Predicted seconds of one optimizer step of the busiest rank (module docstring)."""
    c = DTYPE_BYTES[model_cfg.compute_dtype]
    p = DTYPE_BYTES[model_cfg.params_dtype]
    tp, cp, ep, dp, pp = layout.tp, layout.cp, layout.ep, layout.dp, layout.pp
    M, b = settings.num_micro_batches, settings.micro_batch
    T = b * model_cfg.seq_length / cp
    h = model_cfg.hidden_size
    world = layout.world_size
    workers = min(world, profile.devices_per_node)
    rate = profile.rate_per_worker(workers)
    share = 1.0 if profile.cores is None else max(1.0, workers / profile.cores)
    redo = 1.0 + (1.0 / 3.0 if settings.recompute == "full" else 0.0)
    stage_size = tp * cp * dp
    tp_bw, tp_a = profile.link(tp)
    cp_bw, cp_a = profile.link(tp * cp)
    ep_bw, ep_a = profile.link(ep)
    qk, v = attention_widths(model_cfg)
    per_micro, comm = [], {"tp": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0, "pp": 0.0}
    busiest = (0.0, 0)
    per_layer: Dict[int, float] = {}
    for stage in range(pp):
        layers = split.stage_layers(stage)
        moe = sum(1 for i in layers if counts.layers[i].num_experts)
        t = stage_flops_per_micro(model_cfg, counts, layout, split, settings, stage,
                                  per_layer) / rate
        t += len(layers) * profile.ops_per_layer * profile.op_overhead_s * redo * share
        tp_s = len(layers) * (6 if settings.recompute == "full" else 4) * \
            ring_all_reduce(T * h * c, tp, tp_bw, tp_a)
        cp_s = len(layers) * 3 * (cp - 1) * p2p(T * (qk + v) / tp * c, cp_bw, cp_a) \
            if cp > 1 else 0.0
        ep_s = moe * (6 if settings.recompute == "full" else 4) * \
            all_to_all(model_cfg.num_experts_per_tok * T * h * c, ep, ep_bw, ep_a)
        per_micro.append(t + tp_s + cp_s + ep_s)
        if per_micro[-1] >= busiest[0]:
            busiest = (per_micro[-1], stage)
            comm.update(tp=M * tp_s, cp=M * cp_s, ep=M * ep_s)
            compute_s = M * t
    pipe = busiest[0] * M / max(1e-9, 1.0 - bubble_fraction)
    bubble_s = pipe - busiest[0] * M
    # data parallel: dense parameters over dp x cp, routed experts over their edp group
    stage = busiest[1]
    layers = split.stage_layers(stage)
    experts = sum(counts.layers[i].experts for i in layers) / ep
    dense = sum(counts.layers[i].per_rank(tp, ep) for i in layers) - experts
    dense += (counts.embedding / tp if stage == 0 else 0) + \
        ((counts.output / tp + counts.final_norm) if stage == pp - 1 else 0)
    units = len(layers) + 2
    dp_bw, dp_a = profile.link(stage_size)
    edp = stage_size // ep
    comm["dp"] = dp_comm_seconds(layout.shard_strategy if layout.dp_shard > 1 else "no_shard",
                                 dense, dp * cp, p, units, M, dp_bw, dp_a) + \
        dp_comm_seconds(layout.shard_strategy if layout.dp_shard > 1 else "no_shard",
                        experts, edp, p, units, M, dp_bw, dp_a)
    if pp > 1:
        pp_bw, pp_a = profile.link(2 * stage_size)
        comm["pp"] = M * split.vpp * 2 * p2p(T * h * c, pp_bw, pp_a)
    step = pipe + comm["pp"] + comm["dp"]
    flops = model_flops_per_token(model_cfg, counts) * global_batch * model_cfg.seq_length
    mfu = flops / (step * profile.peak_flops * world) if step > 0 else 0.0
    return StepCost(compute_s=compute_s, bubble_s=bubble_s, comm_s=comm, step_s=step,
                    bubble_fraction=bubble_fraction, mfu=mfu)


def bubble_from_busy(busy: float, makespan: float) -> float:
    """Idle fraction of a stage busy ``busy`` of a schedule lasting ``makespan``."""
    return max(0.0, 1.0 - busy / makespan) if makespan > 0 else 0.0
