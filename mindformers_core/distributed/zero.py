"""ZeRO-1 optimizer-state sharding over data-parallel ranks (``data_parallel_shard`` > 1 or -1).

``build_optimizer(cfg, model, shard_layout=ZeroSharding(comm, num_shards))`` builds the sharded
optimizer directly: ``Sharded{cls}`` (:class:`ZeroMixin`, and ``zero_muon.ZeroMuonMixin`` for
Muon, in front of the optimizer class) allocates its state as this rank's rows from the start
and works through the optimizer's public state-slot API (AdamW, SGD, Lion, Muon). Nothing
converts an optimizer after it is built. Per rank, with ``S`` shards
(``shard_layout``: dim-0 rows, parameters with fewer rows than shards replicated):

* moments and other per-parameter state (``adam_m``, ``adam_v``, ``muon_m``, ``lion_m``) hold
  only this rank's rows;
* fp32 masters of bf16/fp16 parameters hold only this rank's rows; fp32 parameters are their
  own master, so their master shard is a temporary copy of this rank's rows during the step
  (the full parameter is up to date on every rank after each step);
* ``step(grads)`` takes the full, already reduced gradients (the trainer's DP all-reduce),
  updates this rank's rows with the unchanged optimizer math (element-wise updates act on
  rows exactly as on the whole tensor), then one all-gather of every rank's updated fp32 rows
  (one flat buffer) rebuilds every parameter on every rank, cast to its dtype.

The update is therefore the single-process update of the same global batch. Persistent
optimizer memory per rank (masters + state) is about ``1/S`` of the unsharded optimizer's.

Fully sharded data parallel (``distributed/fsdp.py``) builds the same classes with two sets of
parameter names: ``grad_rows`` (their gradients arrive already reduce-scattered: this rank's
rows, not sliced again) and ``param_rows`` (the Parameter itself holds only this rank's rows:
its master is kept like a replicated parameter's, its update is written into it, and it is
not all-gathered after the step). ``full_shapes`` gives such a parameter's full shape, which
the layout, the state_dict format and Muon's split rules use (``param_shape``).

``state_dict()`` is collective (every rank must call it; one all-gather) and returns the same
full, unsharded format as the plain optimizer, so checkpoints do not depend on the shard
count; ``load_state_dict`` takes that format and keeps this rank's rows (an FSDP parameter's
state may also come as this rank's rows already).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

from ..optim.host.views import scale_many_in_place
from ..optim.main_params import MainParams, MasterSnapshot, is_low_precision
from .comm import Communicator
from .shard_layout import ShardLayout

__all__ = ["ShardedMainParams", "ZeroMixin", "ZeroSharding", "optimizer_state_bytes",
           "sharded_class", "optimizer_shards"]


def _fp32_numpy(t) -> np.ndarray:
    return (t if t.dtype == ms.float32 else t.astype(ms.float32)).asnumpy()


def _new_param(arr: np.ndarray, name: str, dtype=ms.float32) -> Parameter:
    t = Tensor(np.ascontiguousarray(arr, np.float32).copy())
    return Parameter(t if dtype == ms.float32 else t.astype(dtype), name=name, requires_grad=False)


class ShardedMainParams(MasterSnapshot):
    """``MainParams`` with this rank's rows only (same interface, see the module docstring)."""

    store_param_remainders = False

    def __init__(self, params: Sequence[Parameter], layout: ShardLayout, source: MainParams,
                 param_rows: Sequence[bool] = ()):
        if source.store_param_remainders:
            raise ValueError("store_param_remainders cannot be combined with optimizer-state "
                             "sharding (parallelism.data_parallel_shard != 1)")
        self.params = tuple(params)
        self.layout = layout
        # True: the parameter holds only this rank's rows (FSDP), kept like a replicated one
        self.param_rows = tuple(param_rows) or (False,) * len(self.params)
        self._persistent: List[Optional[Parameter]] = []
        self._live: Dict[int, Parameter] = {}
        self._snapshot: Optional[List[Optional[float]]] = None
        for i, p in enumerate(self.params):
            if not self._full_param_rows(i):
                self._persistent.append(source.master(i))       # the param or its master
            elif is_low_precision(p):
                start, stop = layout.rows(i)
                full = _fp32_numpy(source.master(i))
                self._persistent.append(_new_param(full[start:stop], f"main_param.{p.name}"))
            else:
                self._persistent.append(None)                    # rows taken at step time

    def _full_param_rows(self, i: int) -> bool:
        """The parameter is full and this rank keeps only rows of it (ZeRO-1)."""
        return self.layout.is_sharded(i) and not self.param_rows[i]

    def master(self, i: int) -> Parameter:
        m = self._persistent[i]
        if m is not None:
            return m
        if i not in self._live:
            start, stop = self.layout.rows(i)
            p = self.params[i]
            self._live[i] = _new_param(_fp32_numpy(p)[start:stop], f"main_param.{p.name}")
        return self._live[i]

    def store(self, i: int, master: Parameter) -> None:
        """Replicated: cast into the parameter (as ``MainParams``). Sharded: the post-step
        all-gather writes the parameter from every rank's rows."""
        if not self._full_param_rows(i) and master is not self.params[i]:
            self.params[i].set_data(master.astype(self.params[i].dtype))

    def store_many(self, indices: Sequence[int], masters: Sequence[Parameter]) -> None:
        """:meth:`store` for several parameters."""
        for i, m in zip(indices, masters):
            self.store(i, m)

    def scale_and_store_many(self, indices: Sequence[int], masters: Sequence[Parameter],
                             factor: float) -> None:
        """masters *= factor, then :meth:`store_many` (``MainParams`` interface)."""
        scale_many_in_place(masters, factor)
        self.store_many(indices, masters)

    def end_step(self) -> None:
        self._live.clear()

    def has_distinct_master(self, i: int) -> bool:
        return self._persistent[i] is not self.params[i] and is_low_precision(self.params[i])

    def uses_remainder(self, i: int) -> bool:  # noqa: ARG002 - MainParams interface
        return False

    def tensors(self) -> tuple:
        """fp32 masters aligned with params: this rank's rows for sharded parameters."""
        return tuple(self.master(i) for i in range(len(self.params)))

    def persistent_bytes(self) -> int:
        """Bytes of masters kept between steps besides the parameters themselves."""
        return int(sum(m.nbytes for m, p in zip(self._persistent, self.params)
                       if m is not None and m is not p))

    def reload_from_model(self, indices: Optional[Sequence[int]] = None) -> None:
        for i in (range(len(self.params)) if indices is None else indices):
            m = self._persistent[i]
            if m is None or m is self.params[i]:
                continue
            full = _fp32_numpy(self.params[i])
            if self._full_param_rows(i):
                start, stop = self.layout.rows(i)
                full = full[start:stop]
            m.set_data(Tensor(full.copy()))



