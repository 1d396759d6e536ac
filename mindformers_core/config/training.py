"""`training:` section: steps, batch sizes, clipping, NaN skipping, seeds.

Fields and defaults follow MindFormers 2.1 ``TrainingConfig``; where upstream accepts unsafe
values we reject them: ``steps`` must be > 0 and ``max_norm`` > 0 (``null``
disables clipping explicitly, since upstream would scale every gradient to 0 with 0 and flip
it with a negative value).

Derived values (accumulation steps, data parallel size) are not stored here; they come from
``RunConfig.plan()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..errors import MAX_STEPS, ConfigError
from .schema import Section, check_range

JIT_MODES = ("none", "layer", "model")


def check_jit_mode(mode) -> None:
    """Rule of ``training.jit``: one of ``JIT_MODES`` (ValueError otherwise)."""
    if mode not in JIT_MODES:
        raise ValueError(f"must be one of {list(JIT_MODES)}, got {mode!r}")

__all__ = ["TrainingConfig", "JIT_MODES", "check_jit_mode"]


@dataclass
class TrainingConfig(Section):
    #: Total optimizer steps; also the LR scheduler's ``total_steps``.
    steps: int = 1000
    #: Samples per device per micro-batch.
    local_batch_size: int = 1
    #: Samples per optimizer step over all data-parallel ranks and micro-batches.
    global_batch_size: int = 1
    #: Global-norm clipping threshold: grads *= max_norm / (norm + 1e-6) when that is < 1.
    #: ``null`` disables clipping.
    max_norm: Optional[float] = 1.0
    #: Skip the optimizer update (lr does not advance) when the global norm is NaN/inf.
    use_skip_step_on_nan: bool = False
    #: Stop with an error after this many consecutive skipped steps; 0 disables the guard.
    max_consecutive_skipped_steps: int = 0
    seed: int = 42
    #: Deterministic kernels (slower); seeds are always set.
    deterministic: bool = False
    #: Megatron batch ramp-up ``[start_global_batch_size, batch_size_increment, rampup_samples]``.
    rampup_batch_size: Optional[List[int]] = None
    #: End the run after this many completed steps (with a checkpoint when saving is on); the
    #: LR schedule still spans ``steps``, so a resumed run continues the same curve.
    stop_at_step: Optional[int] = None
    #: Evaluate on the held-out data every this many steps (and after the last); null = only
    #: after the last step. Needs ``eval_dataset`` or ``train_dataset.validation_split``.
    eval_interval: Optional[int] = None
    #: Batches (of ``local_batch_size`` per rank) per evaluation: the same samples every time.
    eval_steps: int = 10
    #: Print the step line every this many steps (``metrics.jsonl`` gets every step).
    log_interval: int = 1
    #: How the decoder layers run: ``none`` (PyNative), ``layer`` (each layer compiled with
    #: ``mindspore.jit``; MoE blocks stay PyNative) or ``model`` (the whole forward compiled;
    #: dense models only). See docs/performance.md.
    jit: str = "layer"

    def validate(self, path: str) -> None:
        check_range(self.steps, f"{path}.steps", lo=0, lo_open=True)
        check_range(self.steps, f"{path}.steps", hi=MAX_STEPS)
        # upstream checks global_batch_size first
        check_range(self.global_batch_size, f"{path}.global_batch_size", lo=0, lo_open=True)
        check_range(self.local_batch_size, f"{path}.local_batch_size", lo=0, lo_open=True)
        if self.max_norm is not None and not self.max_norm > 0:
            raise ConfigError(f"{path}.max_norm",
                              f"must be > 0, got {self.max_norm!r} (0 would zero every gradient "
                              "and a negative value flip it; write null to disable clipping)")
        if self.max_consecutive_skipped_steps < 0:
            raise ConfigError(f"{path}.max_consecutive_skipped_steps",
                              f"must be >= 0, got {self.max_consecutive_skipped_steps}.")
        if self.max_consecutive_skipped_steps > 0 and not self.use_skip_step_on_nan:
            raise ConfigError(f"{path}.max_consecutive_skipped_steps",
                              "has no effect unless use_skip_step_on_nan is True")
        # numpy.random.seed and mindspore.set_seed take 0 <= seed < 2**32
        check_range(self.seed, f"{path}.seed", lo=0, hi=2 ** 32 - 1)
        if self.stop_at_step is not None and not 1 <= self.stop_at_step <= self.steps:
            raise ConfigError(f"{path}.stop_at_step",
                              f"must be in [1, steps={self.steps}], got {self.stop_at_step}")
        self._validate_rampup(f"{path}.rampup_batch_size")
        for name in ("eval_interval", "eval_steps", "log_interval"):
            check_range(getattr(self, name), f"{path}.{name}", lo=1)
        try:
            check_jit_mode(self.jit)
        except ValueError as err:
            raise ConfigError(f"{path}.jit", str(err)) from None

    def _validate_rampup(self, path: str) -> None:
        rbs = self.rampup_batch_size
        if rbs is None:
            return
        if len(rbs) != 3:
            raise ConfigError(path, "must be a 3-element list [start_global_batch_size, "
                                    f"batch_size_increment, rampup_samples], got {rbs!r}.")
        start, increment, samples = rbs
        if start <= 0:
            raise ConfigError(f"{path}[0]", f"(start_global_batch_size) must be > 0, got {start}.")
        if increment <= 0:
            raise ConfigError(f"{path}[1]", f"(batch_size_increment) must be > 0, got {increment}.")
        if samples < 0:
            raise ConfigError(f"{path}[2]", f"(rampup_samples) must be >= 0, got {samples}.")
        if start > self.global_batch_size:
            raise ConfigError(f"{path}[0]", f"(start_global_batch_size) {start} must be <= "
                                            f"global_batch_size ({self.global_batch_size})")
        if (self.global_batch_size - start) % increment != 0:
            raise ConfigError(f"{path}[1]", f"global_batch_size ({self.global_batch_size}) - "
                                            f"start_global_batch_size ({start}) must be divisible "
                                            f"by batch_size_increment ({increment})")
