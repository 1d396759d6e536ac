"""Seeding and the RNG states of Python ``random``, numpy and MindSpore.

Seeding follows upstream (``set_seed``, ``manual_seed``, ``np.random.seed``) and also seeds
Python's ``random`` (upstream does not). ``deterministic=True`` additionally turns on
MindSpore's deterministic kernels (``mindspore.set_deterministic(True)``, which in 2.10 sets
the context key ``deterministic`` to ``"ON"``). MindSpore cannot switch it back off within a
process, so a later ``deterministic=False`` run in the same process stays deterministic.

States are split into JSON-able parts and arrays so the checkpoint can store them.
"""
from __future__ import annotations

import random
from typing import Dict, Tuple

import numpy as np

__all__ = ["seed_everything", "enable_deterministic", "capture_rng_state", "restore_rng_state"]


def enable_deterministic() -> None:
    """MindSpore's deterministic kernels on (they cannot be switched off again)."""
    import mindspore as ms

    if ms.get_context("deterministic") != "ON":
        # set_deterministic may be called once per process; later runs in the same process
        # (tests, notebooks) fall back to the context key it sets.
        try:
            ms.set_deterministic(True)
        except RuntimeError:
            ms.set_context(deterministic="ON")


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed MindSpore, numpy and Python ``random``; optionally force deterministic kernels."""
    import mindspore as ms

    if deterministic:
        enable_deterministic()
    ms.set_seed(seed)
    if hasattr(ms, "manual_seed"):
        ms.manual_seed(seed)
    np.random.seed(seed % (2 ** 32))
    random.seed(seed)


def capture_rng_state() -> Tuple[dict, Dict[str, np.ndarray]]:
    """(json_part, arrays) describing the current state of the three generators."""
    import mindspore as ms

    py_version, py_internal, py_gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    json_part = {
        "python": {"version": py_version, "gauss": py_gauss},
        "numpy": {"name": name, "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
    }
    arrays = {
        "python_internal": np.asarray(py_internal, dtype=np.int64),
        "numpy_keys": np.asarray(keys, dtype=np.uint32),
    }
    if hasattr(ms, "get_rng_state"):
        arrays["mindspore"] = ms.get_rng_state().asnumpy()
    return json_part, arrays


def restore_rng_state(json_part: dict, arrays: Dict[str, np.ndarray]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    import mindspore as ms

    py = json_part["python"]
    random.setstate((py["version"], tuple(int(x) for x in arrays["python_internal"]), py["gauss"]))
    npj = json_part["numpy"]
    np.random.set_state((npj["name"], arrays["numpy_keys"].astype(np.uint32), npj["pos"],
                         npj["has_gauss"], npj["cached_gaussian"]))
    if "mindspore" in arrays and hasattr(ms, "set_rng_state"):
        ms.set_rng_state(ms.Tensor(arrays["mindspore"]))
