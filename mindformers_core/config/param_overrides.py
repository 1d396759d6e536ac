"""Sub-sections of `optimizer:` for parameter groups: ``param_overrides`` entries and ``mup``.

A ``param_overrides`` entry selects parameters (``name``: shell-style globs on the full
parameter name, and/or ``ndim``: exact number of dimensions; both given = both must match) and
states what the group changes: ``lr_mult`` (lr = schedule lr * lr_mult) or ``max_lr``/``min_lr``
(the schedule re-evaluated with that peak and floor), ``weight_decay`` or ``wd_mult``, ``eps``,
``betas``, and ``optimizer`` (route the group to another optimizer kind). The grouping itself is
done by ``mindformers_core.optim.param_groups``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional, Union

from ..core.optimizer_rules import OVERRIDE_FIELDS, OVERRIDE_RANGES, is_beta_pair
from ..errors import ConfigError
from .schema import Section, check_range

__all__ = ["ParamOverrideConfig", "MupConfig", "check_betas"]


def check_betas(betas, path: str) -> None:
    """``betas``: exactly two values, each in [0, 1) (``core.optimizer_rules.is_beta_pair``)."""
    if not is_beta_pair(betas):
        raise ConfigError(path, f"expected 2 values in [0, 1), got {list(betas)!r}")


@dataclass
class ParamOverrideConfig(Section):
    name: Optional[Union[List[str], str]] = None
    ndim: Optional[int] = None
    lr_mult: Optional[float] = None
    max_lr: Optional[float] = None
    min_lr: Optional[float] = None
    weight_decay: Optional[float] = None
    wd_mult: Optional[float] = None
    eps: Optional[float] = None
    betas: Optional[List[float]] = None
    optimizer: Optional[Literal["adamw", "muon", "sgd", "lion"]] = None

    def validate(self, path: str) -> None:
        if isinstance(self.name, str):
            self.name = [self.name]
        if not self.name and self.ndim is None:
            raise ConfigError(path, "selects no parameter: give 'name' (a list of globs) "
                                    "and/or 'ndim'")
        for i, pattern in enumerate(self.name or []):
            if not pattern:
                raise ConfigError(f"{path}.name[{i}]", "empty pattern matches nothing")
        check_range(self.ndim, f"{path}.ndim", lo=0)
        if all(getattr(self, k) is None for k in OVERRIDE_FIELDS):
            raise ConfigError(path, f"changes nothing: set at least one of {list(OVERRIDE_FIELDS)}")
        for k, bounds in OVERRIDE_RANGES.items():
            check_range(getattr(self, k), f"{path}.{k}", **bounds)
        if self.betas is not None:
            check_betas(self.betas, f"{path}.betas")
        if self.lr_mult is not None and (self.max_lr is not None or self.min_lr is not None):
            raise ConfigError(f"{path}.lr_mult", "set either lr_mult or max_lr/min_lr, not both")
        if self.weight_decay is not None and self.wd_mult is not None:
            raise ConfigError(f"{path}.wd_mult", "set either weight_decay or wd_mult, not both")
        if self.min_lr is not None and self.max_lr is not None and self.min_lr > self.max_lr:
            raise ConfigError(f"{path}.min_lr",
                              f"must be <= max_lr ({self.max_lr!r}), got {self.min_lr!r}")


@dataclass
class MupConfig(Section):
    """muP: ``width_mult = model.hidden_size / base_hidden_size``."""
    base_hidden_size: int = field(default=None)  # type: ignore[assignment]  # required

    def validate(self, path: str) -> None:
        if self.base_hidden_size is None:
            raise ConfigError(f"{path}.base_hidden_size", "required (the width of the base "
                                                          "model the hyperparameters were tuned on)")
        check_range(self.base_hidden_size, f"{path}.base_hidden_size", lo=1)
