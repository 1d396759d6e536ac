"""Memory planner: per-rank bytes of a run, compared with the memory of one device (pure).

    plan = plan_memory(cfg, world_size)             # layout from the config
    plan = estimate_memory(cfg, Layout(dp=4, tp=8, pp=8, ep=32), settings)   # any layout
    # verdict and text: core/memory_verdict.py (memory_verdict, format_memory_plan)

No MindSpore import (``--check`` uses it). Every item is bytes on the busiest rank; the
formulas are in docs/memory.md. Notation: ``N_r`` parameters this rank owns (dense weights /
tp, experts / ep, layers / pp), ``b`` micro-batch, ``s`` sequence (/ cp), ``h`` hidden, ``n``
heads, ``V`` vocabulary, ``c`` bytes of the compute dtype, ``D`` the data-parallel shard size.

* parameters ``N_r * p`` (p = bytes of ``params_dtype``), ``/ D`` under ``optim_grads_params``;
* gradients ``N_r * (4 + p')``: this package accumulates every gradient in float32
  (trainer/accumulate.py) and a bf16/fp16 parameter's raw gradient (``p' = p``, 0 for float32)
  lives next to it; ``/ D`` under ``optim_grads`` and ``optim_grads_params``;
* fp32 masters ``N_r * 4 / D`` for 16-bit parameters (routed experts under ``ep > 1``: whole,
  not ``/ D``, as their ZeRO groups hold other experts) (2 with AdamW's explicit
  ``store_param_remainders: True``: an int16 remainder), 0 for float32 parameters;
* optimizer state ``/ D``: AdamW ``m`` + ``v`` (4 or 2 bytes each, ``exp_avg_dtype`` /
  ``exp_avg_sq_dtype``); Muon one fp32 momentum on its matrices plus ``m`` + ``v`` (fp32) on
  its AdamW branch (embedding, output layer, 1-D); Lion one fp32 moment; SGD one fp32
  momentum buffer when ``sgd_momentum > 0``;
* activations: per layer and micro-batch (:func:`layer_activation_bytes`), times the layers
  of the stage and the micro-batches in flight (1F1B: ``min(pp, accumulation)``), with full /
  selective recompute and flash attention as parameters;
* MoE dispatch buffers (:func:`moe_dispatch_bytes`): this package's dense-over-experts form
  (every expert on every token, models/mlp.py) or an all-to-all dispatch of ``k`` copies per
  token (upstream, and what ``ep > 1`` means);
* backward workspace ``2 b n s^2 (4 + c')``: the gradients of one layer's attention
  probabilities and scores (none with flash attention); gradient clipping copy ``4 N_r`` with
  ``training.max_norm`` set (clip_by_norm writes new float32 gradients);
* logits / cross-entropy workspace ``b s V / tp * (4 + 4 + 4 + c')``: float32 logits, their
  log-softmax, the logits' gradient, and the compute-dtype logits before the cast (``c' = c``
  for 16-bit compute, else 0);
* under ``optim_grads_params`` with ``D > 1`` (distributed/fsdp.py) every decoder layer is a
  recomputed unit (activations as full recompute of all layers), and the largest unit
  (a layer, the embedding or the output layer: ``N_u`` parameters) is gathered at a time:
  FSDP gathered unit ``N_u * (2 p + 4)`` (its full weights, their full gradient and its
  float32 copy for the reduce-scatter);
* compiled-graph buffers (core/memory_jit.py): under ``training.jit: layer`` / ``model`` on
  CPU, every compiled, non-recomputed layer keeps about 0.6 x its activations on top (measured).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .memory_device import ASCEND_910B_BYTES, device_memory_limit, plan_backend
from .parallel_dims import fsdp_ranks, ulysses_degree
from .memory_jit import JIT_PLAN_MODES, compiled_graph_bytes, planned_jit_mode
from .pipeline_split import StageSplit, peak_in_flight_bound, pipeline_stages
from .recompute import SELECT_MODES, parse_layer_selection

__all__ = ["DTYPE_BYTES", "ASCEND_910B_BYTES", "WARN_FRACTION", "LayerParams", "ParamCounts",
           "param_counts", "Layout", "ActivationSettings", "OptimizerState", "MemoryPlan",
           "layout_from_config", "settings_from_config", "optimizer_state_from_config",
           "layer_activation_bytes", "moe_dispatch_bytes", "logits_bytes", "estimate_memory",
           "plan_memory", "device_memory_limit", "plan_backend",
           "pipeline_stages", "config_stage_layers", "stage_items",
           "SHARD_STRATEGIES"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp32": 4, "bf16": 2}
WARN_FRACTION = 0.9
SHARD_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


# ----------------------------------------------------------------------------------------------
# parameter count (the one analytic count: tools/doctor.py uses it too)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerParams:
    """Trainable parameters of one decoder layer, by how a layout splits them."""
    norms: int        # RMSNorm gammas (input, pre-MLP, MLA q/kv): replicated
    attention: int    # attention matrices: split by tp, except ``attention_replicated``
    mlp: int          # dense MLP (split by tp), or the shared experts of a MoE layer
    router: int       # MoE router E x h: replicated
    experts: int      # routed experts: split by ep
    num_experts: int = 0
    attention_replicated: int = 0   # MLA's down-projections (inside attention): replicated

    def per_rank(self, tp: int, ep: int) -> int:
        """Parameters one rank holds (models/tp_plan.py): the attention matrices and the
        dense MLP or shared experts split by tp, MLA's down-projections, the norms and the
        router replicated, the routed experts split by ep."""
        attention = (self.attention - self.attention_replicated) // tp + self.attention_replicated
        return self.norms + attention + self.mlp // tp + self.router + self.experts // ep

    @property
    def total(self) -> int:
        return self.norms + self.attention + self.mlp + self.router + self.experts


@dataclass(frozen=True)
class ParamCounts:
    embedding: int    # V x h, split by tp (vocabulary-parallel)
    output: int       # V x h (0 when tied), split by tp
    final_norm: int
    layers: Tuple[LayerParams, ...]

    @property
    def total(self) -> int:
        return self.embedding + self.output + self.final_norm + sum(l.total for l in self.layers)


def param_counts(model_cfg) -> ParamCounts:
    """Trainable parameters of ``build_model(model_cfg)`` without building it.

    Per layer: 2 RMSNorm gammas (+ the q/k head norms); attention (GQA: qkv + proj; MLA: q down/up (or q_proj) with
    its norm, kv down/up with its norm, proj); MLP (SwiGLU: fc1 h x 2f, fc2 f x h) or MoE
    (router E x h, experts E x (h x 2m + m x h), shared experts an MLP of width n_shared x m).
    Plus the embedding V x h, the final norm h and the output layer V x h unless tied.
    """
    c = model_cfg
    h, heads, V = c.hidden_size, c.num_attention_heads, c.vocab_size
    norms = 2 * h
    down = 0
    if c.resolved_multi_latent_attention():
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        down = (c.kv_lora_rank + c.qk_rope_head_dim) * h
        if c.q_lora_rank is None:
            attn = heads * qk * h
        else:
            attn = c.q_lora_rank * h + heads * qk * c.q_lora_rank
            down += c.q_lora_rank * h
            norms += c.q_lora_rank
        attn += (c.kv_lora_rank + c.qk_rope_head_dim) * h \
            + heads * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank \
            + h * heads * c.v_head_dim
        norms += c.kv_lora_rank
    else:
        hd = c.resolved_kv_channels()
        attn = (heads * hd + 2 * c.resolved_num_query_groups() * hd) * h + h * heads * hd
        norms += 2 * hd if c.resolved_qk_layernorm() else 0   # Qwen3's per-head q/k gains
    layers = []
    for i in range(c.num_layers):
        if c.model_type == "deepseek_v3" and i >= c.first_k_dense_replace:
            m, e = c.resolved_moe_intermediate_size(), c.n_routed_experts
            layers.append(LayerParams(norms, attn, 3 * c.n_shared_experts * m * h, e * h,
                                      e * 3 * m * h, e, down))
        else:
            layers.append(LayerParams(norms, attn, 3 * c.resolved_ffn_hidden_size() * h, 0, 0,
                                      0, down))
    return ParamCounts(V * h, 0 if c.tie_word_embeddings else V * h, h, tuple(layers))


# ----------------------------------------------------------------------------------------------
# inputs of the estimate
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Parallel layout: sizes, and over how many data-parallel ranks state is sharded."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    dp_shard: int = 1               # D: ranks the sharded state is split over (1..dp)
    shard_strategy: str = "optim"   # what is sharded over D (config/compat/parallel_noop.py names)

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "ep", "cp", "dp_shard"):
            if getattr(self, name) < 1:
                raise ValueError(f"layout.{name} must be >= 1, got {getattr(self, name)}")
        if self.dp % self.dp_shard != 0:
            raise ValueError(f"layout.dp_shard({self.dp_shard}) must divide dp({self.dp})")
        if self.shard_strategy not in SHARD_STRATEGIES:
            raise ValueError(f"layout.shard_strategy must be one of {SHARD_STRATEGIES}, got "
                             f"{self.shard_strategy!r}")
        if (self.dp * self.tp * self.cp) % self.ep != 0:
            raise ValueError(f"layout.ep({self.ep}) must divide dp*tp*cp "
                             f"({self.dp * self.tp * self.cp}): experts are spread over the "
                             "data/tensor/context-parallel ranks of a stage")

    @classmethod
    def from_dims(cls, dims) -> "Layout":
        """The planner's view of a run's :class:`~.parallel_dims.ParallelDims` (the planner
        also takes layouts no run has, for what-if questions: tools/memory_report.py)."""
        return cls(dp=dims.dp, tp=dims.tp, pp=dims.pp, ep=dims.ep, cp=dims.cp,
                   sequence_parallel=dims.sequence_parallel, dp_shard=dims.dp_shard,
                   shard_strategy=dims.shard_strategy)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def state_shards(self) -> int:
        """Ranks the sharded state is split over: D (1 under no_shard: replicated), or under
        context parallel with FSDP (optim_grads / optim_grads_params over every dp rank)
        D x cp, the dp_cp group (distributed/fsdp.py)."""
        if self.shard_strategy in ("optim_grads", "optim_grads_params"):
            return fsdp_ranks(self.dp, self.dp_shard, self.cp)
        return 1 if self.shard_strategy == "no_shard" else self.dp_shard

    def shard(self, what: str) -> int:
        """Divisor of an item: :attr:`state_shards` when the strategy shards ``what``
        (optim|grads|params)."""
        level = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        need = {"optim": 1, "grads": 2, "params": 3}[what]
        return self.state_shards if level[self.shard_strategy] >= need else 1

    def describe(self) -> str:
        sp = ", sp" if self.sequence_parallel else ""
        return (f"dp {self.dp} (state sharded over {self.state_shards}, "
                f"{self.shard_strategy}), tp {self.tp}, pp {self.pp}, ep {self.ep}, "
                f"cp {self.cp}{sp}")


@dataclass(frozen=True)
class ActivationSettings:
    micro_batch: int = 1
    num_micro_batches: int = 1        # accumulation steps (bounds what 1F1B keeps in flight)
    recompute: str = "none"           # none | full | selective
    recompute_layers: Optional[int] = None   # full: layers recomputed per stage (None = all)
    flash_attention: bool = False
    moe_dispatch: str = "dense"       # dense (this package) | alltoall (upstream)
    jit: str = "none"                 # training.jit as modelled (core/memory_jit.py)
    #: ranks of one cp all-to-all (core/parallel_dims.ulysses_degree): the attention core runs
    #: heads / ulysses of seq_length / cp * ulysses tokens
    ulysses: int = 1

    def __post_init__(self):
        if self.recompute not in ("none", "full", "selective"):
            raise ValueError(f"recompute must be 'none', 'full' or 'selective', got "
                             f"{self.recompute!r}")
        if self.moe_dispatch not in ("dense", "alltoall"):
            raise ValueError(f"moe_dispatch must be 'dense' or 'alltoall', got "
                             f"{self.moe_dispatch!r}")
        if self.jit not in JIT_PLAN_MODES:
            raise ValueError(f"jit must be one of {JIT_PLAN_MODES}, got {self.jit!r}")
        if self.ulysses < 1:
            raise ValueError(f"ulysses must be >= 1, got {self.ulysses}")
        if self.micro_batch < 1 or self.num_micro_batches < 1:
            raise ValueError(f"micro_batch and num_micro_batches must be >= 1, got "
                             f"{self.micro_batch}, {self.num_micro_batches}")


@dataclass(frozen=True)
class OptimizerState:
    """Bytes of optimizer state per parameter, for the parameters of each branch."""
    kind: str
    matrix_bytes: int      # per parameter on the main branch (Muon: its matrices)
    adamw_bytes: int       # per parameter on Muon's AdamW branch (= matrix_bytes otherwise)
    master_bytes: int      # fp32 master (or remainder) per 16-bit parameter


# ----------------------------------------------------------------------------------------------
# from a RunConfig
# ----------------------------------------------------------------------------------------------
def layout_from_config(cfg, world_size: int) -> Layout:
    """The layout the config asks for on ``world_size`` ranks: the run's ParallelDims
    (``cfg.parallel_dims``, core/parallel_dims.py) as the planner's :class:`Layout`."""
    return Layout.from_dims(cfg.parallel_dims(world_size))


