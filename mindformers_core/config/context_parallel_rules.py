"""Rules of context parallelism (``parallelism.context_parallel > 1``), pure.

Fields (upstream's): ``context_parallel_method`` (``colossal`` ring attention, ``ulysses``
all-to-all, ``hybrid`` ulysses inside groups of ``ulysses_degree_in_cp`` ranks and the ring
across them; docs/context_parallel.md), ``ulysses_degree_in_cp`` (hybrid: divides
``context_parallel``; ulysses: unwritten or equal to it, upstream's rule; refused with
colossal), ``context_parallel_mask_type`` (``causal`` only) and
``context_parallel_async`` (any value; it changes nothing here, a ``--check`` note:
config/compat/parallel_noop.py ``PERFORMANCE_FLAGS``).

Against the model (``check_context_parallel``, RunConfig):

* ``seq_length`` divisible by ``2 * context_parallel``: the load-balanced causal split gives
  every rank two of ``2 cp`` equal chunks (``distributed/cp_layout.py``);
* ``num_attention_heads`` (and, without MLA, ``num_query_groups``), divided by
  ``tensor_parallel`` under cp x tp, divisible by the ulysses degree (``context_parallel`` for
  ulysses, ``ulysses_degree_in_cp`` for hybrid): the all-to-all swaps the sequence split for a
  split of whole heads (of a tp rank's local heads);
* ``training.jit: none`` (what an unwritten ``training.jit`` means under cp): the cp
  attention's collectives run in PyNative. Recompute runs (``recompute:``, full or select):
  a recomputed layer or attention reruns its cp core, ring passes or all-to-alls included, in
  the backward, on every cp rank in the same order. ``core_attention`` recomputes ulysses'
  inner core; the ring's own backward already recomputes its blocks from q, k, v and the
  saved log-sum-exp (``distributed/ring_attention.py``), so it keeps no S x S scores either;
* no ``model.moe_expert_capacity_factor`` (dropless MoE): each cp rank routes its chunks'
  tokens, so a capacity would drop other pairs than one process does.
"""
from __future__ import annotations

from ..core.parallel_dims import ulysses_degree as core_ulysses_degree

__all__ = ["ulysses_degree", "check_context_parallel_fields", "check_context_parallel"]


def ulysses_degree(par) -> int:
    """The ranks of one all-to-all of ``par`` (``core.parallel_dims.ulysses_degree``)."""
    return core_ulysses_degree(par.context_parallel_method, par.context_parallel,
                               par.ulysses_degree_in_cp)


def check_context_parallel_fields(par, path: str) -> None:
    """The cp fields of a ParallelismConfig among themselves (ConfigError naming the field)."""
    from ..errors import ConfigError
    cp, method, u = par.context_parallel, par.context_parallel_method, par.ulysses_degree_in_cp
    if par.context_parallel_mask_type != "causal":
        raise ConfigError(f"{path}.context_parallel_mask_type",
                          f"must be 'causal', got {par.context_parallel_mask_type!r}: the "
                          f"load-balanced split and the ring's block masks are causal (no other "
                          f"context-parallel mask is implemented)")
    if u is not None and method == "ulysses" and u != cp:
        # upstream's rule: under ulysses the all-to-all spans the whole cp group, and an
        # unwritten degree is context_parallel (its parallel-training guide writes it equal)
        raise ConfigError(f"{path}.ulysses_degree_in_cp",
                          f"must equal {path}.context_parallel({cp}) with "
                          f"context_parallel_method 'ulysses' (the all-to-all spans the whole "
                          f"cp group), got {u}; leave it out, or use 'hybrid' for a smaller "
                          f"ulysses group")
    if u is not None and method == "colossal":
        raise ConfigError(f"{path}.ulysses_degree_in_cp",
                          f"is set ({u}) while {path}.context_parallel_method is {method!r}: it "
                          f"is the ulysses group size of the 'hybrid' (and 'ulysses', equal to "
                          f"context_parallel) methods; remove it or set context_parallel_method: "
                          f"hybrid")
    if u is not None and (u < 1 or cp % u):
        raise ConfigError(f"{path}.ulysses_degree_in_cp",
                          f"ulysses_degree_in_cp({u}) must be >= 1 and divide "
                          f"{path}.context_parallel({cp})")
    if method == "hybrid" and u is None and cp > 1:
        raise ConfigError(f"{path}.ulysses_degree_in_cp",
                          f"context_parallel_method 'hybrid' needs ulysses_degree_in_cp (the "
                          f"ulysses group size, a divisor of context_parallel({cp}))")


def check_context_parallel(cfg) -> None:
    """Every context-parallel rule of a RunConfig against its model and training sections."""
    from ..errors import ConfigError
    par, model = cfg.parallelism, cfg.model
    cp = par.context_parallel
    if cp == 1:
        return
    layout = f" (parallelism.context_parallel: {cp})"
    if model.seq_length % (2 * cp):
        raise ConfigError("model.seq_length",
                          f"seq_length({model.seq_length}) must be divisible by 2 * "
                          f"context_parallel = {2 * cp}: the load-balanced causal split gives "
                          f"each rank chunks i and 2cp-1-i of 2cp equal chunks" + layout)
    u, tp = ulysses_degree(par), par.tensor_parallel
    sizes = [("num_attention_heads", model.num_attention_heads)]
    if not model.resolved_multi_latent_attention():
        sizes.append(("num_query_groups", model.resolved_num_query_groups()))
    for name, value in sizes:
        # under cp x tp the all-to-all splits a tp rank's value / tp local heads (a size tp
        # does not divide is tensor_parallel_rules.py's refusal)
        local = value // tp if value % tp == 0 else value
        if local % u:
            of_tp = f" / tensor_parallel({tp}) = {local}" if local != value else ""
            raise ConfigError(f"model.{name}",
                              f"{name}({value}){of_tp} must be divisible by the ulysses degree "
                              f"{u} (parallelism.context_parallel_method "
                              f"{par.context_parallel_method!r}): the all-to-all gives each "
                              f"rank whole heads" + layout)
    if cfg.model_jit_mode() != "none":   # unwritten, it is none under cp (model_jit_mode)
        raise ConfigError("training.jit", "must be none with context parallelism (or left "
                                          "out): the ring's and the all-to-all's collectives "
                                          "run in PyNative" + layout)
    capacity = model.moe_expert_capacity_factor
    if capacity is not None:
        # each cp rank routes the tokens of its two chunks (models/cp_model.py), so a capacity
        # drops pairs per chunk, not per micro-batch as one process does (measured at cp2: the
        # loss and grad_norm leave one process's from step 1); tensor_parallel_rules.py refuses
        # tp x ep for the same reason
        raise ConfigError("model.moe_expert_capacity_factor",
                          f"is {capacity}, but context parallel runs dropless only: each cp "
                          f"rank routes its chunks' tokens, so a capacity would drop pairs per "
                          f"chunk, not per micro-batch as one process does; unset it or set "
                          f"parallelism.context_parallel: 1" + layout)
