"""The memory planner's verdict and text (the estimate is core/memory_plan.py; pure).

    status, reason, suggestion = memory_verdict(plan, cfg); print(format_memory_plan(plan))

FAIL above the device limit (naming the biggest item and the cheapest fix that fits), WARN
above 90% of it, PASS otherwise.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import List, Tuple

from .memory_plan import SHARD_STRATEGIES, WARN_FRACTION, MemoryPlan, estimate_memory

__all__ = ["memory_verdict", "format_memory_plan", "format_bytes", "format_count"]

_GIB = 1024 ** 3


def format_bytes(n: float) -> str:
    for scale, unit in ((1024 ** 4, "TiB"), (_GIB, "GiB"), (1024 ** 2, "MiB"), (1024, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_count(n: float) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"


def _fixes(cfg, plan: MemoryPlan) -> List[Tuple[str, MemoryPlan]]:
    """Candidate fixes, cheapest first: a larger optimizer shard / shard more, a smaller
    micro-batch, flash attention, selective then full recompute."""
    lay, st = plan.layout, plan.settings
    out = []
    if lay.dp > 1 and lay.dp_shard < lay.dp:
        out.append(("parallelism.data_parallel_shard: -1 (shard the optimizer state over all "
                    f"{lay.dp} data-parallel ranks)", replace(lay, dp_shard=lay.dp), st))
    if lay.dp_shard > 1 and lay.ep == 1:   # FSDP with expert parallel: config/layout.py refuses
        for strategy in ("optim_grads", "optim_grads_params"):
            if SHARD_STRATEGIES.index(strategy) > SHARD_STRATEGIES.index(lay.shard_strategy):
                out.append((f"parallelism.data_parallel_shard_strategy: {strategy}",
                            replace(lay, dp_shard=lay.dp, shard_strategy=strategy), st))
    if st.micro_batch > 1:
        out.append((f"training.local_batch_size: {st.micro_batch // 2} (a smaller micro-batch; "
                    "global_batch_size kept by accumulation)", lay,
                    replace(st, micro_batch=st.micro_batch // 2,
                            num_micro_batches=st.num_micro_batches * 2)))
    if not st.flash_attention:
        out.append(("model.use_flash_attention: True", lay, replace(st, flash_attention=True)))
    if st.recompute == "none":
        out.append(("recompute.mode: selective", lay, replace(st, recompute="selective")))
    if st.recompute != "full" or st.recompute_layers is not None:
        out.append(("recompute.mode: full", lay,
                    replace(st, recompute="full", recompute_layers=None)))
    return [(text, estimate_memory(cfg, l, s)) for text, l, s in out]


def memory_verdict(plan: MemoryPlan, cfg=None) -> Tuple[str, str, str]:
    """(status, reason, suggestion): FAIL above the limit, WARN above 90% of it, else PASS.

    A FAIL names the biggest item and the cheapest fix that fits (``cfg`` given); when no
    single fix fits it says how many ranks of model parallelism the state alone needs.
    """
    total = plan.total
    head = (f"{format_bytes(total)} per rank ({plan.layout.describe()}; "
            f"{format_count(plan.params_per_rank)} of {format_count(plan.total_params)} "
            "parameters)")
    if plan.limit is None:
        return "WARN", f"{head}; device memory unknown ({plan.limit_source})", \
            "context.max_device_memory: the memory of one device"
    frac = total / plan.limit
    where = f"{frac:.0%} of {format_bytes(plan.limit)} ({plan.limit_source})"
    big = max(plan.items, key=plan.items.get)
    if frac <= WARN_FRACTION:
        return "PASS", f"{head}: {where}", ""
    if frac <= 1.0:
        return "WARN", f"{head}: {where}, above {WARN_FRACTION:.0%}; biggest item {big} " \
                       f"{format_bytes(plan.items[big])}", "leave headroom: " + \
            "recompute.mode: selective, or a smaller training.local_batch_size"
    reason = (f"{head} exceeds the device: {where}; biggest item {big} "
              f"{format_bytes(plan.items[big])}")
    if cfg is None:
        return "FAIL", reason, "recompute, a larger data_parallel_shard or a smaller micro-batch"
    fixes = _fixes(cfg, plan)
    for text, fixed in fixes:
        if fixed.total <= plan.limit:
            return "FAIL", reason, f"{text} -> {format_bytes(fixed.total)} per rank"
    state = sum(plan.items[k] for k in ("parameters", "gradients", "fp32 masters",
                                        "optimizer state"))
    ranks = math.ceil(state / plan.limit / WARN_FRACTION)
    best = min(fixes, key=lambda f: f[1].total) if fixes else None
    tail = f"; the best single fix ({best[0]}) still needs {format_bytes(best[1].total)}" \
        if best else ""
    return "FAIL", reason, (f"no single fix fits: parameters, gradients and optimizer state "
                            f"alone take {format_bytes(state)}, i.e. at least {ranks}x more "
                            f"model parallelism (tensor/pipeline/expert parallel) or state "
                            f"sharding{tail}")


def format_memory_plan(plan: MemoryPlan) -> str:
    """The per-rank table printed by ``--check`` and at the start of a run."""
    st = plan.settings
    cp = plan.layout.cp
    # context parallel: each rank holds seq_length / cp tokens of every sequence
    seq = (f"sequence {plan.seq_per_rank} per rank (seq_length {plan.seq_length} / cp {cp}), "
           if cp > 1 else "")
    lines = [f"memory plan (per rank, {plan.layout.describe()}; micro-batch {st.micro_batch}, "
             f"{seq}"
             f"recompute {st.recompute}, flash attention {'on' if st.flash_attention else 'off'}"
             f", busiest pipeline stage {plan.stage} with {plan.stage_layers} layers)"]
    width = max(len(k) for k in plan.items)
    lines.append(f"  {'parameters held'.ljust(width)}  {format_count(plan.params_per_rank):>12}"
                 f"  (of {format_count(plan.total_params)}; tp {plan.layout.tp})")
    for key, value in plan.items.items():
        lines.append(f"  {key.ljust(width)}  {format_bytes(value):>12}")
    lines.append(f"  {'total'.ljust(width)}  {format_bytes(plan.total):>12}")
    if plan.limit is not None:
        lines.append(f"  {'limit'.ljust(width)}  {format_bytes(plan.limit):>12}  "
                     f"({plan.limit_source}; {plan.total / plan.limit:.0%} used)")
    return "\n".join(lines)
