"""`profiler:` section (upstream MindFormers' PyNative names; older branches' names too).
Behaviour: trainer/profiler.py runs MindSpore's profiler over steps
``[start_step, end_step]`` (1-based, inclusive) on the ranks ``profiler_rank`` (null = all) and
writes its output under ``output_path`` (null or "" = ``<output_dir>/profile``; a relative
path is taken under the output dir).

Older spellings: ``enable_profiler`` (= ``enable_profiling``), ``stop_step`` (= ``end_step``),
``enable_memory`` (= ``profile_memory``), ``save_traces_folder`` (= ``output_path``),
``profiler_level`` ``"Level0"``/``"Level1"``/``"Level2"`` (= 0/1/2). Writing both spellings of
one field is an error. Older branches describe the window with MindSpore's
schedule keys instead; with ``profiler_repeat: 1`` that is one window,

    start = profiler_skip_first + profiler_skip_first_wait + profiler_wait + profiler_warmup + 1
    end   = start + profiler_active - 1

(MindSpore discards the warm-up steps it records), so either form may be written, not both;
``profiler_repeat`` other than 1 (several windows) is not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from ..errors import ConfigError
from .compat.noop import require_noop
from .schema import Section, check_range

__all__ = ["ProfilerConfig", "PROFILER_ALIASES"]

#: older name -> current name
PROFILER_ALIASES = {"enable_profiler": "enable_profiling", "stop_step": "end_step",
                    "enable_memory": "profile_memory", "save_traces_folder": "output_path"}
_SCHEDULE_KEYS = ("profiler_skip_first", "profiler_skip_first_wait", "profiler_wait",
                  "profiler_warmup", "profiler_active", "profiler_repeat")
_LEVELS = {"Level0": 0, "Level1": 1, "Level2": 2, "LevelNone": None}


@dataclass
class ProfilerConfig(Section):
    enable_profiling: bool = False
    start_step: int = 1
    end_step: int = 1
    output_path: Optional[str] = None
    profiler_rank: Optional[List[int]] = None
    profiler_level: Optional[Union[int, str]] = 0
    mstx: bool = False
    profile_memory: bool = False
    profile_cpu: bool = True
    with_stack: bool = True
    # older branches' scheduler keys: only one window is supported
    profiler_skip_first: int = 0
    profiler_skip_first_wait: int = 0
    profiler_wait: int = 0
    profiler_warmup: int = 0
    profiler_active: int = 1
    profiler_repeat: int = 1

    @classmethod
    def from_dict(cls, data, path: str):
        data = dict(cls.mapping_of(data, path))
        for old, new in PROFILER_ALIASES.items():
            if old in data:
                if new in data:
                    raise ConfigError(f"{path}.{old}", f"sets the same field as {new!r} "
                                                       "(older and current spelling); keep one")
                data[new] = data.pop(old)
        return super().from_dict(data, path)

    def window(self):
        """``(start_step, end_step)``, 1-based and inclusive."""
        if not self._uses_schedule():
            return self.start_step, self.end_step
        start = (self.profiler_skip_first + self.profiler_skip_first_wait + self.profiler_wait
                 + self.profiler_warmup + 1)
        return start, start + self.profiler_active - 1

    def to_dict(self):
        """Only the window form the user wrote (start/end steps or the schedule keys)."""
        drop = ("start_step", "end_step") if self._uses_schedule() else _SCHEDULE_KEYS
        return {k: v for k, v in super().to_dict().items() if k not in drop}

    def _uses_schedule(self) -> bool:
        return any(k in self.explicit_keys for k in _SCHEDULE_KEYS)

    def level(self) -> Optional[int]:
        """profiler_level as 0/1/2 (None = LevelNone)."""
        if isinstance(self.profiler_level, str):
            return _LEVELS[self.profiler_level]
        return self.profiler_level

    def validate(self, path: str) -> None:
        if isinstance(self.profiler_level, str) and self.profiler_level not in _LEVELS:
            raise ConfigError(f"{path}.profiler_level", f"must be 0, 1, 2 or one of "
                                                        f"{list(_LEVELS)}, got "
                                                        f"{self.profiler_level!r}")
        if isinstance(self.profiler_level, int):
            check_range(self.profiler_level, f"{path}.profiler_level", lo=0, hi=2)
        # upstream's messages
        if self.start_step <= 0 or self.end_step <= 0:
            raise ConfigError(f"{path}.start_step",
                              "ProfilerConfig.start_step and end_step must be positive, but "
                              f"got {self.start_step} and {self.end_step}")
        if self.start_step > self.end_step:
            raise ConfigError(f"{path}.start_step",
                              "ProfilerConfig.start_step must be less than or equal to "
                              f"end_step, but got {self.start_step} and {self.end_step}")
        if self._uses_schedule():
            both = [k for k in ("start_step", "end_step") if k in self.explicit_keys]
            if both:
                raise ConfigError(f"{path}.{both[0]}", "given together with the schedule keys "
                                                       f"{list(_SCHEDULE_KEYS)}; use one form")
            for name in _SCHEDULE_KEYS[:4]:
                check_range(getattr(self, name), f"{path}.{name}", lo=0)
            check_range(self.profiler_active, f"{path}.profiler_active", lo=1)
            require_noop(f"{path}.profiler_repeat", self.profiler_repeat, (1,),
                         "several profiling windows")
        require_noop(f"{path}.mstx", self.mstx, (False,), "mstx light-weight profiling")
        if self.profiler_rank is not None:
            for i, rank in enumerate(self.profiler_rank):
                check_range(rank, f"{path}.profiler_rank[{i}]", lo=0)