class ZeroMixin:
    """Sharded-state behaviour in front of an ``Optimizer`` subclass (see module docstring).

    Built by ``ZeroSharding.build`` only: the state is allocated as this rank's rows from the
    start. It uses the optimizer's
    public state-slot API only (``masters``/``set_masters``, ``state_slots``/``set_state``/
    ``get_state``, ``state_shape``, ``slot_dtype``); its own attributes are ``_zero_comm``
    (Communicator) and ``_zero_layout`` (ShardLayout).
    """

    #: ``state_dict()`` is a collective: every rank must call it (the trainer's save does)
    collective_state_dict = True

    def __init__(self, *args, zero: "ZeroSharding", **kwargs):
        self._zero_comm = zero.comm
        self._zero_shards = zero.num_shards
        self._zero_sharding = zero
        self._zero_whole = zero.keep_whole
        super().__init__(*args, **kwargs)
        names = [p.name for p in self.parameters]
        self._zero_grad_rows = [n in zero.grad_rows for n in names]
        self._zero_param_rows = [n in zero.param_rows for n in names]
        self.set_masters(ShardedMainParams(self.parameters, self._layout(), self.masters,
                                           self._zero_param_rows))
        self._zero_setup()

    def _layout(self) -> ShardLayout:
        """The layout of this optimizer's parameters (made on first use: the base class asks
        for state shapes while it builds its state)."""
        layout = self.__dict__.get("_zero_layout")
        if layout is None:
            comm = self._zero_comm
            layout = ShardLayout([self.param_shape(i) for i in range(len(self.parameters))],
                                 self._zero_shards, comm.rank, comm.world_size,
                                 [p.name in self._zero_whole for p in self.parameters])
            self._zero_layout = layout
        return layout

    def _zero_setup(self) -> None:
        """Hook run once the sharded state is in place (``zero_muon``: the NS owners)."""

    # -- state -----------------------------------------------------------------------------------
    def param_shape(self, i: int) -> tuple:
        """The full shape of parameter i (an FSDP parameter holds only its rows)."""
        return self._zero_sharding.full_shape(self.parameters[i])

    def state_shape(self, i: int) -> tuple:
        return tuple(self._layout().shard_shape(i))

    def optimizer_state_bytes(self) -> int:
        """Persistent optimizer memory of this rank: state tensors + distinct fp32 masters."""
        return optimizer_state_bytes(self)

    # -- step ------------------------------------------------------------------------------------
    def step(self, grads: Sequence[Optional[Tensor]]) -> None:
        """Full reduced gradients in; this rank's rows updated; all parameters all-gathered."""
        grads = self.check_grads(grads)
        layout = self._zero_layout
        self.masters.end_step()   # fp32 rows are taken afresh from the current parameters
        local = []
        for i, g in enumerate(grads):
            if g is None or not layout.is_sharded(i) or self._zero_grad_rows[i]:
                local.append(g)
            else:
                start, stop = layout.rows(i)
                local.append(g[start:stop])
        try:
            super().step(local)
            self._zero_allgather_params()
        finally:
            self.masters.end_step()

    def _zero_allgather_params(self) -> None:
        """One all-gather of every rank's updated fp32 rows; every parameter rebuilt."""
        layout = self._zero_layout
        idx = [i for i in range(len(self.parameters))
               if layout.is_sharded(i) and not self._zero_param_rows[i]]
        if not idx:
            return
        items = [(i, self.masters.master(i).asnumpy()) for i in idx]
        fulls = layout.unpack_gathered(self._zero_comm.all_gather(layout.pack(items)), idx)
        for i, arr in zip(idx, fulls):
            p = self.parameters[i]
            t = Tensor(arr)
            p.set_data(t if p.dtype == ms.float32 else t.astype(p.dtype))

    # -- checkpoints -----------------------------------------------------------------------------
    def _state_entries(self):
        """``(key, param index, fp32 array)`` of every master and state slot, this rank's rows
        for the sharded ones."""
        for i, p in enumerate(self.parameters):
            if self.masters.has_distinct_master(i):
                yield f"main_param.{p.name}", i, _fp32_numpy(self.masters.master(i)).copy()
        for prefix, slots in self.state_slots.items():
            for i, (p, t) in enumerate(zip(self.parameters, slots)):
                if t is not None:
                    yield f"{prefix}.{p.name}", i, _fp32_numpy(t).copy()

    def state_dict(self) -> Dict[str, Any]:
        """The unsharded format of the plain optimizer (collective: one all-gather)."""
        layout = self._zero_layout
        sd: Dict[str, Any] = {"global_step": int(self.global_step)}
        keys, items = [], []
        for key, i, arr in self._state_entries():
            if layout.is_sharded(i):
                keys.append(key)
                items.append((i, arr))
            else:
                sd[key] = arr
        if items:   # the same on every rank: the layout depends only on the shapes
            gathered = self._zero_comm.all_gather(layout.pack(items))
            for key, arr in zip(keys, layout.unpack_gathered(gathered, [i for i, _ in items])):
                sd[key] = arr
        self.masters.end_step()
        return sd

    def shard_state_dict(self):
        """``(state dict, rows)`` of this rank without communication (sharded checkpoints):
        the sharded entries hold this rank's rows, ``rows[key] = (start, stop, d0)``; the
        replicated ones are whole, as in :meth:`state_dict`."""
        layout = self._zero_layout
        sd: Dict[str, Any] = {"global_step": int(self.global_step)}
        rows = {}
        for key, i, arr in self._state_entries():
            sd[key] = arr
            # an FSDP parameter's rows are its own layout (its ShardSpec), not rows of it
            if layout.is_sharded(i) and not self._zero_param_rows[i]:
                rows[key] = layout.rows(i) + (int(self.parameters[i].shape[0]),)
        self.masters.end_step()
        return sd, rows

    @property
    def zero_shards(self):
        """``(num_shards, shard_index, replica, replicas)`` of this rank's optimizer state
        (``replicas``: the ranks of the ZeRO group holding each row block)."""
        layout = self._zero_layout
        return (layout.num_shards, layout.shard_index, layout.rank // layout.num_shards,
                max(1, self._zero_comm.world_size // layout.num_shards))

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Take this rank's rows of a full (unsharded-format) state dict."""
        if "global_step" not in sd:
            raise KeyError("optimizer state_dict has no 'global_step'")
        layout = self._zero_layout

        def rows_of(key, i):
            arr = np.asarray(sd[key], dtype=np.float32)
            if self._zero_param_rows[i] and tuple(arr.shape) == tuple(self.parameters[i].shape):
                return arr   # an FSDP parameter's state already cut to its rows (a resharded
                #              sharded checkpoint, trainer/sharded_save.reshard_for_model)
            if tuple(arr.shape) != tuple(self.param_shape(i)):
                raise ValueError(f"state_dict entry '{key}' has shape {tuple(arr.shape)}, "
                                 f"expected {tuple(self.param_shape(i))}")
            start, stop = layout.rows(i)
            return arr[start:stop] if layout.is_sharded(i) else arr

        for i, p in enumerate(self.parameters):
            if not self.masters.has_distinct_master(i):
                continue
            key = f"main_param.{p.name}"
            if key in sd:
                self.masters.master(i).set_data(Tensor(rows_of(key, i).copy()))
            else:
                self.masters.reload_from_model([i])
        slots_now = self.state_slots
        prefixes = list(slots_now) + [q for q in self.state_prefixes() if q not in slots_now]
        for prefix in prefixes:
            for i, p in enumerate(self.parameters):
                key = f"{prefix}.{p.name}"
                if key not in sd:
                    continue
                slots = self.state_slots.get(prefix)
                dtype = slots[i].dtype if slots and slots[i] is not None \
                    else self.slot_dtype(prefix)
                target = self.get_state(prefix, i, dtype)
                target.set_data(Tensor(rows_of(key, i).copy()).astype(dtype))
        self.global_step = int(sd["global_step"])
        self.masters.end_step()


def optimizer_state_bytes(opt) -> int:
    """Persistent optimizer memory of this rank (any Optimizer, sharded or not): every state
    tensor plus the fp32 masters that are not the parameters themselves."""
    total = 0
    for slots in opt.state_slots.values():
        total += sum(int(t.nbytes) for t in slots if t is not None)
    return total + int(opt.masters.persistent_bytes())


_CLASSES: Dict[type, type] = {}


def sharded_class(cls: type) -> type:
    """``Sharded{cls}``: ZeroMixin (+ ZeroMuonMixin for Muon) in front of ``cls``."""
    if issubclass(cls, ZeroMixin):
        return cls
    if cls not in _CLASSES:
        from ..optim.muon import Muon
        bases = (ZeroMixin, cls)
        if issubclass(cls, Muon):
            from .zero_muon import ZeroMuonMixin
            bases = (ZeroMuonMixin,) + bases
        _CLASSES[cls] = type(f"Sharded{cls.__name__}", bases, {})
    return _CLASSES[cls]


class ZeroSharding:
    """How ``optim.build.build_optimizer(..., shard_layout=...)`` builds an optimizer for
    data parallelism over ``comm``: its state sharded over ``num_shards`` ranks (None or -1:
    all; 1: replicated, the plain class) and Muon's QK-Clip logits MAX-reduced over ranks."""

    def __init__(self, comm: Communicator, num_shards: Optional[int] = None, *,
                 keep_whole: Iterable[str] = (), grad_rows: Iterable[str] = (),
                 param_rows: Iterable[str] = (),
                 full_shapes: Optional[Mapping[str, Sequence[int]]] = None):
        """``keep_whole``: names of parameters whose state stays whole on each rank (expert
        weights under expert parallelism: ranks hold different experts)."""
        self.keep_whole = frozenset(keep_whole)
        world = comm.world_size
        shards = world if num_shards in (None, -1) else int(num_shards)
        if shards < 1 or world % shards != 0:
            raise ValueError(f"number of optimizer-state shards ({shards}) must divide the "
                             f"world size ({world})")
        self.comm = comm
        self.num_shards = shards
        # FSDP (module docstring): parameters whose gradient / storage is this rank's rows
        self.grad_rows = frozenset(grad_rows)
        self.param_rows = frozenset(param_rows)
        self.full_shapes = {k: tuple(int(d) for d in v) for k, v in (full_shapes or {}).items()}
        if self.param_rows - self.grad_rows or (self.param_rows and shards != world):
            raise ValueError("parameters stored as row shards need row-sharded gradients and "
                             "the optimizer state sharded over all ranks")

    def full_shape(self, p: Parameter) -> tuple:
        """The full shape of ``p`` (its own unless it is stored as rows)."""
        return self.full_shapes.get(p.name, tuple(p.shape))

    def build(self, cls: type, groups, kwargs: Dict[str, Any]):
        """``cls(groups, **kwargs)``, sharded when there is more than one shard."""
        from ..optim.muon import Muon
        kwargs = dict(kwargs)
        if issubclass(cls, Muon) and self.comm.world_size > 1:
            kwargs.setdefault("max_logits_reducer", self.comm.all_reduce_max)
        if self.num_shards == 1:
            return cls(groups, **kwargs)
        return sharded_class(cls)(groups, zero=self, **kwargs)


def optimizer_shards(cfg, comm: Communicator) -> int:
    """Optimizer-state shards of a run over its data parallelism
    (``ParallelismConfig.optimizer_shards``)."""
    return cfg.parallelism.optimizer_shards(cfg.data_parallel(comm.world_size))
