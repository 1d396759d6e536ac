"""fp32 master weights ("main params") for low-precision model parameters.

Upstream (MindFormers ``main_params.py``, Megatron's mixed-precision optimizer): every bf16/fp16
parameter gets an fp32 copy ``Parameter(param.float(), name="main_param.{name}")``; the optimizer
reads and writes only the master, then casts it back into the model parameter after each step.
fp32 parameters are their own master (the same object, no copy).

``store_param_remainders`` (seed 002, TransformerEngine FusedAdam): for a bf16 parameter the
fp32 master is not stored; instead the 16 low bits of its fp32 bit pattern are kept as an int16
"remainder" next to the bf16 parameter, which holds the 16 high bits rounded half-up on bit 15:

    bits(master)  = u32
    bf16 bits     = (u32 + 0x8000) >> 16          (round half up in magnitude)
    remainder     = int16(u32 & 0xFFFF)           (two's complement)
    u32           = (bf16 bits << 16) + remainder (exact reconstruction, integer arithmetic)

When bit 15 of u32 is set the high half was rounded up and the remainder is negative, so the sum
restores the exact master. Masters then cost 2 bytes per parameter instead of 4.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

__all__ = ["MainParams", "is_low_precision", "split_fp32_to_bf16_and_remainder",
           "merge_bf16_and_remainder"]

LOW_PRECISION = (ms.bfloat16, ms.float16)


def is_low_precision(param) -> bool:
    """True for bf16/fp16 tensors (those that get an fp32 master)."""
    return param.dtype in LOW_PRECISION


def split_fp32_to_bf16_and_remainder(master: np.ndarray):
    """fp32 array -> (fp32 array holding exactly the bf16 value, int16 remainder)."""
    u32 = np.ascontiguousarray(master, dtype=np.float32).view(np.uint32)
    high = ((u32.astype(np.uint64) + 0x8000) >> 16).astype(np.uint32)  # may carry into exponent
    remainder = (u32 & 0xFFFF).astype(np.uint16).view(np.int16)
    bf16_as_fp32 = (high << 16).view(np.float32)
    return bf16_as_fp32, remainder


def merge_bf16_and_remainder(bf16_as_fp32: np.ndarray, remainder: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_fp32_to_bf16_and_remainder` (bit-exact)."""
    high = np.ascontiguousarray(bf16_as_fp32, dtype=np.float32).view(np.uint32).astype(np.int64)
    u32 = (high + remainder.astype(np.int64)).astype(np.uint32)
    return u32.view(np.float32)


