"""The one default of every optimizer hyperparameter (pure Python, no MindSpore).

Keys are the constructor argument names of the optimizer classes. The classes take their
signature defaults from here, and ``config.optimizer.OptimizerConfig`` declares its field
defaults from here, so an optimizer built from YAML, from a dict or from keyword arguments
starts from the same values. Per-group values (``lr``, ``weight_decay``, ``eps``, ``betas``)
are carried by the parameter groups; these are the values of a group that does not set them.
"""
from __future__ import annotations

from types import MappingProxyType

from .ns_schedule import DEFAULT_NS_COEFFICIENTS

__all__ = ["ADAMW_DEFAULTS", "SGD_DEFAULTS", "LION_DEFAULTS", "MUON_DEFAULTS", "DEFAULTS"]

ADAMW_DEFAULTS = MappingProxyType({
    "lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01,
    "decoupled_weight_decay": True, "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32",
    "enable_cpu_offload": False,
})

SGD_DEFAULTS = MappingProxyType({
    "lr": 1e-3, "momentum": 0.9, "weight_decay": 0.01, "nesterov": False,
})

#: Megatron's lion_beta1 = 0.95, lion_beta2 = 0.98
LION_DEFAULTS = MappingProxyType({
    "lr": 1e-4, "betas": (0.95, 0.98), "weight_decay": 0.01,
})

#: upstream MindFormers 2.1 Muon (eps is the Newton-Schulz normalisation floor), plus this
#: project's knobs (scale mode, extra factor, scalar optimizer, AdamW-branch lr ratio)
MUON_DEFAULTS = MappingProxyType({
    "lr": 2e-2, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
    "matched_adamw_rms": 0.2, "eps": 1e-7, "ns_steps": 5,
    "ns_coefficients": tuple(DEFAULT_NS_COEFFICIENTS), "adamw_betas": (0.95, 0.95),
    "adamw_eps": 1e-8, "qk_clip_enabled": True, "qk_clip_threshold": 100.0,
    "comm_strategy": "allgather", "use_fused_adamw": False, "muon_split_qkv": True,
    "muon_scale_mode": "spectral", "muon_extra_scale_factor": 1.0,
    "muon_scalar_optimizer": "adam", "muon_coefficient_type": None, "ns_dtype": None,
    "adamw_lr_mult": 1.0, "lion_betas": LION_DEFAULTS["betas"],
    "phase0_batch_memory_gb": 1.0, "ns_batch_memory_gb": 1.0, "phase4_batch_memory_gb": 4.0,
    "swap": False,
})

#: optimizer ``type`` -> its defaults
DEFAULTS = MappingProxyType({"AdamW": ADAMW_DEFAULTS, "SGD": SGD_DEFAULTS,
                             "Lion": LION_DEFAULTS, "Muon": MUON_DEFAULTS})
