"""Optimizers, parameter groups, fp32 masters, clipping.

Names are resolved lazily (PEP 562) so that importing one submodule does not import every
optimizer, and so that the config layer can use pure-Python helpers without MindSpore.
"""
import importlib

_EXPORTS = {
    # name: submodule
    "Optimizer": "optimizer",
    "AdamW": "adamw",
    "SGD": "sgd",
    "Lion": "lion",
    "Muon": "muon",
    "build_optimizer": "build",
    "OPTIMIZERS": "build",
    "ParamKey": "param_groups",
    "ParamPredicate": "param_groups",
    "ParamWithNamePredicate": "param_groups",
    "ParamGroupOverride": "param_groups",
    "get_param_groups": "param_groups",
    "get_standard_config_overrides": "param_groups",
    "get_mup_config_overrides": "param_groups",
    "check_config_overrides_consistency": "param_groups",
    "format_param_group_table": "param_groups",
    "global_grad_norm": "clip_grad",
    "clip_grad_by_global_norm": "clip_grad",
    "MainParams": "main_params",
    "muon_routing": "muon_routing",
    "mup_width_mult": "mup",
    "build_config_overrides": "param_groups",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
