"""Shared optimizer base: parameter groups, fp32 masters, per-group lr, state_dict.

Subclasses (AdamW, SGD, Lion, Muon) implement :meth:`Optimizer._update` (one parameter, fp32
master and fp32 gradient, updated in place) and may override :meth:`Optimizer._step_group`
to update a whole group at once. Everything else lives here:

* groups: a flat list of Parameters is one group; a group dict holds ``params`` and optional
  ``lr_mult``, ``max_lr``, ``min_lr``, ``weight_decay``, ``wd_mult``, ``eps``, ``betas``,
  ``name`` (other keys are kept untouched for the caller). Each group gets ``lr`` (current,
  absolute) = base lr * ``lr_mult``.
* ``parameters``: the caller's Parameters in group order; they are updated in place
  (``Parameter.set_data`` or a kernel writing into the Parameter), never rebound.
* masters (``main_params.MainParams``): fp32 copies ``main_param.{name}`` for bf16/fp16
  parameters; fp32 parameters are their own master. The step runs on masters and writes back.
* state: per-parameter tensors named ``{prefix}.{param name}`` (e.g. ``adam_m.w``), made by
  :meth:`_new_state`; ``state_dict()`` returns numpy arrays, ``load_state_dict`` restores
  them bit for bit.
* shapes (:class:`StateShapes`, the ``state_shapes`` keyword): the full (logical) shape of each
  parameter and the shape of its state tensors. The default, :class:`ParameterShapes`, is each
  parameter's own shape; a sharding passes its own at construction (``distributed.zero``:
  this rank's rows), before any state exists.
* ``embedding_min_norm`` (Megatron): after each update, rows of the input word embedding whose
  L2 norm is non-zero and below the threshold are rescaled to norm ``2 * threshold``.
"""
from __future__ import annotations

import fnmatch
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, ops

from ..core.optimizer_rules import check_embedding_min_norm
from .main_params import MainParams

__all__ = ["Optimizer", "StateShapes", "ParameterShapes", "normalize_param_groups",
           "EMBEDDING_PATTERNS", "to_fp32", "state_dtype"]

# Input-embedding parameter names (Megatron naming) targeted by embedding_min_norm.
EMBEDDING_PATTERNS = ("*word_embeddings.weight", "word_embeddings*")

_STATE_DTYPES = {"fp32": ms.float32, "bf16": ms.bfloat16, "float32": ms.float32,
                 "bfloat16": ms.bfloat16, ms.float32: ms.float32, ms.bfloat16: ms.bfloat16}


def normalize_param_groups(params_or_groups) -> List[Dict[str, Any]]:
    """A list of group dicts (shallow copies) with ``params`` as a list of Parameters.

    A flat sequence of Parameters is one group. Errors: empty input, a group without
    ``params``, a non-Parameter entry, a Parameter listed twice.
    """
    items = list(params_or_groups)
    if not items:
        raise ValueError("optimizer got an empty parameter list")
    if all(isinstance(x, dict) for x in items):
        groups = [dict(g) for g in items]
    elif any(isinstance(x, dict) for x in items):
        raise TypeError("params must be all Parameters or all group dicts, not a mix")
    else:
        groups = [{"params": items}]
    seen = set()
    for gi, group in enumerate(groups):
        if "params" not in group:
            raise ValueError(f"parameter group {gi} has no 'params' key")
        plist = group["params"]
        plist = [plist] if isinstance(plist, Parameter) else list(plist)
        for p in plist:
            if not isinstance(p, Parameter):
                raise TypeError(f"parameter group {gi}: optimizer params must be mindspore "
                                f"Parameters, got {type(p).__name__}")
            if id(p) in seen:
                raise ValueError(f"parameter '{p.name}' appears in more than one group")
            seen.add(id(p))
        group["params"] = plist
    return groups


def state_dtype(value) -> ms.dtype:
    """'fp32' | 'bf16' (or the mindspore dtype) -> mindspore dtype."""
    if value not in _STATE_DTYPES:
        raise ValueError(f"optimizer state dtype must be 'fp32' or 'bf16', got {value!r}")
    return _STATE_DTYPES[value]


