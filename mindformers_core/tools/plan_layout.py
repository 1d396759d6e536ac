"""Layout advisor: for a config, a world size and a device, the layouts that fit, ranked by
predicted step time (docs/plan_layout.md).

    python -m mindformers_core.tools.plan_layout --config x.yaml [--set k=v ...] --world N \\
        --device-memory 64GiB [--device NAME] [--top 10] [--json] [--vary micro_batch,recompute]

Without ``--device`` the device is the config's own backend (``context``; core/memory_plan.py's
``plan_backend``) and its memory ``context.max_device_memory`` (host RAM on CPU);
``--device-memory`` overrides the memory. ``--calibration FILE`` reads the CPU measurements of
tools/calibrate_device.py. Exit 0 with layouts, 2 with a refused flag (the message names it).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Dict, List, Optional

from ..config import ConfigError
from ..core.device_profiles import BACKEND_PROFILE, PROFILES, DeviceProfile, calibrated, get_profile
from ..core.memory_plan import device_memory_limit, plan_backend
from ..core.memory_verdict import format_bytes
from .cli import add_run_config_arguments, load_run_config, parse_tool_args
from .layout_search import RECOMPUTE_YAML, Evaluated, search

__all__ = ["parse_device_memory", "resolve_device", "advise", "format_table", "why_best",
           "paste_yaml", "fitting_summary", "UsageError", "main"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)\s*$")
_SCALE = {"B": 1, "KB": 1e3, "KiB": 2 ** 10, "MB": 1e6, "MiB": 2 ** 20, "GB": 1e9,
          "GiB": 2 ** 30, "TB": 1e12, "TiB": 2 ** 40}
VARY = ("micro_batch", "recompute")
VARY_ALL_UP_TO = 64


class UsageError(ValueError):
    """A refused flag: the message starts with the flag."""


def parse_device_memory(text: str) -> float:
    """Bytes of ``"64GiB"`` / ``"80GB"`` / ``"512MiB"`` (a unit is required)."""
    m = _SIZE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--device-memory: expected a positive size with a unit (B, KB, KiB, "
                         f"MB, MiB, GB, GiB, TB, TiB), e.g. 64GiB, got {text!r}")
    return float(m.group(1)) * _SCALE[m.group(2)]


def resolve_device(cfg, name: Optional[str], memory: Optional[str],
                   calibration: Optional[str] = None):
    """(profile, memory limit in bytes, where the limit comes from)."""
    if name is not None and name not in PROFILES:
        raise UsageError(f"--device: unknown device {name!r}; known: {', '.join(sorted(PROFILES))}")
    profile: DeviceProfile = get_profile(name or BACKEND_PROFILE[plan_backend(cfg.context)])
    if calibration:
        try:
            with open(calibration, encoding="utf-8") as fh:
                profile = calibrated(profile, json.load(fh))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--calibration: cannot read {calibration!r}: {exc}") from None
    if memory is not None:
        return profile, parse_device_memory(memory), f"--device-memory {memory}"
    if name is not None and profile.memory_bytes > 0:
        return profile, profile.memory_bytes, f"{profile.name} ({format_bytes(profile.memory_bytes)})"
    limit, source = device_memory_limit(cfg.context)
    if limit is None:
        raise UsageError(f"--device-memory: the device memory is unknown ({source}); give it")
    return profile, limit, source


def advise(cfg, world: int, profile: DeviceProfile, limit: float, *, source=None,
           overrides=(), vary=(), top: int = 10):
    """(fitting layouts best first, facts); UsageError naming the flag when none fits, with
    what would fit (more devices, recompute, a smaller micro-batch)."""
    layouts, facts = search(cfg, world, profile, limit, source=source, overrides=overrides,
                            vary=vary, top=top)
    if layouts:
        return layouts, facts
    smallest = facts["smallest"]
    if smallest is None:
        raise UsageError(f"--world: no layout of this model runs on {world} devices "
                         f"(check_layout and the config's rules refuse every one)")
    hints = _what_would_fit(cfg, world, profile, limit, vary)
    raise UsageError(
        f"--world: no layout fits on {world} devices of {format_bytes(limit)}: the smallest "
        f"({smallest.candidate.describe()}, recompute {smallest.candidate.recompute}, "
        f"micro-batch {smallest.candidate.micro_batch}) needs "
        f"{format_bytes(smallest.memory_bytes)} per rank; would fit: "
        + ("; ".join(hints) if hints else "nothing tried (up to 16x the devices, recompute, "
                                          "a smaller micro-batch): a larger --device-memory"))


def _what_would_fit(cfg, world, profile, limit, vary) -> List[str]:
    hints = []
    for factor in (2, 4, 8, 16):
        if search(cfg, world * factor, profile, limit, vary=vary, top=1, time_unfit=False)[0]:
            hints.append(f"more devices (--world {world * factor})")
            break
    if "recompute" not in vary and search(cfg, world, profile, limit, time_unfit=False,
                                          vary=set(vary) | {"recompute"}, top=1)[0]:
        hints.append("recompute (--vary recompute)")
    if "micro_batch" not in vary and search(cfg, world, profile, limit, time_unfit=False,
                                            vary=set(vary) | {"micro_batch"}, top=1)[0]:
        hints.append("a smaller micro-batch (--vary micro_batch)")
    return hints


def format_table(layouts: List[Evaluated]) -> str:
    head = (f"{'#':>2}  {'layout':<34} {'rc':<9} {'mb':>3} {'mem/rank':>10} {'step s':>10} "
            f"{'bubble s':>9} {'comm s':>9} {'MFU':>6}")
    rows = [head, "-" * len(head)]
    for i, e in enumerate(layouts, 1):
        c = e.candidate
        rows.append(f"{i:>2}  {c.describe():<34} {c.recompute:<9} {c.micro_batch:>3} "
                    f"{format_bytes(e.memory_bytes):>10} {e.cost.step_s:>10.4g} "
                    f"{e.cost.bubble_s:>9.3g} {e.cost.exposed_comm_s:>9.3g} "
                    f"{e.cost.mfu:>6.1%}")
    return "\n".join(rows)


def why_best(layouts: List[Evaluated], facts: Dict[str, object], limit: float) -> str:
    """One line: what the best one saves against the next, and what memory rules out."""
    best = layouts[0]
    line = f"best: {best.candidate.describe()} at {best.cost.step_s:.4g} s/step"
    if len(layouts) > 1:
        nxt = layouts[1]
        parts = {"compute": nxt.cost.compute_s - best.cost.compute_s,
                 "bubble": nxt.cost.bubble_s - best.cost.bubble_s}
        for axis in best.cost.comm_s:
            parts[f"{axis} communication"] = nxt.cost.comm_s[axis] - best.cost.comm_s[axis]
        what = max(parts, key=parts.get)
        line += (f"; the next ({nxt.candidate.describe()}) is "
                 f"{nxt.cost.step_s / best.cost.step_s - 1:.1%} slower, most of it "
                 f"{what} (+{parts[what]:.3g} s)")
    unfit = facts.get("faster_unfit")
    if unfit is not None and unfit.cost.step_s < best.cost.step_s:
        line += (f"; memory forces it: {unfit.candidate.describe()} would take "
                 f"{unfit.cost.step_s:.4g} s but needs {format_bytes(unfit.memory_bytes)} "
                 f"> {format_bytes(limit)}")
    return line


def paste_yaml(e: Evaluated) -> str:
    """The ``parallelism:`` / ``recompute:`` / ``training.local_batch_size`` to paste."""
    lines = ["parallelism:"]
    for k, v in e.candidate.parallelism().items():
        lines.append(f"  {k}: {json.dumps(v)}")
    lines.append("recompute:")
    for k, v in RECOMPUTE_YAML[e.candidate.recompute].items():
        lines.append(f"  {k}: {json.dumps(v)}")
    lines += ["training:", f"  local_batch_size: {e.candidate.micro_batch}"]
    return "\n".join(lines)


def fitting_summary(cfg, world: int, limit: float, top: int = 3, *, source=None,
                    overrides=()) -> str:
    """For ``--check`` when the memory verdict is FAIL: ``these fit: ...`` (the advisor's best
    layouts on the config's device, recompute varied, and the micro-batch too up to
    ``VARY_ALL_UP_TO`` devices: beyond, the search would slow ``--check`` to minutes);
    ``source`` / ``overrides``: the config file and ``--set`` values, so that every layout
    listed loads (tools/layout_search.py's config check)."""
    profile = get_profile(BACKEND_PROFILE[plan_backend(cfg.context)])
    vary = VARY if world <= VARY_ALL_UP_TO else ("recompute",)
    layouts, _ = search(cfg, world, profile, limit, source=source, overrides=overrides,
                        vary=vary, top=top, time_unfit=False)
    if not layouts:
        return (f"these fit: none on {world} devices (python -m "
                f"mindformers_core.tools.plan_layout says what would)")
    return "these fit: " + "; ".join(
        f"{e.candidate.describe()}, recompute {e.candidate.recompute}, micro-batch "
        f"{e.candidate.micro_batch} ({format_bytes(e.memory_bytes)}, {e.cost.step_s:.3g} s/step)"
        for e in layouts) + " (python -m mindformers_core.tools.plan_layout for the YAML)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.plan_layout",
                                description=__doc__.split("\n\n")[0])
    add_run_config_arguments(p)
    p.add_argument("--world", type=int, required=True, help="number of devices (ranks)")
    p.add_argument("--device-memory", dest="device_memory", default=None,
                   help="memory of one device, with a unit: 64GiB, 80GB, 512MiB")
    p.add_argument("--device", default=None, help=f"device profile: {', '.join(sorted(PROFILES))}")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--json", action="store_true", help='print only {"layouts": [...]}')
    p.add_argument("--vary", default="", help=f"also vary: {','.join(VARY)}")
    p.add_argument("--calibration", default=None,
                   help="JSON of tools/calibrate_device.py (the CPU's measured rates)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args, code = parse_tool_args(build_parser(), argv)
    return code if code is not None else _run(args)


def _run(args) -> int:
    try:
        vary = [v for v in (x.strip() for x in args.vary.split(",")) if v]
        bad = [v for v in vary if v not in VARY]
        if bad:
            raise UsageError(f"--vary: expected a comma list of {', '.join(VARY)}, got {bad[0]!r}")
        if args.world < 1:
            raise UsageError(f"--world: must be >= 1, got {args.world}")
        if args.top < 1:
            raise UsageError(f"--top: must be >= 1, got {args.top}")
        cfg = load_run_config(args)
        profile, limit, _ = resolve_device(cfg, args.device, args.device_memory,
                                           args.calibration)
        layouts, facts = advise(cfg, args.world, profile, limit, source=args.config,
                                overrides=args.overrides, vary=vary, top=args.top)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"layouts": [e.to_json() for e in layouts]}, indent=2))
        return 0
    print(f"{facts['accepted']} layouts accepted on {args.world} x {profile.name} "
          f"({format_bytes(limit)} each); the {len(layouts)} fastest that fit:")
    print(format_table(layouts))
    print(why_best(layouts, facts, limit))
    print()
    print(paste_yaml(layouts[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
