"""fp32 master weights ("main params") for low-precision model parameters.

Upstream (MindFormers ``main_params.py``, Megatron's mixed-precision optimizer): every bf16/fp16
parameter gets an fp32 copy ``Parameter(param.float(), name="main_param.{name}")``; the optimizer
reads and writes only the master, then casts it back into the model parameter after each step.
fp32 parameters are their own master (the same object, no copy).

``store_param_remainders`` (TransformerEngine FusedAdam): for a bf16 parameter the
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

import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

from .host.views import aliased_view, numpy_view_aliases_storage, scale_many_in_place

__all__ = ["MainParams", "is_low_precision", "split_fp32_to_bf16_and_remainder",
           "merge_bf16_and_remainder", "fp32_to_bf16_bits", "scale_and_cast_blocked"]

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


# Elements per block of the blocked epilogue: 256K fp32 = 1 MiB, so a block of the master
# and its uint32 scratch stay in cache between the multiply and the cast passes. Measured at
# 10M bf16 params on the 2-core CPU (decay + cast, ns/param): 64K blocks 1.47 with one
# thread, 1.43 with two (short ufunc calls serialise on the GIL); 256K blocks with two
# threads 0.93; 1M blocks 1.00.
BLOCK = 1 << 18
_POOL: Optional[tuple] = None   # (pid, ThreadPoolExecutor), made on first use


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def fp32_to_bf16_bits(src: np.ndarray, dst_u16: np.ndarray, tmp_u32: np.ndarray) -> None:
    """bf16 bits of fp32 ``src`` (round to nearest, ties to even) into ``dst_u16``.

    With u = bits(src): bf16 = (u + 0x7FFF + ((u >> 16) & 1)) >> 16, five vectorised integer
    passes over a cache-resident block (~2x faster than numpy's element-wise bfloat16 cast,
    which also holds the GIL). This is exact RNE for every finite value and infinity
    (overflow rounds to inf as in a float cast); NaN payloads could carry into the sign or
    exponent, so a block holding a NaN takes the dtype cast instead (bit-identical to
    MindSpore's Cast). ``tmp_u32`` is scratch of at least ``src.size`` elements.
    """
    if np.isnan(np.minimum.reduce(src)):  # min propagates NaN; one pass, no bool array
        with np.errstate(invalid="ignore"):  # NaN -> bf16 NaN is the intended result
            np.copyto(dst_u16.view(_bf16_dtype()), src, casting="unsafe")
        return
    u = src.view(np.uint32)
    t = tmp_u32[:u.size]
    np.right_shift(u, np.uint32(16), out=t)
    np.bitwise_and(t, np.uint32(1), out=t)
    t += np.uint32(0x7FFF)
    t += u
    t >>= np.uint32(16)
    np.copyto(dst_u16, t, casting="unsafe")


_BF16 = []
_ONE: List[Tensor] = []


def wait_for_kernels() -> None:
    """Block until the kernels queued so far have run, through a one-element op.

    PyNative runs ops and graphs in launch order, so the result of a new tiny op is ready
    only after them. Measured on CPU at 10M params: waiting this way right after the group
    graph costs ~0.2 ms over the kernels, whereas the first ``Parameter.asnumpy()`` of a
    Parameter the graph writes waits ~20 ms longer. Correctness does not depend on it: the
    ``asnumpy()`` that follows still waits for anything pending.
    """
    if not _ONE:
        _ONE.append(Tensor(np.ones(1, np.float32)))
    (_ONE[0] + 0).asnumpy()


def _bf16_dtype():
    if not _BF16:
        _BF16.append(Tensor(np.zeros(1, np.float32)).astype(ms.bfloat16).asnumpy().dtype)
    return _BF16[0]


def scale_and_cast_blocked(pairs, factor: float) -> None:
    """For each (fp32 master array, bf16/fp16 target array or None): master *= factor in
    place, then target <- cast(master), round to nearest even (bit-identical to MindSpore's
    Cast). Contiguous arrays go block by block (:data:`BLOCK` elements), so the cast reads
    the block the multiply just wrote from cache; bf16 uses :func:`fp32_to_bf16_bits`, fp16
    numpy's cast. Above two blocks in all, the blocks are split over a few threads (numpy
    releases the GIL inside these ufuncs; the MindSpore kernels are idle meanwhile).
    """
    f32 = np.float32(factor)
    bf16 = _bf16_dtype()
    work = []   # (master block, target block or None, blocked?)
    for master, target in pairs:
        if factor == 1.0 and target is None:
            continue
        if not master.flags.c_contiguous or (target is not None
                                             and not target.flags.c_contiguous):
            work.append((master, target, False))  # strided: whole-array ufuncs
            continue
        m = master.reshape(-1)
        t = None if target is None else target.reshape(-1)
        for a in range(0, m.size, BLOCK):
            work.append((m[a:a + BLOCK], None if t is None else t[a:a + BLOCK], True))
    if not work:
        return

    def run(jobs):
        tmp = np.empty(BLOCK, np.uint32)
        for m, t, blocked in jobs:
            if factor != 1.0:
                np.multiply(m, f32, out=m)
            if t is None:
                continue
            if blocked and t.dtype == bf16:
                fp32_to_bf16_bits(m, t.view(np.uint16), tmp)
            else:
                np.copyto(t, m, casting="unsafe")

    total = sum(job[0].size for job in work)
    n = min(_workers(), total // BLOCK, len(work))
    if n <= 1:
        run(work)
        return
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():  # a forked child has no pool threads
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=_workers(),
                                                 thread_name_prefix="adam-epilogue"))
    parts, acc, cut = [[]], 0, total / n   # contiguous runs of about total/n elements
    for job in work:
        if acc >= cut * len(parts) and len(parts) < n:
            parts.append([])
        parts[-1].append(job)
        acc += job[0].size
    list(_POOL[1].map(run, parts))


class MasterSnapshot:
    """Checkpoint-load bookkeeping shared by :class:`MainParams` and its sharded form
    (``distributed.zero.ShardedMainParams``): needs ``params``, ``master(i)``,
    ``has_distinct_master(i)`` and ``reload_from_model(indices)``."""

    _snapshot: Optional[List[Optional[float]]] = None

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


class MainParams(MasterSnapshot):
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

    def persistent_bytes(self) -> int:
        """Bytes kept between steps besides the parameters: fp32 masters and remainders."""
        total = 0
        for i in range(len(self.params)):
            if self.uses_remainder(i):
                total += int(self._remainders[i].nbytes)
            elif self.has_distinct_master(i):
                total += int(self.master(i).nbytes)
        return total

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

        Where ``asnumpy()`` aliases the Parameters' CPU buffers, the fp32 -> bf16/fp16 cast is
        written straight into the model parameter's own buffer by
        :func:`scale_and_cast_blocked` (round to nearest even: bit-identical to MindSpore's
        Cast, tested, and ~7x faster than it on CPU).
        """
        # local import: optimizer imports this module
        cast = [(i, m) for i, m in zip(indices, masters)
                if self._remainders[i] is None and m is not self.params[i]]
        for i, m in zip(indices, masters):
            if self._remainders[i] is not None:
                self.store(i, m)
        if not cast:
            return
        fast = numpy_view_aliases_storage(low_precision=True)
        if fast:
            wait_for_kernels()
        pairs = []
        for i, m in cast:
            source = aliased_view(m) if fast else None
            target = aliased_view(self.params[i]) if source is not None else None
            if target is not None:
                pairs.append((source, target))
            else:
                self.params[i].set_data(m.astype(self.params[i].dtype))
        scale_and_cast_blocked(pairs, 1.0)

    def scale_and_store_many(self, indices: Sequence[int], masters: Sequence[Parameter],
                             factor: float) -> None:
        """masters *= factor, then :meth:`store_many`, with one host sync.

        Where ``asnumpy()`` aliases the CPU buffers, the multiply and the fp32 -> bf16/fp16
        write-back run in one cache-blocked pass (:func:`scale_and_cast_blocked`): the master
        is read from memory once instead of twice. Elsewhere (device memory, remainders) the
        MindSpore-op path: ``host_views.scale_many_in_place`` then :meth:`store_many`.
        """
        if factor == 1.0 and all(m is self.params[i] for i, m in zip(indices, masters)):
            return  # nothing to write: no host sync, the kernels stay asynchronous
        fast = (numpy_view_aliases_storage() and numpy_view_aliases_storage(low_precision=True)
                and not any(self._remainders[i] is not None for i in indices))
        pairs = []
        if fast:
            wait_for_kernels()
            for i, m in zip(indices, masters):
                src = aliased_view(m)
                dst = None if m is self.params[i] else aliased_view(self.params[i])
                if src is None or (dst is None and m is not self.params[i]):
                    fast = False
                    break
                pairs.append((src, dst))
        if not fast:
            scale_many_in_place(masters, factor)
            self.store_many(indices, masters)
            return
        scale_and_cast_blocked(pairs, factor)

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



def _check_shape(key, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"state_dict entry '{key}' has shape {tuple(got)}, "
                         f"expected {tuple(want)}")
