"""The process-wide kernel object of one host C source (CPU), shared by the host kernels.

``host_adam``, ``host_norm`` and ``host_accumulate`` each wrap one C source built by
``optim/host/native.py``. A :class:`HostKernelSlot` builds its kernel object on first use, only
where a tensor's ``asnumpy()`` aliases its storage (``host_views``: CPU), keeps it for the
process, says why there is none, and forgets it for tests that switch
``MFC_NATIVE_KERNELS`` (:func:`slot_generation` counts those resets, so the seam that chose
the kernels, ``optim/host/seam.py``, chooses again). ``symbols`` are the C functions the
factory binds: a library lacking one is not loaded (``native.load``). The functions below are
the steps every host call shares: wait for queued kernels, the pointer array of a tensor list,
and the block walk split over threads.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

from . import native
from .flat_state import synchronous_dispatch
from .views import host_threads, numpy_view_aliases_storage
from ..main_params import wait_for_kernels

__all__ = ["HostKernelSlot", "wait_before_host_access", "pointer_array", "block_count",
           "run_blocks", "slot_generation"]

K = TypeVar("K")
_RESETS = [0]


def slot_generation() -> int:
    """How many times a slot was reset in this process."""
    return _RESETS[0]


class HostKernelSlot(Generic[K]):
    """``get()``: ``factory(lib)`` of the library built from ``source``, or None."""

    def __init__(self, source: str, factory: Callable[..., K], symbols: Sequence[str]):
        self.source = source
        self.factory = factory
        self.symbols = tuple(symbols)
        self._kernel: List[Optional[K]] = []

    def get(self) -> Optional[K]:
        if not self._kernel:
            lib = native.load(self.source, self.symbols) if numpy_view_aliases_storage() \
                else None
            self._kernel.append(self.factory(lib) if lib is not None else None)
        return self._kernel[0]

    def unavailable_reason(self) -> str:
        """Why :meth:`get` is None ('' when the kernel is available)."""
        if self.get() is not None:
            return ""
        if not numpy_view_aliases_storage():
            return "tensor storage is not host memory"
        return native.unavailable_reason(self.source)

    def reset(self) -> None:
        self._kernel.clear()
        native.forget(self.source)
        _RESETS[0] += 1


def wait_before_host_access() -> None:
    """With asynchronous dispatch, wait for the queued kernels (they may still write the
    tensors a host call is about to read); synchronous dispatch (the trainer's CPU mode) has
    nothing queued."""
    if not synchronous_dispatch():
        wait_for_kernels()


def pointer_array(addresses: Sequence[int]):
    """``addresses`` as a C ``void *[]`` for a host call."""
    return (ctypes.c_void_p * len(addresses))(*addresses)


def block_count(sizes: Sequence[int], block: int) -> int:
    """Blocks of ``block`` elements when each tensor of ``sizes`` is cut on its own."""
    return sum(-(-int(s) // block) for s in sizes)


def run_blocks(run: Callable[[Tuple[int, int]], int], sizes: Sequence[int], block: int,
               threaded_min: int, threads: Optional[int], what: str) -> None:
    """``run((b_lo, b_hi))`` (a host call returning the elements it covered) over every block,
    split over ``threads`` (default :func:`host_views.host_threads`) when the tensors hold at
    least ``threaded_min`` elements; a count that is not every element is a bug in the
    kernel's block walk (RuntimeError naming ``what``)."""
    total = sum(int(s) for s in sizes)
    threads = (threads or host_threads()) if total >= threaded_min else 1
    done = sum(native.run_split(run, block_count(sizes, block), threads))
    if done != total:
        raise RuntimeError(f"{what} covered {done} of {total} elements")
