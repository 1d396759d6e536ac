"""LR schedules: every MindFormers 2.1.0 schedule as a pure ``lr_at(step)``, and the registry.

    from mindformers_core.core.lr import build_lr_scheduler, LR_SCHEDULERS, scheduler_fields, group_lrs
    sched = build_lr_scheduler(cfg.lr_scheduler, total_steps=cfg.training.steps)
    lr = sched.lr_at(step)     # 0-based optimizer step, no hidden state; equals MindFormers'
                               # float32 curve within abs 1e-9 or rel 1e-6 where it is sane

Pure Python (``math`` only): importing it never imports MindSpore.
"""
from .base import LRSchedule, WarmupSchedule
from .build import build_lr_scheduler, group_lrs, schedule_class, scheduler_fields
from .lr_schedule import (LR_SCHEDULERS, ConstantWarmUpLR, ConstantWithCoolDownLR,
                          CosineAnnealingLR, CosineAnnealingWarmRestarts, CosineWithRestartsAndWarmUpLR,
                          CosineWithWarmUpLR, InverseSqrtLR, LearningRateWiseLayer, LinearWithWarmUpLR,
                          PolynomialWithWarmUpLR, WarmUpStableDecayLR, canonical_type)

__all__ = [
    "LR_SCHEDULERS", "LRSchedule", "WarmupSchedule", "build_lr_scheduler", "group_lrs",
    "scheduler_fields", "schedule_class", "canonical_type",
    "ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR",
    "CosineWithRestartsAndWarmUpLR", "PolynomialWithWarmUpLR", "WarmUpStableDecayLR",
    "ConstantWithCoolDownLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
    "LearningRateWiseLayer", "InverseSqrtLR",
]
