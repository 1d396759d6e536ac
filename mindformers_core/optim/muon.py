"""Muon: momentum orthogonalised by Newton-Schulz for matrices, AdamW (or Lion) for the rest.

Update at optimizer step t (once per optimizer step, on the accumulated gradient g of the whole
step; never per micro-batch), for a Muon-routed parameter with fp32 master p, group lr and
effective weight decay wd (upstream MindFormers 2.1):

    m <- mu * m + g                                   (fp32 momentum buffer muon_m.{name})
    U  = g + mu * m   (nesterov)   or   U = m         (the buffer itself is never overwritten)
    for each piece X of U (muon_split: fused q/kv/fc1/expert weights are cut into pieces):
        D_X = lr * scale(A, B) * matched_adamw_rms * muon_extra_scale_factor * NS(X)
            scale = sqrt(max(A, B)) for muon_scale_mode "spectral" (upstream); (A, B) = the
            piece's last two dims
    p <- p * (1 - lr * wd) - merge(D)

NS is `newton_schulz.orthogonalize` with the schedule from `ns_coefficients` (flat or
segmented) or the named preset `muon_coefficient_type`; pieces of the same (A, B) across all
weights are stacked and orthogonalised in one batched call (bounded by ns_batch_memory_gb).

Every other parameter (1-D, and 2-D/3-D ones matching `adamw_include`, default
`*word_embeddings*`, `*output_layer*`) takes AdamW with `adamw_betas`, `adamw_eps`, the bias
corrections of Muon's own step counter, and lr * `adamw_lr_mult` (the fixed Muon/AdamW lr ratio,
e.g. Muon 2e-2 with AdamW 3e-3 is adamw_lr_mult 0.15): the rule object ``scalar_rule``
(``update_rules.AdamRule``, the same Adam math as ``AdamW``). `muon_scalar_optimizer: lion`
uses ``update_rules.LionRule`` for them instead (sign of the interpolated momentum, betas
`lion_betas`). Muon is an ``Optimizer`` of its own (it holds these rules, it does not inherit
AdamW), so it allocates Adam moments only for the parameters of its Adam branch.

After all updates, QK-Clip (`qk_clip.qk_clip_step`) rescales the MLA q/k rows of the fp32
masters of heads whose tracked max logit exceeds `qk_clip_threshold`; then the masters are
copied to the low-precision model parameters. `last_qk_clip` holds what it did.

State names are upstream's: `muon_m.{name}` (Muon), `adam_m.{name}` / `adam_v.{name}` (AdamW
branch only), `main_param.{name}` (fp32 masters of bf16/fp16 params), `global_step`.

Construction checks run in upstream's order with upstream's messages: memory
budgets, swap, model (given, not legacy, MLA), ns schedule, qk_clip_threshold, adamw_include,
Ascend cube_math_type, split rules, comm_strategy; then our extra knobs. Unlike upstream, a 3-D
weight that is not a grouped expert weight is rejected here, not at the first step.

Communication: single-card and replicated data parallel need nothing (gradients arrive
reduced). Where the update pieces live is the ``exchange`` (a :class:`MuonExchange`):
:class:`LocalExchange` here, ``distributed.shard_exchange.ShardedMuonExchange`` for sharded
weights (ZeRO-1 rows, tensor-parallel shards, both; allgather: every rank gathers the full U
and runs NS; allgather_deredundency: one owner rank per weight runs NS and the update goes
back). ``_muon_update`` is the one momentum / NS / scale / decay path for all of them; on one
card both strategies give the same update. A tensor-parallel shard's split rule and scale come
from its full shape (``full_shapes``), never the shard's.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, ops

from ..core.muon_rules import (check_memory_budget, check_muon_range, check_muon_swap,
                               check_qk_clip_threshold)
from ..core.optimizer_defaults import MUON_DEFAULTS as D
from ..core.optimizer_rules import is_beta_pair
from .adamw import validate_adamw_args, validate_adamw_groups
from .muon_routing import normalize_adamw_include, routes_to_muon
from .muon_split import SplitRule, merge_pieces, piece_shapes, split_pieces, split_rule_for
from .newton_schulz import (DEFAULT_NS_COEFFICIENTS, MUON_SCALE_MODES, configure_ns_precision,
                            default_ns_dtype, muon_scale_factor, normalize_ns_schedule,
                            orthogonalize, preset_schedule)
from .optimizer import Optimizer, StateShapes, to_fp32
from .qk_clip import QKClipModel, QKClipStats, qk_clip_step
from .update_rules import AdamRule, LionRule, apply_muon_delta, muon_momentum

__all__ = ["Muon", "MuonExchange", "LocalExchange", "COMM_STRATEGIES", "SCALAR_OPTIMIZERS"]

COMM_STRATEGIES = ("allgather", "allgather_deredundency")
SCALAR_OPTIMIZERS = ("adam", "lion")
_NS_DTYPES = {None: None, "float32": ms.float32, "fp32": ms.float32, "bfloat16": ms.bfloat16,
              "bf16": ms.bfloat16}
_MEMORY_BUDGETS = ("phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb")


def _as_float(value):
    """Ints are accepted where floats are expected (bools are not numbers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class MuonExchange(Protocol):
    """Where the pieces of Muon's update matrices live (one process, or sharded over ranks).

    ``Muon._muon_update`` is the one momentum/NS/scale/decay path; an exchange tells it which
    full matrices to orthogonalise here and how to get this rank's part of each update back
    (``distributed.shard_exchange.ShardedMuonExchange`` for ZeRO rows, tensor-parallel shards
    and their composition)."""

    def full_updates(self, jobs: list, us: List[Tensor]) -> Dict[int, Tensor]:
        """``{k: full U of job k}`` for the jobs orthogonalised on this rank, from this rank's
        parts ``us`` (aligned with ``jobs``)."""

    def on_newton_schulz(self, shapes) -> None:
        """Called with the shapes of every batched Newton-Schulz call run here (counting)."""

    def local_updates(self, jobs: list, deltas: Dict[int, Tensor]) -> List[Tensor]:
        """This rank's part of every job's scaled update, from the full ones computed here."""

    def full_masters(self, masters, indices: List[int]) -> list:
        """The fp32 masters of parameters ``indices`` as the model holds them (QK-Clip scales
        whole head rows of the model's q/kv weights)."""

    def keep_rows(self, i: int, full, master) -> None:
        """Write this rank's part of ``full`` (from :meth:`full_masters`) into ``master``."""


class LocalExchange:
    """One process (or replicated data parallel): everything is whole and local."""

    def full_updates(self, jobs, us):  # noqa: ARG002 - MuonExchange
        return dict(enumerate(us))

    def on_newton_schulz(self, shapes) -> None:  # noqa: ARG002 - nothing to count here
        return None

    def local_updates(self, jobs, deltas):
        return [deltas[k] for k in range(len(jobs))]

    def full_masters(self, masters, indices):
        return [masters.master(i) for i in indices]

    def keep_rows(self, i, full, master) -> None:  # noqa: ARG002 - full is the master
        return None


class Muon(Optimizer):
    """Muon with an AdamW (or Lion) branch; see the module docstring.

    Args:
        params_or_groups: Parameters or group dicts (groups may carry "optimizer": "muon" |
            "adamw" from `param_groups`; otherwise routing uses `adamw_include`).
        model: the model (required): MLA checks, split dims, QK-Clip layout and logits.
        lr: base lr (the trainer sets each group's lr every step).
        weight_decay, momentum, nesterov, matched_adamw_rms, eps (Newton-Schulz norm floor),
        ns_steps, ns_coefficients, adamw_betas, adamw_eps, qk_clip_enabled, qk_clip_threshold,
        comm_strategy, adamw_include, use_fused_adamw: as upstream MindFormers 2.1.
        muon_split_qkv: False = every Muon 2-D weight is one matrix.
        muon_scale_mode, muon_extra_scale_factor: update scale mode and extra factor.
        muon_scalar_optimizer: 'adam' | 'lion' for the non-Muon parameters.
        muon_coefficient_type: named NS preset instead of ns_coefficients.
        ns_dtype: None (fp32 on CPU, bf16 on Ascend) | 'float32' | 'bfloat16'.
        adamw_lr_mult: lr multiplier of the AdamW/Lion branch.
        lion_betas: (beta1, beta2) of the Lion branch.
        phase0/ns/phase4_batch_memory_gb: memory budgets (GB); ns_ caps one batched NS call
            (phase0_/phase4_ are upstream keys, checked and otherwise unused here).
        swap: must be False ("Muon does not support swap.").
        max_logits_reducer: data-parallel MAX reduction for QK-Clip (None on one card).
        embedding_min_norm: see `Optimizer`.
        learning_rate: upstream's name for `lr` (accepted for upstream-style callers).
        full_shapes: parameter name -> full (logical) shape, for parameters the model holds
            as a shard (tensor parallel: ``ShardSpec.full_shape``). Split pieces and the
            update scale use the full shape; the exchange (:meth:`use_exchange`) gathers it.
        state_shapes: see ``Optimizer`` (ZeRO's rows, ``distributed.zero``; its
            ``param_shape`` is the full shape of an FSDP row shard).
    """

    optimizer_name = "Muon"

    def __init__(self, params_or_groups, model=None, lr: float = D["lr"],
                 weight_decay: float = D["weight_decay"], momentum: float = D["momentum"],
                 nesterov: bool = D["nesterov"], matched_adamw_rms: float = D["matched_adamw_rms"],
                 eps: float = D["eps"], ns_steps: int = D["ns_steps"],
                 ns_coefficients: Sequence = D["ns_coefficients"],
                 adamw_betas=D["adamw_betas"], adamw_eps: float = D["adamw_eps"],
                 qk_clip_enabled: bool = D["qk_clip_enabled"],
                 qk_clip_threshold: float = D["qk_clip_threshold"],
                 comm_strategy: str = D["comm_strategy"], adamw_include=None,
                 use_fused_adamw: bool = D["use_fused_adamw"],
                 muon_split_qkv: bool = D["muon_split_qkv"],
                 muon_scale_mode: str = D["muon_scale_mode"],
                 muon_extra_scale_factor: float = D["muon_extra_scale_factor"],
                 muon_scalar_optimizer: str = D["muon_scalar_optimizer"],
                 muon_coefficient_type: Optional[str] = D["muon_coefficient_type"],
                 ns_dtype=D["ns_dtype"], adamw_lr_mult: float = D["adamw_lr_mult"],
                 lion_betas=D["lion_betas"],
                 phase0_batch_memory_gb: float = D["phase0_batch_memory_gb"],
                 ns_batch_memory_gb: float = D["ns_batch_memory_gb"],
                 phase4_batch_memory_gb: float = D["phase4_batch_memory_gb"],
                 swap: bool = D["swap"], max_logits_reducer=None, embedding_min_norm=None,
                 learning_rate: Optional[float] = None,
                 full_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                 state_shapes: Optional[StateShapes] = None):
        if learning_rate is not None:   # upstream's name for lr
            if lr != D["lr"] and lr != learning_rate:
                raise ValueError(f"Muon got lr={lr!r} and learning_rate={learning_rate!r}; "
                                 "give one of them")
            lr = learning_rate
        # 1. base optimizer (groups, fp32 masters); the AdamW branch's checks and messages
        adamw_betas = tuple(_as_float(b) for b in adamw_betas) \
            if isinstance(adamw_betas, (list, tuple)) else adamw_betas
        adamw_eps, weight_decay = _as_float(adamw_eps), _as_float(weight_decay)
        validate_adamw_args(adamw_betas, adamw_eps, weight_decay, self.optimizer_name)
        super().__init__(params_or_groups,
                         {"lr": float(lr), "betas": tuple(adamw_betas), "eps": adamw_eps,
                          "weight_decay": weight_decay},
                         embedding_min_norm=embedding_min_norm, state_shapes=state_shapes)
        validate_adamw_groups(self.param_groups, self.optimizer_name)
        # 2. memory budgets: all three are checked (upstream's keys); only the Newton-Schulz one
        # bounds anything here (one batched NS call, GB -> bytes)
        for name, value in zip(_MEMORY_BUDGETS, (phase0_batch_memory_gb, ns_batch_memory_gb,
                                                 phase4_batch_memory_gb)):
            check_memory_budget(name, value)
        self.ns_batch_memory_bytes = int(ns_batch_memory_gb * 2 ** 30)
        # 3. swap
        check_muon_swap(swap)
        # 4. model
        self._verify_model(model)
        self.model = model
        # 5. adamw_betas (validated by AdamW above)
        self.adamw_betas = tuple(adamw_betas)
        self.adamw_eps = adamw_eps
        # 6. Newton-Schulz schedule; flat: ns_steps triples; segmented: the counts give the steps
        if muon_coefficient_type is not None:
            if tuple(ns_coefficients) != tuple(DEFAULT_NS_COEFFICIENTS):
                raise ValueError("set either muon_coefficient_type (a named preset) or "
                                 "ns_coefficients, not both")
            self.ns_schedule = preset_schedule(muon_coefficient_type, ns_steps)
        else:
            self.ns_schedule = normalize_ns_schedule(ns_coefficients, ns_steps)
        self.ns_steps = len(self.ns_schedule)
        # 7. QK-Clip threshold
        check_qk_clip_threshold(qk_clip_enabled, qk_clip_threshold)
        # 8. routing
        patterns = normalize_adamw_include(adamw_include)
        self.adamw_include = patterns
        self._is_muon = self._route(patterns)
        # 9. Ascend matmul precision (no-op on CPU)
        if any(self._is_muon):
            configure_ns_precision()
        # 10. split rules (upstream: model.make_model_muon_fns()), from the full shapes
        self._full_shapes = self._check_full_shapes(full_shapes or {})
        cfg = model.get_gpt_transformer_config()
        self.muon_split_qkv = bool(muon_split_qkv)
        self._rules: List[Optional[SplitRule]] = [
            split_rule_for(p.name, self.full_shape(i), cfg, self.muon_split_qkv)
            if is_muon else None
            for i, (p, is_muon) in enumerate(zip(self.parameters, self._is_muon))]
        # 11. comm strategy
        if comm_strategy not in COMM_STRATEGIES:
            raise ValueError("comm_strategy must be 'allgather' or 'allgather_deredundency', "
                             f"got {comm_strategy!r}.")
        self.comm_strategy = comm_strategy
        # this project's knobs (scale mode, extra factor, scalar optimizer, lr ratio)
        self._verify_extras(momentum, matched_adamw_rms, muon_scale_mode, muon_extra_scale_factor,
                            muon_scalar_optimizer, adamw_lr_mult, lion_betas)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.matched_adamw_rms = float(matched_adamw_rms)
        self.ns_eps = float(eps)
        self.muon_scale_mode = muon_scale_mode
        self.muon_extra_scale_factor = float(muon_extra_scale_factor)
        self.muon_scalar_optimizer = muon_scalar_optimizer
        self.adamw_lr_mult = float(adamw_lr_mult)
        self.lion_betas = tuple(float(b) for b in lion_betas)
        if ns_dtype not in _NS_DTYPES and ns_dtype not in (ms.float32, ms.bfloat16):
            raise ValueError(f"ns_dtype must be None, 'float32' or 'bfloat16', got {ns_dtype!r}.")
        self.ns_dtype = _NS_DTYPES.get(ns_dtype, ns_dtype) or default_ns_dtype()
        if self.ns_dtype == ms.bfloat16 and ms.get_context("device_target") == "CPU":
            raise ValueError("ns_dtype bfloat16 needs Ascend: MindSpore has no CPU bf16 matmul kernel.")
        self.qk_clip_enabled = bool(qk_clip_enabled)
        self.qk_clip_threshold = float(qk_clip_threshold) if self.qk_clip_enabled else qk_clip_threshold
        self.use_fused_adamw = bool(use_fused_adamw)  # same math; upstream ignores it (allgather)
        self.max_logits_reducer = max_logits_reducer
        self.last_qk_clip: Optional[QKClipStats] = None
        self._qk_names = self._qk_clip_param_names()
        # 12. the scalar branch's rule, and the state: muon_m for Muon params, adam_m/adam_v
        # (or lion_m) for the others only
        self.scalar_rule = AdamRule("fused") if self.muon_scalar_optimizer == "adam" \
            else LionRule(self.lion_betas)
        for prefix in ("muon_m", "adam_m", "adam_v"):
            self._state.setdefault(prefix, [None] * len(self.parameters))
        for i, is_muon in enumerate(self._is_muon):
            for prefix in ("muon_m",) if is_muon else self.scalar_rule.state_prefixes:
                self._new_state(prefix, i)
        #: where the rows of the update matrices live (``distributed.zero`` shards them)
        self.exchange: MuonExchange = LocalExchange()

    # -- construction checks -------------------------------------------------------------------
    @staticmethod
    def _verify_model(model) -> None:
        if model is None:
            raise ValueError("Model must be provided for Muon optimizer.")
        is_legacy = getattr(model, "is_legacy_model", None)
        if is_legacy is not None and is_legacy():
            raise ValueError("Muon does not support Legacy Model.")
        if not getattr(model.get_gpt_transformer_config(), "multi_latent_attention", False):
            raise ValueError("Current Muon implementation only supports models with "
                             "Multi-Latent Attention enabled.")

    def _check_full_shapes(self, full_shapes) -> Dict[str, Tuple[int, ...]]:
        names = {p.name: p for p in self.parameters}
        out = {}
        for name, shape in full_shapes.items():
            if name not in names:
                raise ValueError(f"full_shapes names {name!r}, which is not a parameter of this "
                                 "optimizer")
            shape = tuple(int(d) for d in shape)
            local = tuple(names[name].shape)
            if len(shape) != len(local) or any(f % l for f, l in zip(shape, local)):
                raise ValueError(f"full shape {shape} of {name!r} does not hold its shard "
                                 f"{local} a whole number of times in every dim")
            out[name] = shape
        return out

    def _route(self, patterns) -> List[bool]:
        """Muon (True) or the AdamW branch (False) per parameter; a group's "optimizer" wins."""
        out = []
        for gi, (group, indices) in enumerate(zip(self.param_groups, self._group_indices)):
            kind = group.get("optimizer")
            if kind not in (None, "muon", "adamw"):
                raise ValueError(f"parameter group {gi}: Muon groups take optimizer 'muon' or "
                                 f"'adamw', got {kind!r}")
            for i in indices:
                p = self.parameters[i]
                shape = self.param_shape(i)
                if kind == "adamw":
                    out.append(False)
                elif kind == "muon":
                    if not routes_to_muon(p.name, shape, ()):
                        raise ValueError(f"parameter group {gi} sends {p.name!r} (shape {shape}) "
                                         "to Muon, which needs a 2-D or grouped-expert 3-D weight.")
                    out.append(True)
                else:
                    out.append(routes_to_muon(p.name, shape, patterns))
        return out

    @staticmethod
    def _verify_extras(momentum, matched_adamw_rms, scale_mode, extra, scalar_opt, adamw_lr_mult,
                       lion_betas) -> None:
        check_muon_range("momentum", momentum)
        check_muon_range("matched_adamw_rms", matched_adamw_rms)
        if scale_mode not in MUON_SCALE_MODES:
            raise ValueError(f"muon_scale_mode must be one of {list(MUON_SCALE_MODES)}, "
                             f"got {scale_mode!r}.")
        check_muon_range("muon_extra_scale_factor", extra)
        if scalar_opt not in SCALAR_OPTIMIZERS:
            raise ValueError(f"muon_scalar_optimizer must be 'adam' or 'lion', got {scalar_opt!r}.")
        check_muon_range("adamw_lr_mult", adamw_lr_mult)
        if not is_beta_pair(tuple(lion_betas)):
            raise ValueError(f"lion_betas must be two values in [0, 1), got {lion_betas!r}.")

    def _qk_clip_param_names(self) -> Tuple[str, ...]:
        layout = self.model.qk_clip_layout() if isinstance(self.model, QKClipModel) else []
        return tuple(sorted({e[k] for e in layout for k in ("q_param", "kv_param")}))

    # -- state ---------------------------------------------------------------------------------
    def state_prefixes(self) -> tuple:
        return ("muon_m", "lion_m") if self.muon_scalar_optimizer == "lion" else \
            ("muon_m", "adam_m", "adam_v")

    @property
    def muon_mask(self) -> Tuple[bool, ...]:
        """Per parameter: True when Muon updates it, False for the scalar (AdamW/Lion) branch."""
        return tuple(self._is_muon)

    def full_shape(self, i: int) -> Tuple[int, ...]:
        """The full (logical) shape of parameter i: ``full_shapes`` for a tensor-parallel
        shard, else ``param_shape(i)`` (its own shape, or the full shape of an FSDP row
        shard as the ZeRO sharding reports it)."""
        p = self.parameters[i]
        return self._full_shapes.get(p.name, tuple(self.param_shape(i)))

    def use_exchange(self, exchange: MuonExchange) -> None:
        """Where the update matrices live (set once by the sharding that builds this
        optimizer, e.g. ``distributed.shard_exchange``)."""
        self.exchange = exchange

    def split_rule(self, i: int) -> Optional[SplitRule]:
        """How parameter i is cut into Newton-Schulz pieces (None: not a Muon parameter)."""
        return self._rules[i]

    @property
    def qk_param_names(self) -> Tuple[str, ...]:
        """Names of the MLA q/kv weights QK-Clip rescales."""
        return self._qk_names

    @property
    def muon_param_names(self) -> Tuple[str, ...]:
        return tuple(p.name for p, m in zip(self.parameters, self._is_muon) if m)

    @property
    def adamw_param_names(self) -> Tuple[str, ...]:
        return tuple(p.name for p, m in zip(self.parameters, self._is_muon) if not m)

    def piece_shapes_of(self, name: str) -> List[tuple]:
        """The Newton-Schulz pieces of Muon parameter `name` (for inspection and tests)."""
        i = self._index_of_name(name)
        if not self._is_muon[i]:
            raise ValueError(f"{name!r} is not updated by Muon")
        return piece_shapes(self._rules[i], self.full_shape(i), name)

    # -- step ----------------------------------------------------------------------------------
    def step(self, grads: Sequence[Optional[Tensor]]) -> None:
        """One optimizer update from the accumulated gradients (aligned with `parameters`;
        None = no gradient: the parameter, its decay and its state are left alone)."""
        grads = self.check_grads(grads)
        self.global_step += 1
        muon_jobs = []
        for group, indices in zip(self.param_groups, self._group_indices):
            scalar_jobs = []
            for i in indices:
                if grads[i] is None:
                    continue
                g = to_fp32(grads[i])
                if self._is_muon[i]:
                    muon_jobs.append((group, i, g))
                else:
                    scalar_jobs.append((i, g))
            if scalar_jobs:
                self._scalar_updates(dict(group, lr=float(group["lr"]) * self.adamw_lr_mult),
                                     scalar_jobs)
        if muon_jobs:
            self._muon_update(muon_jobs)
        if self.qk_clip_enabled:
            self.last_qk_clip = self._apply_qk_clip()
        self._embedding_min_norm_step(grads)

    def _muon_update(self, jobs) -> None:
        """The one Muon update path (one process or sharded, see ``MuonExchange``):
        momentum on this rank's rows, the full U of each weight, Newton-Schulz of the pieces
        (batched by shape), scaling, this rank's rows of the update, decay and apply."""
        ex = self.exchange
        us = []
        for _, i, g in jobs:
            m = self._state["muon_m"][i]
            m_new, u = muon_momentum(m, g, self.momentum, self.nesterov)
            m.set_data(m_new)
            us.append(u)
        full = ex.full_updates(jobs, us)
        mine = sorted(full)
        pieces = {k: split_pieces(self._rules[jobs[k][1]], full[k]) for k in mine}
        buckets: Dict[tuple, list] = {}    # (A, B) -> [(job, piece index, tensor)]
        for k in mine:
            for n, piece in enumerate(pieces[k]):
                buckets.setdefault(tuple(piece.shape[-2:]), []).append((k, n, piece))
        for items in buckets.values():
            for chunk in self._chunks(items):
                ex.on_newton_schulz([t.shape for _, _, t in chunk])
                for (k, n, _), out in zip(chunk, self.orthogonalize_many([t for _, _, t in chunk])):
                    pieces[k][n] = out
        deltas = {}
        for k in mine:
            group, i, _ = jobs[k]
            coef = float(group["lr"]) * self.matched_adamw_rms * self.muon_extra_scale_factor
            scaled = [x * (coef * muon_scale_factor(x.shape[-2], x.shape[-1], self.muon_scale_mode))
                      for x in pieces[k]]
            deltas[k] = merge_pieces(self._rules[i], scaled, tuple(full[k].shape))
        for (group, i, _), delta in zip(jobs, ex.local_updates(jobs, deltas)):
            master = self._masters.master(i)
            apply_muon_delta(master, delta, float(group["lr"]), self.group_weight_decay(group))
            self._masters.store(i, master)

    def _chunks(self, items):
        """Split a same-shape bucket so one batched NS holds at most ns_batch_memory bytes."""
        chunk, size = [], 0
        for item in items:
            t = item[2]
            nbytes = 4 * math.prod(t.shape)
            if chunk and size + nbytes > self.ns_batch_memory_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(item)
            size += nbytes
        if chunk:
            yield chunk

    def orthogonalize_many(self, tensors: List[Tensor]) -> List[Tensor]:
        """NS of same-(A, B) matrices/batches as one batched call; results in input order."""
        if len(tensors) == 1:
            return [orthogonalize(tensors[0], self.ns_schedule, self.ns_eps, self.ns_dtype)]
        if all(t.ndim == 2 for t in tensors):
            out = orthogonalize(ops.stack(tensors), self.ns_schedule, self.ns_eps, self.ns_dtype)
            return list(ops.unstack(out, 0))
        sizes = [t.shape[0] if t.ndim == 3 else 1 for t in tensors]
        stacked = ops.cat([t if t.ndim == 3 else t.expand_dims(0) for t in tensors], 0)
        out = ops.split(orthogonalize(stacked, self.ns_schedule, self.ns_eps, self.ns_dtype),
                        sizes, 0)
        return [o if t.ndim == 3 else o.squeeze(0) for o, t in zip(out, tensors)]

    # -- scalar branch ---------------------------------------------------------------------
    def _scalar_updates(self, group: Dict[str, Any], jobs) -> None:
        """The scalar branch of a group's ``(i, grad)`` jobs: one many-tensor step where the
        rule has one (``AdamRule.branch_update_many``), else parameter by parameter."""
        rule = self.scalar_rule
        indices = [i for i, _ in jobs]
        masters = [self._masters.master(i) for i in indices]
        states = [[self.get_state(prefix, i) for i in indices] for prefix in rule.state_prefixes]
        if rule.branch_update_many(masters, states, [g for _, g in jobs], float(group["lr"]),
                                   group, self.group_weight_decay(group), self.global_step):
            self._masters.store_many(indices, masters)
            return
        for (i, g), master in zip(jobs, masters):
            self._scalar_update(group, i, master, g)
            self._masters.store(i, master)

    def _scalar_update(self, group: Dict[str, Any], i: int, master, g: Tensor) -> None:
        """AdamW (``adamw_betas``, ``adamw_eps``, Muon's step count) or Lion (``lion_betas``)."""
        rule = self.scalar_rule
        rule.branch_update(master, [self.get_state(prefix, i) for prefix in rule.state_prefixes],
                           g, float(group["lr"]), group, self.group_weight_decay(group),
                           self.global_step)

    # -- QK-Clip -------------------------------------------------------------------------------
    def _apply_qk_clip(self) -> Optional[QKClipStats]:
        """Clip on whole fp32 masters (``exchange.full_masters``), keep this rank's rows, then
        copy the rescaled masters to the model parameters."""
        if not self._qk_names:
            return None
        index = {p.name: i for i, p in enumerate(self.parameters)}
        names = [n for n in self._qk_names if n in index]
        full = self.exchange.full_masters(self._masters, [index[n] for n in names])
        param_map = {p.name: p for p in self.model.get_parameters()} \
            if len(names) < len(self._qk_names) else {}
        param_map.update(zip(names, full))
        stats = qk_clip_step(self.model, self.qk_clip_threshold, param_map,
                             self.max_logits_reducer)
        if stats.num_clipped_heads:
            for name, whole in zip(names, full):
                i = index[name]
                master = self._masters.master(i)
                self.exchange.keep_rows(i, whole, master)
                self._masters.store(i, master)
        return stats