class StateShapes(Protocol):
    """The shapes an optimizer gives its parameters, by index in ``Optimizer.parameters``."""

    def param_shape(self, i: int) -> tuple:
        """The full (logical) shape of parameter i."""

    def state_shape(self, i: int) -> tuple:
        """The shape of parameter i's state tensors (moments, momenta)."""


class ParameterShapes:
    """The default :class:`StateShapes`: each parameter's own shape, for both."""

    def __init__(self, params: Sequence[Parameter]):
        self.params = tuple(params)

    def param_shape(self, i: int) -> tuple:
        return tuple(self.params[i].shape)

    def state_shape(self, i: int) -> tuple:
        return tuple(self.params[i].shape)


class Optimizer:
    """Base class; see the module docstring. ``defaults`` fills missing group keys;
    ``state_shapes`` (a :class:`StateShapes`, default :class:`ParameterShapes`) gives the
    parameter and state shapes, fixed before any state is made."""

    #: name of the optimizer in error messages
    optimizer_name = "Optimizer"
    #: whether ``state_dict()`` is a collective every rank must call (a sharded state's:
    #: distributed/zero.py); the trainer's save reads it
    collective_state_dict = False

    def __init__(self, params_or_groups, defaults: Dict[str, Any], *,
                 store_param_remainders: bool = False,
                 embedding_min_norm: Optional[float] = None,
                 embedding_patterns: Sequence[str] = EMBEDDING_PATTERNS,
                 state_shapes: Optional[StateShapes] = None):
        try:
            check_embedding_min_norm(embedding_min_norm)
        except ValueError as err:
            raise ValueError(f"embedding_min_norm {err}") from None
        self.defaults = dict(defaults)
        self.param_groups = normalize_param_groups(params_or_groups)
        base_lr = float(self.defaults.get("lr", 0.0))
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            group.setdefault("lr_mult", 1.0)
            group.setdefault("wd_mult", 1.0)
            group["lr"] = base_lr * float(group["lr_mult"])
        self.parameters = tuple(p for g in self.param_groups for p in g["params"])
        self._group_indices: List[List[int]] = []
        start = 0
        for g in self.param_groups:
            self._group_indices.append(list(range(start, start + len(g["params"]))))
            start += len(g["params"])
        #: parameter and state shapes (:class:`StateShapes`)
        self.state_shapes: StateShapes = ParameterShapes(self.parameters) \
            if state_shapes is None else state_shapes
        self._masters = MainParams(self.parameters, store_param_remainders)
        self.store_param_remainders = bool(store_param_remainders)
        self.embedding_min_norm = embedding_min_norm
        self._embedding_idx = [i for i, p in enumerate(self.parameters)
                               if any(fnmatch.fnmatchcase(p.name, pat)
                                      for pat in embedding_patterns)]
        self._state: Dict[str, List[Optional[Parameter]]] = {}
        self.global_step = 0

    # -- lr ------------------------------------------------------------------------------------
    def set_lr(self, base_lr: float) -> None:
        """Every group: lr = base_lr * lr_mult."""
        for g in self.param_groups:
            g["lr"] = float(base_lr) * float(g["lr_mult"])

    def set_group_lrs(self, lrs: Sequence[float]) -> None:
        """Explicit absolute lr per group (e.g. from ``core.lr.group_lrs``)."""
        lrs = list(lrs)
        if len(lrs) != len(self.param_groups):
            raise ValueError(f"set_group_lrs got {len(lrs)} values for "
                             f"{len(self.param_groups)} parameter groups")
        for g, lr in zip(self.param_groups, lrs):
            g["lr"] = float(lr)

    @property
    def group_lrs(self) -> List[float]:
        return [g["lr"] for g in self.param_groups]

    # -- masters -------------------------------------------------------------------------------
    @property
    def main_params(self) -> tuple:
        """fp32 masters aligned with ``parameters`` (fp32 params are their own)."""
        return self._masters.tensors()

    def reload_main_params_from_model(self) -> None:
        """master <- fp32(model param) for every low-precision parameter."""
        self._masters.reload_from_model()

    def save_main_params_snapshot(self) -> None:
        self._masters.save_snapshot()

    def reload_unloaded_main_params(self) -> None:
        self._masters.reload_unloaded_from_model()

    # -- state ---------------------------------------------------------------------------------
    # -- state slots: the public API wrappers (``distributed.zero``) use ---------------------
    @property
    def masters(self):
        """The fp32 master store (``main_params.MainParams`` or a sharded one): ``master(i)``,
        ``store(i, master)``, ``tensors()``, ..."""
        return self._masters

    def set_masters(self, store) -> None:
        """Replace the master store (a sharded store of the same parameters)."""
        self._masters = store

    @property
    def state_slots(self) -> Mapping[str, List[Optional[Parameter]]]:
        """``{prefix: [tensor or None per parameter]}``, read-only; :meth:`set_state`
        replaces one tensor."""
        return MappingProxyType(self._state)

    def set_state(self, prefix: str, i: int, tensor: Optional[Parameter]) -> None:
        """Put ``tensor`` in slot ``prefix`` of parameter i."""
        self._state.setdefault(prefix, [None] * len(self.parameters))[i] = tensor

    def get_state(self, prefix: str, i: int, dtype=None) -> Parameter:
        """The state tensor ``prefix`` of parameter i, created (zeros) when missing."""
        return self._get_state(prefix, i, self.slot_dtype(prefix) if dtype is None else dtype)

    def param_shape(self, i: int) -> tuple:
        """The full (logical) shape of parameter i (``state_shapes``): its own, unless a
        sharding holds a parameter stored as a shard (``distributed.zero``)."""
        return tuple(self.state_shapes.param_shape(i))

    def state_shape(self, i: int) -> tuple:
        """Shape of parameter i's state tensors (``state_shapes``): the parameter's, or only
        this rank's rows under a sharding (``distributed.zero``)."""
        return tuple(self.state_shapes.state_shape(i))

    def slot_dtype(self, prefix: str):
        """Storage dtype of state ``prefix``."""
        return self._state_dtype(prefix)

    def index_of(self, name: str) -> int:
        """Index in ``parameters`` of the parameter called ``name``."""
        return self._index_of_name(name)

    def _new_state(self, prefix: str, i: int, dtype=ms.float32) -> Parameter:
        """Zeros of :meth:`state_shape`, named ``{prefix}.{name}``, registered for state_dict."""
        p = self.parameters[i]
        tensor = Parameter(Tensor(np.zeros(self.state_shape(i), np.float32)).astype(dtype),
                           name=f"{prefix}.{p.name}", requires_grad=False)
        self.set_state(prefix, i, tensor)
        return tensor

    def _get_state(self, prefix: str, i: int, dtype=ms.float32) -> Parameter:
        slots = self._state.get(prefix)
        if slots is None or slots[i] is None:
            return self._new_state(prefix, i, dtype)
        return slots[i]

    def state_dict(self) -> Dict[str, Any]:
        """``{"global_step": int, "main_param.{name}": ndarray, "{prefix}.{name}": ndarray}``.

        bf16 states are returned as float32 arrays (exact); they are cast back on load.
        """
        sd: Dict[str, Any] = {"global_step": int(self.global_step)}
        for key, arr in self._masters.state_items():
            sd[key] = arr
        for prefix, slots in self._state.items():
            for p, t in zip(self.parameters, slots):
                if t is not None:
                    sd[f"{prefix}.{p.name}"] = t.astype(ms.float32).asnumpy().copy()
        return sd

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Restore global_step, masters (reloaded from the model when absent) and states."""
        if "global_step" not in sd:
            raise KeyError("optimizer state_dict has no 'global_step'")
        self._masters.load_state_items(sd)
        for prefix, slots in self._state.items():
            for i, p in enumerate(self.parameters):
                key = f"{prefix}.{p.name}"
                if key in sd:
                    arr = np.asarray(sd[key], dtype=np.float32)
                    if tuple(arr.shape) != tuple(p.shape):
                        raise ValueError(f"state_dict entry '{key}' has shape "
                                         f"{tuple(arr.shape)}, expected {tuple(p.shape)}")
                    dtype = slots[i].dtype if slots[i] is not None else ms.float32
                    target = self._get_state(prefix, i, dtype)
                    target.set_data(Tensor(arr.copy()).astype(dtype))
        # states present in sd but not created yet (optimizer not stepped before loading)
        known = set(self._state)
        for key, value in sd.items():
            prefix, _, name = key.partition(".")
            if key == "global_step" or prefix in known or prefix in ("main_param",
                                                                     "param_remainder"):
                continue
            if prefix in self.state_prefixes():
                i = self._index_of_name(name)
                arr = np.asarray(value, dtype=np.float32)
                self._get_state(prefix, i, self._state_dtype(prefix)).set_data(
                    Tensor(arr.copy()).astype(self._state_dtype(prefix)))
        self.global_step = int(sd["global_step"])

    def state_prefixes(self) -> tuple:
        """State prefixes this optimizer creates (subclasses list theirs)."""
        return ()

    def _state_dtype(self, prefix: str):
        return ms.float32

    def _index_of_name(self, name: str) -> int:
        for i, p in enumerate(self.parameters):
            if p.name == name:
                return i
        raise KeyError(f"optimizer state_dict names unknown parameter '{name}'")

    # -- step ----------------------------------------------------------------------------------
    def step(self, grads: Sequence[Optional[Tensor]]) -> None:
        """One update. ``grads`` is aligned with ``parameters``; None = no gradient (the
        parameter is skipped entirely, no weight decay either). Any float dtype; used in fp32."""
        grads = self.check_grads(grads)
        self.global_step += 1
        for group, indices in zip(self.param_groups, self._group_indices):
            live = [i for i in indices if grads[i] is not None]
            if live:
                self._step_group(group, live, [to_fp32(grads[i]) for i in live])
        self._embedding_min_norm_step(grads)

    def check_grads(self, grads: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
        """``grads`` as a list, one per parameter (ValueError otherwise)."""
        grads = list(grads)
        if len(grads) != len(self.parameters):
            raise ValueError(f"{self.optimizer_name}.step got {len(grads)} gradients for "
                             f"{len(self.parameters)} parameters")
        return grads

    def _embedding_min_norm_step(self, grads) -> None:
        """``embedding_min_norm`` after an update, for the embeddings that had a gradient."""
        if self.embedding_min_norm is not None:
            for i in self._embedding_idx:
                if grads[i] is not None:
                    self._apply_embedding_min_norm(i)

    def _step_group(self, group: Dict[str, Any], indices: List[int], grads: List[Tensor]):
        """Update every parameter of a group (default: one :meth:`_update` per parameter)."""
        for i, g in zip(indices, grads):
            master = self._masters.master(i)
            self._update(group, i, master, g)
            self._masters.store(i, master)

    def _update(self, group: Dict[str, Any], i: int, master: Parameter, grad: Tensor) -> None:
        """Update fp32 ``master`` of parameter i in place from fp32 ``grad``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _update")

    # -- helpers for subclasses ----------------------------------------------------------------
    @staticmethod
    def group_weight_decay(group: Dict[str, Any]) -> float:
        """Effective weight decay of a group: weight_decay * wd_mult."""
        return float(group["weight_decay"]) * float(group.get("wd_mult", 1.0))

    def _apply_embedding_min_norm(self, i: int) -> None:
        """Rows with 0 < ||row|| < t are rescaled to norm 2t (Megatron semantics);
        all-zero rows are left alone. Applied to the master, then written back."""
        master = self._masters.master(i)
        t = float(self.embedding_min_norm)
        norms = ops.sqrt(ops.sum(master * master, dim=-1, keepdim=True))
        small = ops.logical_and(norms > 0, norms < t)
        scale = ops.where(small, (2.0 * t) / ops.where(small, norms, ops.ones_like(norms)),
                          ops.ones_like(norms))
        master.set_data(master * scale)
        self._masters.store(i, master)


def to_fp32(grad) -> Tensor:
    """A gradient as an fp32 Tensor (numpy arrays and other float dtypes are converted)."""
    if not isinstance(grad, Tensor):
        grad = Tensor(np.asarray(grad, dtype=np.float32))
    return grad if grad.dtype == ms.float32 else grad.astype(ms.float32)
