"""Per-rank memory estimate of a config under any layout (core/memory_plan.py), as text or as
the Markdown block of docs/recipes.md.

    python -m mindformers_core.tools.memory_report --config configs/npu/deepseek_v3_adamw.yaml \\
        --layout dp=4,tp=8,pp=8,ep=32 --recompute full --flash --device-target Ascend --markdown

The layout may be one the config refuses today (a combination config/layout.py's
``check_layout`` does not run yet): the estimate is what the run would need once it does.
Without ``--layout`` the config's own layout (its ParallelDims) on ``--world-size`` ranks is
used. Exit 1 when the verdict is FAIL.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Dict, List, Optional

from ..core.memory_plan import (ActivationSettings, Layout, MemoryPlan, device_memory_limit,
                                estimate_memory, plan_backend, plan_memory,
                                settings_from_config)
from ..core.memory_verdict import format_bytes, format_count, format_memory_plan, memory_verdict
from .cli import add_run_config_arguments, load_run_config, parse_tool_args

__all__ = ["parse_layout", "memory_report", "markdown_report", "UPSTREAM_671B_COMMAND", "main"]

#: the command whose output docs/recipes.md shows (tests/docs check that they agree)
UPSTREAM_671B_COMMAND = ("python -m mindformers_core.tools.memory_report --config "
                         "configs/npu/deepseek_v3_adamw.yaml --layout dp=4,tp=8,pp=8,ep=32 "
                         "--recompute full --flash --device-target Ascend --markdown")
_LAYOUT_KEYS = ("dp", "tp", "pp", "ep", "cp", "dp_shard")


def parse_layout(text: str) -> Dict[str, int]:
    """``"dp=4,tp=8"`` -> ``{"dp": 4, "tp": 8}``; ValueError naming the bad entry."""
    out: Dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in _LAYOUT_KEYS or not value.isdigit():
            raise ValueError(f"--layout: expected KEY=N with KEY one of {_LAYOUT_KEYS}, got "
                             f"{part!r}")
        out[key] = int(value)
    return out


def memory_report(cfg, layout_sizes: Optional[Dict[str, int]] = None, *,
                  world_size: int = 1, recompute: Optional[str] = None,
                  flash: Optional[bool] = None, shard_strategy: Optional[str] = None,
                  device_target: Optional[str] = None) -> MemoryPlan:
    """The plan of ``cfg`` under ``layout_sizes`` (dp_shard defaults to all of dp, as
    ``data_parallel_shard: -1``), with the given recompute / flash / device overrides."""
    if layout_sizes is None:
        plan = plan_memory(cfg, world_size)
        layout = plan.layout
    else:
        sizes = dict(layout_sizes)
        sizes.setdefault("dp_shard", sizes.get("dp", 1))
        layout = Layout(**sizes, shard_strategy=shard_strategy or
                        cfg.parallelism.data_parallel_shard_strategy)
    if shard_strategy is not None:
        layout = replace(layout, shard_strategy=shard_strategy)
    context = cfg.context if device_target is None else replace(cfg.context,
                                                                device_target=device_target)
    settings: ActivationSettings = settings_from_config(cfg, layout, plan_backend(context))
    if recompute is not None:
        settings = replace(settings, recompute=recompute, recompute_layers=None)
    if flash is not None:
        settings = replace(settings, flash_attention=flash)
    plan = estimate_memory(cfg, layout, settings)
    plan.limit, plan.limit_source = device_memory_limit(context)
    return plan


def markdown_report(plan: MemoryPlan, cfg, command: str) -> str:
    """The Markdown block of docs/recipes.md: the command, the table and the verdict."""
    status, reason, suggestion = memory_verdict(plan, cfg)
    st = plan.settings
    lines = [f"`{command}`", "",
             f"Layout {plan.layout.describe()} ({plan.layout.world_size} devices); micro-batch "
             f"{st.micro_batch}, {st.num_micro_batches} micro-batches per step, recompute "
             f"{st.recompute}, flash attention {'on' if st.flash_attention else 'off'}, MoE "
             f"dispatch {st.moe_dispatch}. The busiest rank (pipeline stage "
             f"{plan.stage} of {plan.layout.pp}, counted from 0; {plan.stage_layers} layers) "
             f"holds {format_count(plan.params_per_rank)} of the "
             f"{format_count(plan.total_params)} parameters.", "",
             "| item | bytes per rank |", "|---|---|"]
    lines += [f"| {k} | {format_bytes(v)} |" for k, v in plan.items.items()]
    lines.append(f"| **total** | **{format_bytes(plan.total)}** |")
    if plan.limit is not None:
        lines.append(f"| limit ({plan.limit_source}) | {format_bytes(plan.limit)} |")
    lines += ["", f"Verdict: **{status}**: {reason}." + (f" Suggestion: {suggestion}."
                                                      if suggestion else "")]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.memory_report",
                                description=__doc__.split("\n\n")[0])
    add_run_config_arguments(p)
    p.add_argument("--layout", default=None,
                   help="KEY=N,... with KEY in dp, tp, pp, ep, cp, dp_shard (default: the "
                        "config's layout on --world-size ranks)")
    p.add_argument("--world-size", dest="world_size", type=int, default=1)
    p.add_argument("--recompute", choices=("none", "full", "selective"), default=None)
    p.add_argument("--flash", action="store_true", default=None,
                   help="estimate with flash attention")
    p.add_argument("--shard-strategy", dest="shard_strategy", default=None,
                   choices=("no_shard", "optim", "optim_grads", "optim_grads_params"))
    p.add_argument("--device-target", dest="device_target", default=None,
                   choices=("CPU", "Ascend", "GPU"))
    p.add_argument("--markdown", action="store_true", help="print the docs/recipes.md block")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, code = parse_tool_args(build_parser(), argv)
    if code is not None:
        return code
    from ..config import ConfigError
    try:
        cfg = load_run_config(args)
        sizes = parse_layout(args.layout) if args.layout else None
        plan = memory_report(cfg, sizes, world_size=args.world_size, recompute=args.recompute,
                             flash=args.flash, shard_strategy=args.shard_strategy,
                             device_target=args.device_target)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.markdown:
        command = "python -m mindformers_core.tools.memory_report " + " ".join(
            argv if argv is not None else sys.argv[1:])
        print(markdown_report(plan, cfg, command))
    else:
        print(format_memory_plan(plan))
        status, reason, suggestion = memory_verdict(plan, cfg)
        print(f"[{status}] {reason}" + (f"\n  -> {suggestion}" if suggestion else ""))
    return 1 if memory_verdict(plan, cfg)[0] == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
