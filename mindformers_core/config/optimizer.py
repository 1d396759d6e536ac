"""`optimizer:` section: one dataclass with the fields of every optimizer type.

Megatron style: a single ``OptimizerConfig`` holds every knob; ``type`` selects the optimizer
and :data:`OPTIMIZER_KEYS` (the one table of which type accepts which key) decides which keys a
YAML may write. A key outside the type's set is an error that lists the valid keys and the
closest one (upstream silently drops such keys).

Type-dependent defaults are resolved at construction: under ``Muon`` ``eps`` is 1e-7 (the
Newton-Schulz normalisation eps) and ``weight_decay`` 0.1 unless written; under the other types
1e-8 and 0.01. ``betas`` under Muon is an error pointing to ``adamw_betas``.

Validation follows upstream MindFormers 2.1's AdamW/Muon checks and messages for Muon
(``ns_coefficients``, ``comm_strategy``, ``qk_clip_threshold``, swap) and Megatron's
``OptimizerConfig.validate()`` (``embedding_min_norm``, ``rmsnorm_weight_decay_mult``,
``min_lr <= lr``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Union

from ..core.optimizer_defaults import (ADAMW_DEFAULTS, DEFAULTS, LION_DEFAULTS, MUON_DEFAULTS,
                                       SGD_DEFAULTS)
from ..core.ns_schedule import (MAX_NS_STEPS, NS_COEFFICIENT_PRESETS,
                                 normalize_ns_schedule, preset_schedule)
from ..core.optimizer_rules import ALLOWED_GROUP_OPTIMIZERS, check_embedding_min_norm
from ..core.muon_rules import (MUON_RANGES, check_memory_budget, check_muon_swap,
                               check_qk_clip_threshold)
from ..errors import ConfigError, checked
from .param_overrides import MupConfig, ParamOverrideConfig, check_betas
from .schema import Section, check_range, closest, unknown_key_error

__all__ = ["OptimizerConfig", "OPTIMIZER_KEYS", "OPTIMIZER_TYPES"]

# ---------------------------------------------------------------------------------------------
# Which type accepts which key (the one place this is declared).
# ---------------------------------------------------------------------------------------------
_COMMON = (
    "type", "weight_decay", "weight_decay_include", "weight_decay_exclude",
    "decoupled_lr", "decoupled_min_lr", "rmsnorm_weight_decay_mult", "apply_wd_to_qk_layernorm",
    "embedding_min_norm", "grad_norm_skip_threshold",
    "loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis",
    "log_num_zeros_in_grad", "param_overrides", "mup",
)
_ADAMW = (
    "betas", "eps", "use_fused", "enable_fused_opt", "swap", "decoupled_weight_decay",
    "exp_avg_dtype", "exp_avg_sq_dtype", "store_param_remainders", "enable_cpu_offload",
)
_MUON = (
    "momentum", "matched_adamw_rms", "nesterov", "eps", "ns_steps", "ns_coefficients",
    "adamw_betas", "adamw_eps", "qk_clip_enabled", "qk_clip_threshold", "comm_strategy",
    "use_fused_adamw", "adamw_include", "swap",
    "muon_split_qkv", "muon_scale_mode", "muon_extra_scale_factor", "muon_scalar_optimizer",
    "muon_coefficient_type", "ns_dtype", "adamw_lr_mult",
    "phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb",
)
OPTIMIZER_KEYS: Dict[str, frozenset] = {
    "AdamW": frozenset(_COMMON + _ADAMW),
    "Muon": frozenset(_COMMON + _MUON),
    "SGD": frozenset(_COMMON + ("sgd_momentum",)),
    "Lion": frozenset(_COMMON + ("lion_beta1", "lion_beta2")),
}
OPTIMIZER_TYPES = tuple(OPTIMIZER_KEYS)


#: Keys that another type accepts: a hint for the user who wrote one under the wrong type.
_KEY_HINTS = {
    ("Muon", "betas"): "Muon uses 'adamw_betas' for its AdamW branch (and 'momentum' for Muon)",
    ("SGD", "momentum"): "SGD's momentum is 'sgd_momentum'",
    ("Lion", "betas"): "Lion uses 'lion_beta1' and 'lion_beta2'",
}

InfFloat = {"allow_inf": True}


@dataclass
class OptimizerConfig(Section):
    """Every optimizer knob; see :data:`OPTIMIZER_KEYS` for which type accepts which."""
    type: Literal["AdamW", "Muon", "SGD", "Lion"] = "AdamW"
    # --- common -----------------------------------------------------------------------------
    #: Decoupled weight decay (AdamW: 0.01, Muon: 0.1 unless written); p <- p * (1 - lr * wd).
    weight_decay: float = None  # type: ignore[assignment]  # resolved per type
    weight_decay_include: Optional[List[str]] = None
    weight_decay_exclude: Optional[List[str]] = None
    #: Separate peak / floor learning rate for the input embedding and output layer.
    decoupled_lr: Optional[float] = None
    decoupled_min_lr: Optional[float] = None
    #: Multiplier of weight decay on RMSNorm gammas (None: default policy, no decay on 1-D).
    rmsnorm_weight_decay_mult: Optional[float] = None
    apply_wd_to_qk_layernorm: bool = False
    #: Word-embedding rows with 0 < norm < this are rescaled to twice this after each update.
    embedding_min_norm: Optional[float] = None
    #: Skip the update when the global grad norm exceeds this (inf: never).
    grad_norm_skip_threshold: float = field(default=math.inf, metadata=InfFloat)
    #: Static loss scale; None = dynamic loss scaling (used for fp16 params only).
    loss_scale: Optional[float] = None
    initial_loss_scale: float = 2.0 ** 32
    min_loss_scale: float = 1.0
    loss_scale_window: float = 1000.0
    hysteresis: int = 2
    log_num_zeros_in_grad: bool = False
    #: Per-parameter-group overrides ({name: [globs], ndim, lr_mult, weight_decay, ...}).
    param_overrides: Optional[List[ParamOverrideConfig]] = None
    #: muP: width_mult = model.hidden_size / mup.base_hidden_size.
    mup: Optional[MupConfig] = None
    # --- AdamW ------------------------------------------------------------------------------
    betas: List[float] = field(default_factory=lambda: list(ADAMW_DEFAULTS["betas"]))
    #: AdamW denominator eps (1e-8); under Muon the Newton-Schulz normalisation eps (1e-7).
    eps: float = None  # type: ignore[assignment]  # resolved per type
    use_fused: bool = False
    enable_fused_opt: bool = False
    #: Keep optimizer state in host memory (AdamW only; Muon refuses it).
    swap: bool = False
    #: False: classic Adam with L2 (wd * p added to the gradient) instead of decoupled decay.
    decoupled_weight_decay: bool = ADAMW_DEFAULTS["decoupled_weight_decay"]
    exp_avg_dtype: Literal["fp32", "bf16"] = ADAMW_DEFAULTS["exp_avg_dtype"]
    exp_avg_sq_dtype: Literal["fp32", "bf16"] = ADAMW_DEFAULTS["exp_avg_sq_dtype"]
    #: Keep optimizer state in host memory (upstream AdamW argument). On CPU the state is in
    #: host memory already, so True is honoured as it is.
    enable_cpu_offload: bool = ADAMW_DEFAULTS["enable_cpu_offload"]
    store_param_remainders: bool = True
    # --- Muon -------------------------------------------------------------------------------
    momentum: float = MUON_DEFAULTS["momentum"]
    matched_adamw_rms: float = MUON_DEFAULTS["matched_adamw_rms"]
    nesterov: bool = MUON_DEFAULTS["nesterov"]
    ns_steps: int = MUON_DEFAULTS["ns_steps"]
    #: Flat [a, b, c] or segmented [[[a, b, c], count], ...].
    ns_coefficients: Any = field(default_factory=lambda: list(MUON_DEFAULTS["ns_coefficients"]))
    adamw_betas: List[float] = field(default_factory=lambda: list(MUON_DEFAULTS["adamw_betas"]))
    adamw_eps: float = MUON_DEFAULTS["adamw_eps"]
    qk_clip_enabled: bool = MUON_DEFAULTS["qk_clip_enabled"]
    qk_clip_threshold: float = MUON_DEFAULTS["qk_clip_threshold"]
    comm_strategy: Literal["allgather", "allgather_deredundency"] = MUON_DEFAULTS["comm_strategy"]
    use_fused_adamw: bool = MUON_DEFAULTS["use_fused_adamw"]
    #: Globs of 2-D/3-D params kept on AdamW; None = ["*word_embeddings*", "*output_layer*"].
    adamw_include: Optional[Union[List[str], str]] = None
    muon_split_qkv: bool = MUON_DEFAULTS["muon_split_qkv"]
    #: Update scale: spectral = sqrt(max(rows, cols)) (upstream MindFormers, times
    #: matched_adamw_rms), shape_scaling = sqrt(max(1, rows/cols)), unit_rms_norm = sqrt(rows/cols).
    muon_scale_mode: Literal["spectral", "shape_scaling", "unit_rms_norm"] = \
        MUON_DEFAULTS["muon_scale_mode"]
    muon_extra_scale_factor: float = MUON_DEFAULTS["muon_extra_scale_factor"]
    muon_scalar_optimizer: Literal["adam", "lion"] = MUON_DEFAULTS["muon_scalar_optimizer"]
    #: Named Newton-Schulz preset (NS_COEFFICIENT_PRESETS) used instead of ns_coefficients.
    muon_coefficient_type: Optional[str] = None
    #: Newton-Schulz dtype; None = float32 on CPU, bfloat16 on Ascend.
    ns_dtype: Optional[Literal["float32", "bfloat16"]] = None
    #: lr multiplier of Muon's AdamW branch.
    adamw_lr_mult: float = MUON_DEFAULTS["adamw_lr_mult"]
    phase0_batch_memory_gb: float = MUON_DEFAULTS["phase0_batch_memory_gb"]
    ns_batch_memory_gb: float = MUON_DEFAULTS["ns_batch_memory_gb"]
    phase4_batch_memory_gb: float = MUON_DEFAULTS["phase4_batch_memory_gb"]
    # --- SGD / Lion -------------------------------------------------------------------------
    sgd_momentum: float = SGD_DEFAULTS["momentum"]
    lion_beta1: float = LION_DEFAULTS["betas"][0]
    lion_beta2: float = LION_DEFAULTS["betas"][1]

    def __post_init__(self) -> None:
        defaults = DEFAULTS.get(self.type, ADAMW_DEFAULTS)
        if self.eps is None:  # AdamW's denominator eps, or Muon's Newton-Schulz floor
            self.eps = defaults.get("eps", ADAMW_DEFAULTS["eps"])
        if self.weight_decay is None:
            self.weight_decay = defaults["weight_decay"]

    # ------------------------------------------------------------------------------------------
    @classmethod
    def accepted_keys(cls, type_name_: str) -> List[str]:
        """The keys ``type`` accepts, sorted."""
        return sorted(OPTIMIZER_KEYS[type_name_])

    @classmethod
    def from_dict(cls, data: Any, path: str):
        data = cls.mapping_of(data, path)
        opt_type = data.get("type", "AdamW")
        if not isinstance(opt_type, str) or opt_type not in OPTIMIZER_KEYS:
            msg = f"must be one of {list(OPTIMIZER_TYPES)}, got {opt_type!r}"
            lowered = {t.lower(): t for t in OPTIMIZER_TYPES}  # Megatron writes 'adam', 'sgd'
            hit = closest(str(opt_type).lower(), lowered)
            if hit:
                msg += f"; did you mean '{lowered[hit]}'?"
            raise ConfigError(f"{path}.type", msg)
        accepted = OPTIMIZER_KEYS[opt_type]
        for key in data:
            if key in accepted:
                continue
            hint = _KEY_HINTS.get((opt_type, key))
            if hint:
                raise ConfigError(f"{path}.{key}", f"not accepted by type {opt_type}: {hint}")
            err = unknown_key_error(path, key, sorted(accepted), what=f"key for type {opt_type}")
            if key in cls.field_names():
                users = [t for t, keys in OPTIMIZER_KEYS.items() if key in keys]
                err = ConfigError(err.path, err.detail + f" ('{key}' belongs to {users})")
            raise err
        return super().from_dict(data, path)

    def to_dict(self) -> Dict[str, Any]:
        """Only the keys this type accepts (so the dump reloads), defaults filled in."""
        full = super().to_dict()
        out = {k: v for k, v in full.items() if k in OPTIMIZER_KEYS[self.type]}
        if self.type == "Muon" and self.muon_coefficient_type is not None:
            out.pop("ns_coefficients")  # the preset replaces it; writing both is an error
        return out

    # ------------------------------------------------------------------------------------------
    def validate(self, path: str) -> None:
        p = lambda name: f"{path}.{name}"  # noqa: E731
        check_range(self.weight_decay, p("weight_decay"), lo=0)
        self._validate_common(p)
        if self.type == "AdamW":
            check_betas(self.betas, p("betas"))
            check_range(self.eps, p("eps"), lo=0, lo_open=True)
        elif self.type == "Muon":
            self._validate_muon(p)
        elif self.type == "SGD":
            check_range(self.sgd_momentum, p("sgd_momentum"), lo=0, hi=1, hi_open=True)
        elif self.type == "Lion":
            check_range(self.lion_beta1, p("lion_beta1"), lo=0, hi=1, hi_open=True)
            check_range(self.lion_beta2, p("lion_beta2"), lo=0, hi=1, hi_open=True)

    def _validate_common(self, p) -> None:
        for name in ("decoupled_lr", "decoupled_min_lr"):
            check_range(getattr(self, name), p(name), lo=0)
        if self.decoupled_min_lr is not None:
            if self.decoupled_lr is None:
                raise ConfigError(p("decoupled_min_lr"), "has no effect without decoupled_lr; "
                                                         "set decoupled_lr too")
            if self.decoupled_min_lr > self.decoupled_lr:
                raise ConfigError(p("decoupled_min_lr"),
                                  f"must be <= decoupled_lr ({self.decoupled_lr!r}), "
                                  f"got {self.decoupled_min_lr!r}")
        if self.rmsnorm_weight_decay_mult is not None and self.rmsnorm_weight_decay_mult < 0:
            raise ConfigError(p("rmsnorm_weight_decay_mult"),
                              f"must be a finite nonnegative value, got "
                              f"{self.rmsnorm_weight_decay_mult!r}")
        checked(p("embedding_min_norm"), check_embedding_min_norm, self.embedding_min_norm)
        check_range(self.grad_norm_skip_threshold, p("grad_norm_skip_threshold"), lo=0,
                    lo_open=True)
        check_range(self.loss_scale, p("loss_scale"), lo=0, lo_open=True)
        check_range(self.initial_loss_scale, p("initial_loss_scale"), lo=0, lo_open=True)
        check_range(self.min_loss_scale, p("min_loss_scale"), lo=0, lo_open=True)
        if self.min_loss_scale > self.initial_loss_scale:
            raise ConfigError(p("min_loss_scale"),
                              f"must be <= initial_loss_scale ({self.initial_loss_scale!r}), "
                              f"got {self.min_loss_scale!r}")
        check_range(self.loss_scale_window, p("loss_scale_window"), lo=0, lo_open=True)
        check_range(self.hysteresis, p("hysteresis"), lo=1)
        for name in ("weight_decay_include", "weight_decay_exclude"):
            for i, pattern in enumerate(getattr(self, name) or []):
                if not pattern:
                    raise ConfigError(f"{p(name)}[{i}]", "empty pattern matches nothing")
        allowed = ALLOWED_GROUP_OPTIMIZERS[self.type.lower()]
        for i, ov in enumerate(self.param_overrides or []):
            if ov.optimizer is not None and ov.optimizer not in allowed:
                runs = [t for t in OPTIMIZER_TYPES
                        if ov.optimizer in ALLOWED_GROUP_OPTIMIZERS[t.lower()]]
                raise ConfigError(f"{p('param_overrides')}[{i}].optimizer",
                                  f"'{ov.optimizer}' groups need optimizer.type "
                                  f"{' or '.join(runs)}, got {self.type}")

    def _validate_muon(self, p) -> None:
        checked(p("swap"), check_muon_swap, self.swap)
        for name in ("momentum", "matched_adamw_rms"):
            check_range(getattr(self, name), p(name), **MUON_RANGES[name])
        check_range(self.eps, p("eps"), lo=0, lo_open=True)
        check_range(self.adamw_eps, p("adamw_eps"), lo=0, lo_open=True)
        check_betas(self.adamw_betas, p("adamw_betas"))
        if self.ns_steps <= 0:
            raise ConfigError(p("ns_steps"), f"ns_steps must be positive, got {self.ns_steps!r}.")
        if self.ns_steps > MAX_NS_STEPS:
            raise ConfigError(p("ns_steps"), f"must be <= {MAX_NS_STEPS}, got {self.ns_steps}")
        if self.muon_coefficient_type is not None:
            if self.muon_coefficient_type not in NS_COEFFICIENT_PRESETS:
                hint = closest(self.muon_coefficient_type, NS_COEFFICIENT_PRESETS)
                raise ConfigError(p("muon_coefficient_type"),
                                  f"must be one of {sorted(NS_COEFFICIENT_PRESETS)}, got "
                                  f"{self.muon_coefficient_type!r}"
                                  + (f"; did you mean '{hint}'?" if hint else ""))
            if "ns_coefficients" in self.explicit_keys:
                raise ConfigError(p("muon_coefficient_type"),
                                  "set either muon_coefficient_type (a named preset) or "
                                  "ns_coefficients, not both")
        else:
            schedule = checked(p("ns_coefficients"), normalize_ns_schedule, self.ns_coefficients,
                               self.ns_steps)
            if len(schedule) != self.ns_steps:  # segmented form: its counts give the steps
                if "ns_steps" in self.explicit_keys:
                    # upstream replaces the written ns_steps by the schedule's length (its
                    # master DeepSeek-V4 config writes 8 beside a 10-step schedule); so do we,
                    # and the launch doctor says so (replaced_ns_steps)
                    object.__setattr__(self, "_written_ns_steps", self.ns_steps)
                self.ns_steps = len(schedule)
        checked(p("qk_clip_threshold"), check_qk_clip_threshold, self.qk_clip_enabled,
                self.qk_clip_threshold)
        if isinstance(self.adamw_include, str):
            self.adamw_include = [self.adamw_include]  # upstream: a bare string is one pattern
        for name in ("muon_extra_scale_factor", "adamw_lr_mult"):
            check_range(getattr(self, name), p(name), **MUON_RANGES[name])
        for name in ("phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb"):
            checked(p(name), check_memory_budget, name, getattr(self, name))

    # ------------------------------------------------------------------------------------------
    def replaced_ns_steps(self):
        """The ``ns_steps`` the config wrote when a segmented ``ns_coefficients`` of another
        length replaced it (as upstream does), else None."""
        return getattr(self, "_written_ns_steps", None)

    def ns_schedule(self):
        """The resolved Newton-Schulz schedule: one (a, b, c) per iteration."""
        if self.muon_coefficient_type is not None:
            return preset_schedule(self.muon_coefficient_type, self.ns_steps)
        return normalize_ns_schedule(self.ns_coefficients, self.ns_steps)
