"""The process-wide kernel object of one host C source (CPU), shared by the host kernels.

``host_adam``, ``host_norm`` and ``host_accumulate`` each wrap one C source built by
``core/native.py``. A :class:`HostKernelSlot` builds its kernel object on first use, only
where a tensor's ``asnumpy()`` aliases its storage (``host_views``: CPU), keeps it for the
process, says why there is none, and forgets it for tests that switch
``MFC_NATIVE_KERNELS``.
"""
from __future__ import annotations

from typing import Callable, Generic, List, Optional, TypeVar

from ..core import native
from .host_views import numpy_view_aliases_storage

__all__ = ["HostKernelSlot"]

K = TypeVar("K")


class HostKernelSlot(Generic[K]):
    """``get()``: ``factory(lib)`` of the library built from ``source``, or None."""

    def __init__(self, source: str, factory: Callable[..., K]):
        self.source = source
        self.factory = factory
        self._kernel: List[Optional[K]] = []

    def get(self) -> Optional[K]:
        if not self._kernel:
            lib = native.load(self.source) if numpy_view_aliases_storage() else None
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
