"""Value rules shared by the optimizer classes, ``optim.param_groups`` and the config layer, as
pure functions (no MindSpore).

Each rule is written once here. Its text names no field; the caller adds the location:
the optimizer classes prefix the argument name (``embedding_min_norm must be a finite positive
value, got 0.0``), the config layer the dotted path (``optimizer.embedding_min_norm: must be a
finite positive value, got 0.0``), and a parameter-group override names its key and field
(``optimizer.param_overrides[0]: lr_mult=-1.0 must be >= 0.``).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from ..errors import in_range, range_requirement

__all__ = ["check_embedding_min_norm", "check_weight_decay", "is_beta_pair", "check_beta_range", "check_beta_count",
           "OVERRIDE_FIELDS", "OPTIMIZER_KINDS", "ALLOWED_GROUP_OPTIMIZERS", "OVERRIDE_RANGES", "override_value_problem"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- embedding_min_norm (Megatron's OptimizerConfig.validate) --------------------------------
def check_embedding_min_norm(value: Any) -> None:
    """``None`` (off) or a finite number > 0; ``ValueError`` naming the rule only."""
    if value is not None and not (_is_number(value) and math.isfinite(value) and value > 0.0):
        raise ValueError(f"must be a finite positive value, got {value!r}")


# --- weight decay (upstream's, torch's wording) ---------------------------------------------
def check_weight_decay(weight_decay) -> None:
    """A decoupled decay coefficient is >= 0."""
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}, should be >= 0.")


# --- betas -----------------------------------------------------------------------------------
def is_beta_pair(value: Any) -> bool:
    """Exactly two numbers, each in [0, 1) (Adam's and Lion's ``betas``)."""
    return (isinstance(value, (list, tuple)) and len(value) == 2
            and all(_is_number(b) and 0.0 <= b < 1.0 for b in value))


def _beta_size_error(betas, name: str) -> ValueError:
    return ValueError(f"For '{name}', the betas size should be in : [2], but got {len(betas)}.")


def check_beta_range(betas, name: str) -> None:
    """The range half of the Adam/Lion ``betas`` checks, upstream's (torch's) wording and
    order: at least two values, ``betas[0]`` and ``betas[1]`` in [0, 1)."""
    if len(betas) < 2:
        raise _beta_size_error(betas, name)
    for k in (0, 1):
        if not 0.0 <= betas[k] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {k}: {betas[k]}, "
                             f"should be >= 0 and < 1.")


def check_beta_count(betas, name: str) -> None:
    """Exactly two ``betas`` (MindSpore's check, after its type checks)."""
    if len(betas) != 2:
        raise _beta_size_error(betas, name)


# --- parameter-group override values ---------------------------------------------------------
OVERRIDE_FIELDS = ("lr_mult", "max_lr", "min_lr", "weight_decay", "wd_mult", "eps", "betas",
                   "optimizer")
OPTIMIZER_KINDS = ("adamw", "muon", "sgd", "lion")

#: which group optimizer kinds each optimizer type (lower case) can run; Muon carries an AdamW
#: branch for the parameters it does not orthogonalise
ALLOWED_GROUP_OPTIMIZERS = {"adamw": ("adamw",), "muon": ("muon", "adamw"), "sgd": ("sgd",),
                            "lion": ("lion",)}

#: the allowed interval of each numeric override field (``errors.check_range`` keywords)
OVERRIDE_RANGES = {
    "lr_mult": dict(lo=0.0), "max_lr": dict(lo=0.0), "min_lr": dict(lo=0.0),
    "weight_decay": dict(lo=0.0), "wd_mult": dict(lo=0.0), "eps": dict(lo=0.0, lo_open=True),
}


def override_value_problem(field: str, value: Any,
                           allowed_optimizers: Optional[Iterable[str]] = None) -> Optional[str]:
    """What is wrong with ``value`` for the known override field ``field`` (``None``: nothing).

    ``allowed_optimizers``: the group optimizer kinds the optimizer type can run (``None``:
    any of :data:`OPTIMIZER_KINDS`)."""
    if field == "optimizer":
        kind = str(value).lower()
        if kind not in OPTIMIZER_KINDS:
            return f"is not one of {list(OPTIMIZER_KINDS)}"
        if allowed_optimizers is not None and kind not in allowed_optimizers:
            return (f"cannot be used with this optimizer type; allowed: "
                    f"{sorted(allowed_optimizers)}")
        return None
    if field == "betas":
        return None if is_beta_pair(value) else "must be two numbers in [0, 1)"
    if not _is_number(value) or not math.isfinite(value):
        return "must be a finite number"
    bounds = OVERRIDE_RANGES[field]
    return None if in_range(value, **bounds) else range_requirement(**bounds)
