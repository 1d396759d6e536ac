"""Muon: momentum orthogonalised by Newton-Schulz for matrices, AdamW (or Lion) for the rest.

Update at optimizer step t (once per optimizer step, on the accumulated gradient g of the whole
step; never per micro-batch), for a Muon-routed parameter with fp32 master p, group lr and
effective weight decay wd (reference §5, DESIGN §5.3):

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
seed 003: e.g. Muon 2e-2 with AdamW 3e-3 is adamw_lr_mult 0.15) -- the AdamW class's math,
inherited. `muon_scalar_optimizer: lion` uses Lion for them instead (sign of the interpolated
momentum, betas `lion_betas`).

After all updates, QK-Clip (`qk_clip.qk_clip_step`) rescales the MLA q/k rows of the fp32
masters of heads whose tracked max logit exceeds `qk_clip_threshold`; then the masters are
copied to the low-precision model parameters. `last_qk_clip` holds what it did.

State names are upstream's: `muon_m.{name}` (Muon), `adam_m.{name}` / `adam_v.{name}` (AdamW
branch only), `main_param.{name}` (fp32 masters of bf16/fp16 params), `global_step`.

Construction checks run in upstream's order with upstream's messages (reference §5): memory
budgets, swap, model (given, not legacy, MLA), ns schedule, qk_clip_threshold, adamw_include,
Ascend cube_math_type, split rules, comm_strategy; then our extra knobs. Unlike upstream, a 3-D
weight that is not a grouped expert weight is rejected here, not at the first step.

Communication: single-card and replicated data parallel need nothing (gradients arrive
reduced). For sharded weights the `comm_strategy` (allgather: every rank gathers the full U and
runs NS; allgather_deredundency: one owner rank per weight runs NS and the update goes back)
plugs in at `_gather_for_ns`, `_run_newton_schulz` and `_scatter_from_ns`; on one card they are
the identity / the plain batched NS and both strategies give the same update.
`distributed/zero_muon.py` builds the ZeRO-sharded variant on these internals (`_is_muon`,
`_rules`, `_chunks`, `_orthogonalize_many`, `_qk_names`, `_muon_update`, `_apply_qk_clip`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor, ops

from .adamw import AdamW
from .build import register_optimizer
from .lion import Lion
from .muon_routing import normalize_adamw_include, routes_to_muon
from .muon_split import SplitRule, merge_pieces, piece_shapes, split_pieces, split_rule_for
from .newton_schulz import (DEFAULT_NS_COEFFICIENTS, MUON_SCALE_MODES, configure_ns_precision,
                            default_ns_dtype, muon_scale_factor, normalize_ns_schedule,
                            orthogonalize, preset_schedule)
from .optimizer import to_fp32
from .qk_clip import QKClipStats, qk_clip_step

__all__ = ["Muon", "COMM_STRATEGIES", "SCALAR_OPTIMIZERS"]

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


class Muon(AdamW):
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
        muon_scale_mode, muon_extra_scale_factor: seed 002 (update scale and extra factor).
        muon_scalar_optimizer: 'adam' | 'lion' for the non-Muon parameters.
        muon_coefficient_type: named NS preset instead of ns_coefficients.
        ns_dtype: None (fp32 on CPU, bf16 on Ascend) | 'float32' | 'bfloat16'.
        adamw_lr_mult: lr multiplier of the AdamW/Lion branch.
        lion_betas: (beta1, beta2) of the Lion branch.
        phase0/ns/phase4_batch_memory_gb: memory budgets (GB); ns_ caps one batched NS call.
        swap: must be False ("Muon does not support swap.").
        max_logits_reducer: data-parallel MAX reduction for QK-Clip (None on one card).
        embedding_min_norm: see `Optimizer`.
        learning_rate: upstream's name for `lr` (accepted for upstream-style callers).
    """

    optimizer_name = "Muon"

    def __init__(self, params_or_groups, model=None, lr: float = 2e-2, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, matched_adamw_rms: float = 0.2,
                 eps: float = 1e-7, ns_steps: int = 5,
                 ns_coefficients: Sequence = DEFAULT_NS_COEFFICIENTS,
                 adamw_betas=(0.95, 0.95), adamw_eps: float = 1e-8,
                 qk_clip_enabled: bool = True, qk_clip_threshold: float = 100,
                 comm_strategy: str = "allgather", adamw_include=None,
                 use_fused_adamw: bool = False, muon_split_qkv: bool = True,
                 muon_scale_mode: str = "spectral", muon_extra_scale_factor: float = 1.0,
                 muon_scalar_optimizer: str = "adam", muon_coefficient_type: Optional[str] = None,
                 ns_dtype=None, adamw_lr_mult: float = 1.0, lion_betas=(0.95, 0.98),
                 phase0_batch_memory_gb: float = 1, ns_batch_memory_gb: float = 1,
                 phase4_batch_memory_gb: float = 4, swap: bool = False,
                 max_logits_reducer=None, embedding_min_norm=None,
                 learning_rate: Optional[float] = None):
        if learning_rate is not None:   # upstream's name for lr
            if lr != 2e-2 and lr != learning_rate:
                raise ValueError(f"Muon got lr={lr!r} and learning_rate={learning_rate!r}; "
                                 "give one of them")
            lr = learning_rate
        # 1. base optimizer (groups, fp32 masters, AdamW state for the AdamW branch)
        adamw_betas = tuple(_as_float(b) for b in adamw_betas) \
            if isinstance(adamw_betas, (list, tuple)) else adamw_betas
        super().__init__(params_or_groups, lr=lr, betas=adamw_betas, eps=_as_float(adamw_eps),
                         weight_decay=_as_float(weight_decay),
                         embedding_min_norm=embedding_min_norm)
        # 2. memory budgets (GB -> bytes)
        for name, value in zip(_MEMORY_BUDGETS, (phase0_batch_memory_gb, ns_batch_memory_gb,
                                                 phase4_batch_memory_gb)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of GB, but got {type(value).__name__}.")
            if not value > 0:
                raise ValueError(f"{name} must be positive, but got {value}.")
            setattr(self, name[:-3] + "_bytes", int(value * 2 ** 30))
        # 3. swap
        if swap:
            raise ValueError("Muon does not support swap.")
        # 4. model
        self._verify_model(model)
        self.model = model
        # 5. adamw_betas (validated by AdamW above)
        self.adamw_betas = tuple(adamw_betas)
        self.adamw_eps = adamw_eps
        # 6. Newton-Schulz schedule
        if muon_coefficient_type is not None:
            if tuple(ns_coefficients) != tuple(DEFAULT_NS_COEFFICIENTS):
                raise ValueError("set either muon_coefficient_type (a named preset) or "
                                 "ns_coefficients, not both")
            self.ns_schedule = preset_schedule(muon_coefficient_type, ns_steps)
        else:
            self.ns_schedule = normalize_ns_schedule(ns_coefficients, ns_steps)
        # flat: ns_steps triples; segmented: ns_steps is ignored, the counts give the steps
        self.ns_steps = len(self.ns_schedule)
        # 7. config
        self._verify_config(self.ns_steps, qk_clip_enabled, qk_clip_threshold)
        # 8. routing
        patterns = normalize_adamw_include(adamw_include)
        self.adamw_include = patterns
        self._is_muon = self._route(patterns)
        # 9. Ascend matmul precision (no-op on CPU)
        if any(self._is_muon):
            configure_ns_precision()
        # 10. split rules (upstream: model.make_model_muon_fns())
        cfg = model.get_gpt_transformer_config()
        self.muon_split_qkv = bool(muon_split_qkv)
        self._rules: List[Optional[SplitRule]] = [
            split_rule_for(p.name, p.shape, cfg, self.muon_split_qkv) if is_muon else None
            for p, is_muon in zip(self.parameters, self._is_muon)]
        # 11. comm strategy
        if comm_strategy not in COMM_STRATEGIES:
            raise ValueError("comm_strategy must be 'allgather' or 'allgather_deredundency', "
                             f"got {comm_strategy!r}.")
        self.comm_strategy = comm_strategy
        # ours: the seed-002 knobs
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
        # 12. state: muon_m for Muon params; adam_m/adam_v (or lion_m) for the rest only
        for i, is_muon in enumerate(self._is_muon):
            if is_muon:
                self._new_state("muon_m", i)
            elif self.muon_scalar_optimizer == "lion":
                self._new_state("lion_m", i)
            if is_muon or self.muon_scalar_optimizer == "lion":
                self._state["adam_m"][i] = None
                self._state["adam_v"][i] = None
        self._state.setdefault("muon_m", [None] * len(self.parameters))

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

    def _verify_config(self, ns_steps, qk_clip_enabled, qk_clip_threshold) -> None:
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps <= 0:
            raise ValueError(f"ns_steps must be positive, got {ns_steps!r}.")
        if len(self.ns_schedule) != ns_steps:
            raise ValueError(f"ns_coefficients schedule length ({len(self.ns_schedule)}) must "
                             f"match ns_steps ({ns_steps}).")
        for i, triple in enumerate(self.ns_schedule):
            if len(triple) != 3:
                raise ValueError(f"each ns_coefficients entry must have 3 elements, got "
                                 f"{triple!r} at step {i}.")
        if qk_clip_enabled and not (isinstance(qk_clip_threshold, (int, float))
                                    and qk_clip_threshold > 0):
            raise ValueError(f"qk_clip_threshold must be positive, got {qk_clip_threshold!r}.")

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
                shape = tuple(p.shape)
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
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
        if not matched_adamw_rms > 0:
            raise ValueError(f"matched_adamw_rms must be positive, got {matched_adamw_rms!r}.")
        if scale_mode not in MUON_SCALE_MODES:
            raise ValueError(f"muon_scale_mode must be one of {list(MUON_SCALE_MODES)}, "
                             f"got {scale_mode!r}.")
        if not extra > 0:
            raise ValueError(f"muon_extra_scale_factor must be positive, got {extra!r}.")
        if scalar_opt not in SCALAR_OPTIMIZERS:
            raise ValueError(f"muon_scalar_optimizer must be 'adam' or 'lion', got {scalar_opt!r}.")
        if not adamw_lr_mult >= 0:
            raise ValueError(f"adamw_lr_mult must be >= 0, got {adamw_lr_mult!r}.")
        if len(tuple(lion_betas)) != 2 or not all(0.0 <= b < 1.0 for b in lion_betas):
            raise ValueError(f"lion_betas must be two values in [0, 1), got {lion_betas!r}.")

    def _qk_clip_param_names(self) -> Tuple[str, ...]:
        layout = self.model.qk_clip_layout() if hasattr(self.model, "qk_clip_layout") else []
        return tuple(sorted({e[k] for e in layout for k in ("q_param", "kv_param")}))

    # -- state ---------------------------------------------------------------------------------
    def state_prefixes(self) -> tuple:
        return ("muon_m", "lion_m") if self.muon_scalar_optimizer == "lion" else \
            ("muon_m", "adam_m", "adam_v")

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
        return piece_shapes(self._rules[i], self.parameters[i].shape, name)

    # -- step ----------------------------------------------------------------------------------
    def step(self, grads: Sequence[Optional[Tensor]]) -> None:
        """One optimizer update from the accumulated gradients (aligned with `parameters`;
        None = no gradient: the parameter, its decay and its state are left alone)."""
        grads = list(grads)
        if len(grads) != len(self.parameters):
            raise ValueError(f"{self.optimizer_name}.step got {len(grads)} gradients for "
                             f"{len(self.parameters)} parameters")
        self.global_step += 1
        muon_jobs = []
        for group, indices in zip(self.param_groups, self._group_indices):
            scalar_group = None
            for i in indices:
                if grads[i] is None:
                    continue
                g = to_fp32(grads[i])
                if self._is_muon[i]:
                    muon_jobs.append((group, i, g))
                    continue
                if scalar_group is None:
                    scalar_group = dict(group, lr=float(group["lr"]) * self.adamw_lr_mult)
                master = self._masters.master(i)
                if self.muon_scalar_optimizer == "lion":
                    self._lion_update(scalar_group, i, master, g)
                else:
                    self._update(scalar_group, i, master, g)  # AdamW math (inherited)
                self._masters.store(i, master)
        if muon_jobs:
            self._muon_update(muon_jobs)
        if self.qk_clip_enabled:
            self.last_qk_clip = self._apply_qk_clip()
        if self.embedding_min_norm is not None:
            for i in self._embedding_idx:
                if grads[i] is not None:
                    self._apply_embedding_min_norm(i)

    def _muon_update(self, jobs) -> None:
        mu = self.momentum
        entries = []                       # (group, i, pieces) with pieces filled in place
        buckets: Dict[tuple, list] = {}    # (A, B) -> [(entry index, piece index, tensor)]
        for group, i, g in jobs:
            m = self._state["muon_m"][i]
            m_new = m * mu + g
            m.set_data(m_new)
            u = g + m_new * mu if self.nesterov else m_new
            u = self._gather_for_ns(i, u)
            pieces = split_pieces(self._rules[i], u)
            for k, piece in enumerate(pieces):
                buckets.setdefault(tuple(piece.shape[-2:]), []).append((len(entries), k, piece))
            entries.append((group, i, pieces))
        self._run_newton_schulz(buckets, entries)
        for group, i, pieces in entries:
            lr = float(group["lr"])
            coef = lr * self.matched_adamw_rms * self.muon_extra_scale_factor
            scaled = [x * (coef * muon_scale_factor(x.shape[-2], x.shape[-1], self.muon_scale_mode))
                      for x in pieces]
            delta = self._scatter_from_ns(i, merge_pieces(self._rules[i], scaled,
                                                          self.parameters[i].shape))
            master = self._masters.master(i)
            decay = 1.0 - lr * self.group_weight_decay(group)
            master.set_data(master * decay - delta if decay != 1.0 else master - delta)
            self._masters.store(i, master)

    def _run_newton_schulz(self, buckets: Dict[tuple, list], entries: list) -> None:
        """NS of every piece: `entries[e][2][k]` <- NS(piece) for each (e, k, piece) of each
        same-shape bucket, batched within the memory budget.

        comm hook: allgather runs all of it on every rank (as here); allgather_deredundency
        would run only the buckets' pieces this rank owns and broadcast the results."""
        for items in buckets.values():
            for chunk in self._chunks(items):
                for (e, k, _), out in zip(chunk, self._orthogonalize_many([t for _, _, t in chunk])):
                    entries[e][2][k] = out

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

    def _orthogonalize_many(self, tensors: List[Tensor]) -> List[Tensor]:
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

    # -- communication hooks (data-parallel helper) --------------------------------------------
    def _gather_for_ns(self, i: int, u: Tensor) -> Tensor:
        """The full fp32 update matrix of parameter i from this rank's part `u`.

        Single card / replicated DP: `u` is already full. A sharded run replaces this with the
        `comm_strategy` gather (allgather: all ranks; allgather_deredundency: the owner rank)."""
        return u

    def _scatter_from_ns(self, i: int, delta: Tensor) -> Tensor:
        """This rank's part of the full update `delta` of parameter i (identity unsharded)."""
        return delta

    # -- scalar branch: Lion -------------------------------------------------------------------
    def _lion_update(self, group: Dict[str, Any], i: int, master, g: Tensor) -> None:
        """Lion's update (lion.Lion._update, state lion_m.{name}) with `lion_betas`."""
        Lion._update(self, dict(group, betas=self.lion_betas), i, master, g)

    # -- QK-Clip -------------------------------------------------------------------------------
    def _apply_qk_clip(self) -> Optional[QKClipStats]:
        """Clip on the fp32 masters, then copy the rescaled masters to the model parameters."""
        if not self._qk_names:
            return None
        index = {self.parameters[i].name: i for i in range(len(self.parameters))}
        param_map = {p.name: p for p in self.model.get_parameters()} \
            if any(n not in index for n in self._qk_names) else {}
        masters = {}
        for name in self._qk_names:
            if name in index:
                masters[name] = self._masters.master(index[name])
        param_map.update(masters)
        stats = qk_clip_step(self.model, self.qk_clip_threshold, param_map,
                             self.max_logits_reducer)
        if stats.num_clipped_heads:
            for name, master in masters.items():
                self._masters.store(index[name], master)
        return stats


def _muon_kwargs(get, explicit) -> Dict[str, Any]:
    """`optimizer:` section (OptimizerConfig or dict) -> Muon keyword arguments."""
    kwargs = dict(
        weight_decay=float(get("weight_decay", 0.1)), momentum=float(get("momentum", 0.95)),
        nesterov=bool(get("nesterov", True)), matched_adamw_rms=float(get("matched_adamw_rms", 0.2)),
        eps=float(get("eps", 1e-7)), ns_steps=int(get("ns_steps", 5)),
        adamw_betas=tuple(float(b) for b in get("adamw_betas", (0.95, 0.95))),
        adamw_eps=float(get("adamw_eps", 1e-8)), qk_clip_enabled=bool(get("qk_clip_enabled", True)),
        qk_clip_threshold=float(get("qk_clip_threshold", 100)),
        comm_strategy=get("comm_strategy", "allgather"), adamw_include=get("adamw_include"),
        use_fused_adamw=bool(get("use_fused_adamw", False)), swap=bool(get("swap", False)),
        muon_split_qkv=bool(get("muon_split_qkv", True)),
        muon_scale_mode=get("muon_scale_mode", "spectral"),
        muon_extra_scale_factor=float(get("muon_extra_scale_factor", 1.0)),
        muon_scalar_optimizer=get("muon_scalar_optimizer", "adam"),
        muon_coefficient_type=get("muon_coefficient_type"), ns_dtype=get("ns_dtype"),
        adamw_lr_mult=float(get("adamw_lr_mult", 1.0)),
        lion_betas=(float(get("lion_beta1", 0.95)), float(get("lion_beta2", 0.98))),
        embedding_min_norm=get("embedding_min_norm"))
    if kwargs["muon_coefficient_type"] is None:
        kwargs["ns_coefficients"] = get("ns_coefficients", list(DEFAULT_NS_COEFFICIENTS))
    for name in _MEMORY_BUDGETS:
        if get(name) is not None:
            kwargs[name] = get(name)
    return kwargs


register_optimizer("Muon", "muon", "Muon", _muon_kwargs)