def settings_from_config(cfg, layout: Layout, backend: Optional[str] = None) \
        -> ActivationSettings:
    """Micro-batch, accumulation, ``recompute:``, ``use_flash_attention`` and ``training.jit``
    of the config; ``backend`` (default: :func:`plan_backend` of ``cfg.context``) decides
    whether compiled layers are modelled (CPU only, core/memory_jit.py)."""
    tr, rc = cfg.training, cfg.recompute
    base = layout.dp * tr.local_batch_size
    accumulation = max(1, tr.global_batch_size // base) if tr.global_batch_size % base == 0 else 1
    mode = rc.mode if rc.mode not in (None, "None") else None
    n = cfg.model.num_layers
    layers = None
    if mode == "full" or rc.full_recompute:
        recompute = "full"
        if rc.full_recompute_layer not in (None, [], (), {}):
            # the one layer selection of recompute: (core/recompute.py)
            layers = len(parse_layer_selection(rc.full_recompute_layer, n))
    elif mode in SELECT_MODES or rc.select_recompute:
        recompute = "selective"
    else:
        recompute = "none"
    if layout.shard("params") > 1:   # fully sharded units are recomputed (distributed/fsdp.py)
        recompute, layers = "full", None
    flash = bool(cfg.model.use_flash_attention)
    # recomputed layers run as Cells, never compiled (RunConfig.model_jit_mode), and so does
    # the CPU blockwise attention (models.compiled.effective_mode)
    jit = planned_jit_mode(cfg.model_jit_mode() if recompute == "none" and not flash
                           else "none",
                           cfg.model.compute_dtype,
                           plan_backend(cfg.context) if backend is None else backend)
    par = cfg.parallelism
    ulysses = ulysses_degree(par.context_parallel_method, layout.cp, par.ulysses_degree_in_cp)
    return ActivationSettings(jit=jit, micro_batch=tr.local_batch_size,
                              num_micro_batches=accumulation,
                              recompute=recompute, recompute_layers=layers,
                              flash_attention=flash,
                              moe_dispatch="alltoall" if layout.ep > 1 else "dense",
                              ulysses=ulysses if layout.cp % ulysses == 0 else 1)


def optimizer_state_from_config(opt_cfg, params_dtype: str) -> OptimizerState:
    kind = opt_cfg.type
    p = DTYPE_BYTES[params_dtype]
    remainder = kind == "AdamW" and p == 2 and "store_param_remainders" in opt_cfg.explicit_keys \
        and bool(opt_cfg.store_param_remainders)
    master = 0 if p == 4 else (2 if remainder else 4)
    if kind == "AdamW":
        m = DTYPE_BYTES[opt_cfg.exp_avg_dtype] + DTYPE_BYTES[opt_cfg.exp_avg_sq_dtype]
        return OptimizerState(kind, m, m, master)
    if kind == "Muon":
        return OptimizerState(kind, 4, 8, master)
    if kind == "Lion":
        return OptimizerState(kind, 4, 4, master)
    sgd = 4 if float(getattr(opt_cfg, "sgd_momentum", 0.0) or 0.0) > 0 else 0
    return OptimizerState(kind, sgd, sgd, master)


# ----------------------------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------------------------
def _attention_core_bytes(model_cfg, b: int, s: int, heads: int, flash: bool) -> int:
    """Saved by the attention core per layer: float32 softmax probabilities [b, n, s, s] and
    their compute-dtype copy, or with flash attention only the float32 log-sum-exp [b, n, s]."""
    c = DTYPE_BYTES[model_cfg.compute_dtype]
    if flash:
        return 4 * b * heads * s
    return b * heads * s * s * (4 + (c if c != 4 else 0))


def _core_bytes(model_cfg, layout: Layout, settings: ActivationSettings, flash: bool) -> int:
    """:func:`_attention_core_bytes` of a rank: under ulysses (``settings.ulysses`` = u) the
    all-to-all gives the core ``heads / u`` of ``seq_length / cp * u`` tokens."""
    u = settings.ulysses
    return _attention_core_bytes(model_cfg, settings.micro_batch,
                                 max(1, model_cfg.seq_length // layout.cp) * u,
                                 max(1, model_cfg.num_attention_heads // layout.tp // u), flash)


def layer_activation_bytes(model_cfg, layout: Layout, settings: ActivationSettings,
                           moe: bool) -> Dict[str, int]:
    """Bytes one layer keeps for backward per micro-batch, by part (no recompute).

    ``boundary``: the tensors at the layer's edges, [b, s, h] each (split by tp only with
    sequence parallelism): the two RMSNorms keep their float32 input and normalised output
    (4 x 4 bytes), the attention and MLP inputs their compute-dtype copy (2 x c);
    ``attention``: q, k, v after RoPE, the projections' outputs and the context (split by tp),
    plus the core (:func:`_attention_core_bytes`); ``mlp``: SwiGLU's fc1 output [2f], gate,
    silu(gate), up and their product [f each] (split by tp); for a MoE layer the shared
    experts' MLP here and the routed experts in :func:`moe_dispatch_bytes`.
    """
    m, cb = model_cfg, DTYPE_BYTES[model_cfg.compute_dtype]
    b, s = settings.micro_batch, max(1, m.seq_length // layout.cp)
    h = m.hidden_size
    tp = layout.tp
    heads = max(1, m.num_attention_heads // tp)
    edge_split = tp if layout.sequence_parallel else 1
    boundary = b * s * h * (4 * 4 + 2 * cb) // edge_split
    if m.resolved_multi_latent_attention():
        dn, dr, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        # q [dn+dr], k [dn+dr], v [dv], kv_up output [dn+dv], context [dv] per head, plus the
        # latent c_kv, k_pe and q down-projection (replicated across tp)
        per_head = 2 * (dn + dr) + dv + (dn + dv) + dv
        latent = m.kv_lora_rank + dr + (m.q_lora_rank or 0)
        attn = b * s * (heads * per_head * cb + latent * (4 + cb))
    else:
        d = m.resolved_kv_channels()
        groups = max(1, m.resolved_num_query_groups() // tp)
        # qkv output, q/k after RoPE (and the GQA-broadcast k, v), context; the q/k norms
        # (Qwen3) keep their float32 input and output
        attn = b * s * d * cb * ((heads + 2 * groups) + 2 * heads + 2 * heads + heads)
        attn += b * s * d * (heads + groups) * 8 if m.resolved_qk_layernorm() else 0
    attn += _core_bytes(m, layout, settings, settings.flash_attention)
    f = m.n_shared_experts * m.resolved_moe_intermediate_size() if moe \
        else m.resolved_ffn_hidden_size()
    mlp = b * s * max(1, f // tp) * 6 * cb if f > 0 else 0
    return {"boundary": int(boundary), "attention": int(attn), "mlp": int(mlp)}


def moe_dispatch_bytes(model_cfg, layout: Layout, settings: ActivationSettings) -> int:
    """Bytes a MoE layer keeps per micro-batch for its routed experts and the router.

    Router: float32 scores, one-hot [T, k, E] and the combine weights [T, E], T = b s tokens.
    ``dense`` (models/mlp.py GroupedExperts): every expert runs on every token, keeping
    [E, T, h] input and output, [E, T, 2m] fc1 output and 3 [E, T, m] SwiGLU tensors.
    ``alltoall``: ``k`` copies of each token are dispatched (send + receive buffers [kT, h]),
    each expert keeps the same SwiGLU tensors for its tokens and the combine [kT, h].
    """
    m = model_cfg
    cb = DTYPE_BYTES[m.compute_dtype]
    t = settings.micro_batch * max(1, m.seq_length // layout.cp)
    e, k, f, h = m.n_routed_experts, m.num_experts_per_tok, m.resolved_moe_intermediate_size(), \
        m.hidden_size
    router = 4 * t * e * (2 + k + 1)
    if settings.moe_dispatch == "dense":
        experts = e // layout.ep * t * (2 * h + 5 * f) * cb
    else:
        experts = k * t * (3 * h + 5 * f) * cb
    return int(router + experts)


def logits_bytes(model_cfg, layout: Layout, settings: ActivationSettings) -> int:
    """float32 logits, log-softmax and logits gradient [b, s, V/tp] (+ the compute-dtype
    logits for 16-bit compute)."""
    cb = DTYPE_BYTES[model_cfg.compute_dtype]
    tokens = settings.micro_batch * max(1, model_cfg.seq_length // layout.cp)
    return int(tokens * math.ceil(model_cfg.vocab_size / layout.tp) * (12 + (cb if cb != 4 else 0)))


# ----------------------------------------------------------------------------------------------
# the estimate
# ----------------------------------------------------------------------------------------------
@dataclass
class MemoryPlan:
    """Per-rank bytes by item (the busiest pipeline stage), the limit and where it came from."""
    items: Dict[str, int]
    layout: Layout
    settings: ActivationSettings
    params_per_rank: int
    total_params: int
    stage_layers: int
    stage: int = 0
    limit: Optional[float] = None
    limit_source: str = ""
    notes: List[str] = field(default_factory=list)
    seq_length: int = 0   # the model's (whole) sequence; each rank holds seq_length / cp

    @property
    def seq_per_rank(self) -> int:
        """Tokens of each sequence a rank holds (context parallel splits the sequence)."""
        return max(1, self.seq_length // self.layout.cp)

    @property
    def total(self) -> int:
        return int(sum(self.items.values()))

    def to_dict(self) -> dict:
        return {"items": dict(self.items), "total": self.total, "limit": self.limit,
                "limit_source": self.limit_source, "layout": self.layout.describe(),
                "params_per_rank": self.params_per_rank, "total_params": self.total_params,
                "stage_layers": self.stage_layers, "stage": self.stage,
                "recompute": self.settings.recompute,
                "flash_attention": self.settings.flash_attention,
                "micro_batch": self.settings.micro_batch, "seq_per_rank": self.seq_per_rank,
                "moe_dispatch": self.settings.moe_dispatch, "notes": list(self.notes)}


def config_stage_layers(cfg, model_cfg, layout: Layout) -> Tuple[List[List[int]], int]:
    """(layers of each stage, interleave): the config's own split (``parallelism.
    pipeline_parallel_layers_per_stage`` / ``_interleave_num``, core/pipeline_split.py) when
    the layout is the config's pipeline size, else the contiguous split of another layout."""
    par = cfg.parallelism
    if layout.pp > 1 and layout.pp == par.pipeline_parallel:
        split = StageSplit.build(model_cfg.num_layers, layout.pp,
                                 par.pipeline_parallel_interleave_num,
                                 par.pipeline_parallel_layers_per_stage)
        return [split.stage_layers(s) for s in range(layout.pp)], split.vpp
    return [list(r) for r in pipeline_stages(model_cfg.num_layers, layout.pp)], 1


def stage_items(model_cfg, counts: ParamCounts, layout: Layout, settings: ActivationSettings,
                 opt: OptimizerState, stage: int, layers: Sequence[int],
                 clip_grads: bool = False, vpp: int = 1) -> Tuple[Dict[str, int], int]:
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    first, last = stage == 0, stage == pp - 1
    adamw_branch = (counts.embedding // tp if first else 0) \
        + ((counts.output // tp + counts.final_norm) if last else 0)
    if counts.output == 0 and last and not first:   # tied: the last stage keeps its own copy
        adamw_branch += counts.embedding // tp
    matrices = 0
    for i in layers:
        lp = counts.layers[i]
        adamw_branch += lp.norms
        matrices += lp.per_rank(tp, ep) - lp.norms
    n_rank = adamw_branch + matrices
    # under ep > 1 the ranks of a ZeRO group hold different experts, so an expert's master and
    # state stay whole on its rank (distributed/ep_reduce.py: ZeroSharding.keep_whole)
    whole = sum(counts.layers[i].experts // ep for i in layers) if ep > 1 else 0
    d = layout.shard("optim")
    p = DTYPE_BYTES[model_cfg.params_dtype]
    items = {
        "parameters": n_rank * p // layout.shard("params"),
        "gradients": n_rank * (4 + (p if p != 4 else 0)) // layout.shard("grads"),
        "fp32 masters": (n_rank - whole) * opt.master_bytes // d + whole * opt.master_bytes,
        "optimizer state": ((matrices - whole) * opt.matrix_bytes
                            + adamw_branch * opt.adamw_bytes) // d + whole * opt.matrix_bytes,
    }
    # micro-batch chunks held at once by the schedule (1F1B: pp - stage), each 1/vpp of the stage
    in_flight = peak_in_flight_bound(pp, stage, settings.num_micro_batches, vpp)
    per_layer, by_kind = [], {}
    for i in layers:
        moe = counts.layers[i].num_experts > 0
        if moe not in by_kind:   # every dense (MoE) layer of a model keeps the same bytes
            by_kind[moe] = (layer_activation_bytes(model_cfg, layout, settings, moe),
                            moe_dispatch_bytes(model_cfg, layout, settings) if moe else 0, moe)
        per_layer.append(by_kind[moe])
    n_layers = len(per_layer)
    recomputed = 0
    if settings.recompute == "full":
        recomputed = n_layers if settings.recompute_layers is None else \
            min(n_layers, settings.recompute_layers)
    acts, moe_total, biggest_layer, compiled = 0, 0, 0, 0
    for j, (parts, dispatch, moe) in enumerate(per_layer):
        full = sum(parts.values())
        biggest_layer = max(biggest_layer, full + dispatch)
        if j < recomputed:   # only the layer's input is kept: [b, s, h] in the compute dtype
            acts += _layer_input_bytes(model_cfg, layout, settings)
            continue
        if settings.recompute == "selective":   # the attention core is recomputed
            full -= _core_bytes(model_cfg, layout, settings, settings.flash_attention)
        acts += full
        moe_total += dispatch
        compiled += compiled_graph_bytes(parts, moe, settings.jit)
    items["activations"] = acts * in_flight // vpp
    items["MoE dispatch buffers"] = moe_total * in_flight // vpp
    if settings.jit != "none":   # compiled layers keep their graphs' buffers (memory_jit.py)
        items["compiled-graph buffers"] = compiled * in_flight // vpp
    if recomputed:   # backward re-runs one recomputed layer at a time and holds all of it
        items["recompute workspace"] = biggest_layer
    if n_layers and not settings.flash_attention:
        # backward of one layer holds the gradients of its probabilities and of its scores
        items["backward workspace"] = 2 * _core_bytes(model_cfg, layout, settings, False)
    items["logits/CE workspace"] = logits_bytes(model_cfg, layout, settings) if last else 0
    if clip_grads:   # clip_by_norm scales every gradient into a new float32 tensor
        items["gradient clipping copy"] = n_rank * 4 // layout.shard("grads")
    if layout.shard("params") > 1:
        unit = max([counts.embedding // tp if first else 0, counts.output // tp if last else 0]
                   + [lp.norms + lp.attention // tp + lp.mlp // tp + lp.router + lp.experts // ep
                      for lp in (counts.layers[i] for i in layers)])
        items["FSDP gathered unit"] = unit * (2 * p + 4)
    return items, n_rank


def _layer_input_bytes(model_cfg, layout: Layout, settings: ActivationSettings) -> int:
    s = max(1, model_cfg.seq_length // layout.cp)
    edge = layout.tp if layout.sequence_parallel else 1
    return settings.micro_batch * s * model_cfg.hidden_size \
        * DTYPE_BYTES[model_cfg.compute_dtype] // edge


def estimate_memory(cfg, layout: Layout, settings: Optional[ActivationSettings] = None, *,
                    model_cfg=None, opt_state: Optional[OptimizerState] = None,
                    split: Optional[StageSplit] = None,
                    counts: Optional[ParamCounts] = None) -> MemoryPlan:
    """Per-rank bytes of ``cfg`` (a RunConfig) under ``layout`` (any sizes, also ones the
    config refuses today), for the busiest pipeline stage. No device limit is attached.
    ``split`` (core/pipeline_split.py) is a pipeline split other than the config's (the
    layout advisor's candidates, tools/plan_layout.py); ``counts`` is ``param_counts(model_cfg)``
    when the caller has it."""
    model_cfg = cfg.model if model_cfg is None else model_cfg
    if settings is None:
        settings = settings_from_config(cfg, layout)
    if opt_state is None:
        opt_state = optimizer_state_from_config(cfg.optimizer, model_cfg.params_dtype)
    counts = param_counts(model_cfg) if counts is None else counts
    if model_cfg.model_type == "deepseek_v3" and model_cfg.n_routed_experts % layout.ep != 0:
        raise ValueError(f"layout.ep({layout.ep}) must divide n_routed_experts "
                         f"({model_cfg.n_routed_experts})")
    if layout.pp > model_cfg.num_layers:
        raise ValueError(f"layout.pp({layout.pp}) must be <= num_layers({model_cfg.num_layers})")
    best = None
    if split is None:
        stage_layers, vpp = config_stage_layers(cfg, model_cfg, layout)
    else:
        stage_layers, vpp = [split.stage_layers(s) for s in range(split.pp)], split.vpp
    for stage, layers in enumerate(stage_layers):
        items, n_rank = stage_items(model_cfg, counts, layout, settings, opt_state, stage,
                                     layers, cfg.training.max_norm is not None, vpp)
        if best is None or sum(items.values()) > sum(best[0].values()):
            best = (items, n_rank, len(layers), stage)
    items, n_rank, n_layers, stage = best
    return MemoryPlan(items=items, layout=layout, settings=settings, params_per_rank=n_rank,
                      total_params=counts.total, stage_layers=n_layers, stage=stage,
                      seq_length=model_cfg.seq_length)


def plan_memory(cfg, world_size: Optional[int] = None, layout: Optional[Layout] = None,
                settings: Optional[ActivationSettings] = None, *,
                host_ram: Optional[float] = None,
                npu_visible: Optional[bool] = None) -> MemoryPlan:
    """:func:`estimate_memory` for the config's layout on ``world_size`` ranks (default: the
    launcher's) or the given ``layout``, with the device limit of ``cfg.context``."""
    if layout is None:
        if world_size is None:
            from ..launch_env import env_world_size
            world_size = env_world_size()
        layout = layout_from_config(cfg, world_size)
    if settings is None:
        settings = settings_from_config(cfg, layout, plan_backend(cfg.context, npu_visible))
    plan = estimate_memory(cfg, layout, settings)
    plan.limit, plan.limit_source = device_memory_limit(cfg.context, host_ram, npu_visible)
    return plan
