"""The `profiler:` section (config/profiler.py): MindSpore's profiler over a step window.

``StepProfiler(cfg, output_dir, rank)``: on a rank it profiles (``profiler_rank`` null = all),
``before_step(n)`` starts MindSpore's profiler (``mindspore.profiler.profile``) when step
``n`` is the window's first; ``after_step(n)`` advances its schedule and stops it after the
window's last step, which writes the trace (``*_ascend_ms/`` with ``ASCEND_PROFILER_OUTPUT``,
``FRAMEWORK``, the name MindSpore uses on every backend) under

    output_path               (absolute)
    <output_dir>/output_path  (relative)
    <output_dir>/profile      (null or "")

A run that ends inside the window stops the profiler in ``close()``.
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["StepProfiler", "profile_dir"]


def profile_dir(output_path: Optional[str], output_dir: Optional[str]) -> str:
    """Where the profiler writes (rules in the module doc)."""
    base = output_dir or "."
    if not output_path:
        return os.path.join(base, "profile")
    return output_path if os.path.isabs(output_path) else os.path.join(base, output_path)


class StepProfiler:
    def __init__(self, cfg, output_dir: Optional[str], rank: int):
        self.cfg = cfg
        ranks = cfg.profiler_rank
        self.active = bool(cfg.enable_profiling) and (ranks is None or rank in ranks)
        self.start, self.end = cfg.window()
        self.path = profile_dir(cfg.output_path, output_dir)
        self._prof = None

    def _build(self):
        import mindspore as ms
        from mindspore.profiler import (ProfilerActivity, ProfilerLevel, schedule,
                                        tensorboard_trace_handler)
        from mindspore.profiler import _ExperimentalConfig as ExperimentalConfig  # its public name
        levels = {None: ProfilerLevel.LevelNone, 0: ProfilerLevel.Level0,
                  1: ProfilerLevel.Level1, 2: ProfilerLevel.Level2}
        activities = [ProfilerActivity.CPU] if self.cfg.profile_cpu else []
        if ms.get_context("device_target") != "CPU":
            activities.append(ProfilerActivity.NPU)
        os.makedirs(self.path, exist_ok=True)
        return ms.profiler.profile(
            activities=activities or [ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=0, active=self.end - self.start + 1, repeat=1,
                              skip_first=0),
            on_trace_ready=tensorboard_trace_handler(self.path),
            profile_memory=self.cfg.profile_memory, with_stack=self.cfg.with_stack,
            experimental_config=ExperimentalConfig(profiler_level=levels[self.cfg.level()]))

    def before_step(self, step: int) -> None:
        if self.active and self._prof is None and step == self.start:
            self._prof = self._build()
            self._prof.start()

    def after_step(self, step: int) -> None:
        if self._prof is None:
            return
        self._prof.step()
        if step >= self.end:
            self.close()

    def close(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()
            self.active = False
