"""``build_optimizer(opt_cfg, model, lr_scheduler=None, shard_layout=None)`` and ``OPTIMIZERS``.

One path from the ``optimizer:`` section to an optimizer: a dict goes through
``OptimizerConfig.from_dict`` (the config layer's types, defaults and checks), and each type
has one explicit builder below that maps the config's fields to its constructor's arguments.
No builder holds a default: every field's default is declared once, in
``core.optimizer_defaults``, which both the config and the constructors read. Parameter groups
come from ``param_groups.get_param_groups(model, opt_cfg)`` and are the only carrier of
per-group ``weight_decay``/``eps``/lr; the initial lr is ``lr_scheduler.lr_at(0)`` (the
trainer sets the group lrs before every step anyway), else the class's default.

``shard_layout`` (an :class:`OptimizerSharding`, e.g. ``distributed.zero.ZeroSharding``) builds
the sharded optimizer at construction: its state is allocated as this rank's rows from the
start, and nothing swaps classes afterwards.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Mapping, Optional, Protocol

from ..config.optimizer import OPTIMIZER_TYPES, OptimizerConfig
from ..errors import ConfigError

__all__ = ["OPTIMIZERS", "BUILDERS", "OptimizerSharding", "build_optimizer", "optimizer_kwargs",
           "as_optimizer_config"]


class OptimizerSharding(Protocol):
    """Builds an optimizer class over groups with keyword arguments, sharded as it sees fit."""

    def build(self, cls: type, groups, kwargs: Dict[str, Any]) -> Any:
        ...


def _adamw_kwargs(cfg: OptimizerConfig) -> Dict[str, Any]:
    kwargs = dict(betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                  decoupled_weight_decay=cfg.decoupled_weight_decay,
                  exp_avg_dtype=cfg.exp_avg_dtype, exp_avg_sq_dtype=cfg.exp_avg_sq_dtype,
                  embedding_min_norm=cfg.embedding_min_norm,
                  enable_cpu_offload=cfg.enable_cpu_offload,
                  use_fused=cfg.use_fused, enable_fused_opt=cfg.enable_fused_opt, swap=cfg.swap)
    # Megatron's store_param_remainders defaults to True but only acts with the precision-aware
    # optimizer; here it acts when written explicitly.
    if "store_param_remainders" in cfg.explicit_keys:
        kwargs["store_param_remainders"] = cfg.store_param_remainders
    return kwargs


def _sgd_kwargs(cfg: OptimizerConfig) -> Dict[str, Any]:
    return dict(momentum=cfg.sgd_momentum, weight_decay=cfg.weight_decay,
                embedding_min_norm=cfg.embedding_min_norm)


def _lion_kwargs(cfg: OptimizerConfig) -> Dict[str, Any]:
    return dict(betas=(cfg.lion_beta1, cfg.lion_beta2), weight_decay=cfg.weight_decay,
                embedding_min_norm=cfg.embedding_min_norm)


def _muon_kwargs(cfg: OptimizerConfig) -> Dict[str, Any]:
    kwargs = dict(
        weight_decay=cfg.weight_decay, momentum=cfg.momentum, nesterov=cfg.nesterov,
        matched_adamw_rms=cfg.matched_adamw_rms, eps=cfg.eps, ns_steps=cfg.ns_steps,
        adamw_betas=tuple(cfg.adamw_betas), adamw_eps=cfg.adamw_eps,
        qk_clip_enabled=cfg.qk_clip_enabled, qk_clip_threshold=cfg.qk_clip_threshold,
        comm_strategy=cfg.comm_strategy, adamw_include=cfg.adamw_include,
        use_fused_adamw=cfg.use_fused_adamw, swap=cfg.swap, muon_split_qkv=cfg.muon_split_qkv,
        muon_scale_mode=cfg.muon_scale_mode, muon_extra_scale_factor=cfg.muon_extra_scale_factor,
        muon_scalar_optimizer=cfg.muon_scalar_optimizer,
        muon_coefficient_type=cfg.muon_coefficient_type, ns_dtype=cfg.ns_dtype,
        adamw_lr_mult=cfg.adamw_lr_mult, lion_betas=(cfg.lion_beta1, cfg.lion_beta2),
        phase0_batch_memory_gb=cfg.phase0_batch_memory_gb,
        ns_batch_memory_gb=cfg.ns_batch_memory_gb,
        phase4_batch_memory_gb=cfg.phase4_batch_memory_gb,
        embedding_min_norm=cfg.embedding_min_norm)
    if cfg.muon_coefficient_type is None:
        kwargs["ns_coefficients"] = cfg.ns_coefficients
    return kwargs


#: type -> (module, class name, builder from OptimizerConfig to keyword arguments); the one
#: table of optimizer types (classes are imported on first use)
BUILDERS: Mapping[str, tuple] = {
    "AdamW": ("adamw", "AdamW", _adamw_kwargs),
    "SGD": ("sgd", "SGD", _sgd_kwargs),
    "Lion": ("lion", "Lion", _lion_kwargs),
    "Muon": ("muon", "Muon", _muon_kwargs),
}
assert set(BUILDERS) == set(OPTIMIZER_TYPES), "optimizer types of config and optim differ"


class _Classes(Mapping):
    """type name -> optimizer class, imported on first use (read-only)."""

    def __getitem__(self, key: str) -> type:
        module, cls_name, _ = BUILDERS[key]
        return getattr(importlib.import_module(f".{module}", __package__), cls_name)

    def __iter__(self):
        return iter(BUILDERS)

    def __len__(self) -> int:
        return len(BUILDERS)


OPTIMIZERS: Mapping[str, type] = _Classes()


def as_optimizer_config(opt_cfg) -> OptimizerConfig:
    """An ``OptimizerConfig`` from itself or a dict (``OptimizerConfig.from_dict``).

    For a dict (a programmatic caller, not a YAML file) a failed optimizer rule surfaces with
    the optimizer's own message, as the class would raise it (the ConfigError's cause)."""
    if isinstance(opt_cfg, OptimizerConfig):
        return opt_cfg
    if not isinstance(opt_cfg, Mapping):
        raise TypeError(f"build_optimizer takes an OptimizerConfig or a dict, got "
                        f"{type(opt_cfg).__name__}")
    opt_type = opt_cfg.get("type", "AdamW")
    if opt_type not in BUILDERS:
        raise NotImplementedError(f"Optimizer type {opt_type} is not implemented yet. "
                                  f"Valid types: {sorted(BUILDERS)}.")
    try:
        return OptimizerConfig.from_dict(dict(opt_cfg), "optimizer")
    except ConfigError as err:
        if isinstance(err.__cause__, (TypeError, ValueError)):
            raise err.__cause__ from None
        raise


def optimizer_kwargs(opt_cfg) -> Dict[str, Any]:
    """The constructor keyword arguments (without params/model/lr) of ``opt_cfg``'s type."""
    cfg = as_optimizer_config(opt_cfg)
    return BUILDERS[cfg.type][2](cfg)


def build_optimizer(opt_cfg, model, lr_scheduler=None,
                    shard_layout: Optional[OptimizerSharding] = None):
    """The optimizer named by ``opt_cfg.type`` over ``model``'s parameter groups."""
    from .param_groups import get_param_groups
    from .host.seam import select_host_kernels
    select_host_kernels()   # the one choice of CPU host kernels every consumer reads
    cfg = as_optimizer_config(opt_cfg)
    kwargs = optimizer_kwargs(cfg)
    if lr_scheduler is not None:
        kwargs["lr"] = float(lr_scheduler.lr_at(0))
    if cfg.type == "Muon":
        kwargs["model"] = model
    groups = get_param_groups(model, cfg)
    if shard_layout is not None:
        return shard_layout.build(OPTIMIZERS[cfg.type], groups, kwargs)
    return OPTIMIZERS[cfg.type](groups, **kwargs)
