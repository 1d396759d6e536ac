"""ZeRO-1 optimizer-state sharding over data-parallel ranks (``data_parallel_shard`` > 1 or -1).

``build_optimizer(cfg, model, shard_layout=ZeroSharding(comm, num_shards))`` builds the sharded
optimizer directly: a :class:`ZeroOptimizer` holding the plain optimizer (AdamW, SGD, Lion,
Muon), which is built with this rank's rows as its state shapes (:class:`ZeroStateShapes`, the
optimizer's ``state_shapes``) and masters (:class:`ShardedMainParams`, ``set_masters``), so it
allocates its state as this rank's rows from the start. The wrapper uses the optimizer's
public API only and never changes its class; Muon gets an exchange over ZeRO's rows
(``shard_exchange.ShardedMuonExchange`` with a ``zero_muon.ZeroRowsLevel``). Nothing
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

Fully sharded data parallel (``distributed/fsdp.py``) builds the same wrapper with two sets of
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
from ..optim.optimizer import normalize_param_groups
from .comm import Communicator
from .shard_exchange import ShardedMuonExchange
from .shard_layout import ShardLayout
from .zero_muon import ZeroRowsLevel

__all__ = ["ShardedMainParams", "ZeroOptimizer", "ZeroSharding", "ZeroStateShapes",
           "optimizer_state_bytes", "optimizer_shards"]


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



class ZeroStateShapes:
    """``optim.optimizer.StateShapes`` of a ZeRO-1 optimizer: the full shape of each parameter
    (an FSDP parameter's from ``full_shapes``) and this rank's rows of it for the state."""

    def __init__(self, layout: ShardLayout, full_shapes: Sequence[Sequence[int]]):
        self.layout = layout
        self.full_shapes = tuple(tuple(int(d) for d in s) for s in full_shapes)

    def param_shape(self, i: int) -> tuple:
        return self.full_shapes[i]

    def state_shape(self, i: int) -> tuple:
        return tuple(self.layout.shard_shape(i))


class ZeroOptimizer:
    """A ZeRO-1 sharded optimizer (see the module docstring): it holds the inner optimizer
    (AdamW, SGD, Lion or Muon, built by :meth:`ZeroSharding.build` with
    :class:`ZeroStateShapes` and :class:`ShardedMainParams`, so its state is this rank's rows
    from the start) and adds what sharding changes: :meth:`step` (this rank's rows of the
    gradients in, one all-gather of the updated rows out), the collective unsharded-format
    :meth:`state_dict` / :meth:`load_state_dict`, :meth:`shard_state_dict` and
    ``zero_shards`` (sharded checkpoints), and Muon's NS-owner report.

    The ``Optimizer`` interface the trainer and the checkpoint code use (parameters, groups,
    lrs, ``global_step``, masters, state slots) is forwarded to the inner optimizer below;
    any other public attribute of the inner optimizer (Muon's ``exchange``, ``last_qk_clip``,
    ``model``, ...) is read from it (``__getattr__``), so protocol checks such as
    ``trainer.protocols.QKClipOptimizer`` answer as for the inner optimizer.
    """

    #: ``state_dict()`` is a collective: every rank must call it (the trainer's save does)
    collective_state_dict = True

    def __init__(self, inner, zero: "ZeroSharding", layout: ShardLayout):
        self._inner = inner
        self._comm = zero.comm
        self._layout = layout
        names = [p.name for p in inner.parameters]
        self._grad_rows = [n in zero.grad_rows for n in names]
        self._param_rows = [n in zero.param_rows for n in names]

    # -- what it holds -----------------------------------------------------------------------
    @property
    def inner(self):
        """The optimizer whose state is this rank's rows (its class: AdamW, SGD, Lion, Muon)."""
        return self._inner

    @property
    def layout(self) -> ShardLayout:
        """The dim-0 rows of every parameter this rank holds (``shard_layout.ShardLayout``)."""
        return self._layout

    @property
    def optimizer_name(self) -> str:
        """``Sharded`` + the inner optimizer's name (e.g. ``ShardedMuon``)."""
        return f"Sharded{self._inner.optimizer_name}"

    def __getattr__(self, name: str):
        # only for names not found on the wrapper: the inner optimizer's public API
        if name.startswith("_") or "_inner" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"ZeroOptimizer({self._inner.optimizer_name}, shards={self._layout.num_shards})"

    # -- the Optimizer interface, forwarded ----------------------------------------------------
    @property
    def parameters(self) -> tuple:
        return self._inner.parameters

    @property
    def param_groups(self):
        return self._inner.param_groups

    @property
    def defaults(self):
        return self._inner.defaults

    def set_lr(self, base_lr: float) -> None:
        self._inner.set_lr(base_lr)

    def set_group_lrs(self, lrs: Sequence[float]) -> None:
        self._inner.set_group_lrs(lrs)

    @property
    def group_lrs(self) -> List[float]:
        return self._inner.group_lrs

    @property
    def global_step(self) -> int:
        return self._inner.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._inner.global_step = value

    @property
    def masters(self):
        return self._inner.masters

    @property
    def main_params(self) -> tuple:
        return self._inner.main_params

    def reload_main_params_from_model(self) -> None:
        self._inner.reload_main_params_from_model()

    def save_main_params_snapshot(self) -> None:
        self._inner.save_main_params_snapshot()

    def reload_unloaded_main_params(self) -> None:
        self._inner.reload_unloaded_main_params()

    @property
    def state_slots(self):
        return self._inner.state_slots

    @property
    def state_shapes(self):
        return self._inner.state_shapes

    def param_shape(self, i: int) -> tuple:
        return self._inner.param_shape(i)

    def state_shape(self, i: int) -> tuple:
        return self._inner.state_shape(i)

    def index_of(self, name: str) -> int:
        return self._inner.index_of(name)

    def check_grads(self, grads: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
        return self._inner.check_grads(grads)

    def optimizer_state_bytes(self) -> int:
        """Persistent optimizer memory of this rank: state tensors + distinct fp32 masters."""
        return optimizer_state_bytes(self._inner)

    # -- step ------------------------------------------------------------------------------------
    def step(self, grads: Sequence[Optional[Tensor]]) -> None:
        """Full reduced gradients in; this rank's rows updated; all parameters all-gathered."""
        inner, layout = self._inner, self._layout
        grads = inner.check_grads(grads)
        masters = inner.masters
        masters.end_step()   # fp32 rows are taken afresh from the current parameters
        local = []
        for i, g in enumerate(grads):
            if g is None or not layout.is_sharded(i) or self._grad_rows[i]:
                local.append(g)
            else:
                start, stop = layout.rows(i)
                local.append(g[start:stop])
        try:
            inner.step(local)
            self._allgather_params()
        finally:
            masters.end_step()

    def _allgather_params(self) -> None:
        """One all-gather of every rank's updated fp32 rows; every parameter rebuilt."""
        layout, params, masters = self._layout, self._inner.parameters, self._inner.masters
        idx = [i for i in range(len(params))
               if layout.is_sharded(i) and not self._param_rows[i]]
        if not idx:
            return
        items = [(i, masters.master(i).asnumpy()) for i in idx]
        fulls = layout.unpack_gathered(self._comm.all_gather(layout.pack(items)), idx)
        for i, arr in zip(idx, fulls):
            p = params[i]
            t = Tensor(arr)
            p.set_data(t if p.dtype == ms.float32 else t.astype(p.dtype))

    # -- checkpoints -----------------------------------------------------------------------------
    def _state_entries(self):
        """``(key, param index, fp32 array)`` of every master and state slot, this rank's rows
        for the sharded ones."""
        inner = self._inner
        masters = inner.masters
        for i, p in enumerate(inner.parameters):
            if masters.has_distinct_master(i):
                yield f"main_param.{p.name}", i, _fp32_numpy(masters.master(i)).copy()
        for prefix, slots in inner.state_slots.items():
            for i, (p, t) in enumerate(zip(inner.parameters, slots)):
                if t is not None:
                    yield f"{prefix}.{p.name}", i, _fp32_numpy(t).copy()

    def state_dict(self) -> Dict[str, Any]:
        """The unsharded format of the plain optimizer (collective: one all-gather)."""
        layout = self._layout
        sd: Dict[str, Any] = {"global_step": int(self._inner.global_step)}
        keys, items = [], []
        for key, i, arr in self._state_entries():
            if layout.is_sharded(i):
                keys.append(key)
                items.append((i, arr))
            else:
                sd[key] = arr
        if items:   # the same on every rank: the layout depends only on the shapes
            gathered = self._comm.all_gather(layout.pack(items))
            for key, arr in zip(keys, layout.unpack_gathered(gathered, [i for i, _ in items])):
                sd[key] = arr
        self._inner.masters.end_step()
        return sd

    def shard_state_dict(self):
        """``(state dict, rows)`` of this rank without communication (sharded checkpoints):
        the sharded entries hold this rank's rows, ``rows[key] = (start, stop, d0)``; the
        replicated ones are whole, as in :meth:`state_dict`."""
        layout, params = self._layout, self._inner.parameters
        sd: Dict[str, Any] = {"global_step": int(self._inner.global_step)}
        rows = {}
        for key, i, arr in self._state_entries():
            sd[key] = arr
            # an FSDP parameter's rows are its own layout (its ShardSpec), not rows of it
            if layout.is_sharded(i) and not self._param_rows[i]:
                rows[key] = layout.rows(i) + (int(params[i].shape[0]),)
        self._inner.masters.end_step()
        return sd, rows

    @property
    def zero_shards(self):
        """``(num_shards, shard_index, replica, replicas)`` of this rank's optimizer state
        (``replicas``: the ranks of the ZeRO group holding each row block)."""
        layout = self._layout
        return (layout.num_shards, layout.shard_index, layout.rank // layout.num_shards,
                max(1, self._comm.world_size // layout.num_shards))

    @property
    def zero_level(self) -> ZeroRowsLevel:
        """ZeRO's rows as a ``shard_exchange`` level (Muon's exchange; a tensor-parallel
        sharding puts its own level in front of it)."""
        return ZeroRowsLevel(self._layout, self._comm)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Take this rank's rows of a full (unsharded-format) state dict."""
        if "global_step" not in sd:
            raise KeyError("optimizer state_dict has no 'global_step'")
        inner, layout = self._inner, self._layout
        params, masters = inner.parameters, inner.masters

        def rows_of(key, i):
            arr = np.asarray(sd[key], dtype=np.float32)
            if self._param_rows[i] and tuple(arr.shape) == tuple(params[i].shape):
                return arr   # an FSDP parameter's state already cut to its rows (a resharded
                #              sharded checkpoint, trainer/sharded_save.reshard_for_model)
            if tuple(arr.shape) != tuple(inner.param_shape(i)):
                raise ValueError(f"state_dict entry '{key}' has shape {tuple(arr.shape)}, "
                                 f"expected {tuple(inner.param_shape(i))}")
            start, stop = layout.rows(i)
            return arr[start:stop] if layout.is_sharded(i) else arr

        for i, p in enumerate(params):
            if not masters.has_distinct_master(i):
                continue
            key = f"main_param.{p.name}"
            if key in sd:
                masters.master(i).set_data(Tensor(rows_of(key, i).copy()))
            else:
                masters.reload_from_model([i])
        slots_now = inner.state_slots
        prefixes = list(slots_now) + [q for q in inner.state_prefixes() if q not in slots_now]
        for prefix in prefixes:
            for i, p in enumerate(params):
                key = f"{prefix}.{p.name}"
                if key not in sd:
                    continue
                slots = inner.state_slots.get(prefix)
                dtype = slots[i].dtype if slots and slots[i] is not None \
                    else inner.slot_dtype(prefix)
                target = inner.get_state(prefix, i, dtype)
                target.set_data(Tensor(rows_of(key, i).copy()).astype(dtype))
        inner.global_step = int(sd["global_step"])
        masters.end_step()

    # -- Muon: who orthogonalises what (allgather_deredundency) --------------------------------
    @property
    def ns_owner(self) -> Dict[int, int]:
        """Parameter index -> the rank that orthogonalises it (a Muon inner optimizer)."""
        return dict(self._muon_exchange().owner)

    @property
    def ns_owner_by_name(self) -> Dict[str, int]:
        return self._muon_exchange().owner_by_name

    @property
    def ns_flops_total(self) -> float:
        """NS FLOPs this rank ran since construction (a Muon inner optimizer)."""
        return self._muon_exchange().ns_flops_total

    def _muon_exchange(self):
        exchange = getattr(self._inner, "exchange", None)
        if exchange is None:      # AttributeError: absent, as on the inner optimizer
            raise AttributeError(f"{self.optimizer_name} has no Muon exchange")
        return exchange


def optimizer_state_bytes(opt) -> int:
    """Persistent optimizer memory of this rank (any Optimizer, sharded or not): every state
    tensor plus the fp32 masters that are not the parameters themselves."""
    total = 0
    for slots in opt.state_slots.values():
        total += sum(int(t.nbytes) for t in slots if t is not None)
    return total + int(opt.masters.persistent_bytes())


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
        """``cls(groups, **kwargs)``, held by a :class:`ZeroOptimizer` when there is more than
        one shard (its state this rank's rows from the start; Muon's exchange over them)."""
        from ..optim.muon import Muon
        kwargs = dict(kwargs)
        is_muon = issubclass(cls, Muon)
        if is_muon and self.comm.world_size > 1:
            kwargs.setdefault("max_logits_reducer", self.comm.all_reduce_max)
        if self.num_shards == 1:
            return cls(groups, **kwargs)
        params = [p for g in normalize_param_groups(groups) for p in g["params"]]
        full = [self.full_shape(p) for p in params]
        layout = ShardLayout(full, self.num_shards, self.comm.rank, self.comm.world_size,
                             [p.name in self.keep_whole for p in params])
        inner = cls(groups, state_shapes=ZeroStateShapes(layout, full), **kwargs)
        inner.set_masters(ShardedMainParams(inner.parameters, layout, inner.masters,
                                            [p.name in self.param_rows for p in params]))
        opt = ZeroOptimizer(inner, self, layout)
        if is_muon:   # the update matrices over this rank's rows (owners for deredundency)
            inner.use_exchange(ShardedMuonExchange.for_optimizer(inner, [opt.zero_level]))
        return opt


def optimizer_shards(cfg, comm: Communicator) -> int:
    """Optimizer-state shards of a run over its data parallelism
    (``ParallelismConfig.optimizer_shards``)."""
    return cfg.parallelism.optimizer_shards(cfg.data_parallel(comm.world_size))
