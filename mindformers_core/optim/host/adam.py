"""A group's Adam / AdamW step in one host C call over every tensor (CPU).

On CPU each eager ``ops.Adam`` launch costs ~90 us of dispatch and the decoupled decay needs a
second pass over the masters (``flat_state.py`` and ``adamw.py`` have the numbers), so a
10M-parameter GPT step took 2.1x torch's fused AdamW. ``asnumpy()`` of a CPU tensor is a view
of its storage (``host_views.py``), so the C kernel in ``host_adam.c`` (built by
``optim/host/native.py``) takes the pointers of every master, moment and gradient of the group and
updates them in place in one pass, the decay included: per element the arithmetic and fp32
rounding of MindSpore's CPU Adam kernel followed by the decay multiply (tested bit for bit
against an op-by-op fp32 reference, and within 1 ulp of the ``ops.Adam`` path, whose kernel
computes its tail elements in double). The step is cut into blocks of :data:`BLOCK` elements and the
blocks are split over the runtime's CPU threads (ctypes releases the GIL).

:func:`host_adam_kernel` is None where this cannot run (device memory is not aliased, no C
compiler, ``MFC_NATIVE_KERNELS=0``); the optimizer then keeps MindSpore's kernels.
:meth:`HostAdamKernel.step` returns False, touching nothing, for tensors it does not take
(not fp32, sizes that differ, strided or without host storage).
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Sequence

from .kernels import HostKernelSlot, pointer_array, run_blocks, wait_before_host_access
from .views import host_address, numpy_view_aliases_storage

__all__ = ["HostAdamKernel", "host_adam_kernel", "host_adam_unavailable_reason",
           "host_adam_notice", "reset_host_adam_kernel", "BLOCK", "SOURCE"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_adam.c")

#: elements per block (256 KiB of each of the four streams): small enough to share a step
#: fairly among threads, large enough that the per-block bookkeeping is negligible
BLOCK = 1 << 16
#: below this many elements one thread does the whole step (thread hand-offs cost ~20-50 us)
THREADED_MIN_NUMEL = 1 << 20

_PTRS = ctypes.POINTER(ctypes.c_void_p)
_I64S = ctypes.POINTER(ctypes.c_int64)


class HostAdamKernel:
    """``step(masters, exp_avg, exp_avg_sq, grads, lr, b1, b2, eps, decay, decay_first, l2)``
    over lists of fp32 tensors (masters and moments updated in place; ``host_adam.c`` has
    the formula)."""

    def __init__(self, lib: ctypes.CDLL):
        fn = lib.mfc_adam_blocks
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_int64, _PTRS, _PTRS, _PTRS, _PTRS, _I64S, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_int64] + [ctypes.c_float] * 5 + \
            [ctypes.c_int32, ctypes.c_float]
        self._fn = fn

    def step(self, masters: Sequence, exp_avg: Sequence, exp_avg_sq: Sequence,
             grads: Sequence, lr: float, b1: float, b2: float, eps: float, decay: float = 1.0,
             decay_first: bool = False, l2: float = 0.0,
             threads: Optional[int] = None) -> bool:
        """One step; False (nothing touched) when the tensors are not all fp32, contiguous,
        in host memory and of matching sizes. ``threads``: default the runtime's."""
        n = len(masters)
        if not n == len(exp_avg) == len(exp_avg_sq) == len(grads):
            return False
        sizes = [int(t.size) for t in masters]
        if any([int(t.size) for t in kind] != sizes for kind in (exp_avg, exp_avg_sq, grads)):
            return False
        wait_before_host_access()
        addresses = [[host_address(t) for t in kind]
                     for kind in (masters, exp_avg, exp_avg_sq, grads)]
        if not all(all(kind) for kind in addresses):
            return False
        ptrs = [pointer_array(kind) for kind in addresses]
        numel = (ctypes.c_int64 * n)(*sizes)
        args = (b1, b2, lr, eps, decay, int(bool(decay_first)), l2)  # host_adam.c order

        def run(lo_hi):
            return self._fn(n, *ptrs, numel, BLOCK, lo_hi[0], lo_hi[1], *args)

        run_blocks(run, sizes, BLOCK, THREADED_MIN_NUMEL, threads, "host Adam")
        return True


_SLOT = HostKernelSlot(SOURCE, HostAdamKernel, ("mfc_adam_blocks",))


def host_adam_kernel() -> Optional[HostAdamKernel]:
    """The process's host Adam kernel, or None where it cannot run (see the module doc)."""
    return _SLOT.get()


def host_adam_unavailable_reason() -> str:
    """Why :func:`host_adam_kernel` is None ('' when it is available)."""
    return _SLOT.unavailable_reason()


def host_adam_notice() -> Optional[str]:
    """A log line when this CPU process runs Adam on MindSpore's kernels for want of the host
    kernel (a missing compiler costs ~2x in the optimizer phase), else None."""
    if not numpy_view_aliases_storage() or host_adam_kernel() is not None:
        return None
    return (f"host Adam kernel : unavailable ({host_adam_unavailable_reason()}); Adam steps "
            f"use ops.Adam launches")


def reset_host_adam_kernel() -> None:
    """Forget the process's kernel (tests switch ``MFC_NATIVE_KERNELS``)."""
    _SLOT.reset()
