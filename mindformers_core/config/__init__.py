"""Strict run configuration: YAML -> typed, validated sections.

    from mindformers_core.config import load_config, RunConfig, ConfigError
    cfg = load_config("run.yaml", overrides=["training.steps=20"])
    cfg.training.steps, cfg.optimizer.betas, cfg.lr_scheduler.warmup_ratio, cfg.model.hidden_size
    cfg.to_dict()   # as a user would write it, defaults filled in
    cfg.plan()      # derived: accumulation steps, data parallel, warmup/decay steps, tokens/step

Importing this package never imports MindSpore (``run_mindformer.py --check`` stays fast).
"""
from .checkpoint import CheckpointConfig
from .dataset import DatasetConfig
from ..errors import ConfigError
from .lr_scheduler import LrSchedulerConfig
from .model import ModelConfig
from .optimizer import OPTIMIZER_KEYS, OPTIMIZER_TYPES, OptimizerConfig
from .param_overrides import MupConfig, ParamOverrideConfig
from .parallelism import ParallelismConfig
from .run_config import DEFAULTED_SECTIONS, RunConfig, RunPlan, apply_overrides, load_config
from .training import TrainingConfig

__all__ = [
    "CheckpointConfig", "ConfigError", "DatasetConfig", "LrSchedulerConfig", "ModelConfig",
    "MupConfig", "OPTIMIZER_KEYS", "OPTIMIZER_TYPES", "OptimizerConfig", "ParallelismConfig",
    "ParamOverrideConfig", "DEFAULTED_SECTIONS", "RunConfig", "RunPlan", "TrainingConfig",
    "apply_overrides", "load_config",
]
