"""The sum of squares of many fp32 gradients in one host C call (CPU).

``clip_grad.global_grad_norm`` launched a norm per bucket of gradients plus a stack, a sum
and a sqrt: ~1.3 ms of dispatch for the tiny GPT's ~20 gradients, 1.5% of its step (``bench/
bench_train.py``). On CPU a tensor's ``data_ptr()`` is its host storage (``host_views``), so
``host_norm.c`` reads every gradient in place and returns float64 partial sums per block of
:data:`BLOCK` elements; they are added here in block order. The result is the same whatever
the thread split (tested), and more accurate than an fp32 reduction.

:func:`host_sq_norm` returns None where it does not apply (no host kernel, a gradient that is
not a contiguous fp32 host tensor); the caller keeps MindSpore's norm.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Sequence

import numpy as np

from .kernels import (HostKernelSlot, block_count, pointer_array, run_blocks,
                           wait_before_host_access)
from .views import host_address

__all__ = ["host_sq_norm", "host_norm_unavailable_reason", "reset_host_norm", "BLOCK",
           "SOURCE"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_norm.c")
#: elements per partial sum (as host_adam.BLOCK: a thread's share stays balanced)
BLOCK = 1 << 16
#: below this many elements one thread reads everything
THREADED_MIN_NUMEL = 1 << 21


def _bind(lib):
    fn = lib.mfc_sq_sum_blocks
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.POINTER(ctypes.c_double)]
    return fn


_SLOT = HostKernelSlot(SOURCE, _bind, ("mfc_sq_sum_blocks",))


def host_sq_norm(tensors: Sequence, threads: Optional[int] = None) -> Optional[float]:
    """Sum of the squares of every element of ``tensors`` (float64 accumulation), or None
    where the host kernel does not take them. Empty tensors count 0."""
    fn = _SLOT.get()
    if fn is None:
        return None
    tensors = [t for t in tensors if t is not None and int(t.size) > 0]
    if not tensors:
        return 0.0
    wait_before_host_access()
    addresses = [host_address(t) for t in tensors]
    if not all(addresses):
        return None
    n = len(tensors)
    sizes = [int(t.size) for t in tensors]
    ptrs = pointer_array(addresses)
    numel = (ctypes.c_int64 * n)(*sizes)
    partial = np.zeros(block_count(sizes, BLOCK), np.float64)
    base = partial.ctypes.data

    def run(lo_hi):
        out = ctypes.cast(base + 8 * lo_hi[0], ctypes.POINTER(ctypes.c_double))
        return fn(n, ptrs, numel, BLOCK, lo_hi[0], lo_hi[1], out)

    run_blocks(run, sizes, BLOCK, THREADED_MIN_NUMEL, threads, "host norm")
    return float(np.sum(partial))


def host_norm_unavailable_reason() -> str:
    """Why :func:`host_sq_norm` is always None ('' when the kernel is available)."""
    return _SLOT.unavailable_reason()


def reset_host_norm() -> None:
    """Forget the process's kernel (tests switch ``MFC_NATIVE_KERNELS``)."""
    _SLOT.reset()
