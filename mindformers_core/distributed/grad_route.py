"""Where each gradient goes after the backward: the one plan of the gradient reduction and of
the global gradient norm, for every layout.

Pure (numpy only). Every builder of a run's layout (data parallel, tensor parallel, FSDP,
expert parallel, a pipeline stage) only *declares*, per parameter, a :class:`GradRoute`:

* ``sum_over``: the groups its gradient is SUMmed over, in order (the ranks that hold the
  same values of it and read other tokens: ``dp``, or ``dp_cp`` under context parallel, for a
  dense weight; ``edp`` for a routed expert, whose ``ep`` ranks hold other experts; ``pp``
  first for the embedding table two pipeline stages share);
* ``scatter_over``: FSDP's ``optim_grads``: the gradient is reduce-scattered over that group
  to this rank's dim-0 rows (the sum and the cut in one collective);
* ``norm_group``: the group its squared norm is summed over, because the ranks of that group
  hold different pieces of it (``tp`` slices, ``ep`` experts, FSDP rows); ``None`` when every
  rank of the stage holds the same reduced gradient, which then counts once;
* ``counted``: False for a copy another rank counts (a pipeline stage's copy of a parameter
  another stage owns);
* ``scale``: a factor applied after the reduction (``disable_gradient_division: false``).

``distributed/grad_reduce.py`` executes the plan (:func:`route_batches`: one bucketed
collective per group of routes) and computes the norm (:func:`combine_sq_norms`)::

    ||g||^2 = OUTER( sum_{norm_group None} ||g_p||^2
                     + sum_G AllReduce_G( sum_{norm_group G} ||g_p||^2 ) )

where ``OUTER`` is the pipeline's sum over its stages (``outer``; each stage counts the
parameters it owns). The groups are visited in sorted order, identical on every rank; inside
a stage every rank holds the same parameter names, so the members of each group issue the same
collectives in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["GradRoute", "route_batches", "norm_batches", "combine_sq_norms", "rerouted"]


@dataclass(frozen=True)
class GradRoute:
    """How one parameter's gradient is reduced and counted in the norm (module docstring)."""
    sum_over: Tuple[str, ...] = ()
    scatter_over: Optional[str] = None
    norm_group: Optional[str] = None
    counted: bool = True
    scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "sum_over", tuple(self.sum_over))
        if self.scatter_over is not None and self.scatter_over in self.sum_over:
            raise ValueError(f"a gradient reduce-scattered over {self.scatter_over!r} is not "
                             f"also summed over it (sum_over {self.sum_over})")

    @property
    def key(self) -> Tuple[Tuple[str, ...], Optional[str]]:
        """The collectives this gradient takes part in (routes with one key share buckets)."""
        return self.sum_over, self.scatter_over


def rerouted(route: GradRoute, **changes) -> GradRoute:
    """``route`` with some fields changed (a wrapping builder's override)."""
    return replace(route, **changes)


def route_batches(routes: Sequence[GradRoute],
                  live: Sequence[bool]) -> List[Tuple[Tuple[Tuple[str, ...], Optional[str]],
                                                      List[int]]]:
    """``[(key, [gradient indices])]``: the live gradients grouped by the collectives they
    take (:attr:`GradRoute.key`), keys in sorted order (the same on every rank), indices in
    order; routes with nothing to communicate are left out."""
    groups: Dict[Tuple[Tuple[str, ...], Optional[str]], List[int]] = {}
    for i, (route, alive) in enumerate(zip(routes, live)):
        if alive and (route.sum_over or route.scatter_over):
            groups.setdefault(route.key, []).append(i)
    return sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))


def norm_batches(routes: Sequence[GradRoute],
                 live: Sequence[bool]) -> List[Tuple[Optional[str], List[int]]]:
    """``[(norm group or None, [indices])]`` of the counted live gradients: the replicated
    ones first, then the groups in sorted order."""
    groups: Dict[Optional[str], List[int]] = {}
    for i, (route, alive) in enumerate(zip(routes, live)):
        if alive and route.counted:
            groups.setdefault(route.norm_group, []).append(i)
    return sorted(groups.items(), key=lambda kv: ("" if kv[0] is None else "~" + kv[0]))


def combine_sq_norms(parts: Sequence[Tuple[Optional[str], float]],
                     group_sum: Callable[[str, float], float],
                     outer: Sequence[str] = ()) -> float:
    """The global squared norm from this rank's ``(norm group, squared norm)`` parts (module
    docstring): the parts of each group added here, one ``group_sum(group, x)`` (the SUM of
    ``x`` over this rank's ``group``) per group in sorted order, then the ``outer`` sums."""
    rep, by_group = 0.0, {}
    for group, sq in parts:
        if group is None:
            rep += float(sq)
        else:
            by_group[group] = by_group.get(group, 0.0) + float(sq)
    total = rep + sum(float(group_sum(g, by_group[g])) for g in sorted(by_group))
    for group in outer:
        total = float(group_sum(group, total))
    return total