class MainParams:
    """The fp32 masters of a sequence of model parameters.

    ``masters[i]`` is the fp32 Parameter the optimizer updates for ``params[i]``:
    the parameter itself when it is fp32, else ``main_param.{name}``. With
    ``store_param_remainders`` bf16 parameters keep an int16 remainder instead and
    :meth:`master` rebuilds an fp32 Parameter on demand (:meth:`store` splits it back).
    """

    def __init__(self, params: Sequence[Parameter], store_param_remainders: bool = False):
        self.params = tuple(params)
        self.store_param_remainders = bool(store_param_remainders)
        self._masters: List[Optional[Parameter]] = []
        self._remainders: List[Optional[np.ndarray]] = []
        self._snapshot: Optional[List[Optional[float]]] = None
        for p in self.params:
            if not is_low_precision(p):
                self._masters.append(p)
                self._remainders.append(None)
            elif self.store_param_remainders and p.dtype == ms.bfloat16:
                # A bf16 value is exactly the high half of its fp32 cast: remainder 0.
                self._masters.append(None)
                self._remainders.append(np.zeros(p.shape, np.int16))
            else:
                self._masters.append(Parameter(p.astype(ms.float32), name=f"main_param.{p.name}",
                                               requires_grad=False))
                self._remainders.append(None)

    # ------------------------------------------------------------------------------------------
    def has_distinct_master(self, i: int) -> bool:
        """True when params[i] has a master other than itself (stored or as remainder)."""
        return self._masters[i] is not self.params[i]

    def uses_remainder(self, i: int) -> bool:
        return self._remainders[i] is not None

    def master(self, i: int) -> Parameter:
        """The fp32 master of params[i] (rebuilt from bf16 + remainder in remainder mode)."""
        if self._remainders[i] is None:
            return self._masters[i]
        high = self.params[i].astype(ms.float32).asnumpy()
        full = merge_bf16_and_remainder(high, self._remainders[i])
        return Parameter(Tensor(full), name=f"main_param.{self.params[i].name}",
                         requires_grad=False)

    def store(self, i: int, master: Parameter) -> None:
        """Write an updated master back into the model parameter (cast to its dtype).

        Remainder mode splits the fp32 value into the bf16 parameter and the remainder.
        fp32 parameters are their own master: nothing to do.
        """
        param = self.params[i]
        if self._remainders[i] is not None:
            high, rem = split_fp32_to_bf16_and_remainder(master.asnumpy())
            self._remainders[i] = rem
            param.set_data(Tensor(high).astype(param.dtype))  # exact: high has 16 zero low bits
        elif master is not param:
            param.set_data(master.astype(param.dtype))

    def store_many(self, indices: Sequence[int], masters: Sequence[Parameter]) -> None:
        """:meth:`store` for several parameters with one host sync.

        Where ``asnumpy()`` aliases the Parameters' CPU buffers, the fp32 -> bf16/fp16 cast is a
        numpy ``copyto`` into the model parameter's own buffer (MindSpore's numpy bfloat16 type,
        round-to-nearest-even: bit-identical to MindSpore's Cast and ~2x faster on CPU).
        """
        # local import: optimizer imports this module
        from .optimizer import _numpy_view_aliases_storage, aliased_view
        cast = [(i, m) for i, m in zip(indices, masters)
                if self._remainders[i] is None and m is not self.params[i]]
        for i, m in zip(indices, masters):
            if self._remainders[i] is not None:
                self.store(i, m)
        if not cast:
            return
        fast = _numpy_view_aliases_storage(low_precision=True)
        sources = [m.asnumpy() for _, m in cast] if fast else []  # first call waits on kernels
        for k, (i, m) in enumerate(cast):
            target = aliased_view(self.params[i]) if fast else None
            if target is not None:
                np.copyto(target, sources[k], casting="unsafe")
            else:
                self.params[i].set_data(m.astype(self.params[i].dtype))

    def tensors(self) -> tuple:
        """fp32 masters aligned with params (remainder masters rebuilt)."""
        return tuple(self.master(i) for i in range(len(self.params)))

    # -- checkpoint helpers -------------------------------------------------------------------
    def state_items(self):
        """(key, numpy array) for each state the masters own (for state_dict)."""
        for i, p in enumerate(self.params):
            if self._remainders[i] is not None:
                yield f"param_remainder.{p.name}", self._remainders[i].copy()
            elif self._masters[i] is not p:
                yield f"main_param.{p.name}", self._masters[i].asnumpy().copy()

    def load_state_items(self, sd: dict) -> None:
        """Restore masters from ``sd``; a low-precision param missing there is reloaded
        from the model (its master becomes the fp32 cast of the model value)."""
        for i, p in enumerate(self.params):
            if self._remainders[i] is not None:
                key = f"param_remainder.{p.name}"
                if key in sd:
                    rem = np.asarray(sd[key])
                    _check_shape(key, rem.shape, p.shape)
                    self._remainders[i] = rem.astype(np.int16).copy()
                else:
                    self._remainders[i] = np.zeros(p.shape, np.int16)
            elif self._masters[i] is not p:
                key = f"main_param.{p.name}"
                if key in sd:
                    arr = np.asarray(sd[key], dtype=np.float32)
                    _check_shape(key, arr.shape, p.shape)
                    self._masters[i].set_data(Tensor(arr.copy()))
                else:
                    self._masters[i].set_data(p.astype(ms.float32))

    def reload_from_model(self, indices: Optional[Sequence[int]] = None) -> None:
        """master <- fp32(model param) for low-precision params (all, or ``indices``)."""
        for i in (range(len(self.params)) if indices is None else indices):
            if self._remainders[i] is not None:
                self._remainders[i] = np.zeros(self.params[i].shape, np.int16)
            elif self._masters[i] is not self.params[i]:
                self._masters[i].set_data(self.params[i].astype(ms.float32))

    def save_snapshot(self) -> None:
        """Upstream ``save_main_params_snapshot``: remember float(sum(master)) of each
        low-precision param before a checkpoint load."""
        self._snapshot = [float(self.master(i).asnumpy().astype(np.float64).sum())
                          if self.has_distinct_master(i) else None
                          for i in range(len(self.params))]

    def reload_unloaded_from_model(self) -> None:
        """Upstream ``reload_main_params_from_model``: after a load, re-copy model -> master
        only where the checksum did not change (the checkpoint held no master for it);
        without a snapshot reload every low-precision master."""
        if self._snapshot is None:
            self.reload_from_model()
            return
        stale = [i for i, before in enumerate(self._snapshot) if before is not None and
                 abs(float(self.master(i).asnumpy().astype(np.float64).sum()) - before) < 1e-6]
        self.reload_from_model(stale)
        self._snapshot = None


def _check_shape(key, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"state_dict entry '{key}' has shape {tuple(got)}, "
                         f"expected {tuple(want)}")
