"""AdamW (torch-equivalent) on fp32 masters, with a fused fast path and a plain reference path.

Update at step t (t = global_step after the increment), per parameter with fp32 master p,
fp32 gradient g, group lr, effective weight decay wd (weight_decay * wd_mult):

    p <- p * (1 - lr * wd)                       decoupled decay on the old value
    m <- b1 * m + (1 - b1) * g
    v <- b2 * v + (1 - b2) * g^2
    p <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)     bc1 = 1 - b1^t, bc2 = 1 - b2^t

eps is outside the sqrt and after bias correction, as in torch.optim.AdamW. The step also runs
when lr = 0 (moments advance). With ``decoupled_weight_decay=False`` (Adam + coupled L2) the
decay line is replaced by g <- g + wd * p.

Fast path (``impl="fused"``, the default when moments are fp32): MindSpore's fused ``ops.Adam``
kernel (one pass over p, m, v, g) computes ``p -= lr_t * m / (sqrt(v) + eps_t)`` with beta
powers given; passing beta powers 0 and folding bias correction into the scalars,

    lr_t  = lr * sqrt(bc2) / bc1,     eps_t = eps * sqrt(bc2),

gives exactly torch's update (multiply numerator and denominator by sqrt(bc2)). The scalars are
computed in float64 in Python; the kernel's EMAs use fp32-rounded betas, and so does the bias
correction (see :meth:`AdamW._fused_scalars`). Per group and step, for a group of at least
``graph_min_numel`` elements: one compiled graph runs ``ops.Adam`` over every parameter
(``fused_adam.FusedAdamGroup``, lr_t divided by the decay factor c = 1 - lr*wd), then one host
sync, then ``MainParams.scale_and_store_many``: on CPU, where ``asnumpy()`` aliases the
buffers, master *= c and the fp32 -> bf16/fp16 write-back run as one cache-blocked, threaded
numpy pass (c*p - lr_t*u == c*(p - (lr_t/c)*u)). Smaller groups launch ``ops.Adam`` per
parameter, same epilogue. Where buffers cannot be aliased (device memory) the graph applies
the decay itself (``decay_in_graph``) and the write-back is MindSpore's Cast; tested to give the
same bits as the CPU path.

Measured alternatives (2-core CPU, 10M params, ns/param, nn.Adam ~0.8-0.9): ``ops.Adam`` graph
0.86 + numpy decay 0.27 (kept); ``ops.AdamWeightDecay`` in one graph (exact AdamW with
lr_t, eps_t, wd*lr/lr_t) 3.6-3.8 and eagerly 2.8; ``FusedCastAdamWeightDecay`` 3.8;
``ops.ApplyGradientDescent(p, lr*wd, p)`` in the graph +4; Mul + Assign in the graph +0.39.
The host sync goes through a one-element op (``main_params.wait_for_kernels``): the first
``asnumpy()`` of a Parameter the graph writes waited ~20 ms longer.

On CPU the whole fused step of a group is first tried as ONE host C call
(``host_adam``, through ``AdamRule.fused_many``): the pointers of every master, moment and
gradient go to a kernel that applies the ``ops.Adam`` arithmetic and the decay in one pass,
split over the runtime's threads. No launch per tensor and no second pass for the decay:
measured 1.08x torch's fused AdamW at 10M GPT parameters and 0.94x at 50M, against
2.1x / 1.7x for the paths below (``bench/bench_adamw_torch.py``, 1 thread each). The paths
below remain where the host kernel is unavailable (device memory, no C compiler,
``MFC_NATIVE_KERNELS=0``) or declines the tensors, and with ``host_kernel=False``.

With synchronous dispatch on CPU (the trainer's mode there) the group graph gives way to
``flat_state.FlatAdamGroup``: tensors of at least ``flat_state.PACK_MAX_NUMEL`` elements get
one eager ``ops.Adam`` launch each and the smaller ones share one launch over flat buffers
(the optimizer's own masters and moments re-pointed into them,
the model's fp32 parameters copied in and out; same bits). In that mode each graph kernel
cost ~75 us on a quiet machine and the graph's runtime slowed ~10x under load; eager
launches ~90 us, ~2x under load (``flat_state`` has the numbers).

``enable_cpu_offload`` keeps the moments in host memory between steps
(``state_offload.HostStateOffload``: moved to the device for the group's update and back);
on CPU they are there already, and nothing moves.

The reference path (``impl="reference"``) composes plain ops and is also used for bf16 moments
(``exp_avg_dtype`` / ``exp_avg_sq_dtype``), whose values are computed in fp32 and stored in bf16.

On Ascend the upstream fused ``AdamW`` kernel could serve the same contract; it is not
available on CPU and is not used here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import mindspore as ms
from mindspore import Parameter, Tensor, mutable

from ..core.optimizer_defaults import ADAMW_DEFAULTS as D
from ..core.optimizer_rules import check_beta_count, check_beta_range, check_weight_decay
from .host.flat_state import FlatAdamGroup, synchronous_dispatch, worth_packing
from .fused_adam import FusedAdamGroup
from .host.views import numpy_view_aliases_storage, scale_many_in_place
from .optimizer import Optimizer, StateShapes, state_dtype
from .state_offload import HostStateOffload, cpu_offload_for
from .update_rules import AdamRule

__all__ = ["AdamW", "validate_adamw_args", "validate_adamw_groups"]

_IMPLS = ("fused", "reference")
_ACCEPTED_FLAGS = ("use_fused", "enable_fused_opt", "swap", "amsgrad", "maximize")


def validate_adamw_args(betas, eps, weight_decay, name: str = "AdamW") -> None:
    """Upstream checks, in upstream order (torch-style ranges, then MindSpore type checks)."""
    betas = list(betas) if isinstance(betas, (list, tuple)) else betas
    if not isinstance(betas, list):
        raise TypeError(f"For '{name}', the type of 'betas' should be 'tuple' or 'list', "
                        f"but got type '{type(betas).__name__}'.")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}, should be >= 0.")
    check_beta_range(betas, name)
    check_weight_decay(weight_decay)
    for k, b in enumerate(betas):
        if not isinstance(b, float):
            raise TypeError(f"For '{name}', the type of 'betas[{k}]' should be 'float', "
                            f"but got type '{type(b).__name__}'.")
    check_beta_count(betas, name)
    if not isinstance(eps, float):
        raise TypeError(f"For '{name}', the type of 'eps' should be 'float', "
                        f"but got type '{type(eps).__name__}'.")
    if not isinstance(weight_decay, float):
        raise TypeError(f"For '{name}', the type of 'weight_decay' should be 'float', "
                        f"but got type '{type(weight_decay).__name__}'.")


def validate_adamw_groups(groups, name: str = "AdamW") -> None:
    """:func:`validate_adamw_args` of every group (the message names the group); a group's
    ``betas`` becomes a tuple."""
    for gi, group in enumerate(groups):
        try:
            validate_adamw_args(group["betas"], group["eps"], group["weight_decay"], name)
        except (TypeError, ValueError) as err:
            raise type(err)(f"parameter group {gi}: {err}") from None
        group["betas"] = tuple(group["betas"])


class AdamW(Optimizer):
    """AdamW with fp32 masters; see the module docstring for the update and the paths.

    Args:
        params_or_groups: Parameters or group dicts (``optimizer.normalize_param_groups``).
        lr: base learning rate (each group: lr * lr_mult; the trainer sets it every step).
        betas, eps, weight_decay: defaults for groups that do not set them.
        decoupled_weight_decay: False = Adam with coupled L2 (g += wd * p).
        exp_avg_dtype, exp_avg_sq_dtype: 'fp32' | 'bf16' storage of m and v.
        store_param_remainders: bf16 params keep an int16 remainder instead of an fp32 master.
        embedding_min_norm: see ``Optimizer``.
        impl: 'fused' (default) or 'reference'.
        graph_min_numel: a group with at least this many elements (all with gradients) runs
            its kernels from one compiled graph (``fused_adam``); None = never.
        host_kernel: on CPU, run each group's fused step as one host C call
            (``host_adam``) where it can; False keeps MindSpore's ``ops.Adam`` paths.
        use_fused, enable_fused_opt, swap, amsgrad, maximize: accepted (kernel/offload flags
        of upstream); amsgrad/maximize must be False.
        enable_cpu_offload: keep the moments in host memory between steps
            (``state_offload``): on CPU they are there already, so True changes nothing; on
            a device (Ascend) each group's moments are moved to the device for its update
            and back (``state_offload.HostStateOffload``).
        state_offload: an explicit ``HostStateOffload`` (e.g. ``device="CPU"`` runs the
            device path on CPU); overrides ``enable_cpu_offload``'s choice.
        state_shapes: see ``Optimizer`` (a sharding's shapes, ``distributed.zero``).
    """

    optimizer_name = "AdamW"

    def __init__(self, params_or_groups, lr: float = D["lr"], betas=D["betas"], eps: float = D["eps"],
                 weight_decay: float = D["weight_decay"], *,
                 decoupled_weight_decay: bool = D["decoupled_weight_decay"],
                 exp_avg_dtype=D["exp_avg_dtype"], exp_avg_sq_dtype=D["exp_avg_sq_dtype"],
                 store_param_remainders: bool = False, embedding_min_norm=None,
                 impl: str = "fused", graph_min_numel=1 << 16, host_kernel: bool = True,
                 enable_cpu_offload: bool = D["enable_cpu_offload"],
                 state_offload: Optional[HostStateOffload] = None,
                 state_shapes: Optional[StateShapes] = None, **flags):
        validate_adamw_args(betas, eps, weight_decay, self.optimizer_name)
        self.enable_cpu_offload = bool(enable_cpu_offload)
        self.state_offload = state_offload or cpu_offload_for(
            self.enable_cpu_offload, ms.get_context("device_target"))
        unknown = sorted(set(flags) - set(_ACCEPTED_FLAGS))
        if unknown:
            raise TypeError(f"{self.optimizer_name} got unexpected keyword arguments {unknown}; "
                            f"accepted flags: {list(_ACCEPTED_FLAGS)}")
        if flags.get("amsgrad") or flags.get("maximize"):
            raise ValueError(f"{self.optimizer_name}: amsgrad and maximize are not supported")
        if impl not in _IMPLS:
            raise ValueError(f"{self.optimizer_name}: impl must be one of {list(_IMPLS)}, "
                             f"got {impl!r}")
        super().__init__(params_or_groups,
                         {"lr": float(lr), "betas": tuple(betas), "eps": eps,
                          "weight_decay": weight_decay},
                         store_param_remainders=store_param_remainders,
                         embedding_min_norm=embedding_min_norm, state_shapes=state_shapes)
        validate_adamw_groups(self.param_groups, self.optimizer_name)
        self.decoupled_weight_decay = bool(decoupled_weight_decay)
        self.exp_avg_dtype = state_dtype(exp_avg_dtype)
        self.exp_avg_sq_dtype = state_dtype(exp_avg_sq_dtype)
        low_moments = self.exp_avg_dtype != ms.float32 or self.exp_avg_sq_dtype != ms.float32
        self.impl = "reference" if low_moments else impl
        self.rule = AdamRule(self.impl, self.decoupled_weight_decay, host_kernel)
        self.graph_min_numel = graph_min_numel
        self._graphs: Dict[tuple, Any] = {}
        self._flat_seen: Dict[tuple, tuple] = {}
        for i in range(len(self.parameters)):
            self._new_state("adam_m", i, self.exp_avg_dtype)
            self._new_state("adam_v", i, self.exp_avg_sq_dtype)
        if self.state_offload is not None:
            self.state_offload.park([t for slots in self._state.values() for t in slots
                                     if t is not None])

    def state_prefixes(self) -> tuple:
        return ("adam_m", "adam_v")

    def _state_dtype(self, prefix: str):
        return self.exp_avg_dtype if prefix == "adam_m" else self.exp_avg_sq_dtype

    # ------------------------------------------------------------------------------------------
    def _hyper(self, group: Dict[str, Any]):
        b1, b2 = group["betas"]
        return float(group["lr"]), float(b1), float(b2), float(group["eps"]), \
            self.group_weight_decay(group)

    def _step_group(self, group: Dict[str, Any], indices: List[int], grads: List[Tensor]):
        if self.state_offload is None:
            self._update_group(group, indices, grads)
            return
        states = [self._state[prefix][i] for prefix in self.state_prefixes() for i in indices]
        with self.state_offload.on_device(states):
            self._update_group(group, indices, grads)

    def _update_group(self, group: Dict[str, Any], indices: List[int], grads: List[Tensor]):
        lr, b1, b2, eps, wd = self._hyper(group)
        m_slots, v_slots = self._state["adam_m"], self._state["adam_v"]
        if self.impl == "fused":
            masters = [self._masters.master(i) for i in indices]
            if self.rule.fused_many(masters, [m_slots[i] for i in indices],
                                    [v_slots[i] for i in indices], grads, lr, b1, b2, eps, wd,
                                    self.global_step):
                self._masters.store_many(indices, masters)
                return
            decay = 1.0 - lr * wd if (wd != 0.0 and self.decoupled_weight_decay) else 1.0
            if abs(decay) >= 1e-3:
                # Decay after the kernel: c*p - lr_t*u == c*(p - (lr_t/c)*u). The multiply
                # then shares the host sync of the write-back: one sync per group and step.
                scalars = self._fused_scalars(lr / decay, b1, b2, eps)
                cell = self._graph_for(indices, masters)
                decayed = False
                if cell is not None and (decay != 1.0 or wd == 0.0):
                    decayed = self._run_graph(cell, indices, grads, scalars, decay)
                else:
                    for i, master, g in zip(indices, masters, grads):
                        self._fused_update(master, m_slots[i], v_slots[i], g, lr,
                                           0.0 if decay != 1.0 else wd, scalars)
                if decayed:  # the graph applied the decay (no aliased host views)
                    self._masters.store_many(indices, masters)
                    return
                # one blocked pass: decay + write-back (MainParams; the sharded store scales)
                self._masters.scale_and_store_many(indices, masters, decay)
                return
            else:  # lr*wd ~ 1: dividing by c would blow up; decay first
                cell = self._graphs.get(tuple(indices))
                if cell is not None and cell.decay_in_graph:
                    # no aliased views: the decay below replaces the masters' data
                    # (set_data), which a compiled graph bound to them would not see
                    del self._graphs[tuple(indices)]
                scale_many_in_place(masters, decay)
                scalars = self._fused_scalars(lr, b1, b2, eps)
                for i, master, g in zip(indices, masters, grads):
                    self._fused_update(master, m_slots[i], v_slots[i], g, lr, 0.0, scalars)
            self._masters.store_many(indices, masters)
        else:
            for i, g in zip(indices, grads):
                master = self._masters.master(i)
                self.rule.reference(master, m_slots[i], v_slots[i], g,
                                    lr, b1, b2, eps, wd, self.global_step)
                self._masters.store(i, master)

    def _update(self, group, i, master, grad):
        """Single-parameter update."""
        lr, b1, b2, eps, wd = self._hyper(group)
        self.rule.update(master, self._state["adam_m"][i], self._state["adam_v"][i], grad,
                         lr, (b1, b2), eps, wd, self.global_step)

    def _graph_for(self, indices: List[int], masters):
        """The whole-group Adam for a group whose parameters all have gradients, persistent
        masters (no remainders), moments in place (no ``state_offload``) and together at
        least ``graph_min_numel`` elements (below that the ~0.3 s compile does not pay off):
        with synchronous CPU dispatch (the trainer's) the packed launches of
        ``flat_state.FlatAdamGroup`` (built on the second step, once the masters proved
        persistent), else the compiled ``fused_adam.FusedAdamGroup`` (built on first use);
        cached by the group's parameter indices."""
        key = tuple(indices)
        if key in self._graphs:
            cell = self._graphs[key]
            if cell is not None and not _same_objects(
                    cell.bound, (masters, [self._state["adam_m"][i] for i in indices],
                                 [self._state["adam_v"][i] for i in indices])):
                # masters/moments are rebuilt per step (e.g. sharded rows): a graph bound to
                # the old objects would update stale copies, so this group goes eager for good
                self._graphs[key] = cell = None
            return cell
        cell = None
        numel = sum(int(m.size) for m in masters)
        # offloaded moments get new data every step (set_data), which a compiled graph or
        # flat buffers bound to them would not see: per-parameter kernels then
        if (self.graph_min_numel is not None and numel >= self.graph_min_numel
                and self.state_offload is None
                and not any(self._masters.uses_remainder(i) for i in indices)
                and any(key == tuple(g) for g in self._group_indices)):
            bound = (list(masters), [self._state["adam_m"][i] for i in indices],
                     [self._state["adam_v"][i] for i in indices])
            aliased = (numpy_view_aliases_storage()
                       and numpy_view_aliases_storage(low_precision=True))
            if aliased and _packable(bound) and synchronous_dispatch():
                if not _same_objects(self._flat_seen.get(key, ((), (), ())), bound):
                    # the masters must prove persistent (the same objects two steps in a
                    # row) before they are re-pointed into flat buffers: a store that
                    # rebuilds them per step (sharded rows) stays per-tensor
                    self._flat_seen[key] = bound
                    return None
                del self._flat_seen[key]
                cell = FlatAdamGroup(bound, self.rule.kernel, self.parameters[indices[0]].name,
                                     [self.parameters[i] for i in indices])
            else:
                cell = FusedAdamGroup(*bound, decay_in_graph=not aliased)
                cell.bound = bound
        self._graphs[key] = cell
        return cell

    def _run_graph(self, cell, indices, grads, scalars, decay: float) -> bool:
        """Run the compiled group; True when it also applied the decay (``decay_in_graph``).
        If the first call cannot compile (e.g. no source code for the graph parser), drop
        to per-parameter kernels for this group from now on (decay left to the caller).

        The grads go in as ``mutable(tuple)``: a plain tuple of Tensors is a constant
        of the graph, so every step's new gradients would recompile it."""
        args = (mutable(tuple(grads)), self.rule.zero, *scalars, Tensor(decay, ms.float32))
        if getattr(cell, "_compiled_ok", False):
            cell(*args)
            return cell.decay_in_graph
        try:
            cell(*args)  # compile errors raise before any kernel
        except (RuntimeError, OSError, TypeError, ValueError):
            self._graphs[tuple(indices)] = None
            m_slots, v_slots = self._state["adam_m"], self._state["adam_v"]
            for i, g in zip(indices, grads):
                self.rule.kernel(self._masters.master(i), m_slots[i], v_slots[i],
                                 self.rule.zero, self.rule.zero, *scalars, g)
            return False
        cell._compiled_ok = True
        return cell.decay_in_graph

    def _fused_scalars(self, lr: float, b1: float, b2: float, eps: float):
        """(lr_t, b1, b2, eps_t) for ``ops.Adam`` at step t = global_step
        (``update_rules.AdamRule.scalars``)."""
        return self.rule.scalars(lr, b1, b2, eps, self.global_step)

    def _fused_update(self, master: Parameter, m: Parameter, v: Parameter, g: Tensor,
                      lr: float, wd: float, scalars) -> None:
        self.rule.fused(master, m, v, g, lr, wd, scalars)


def _packable(bound) -> bool:
    """Masters and moments all fp32 and of the same sizes (not a sharded store holding rows
    of some of them), with at least two tensors small enough to share a launch
    (``flat_state``)."""
    return (all(m.size == a.size == b.size and a.dtype == b.dtype == m.dtype == ms.float32
                for m, a, b in zip(*bound))
            and worth_packing([int(m.size) for m in bound[0]]))


def _same_objects(bound, current) -> bool:
    """True when every Parameter in ``current`` is the very object bound in ``bound``."""
    return all(len(a) == len(b) and all(x is y for x, y in zip(a, b))
               for a, b in zip(bound, current))
