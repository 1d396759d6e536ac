"""What a resume checks in a checkpoint beyond its digest (``checkpoint.py``).

The digest proves the file is the one that was written; these checks prove it is one this run
can continue: the train state is a set of sane counters, the step lies within the schedule,
every optimizer tensor that was saved is there, and every weight has the model's shape and
storage dtype. A failing check is a :class:`CheckpointError` naming the file and the entry,
never a ``KeyError``/``TypeError`` traceback from deep inside the loader.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .store import CheckpointData, CheckpointError
from .train_state import TrainState

__all__ = ["check_train_payload", "check_weight", "optimizer_tensor_names", "lr_jump_warning",
           "LR_JUMP_FACTOR"]

#: a resumed lr more than this factor above or below the last logged one is reported
LR_JUMP_FACTOR = 2.0


def _bad(data: CheckpointData, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {data.path} is not a usable training checkpoint: {what}")


def check_train_payload(data: CheckpointData, total_steps: int) -> None:
    """Structure and ranges of the train state, RNG state and optimizer entry list."""
    st = data.state
    ts = st.get("train_state")
    if not isinstance(ts, dict):
        raise _bad(data, "no train_state object")
    for name in ("step", "applied_steps", "consumed_samples"):
        if name not in ts:
            raise _bad(data, f"train_state has no {name!r}")
    known = {f for f in TrainState().to_dict()}
    for name, value in ts.items():
        if name in known and (type(value) is not int or value < 0):
            raise _bad(data, f"train_state.{name} must be a non-negative integer, got "
                             f"{value!r:.40}")
    step = ts["step"]
    if step != data.step:
        raise _bad(data, f"train_state.step {step} differs from the header's step {data.step}")
    if ts["applied_steps"] > step or ts.get("total_skipped", 0) > step:
        raise _bad(data, f"train_state counts more applied/skipped steps than its step {step}")
    if step > total_steps:
        raise CheckpointError(
            f"checkpoint {data.path} is at step {step}, beyond training.steps={total_steps} of "
            "this run (a checkpoint of another, longer run?); raise training.steps to continue "
            "it, or point checkpoint.load_path at a checkpoint of this run")
    rng = st.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("python"), dict) \
            or not isinstance(rng.get("numpy"), dict):
        raise _bad(data, "no rng state (python and numpy)")
    for key in ("rng.python_internal", "rng.numpy_keys"):
        if key not in data.tensors:
            raise _bad(data, f"tensor {key!r} of the RNG state is missing")
    if not isinstance(st.get("has_optimizer", False), bool):
        raise _bad(data, "has_optimizer must be true or false")
    if st.get("has_optimizer"):
        names = st.get("optimizer_tensors")
        if not isinstance(names, list):
            raise _bad(data, "no optimizer_tensors list")
        missing = [n for n in names if f"optim.{n}" not in data.tensors]
        if missing:
            raise _bad(data, f"optimizer tensor(s) {missing[:5]} are missing")


def optimizer_tensor_names(tensors) -> list:
    """The ``optim.*`` entries of a payload, recorded in the state so a resume can check them."""
    return sorted(k[len("optim."):] for k in tensors if k.startswith("optim."))


def check_weight(data: CheckpointData, name: str, arr: np.ndarray, shape: Sequence[int],
                 storage_dtype: str) -> None:
    """One model weight: the model's shape and the dtype it is stored as (bf16 as float32)."""
    if tuple(arr.shape) != tuple(shape):
        raise CheckpointError(f"checkpoint {data.path}: parameter {name} has shape "
                              f"{tuple(arr.shape)}, the model has {tuple(shape)}")
    if str(arr.dtype) != storage_dtype:
        raise CheckpointError(f"checkpoint {data.path}: parameter {name} is stored as "
                              f"{arr.dtype}, the model's parameter needs {storage_dtype}")


def lr_jump_warning(last_lr: Optional[float], resumed_lr: float, step: int) -> Optional[str]:
    """A warning when the lr of the first resumed step is more than :data:`LR_JUMP_FACTOR`
    times above or below the last logged lr (a schedule changed under a resume), else None."""
    if last_lr is None or not math.isfinite(last_lr) or not math.isfinite(resumed_lr):
        return None
    lo, hi = sorted((abs(last_lr), abs(resumed_lr)))
    if lo == 0 or hi / lo <= LR_JUMP_FACTOR:   # from/to 0: warm-up start or decay end
        return None
    return (f"WARNING: the learning rate jumps {resumed_lr / last_lr:.3g}x at the resume: the last logged step had "
            f"lr {last_lr:.6g}, step {step + 1} gets {resumed_lr:.6g}. If the schedule was "
            "changed on purpose (e.g. extending a WSD run), resume from a checkpoint of the "
            "stable phase instead (see docs/checkpoints.md)")
