"""Plot the LR curve of a run config, with warmup/decay boundaries marked.

    python -m mindformers_core.tools.plot_lr --config x.yaml --out lr.png [--set k=v ...] [--text]

matplotlib is optional: without it (or with ``--text``, or an ``--out`` not ending in
``.png``/``.pdf``/``.svg``) a text table of the lr at the key steps is written instead
(and printed). The curve covers steps ``0 .. total_steps`` (``training.steps``).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..core.lr import LRSchedule, build_lr_scheduler
from .cli import add_run_config_arguments, load_run_config

__all__ = ["plot_lr", "key_steps", "lr_table", "schedule_from", "main"]

_IMAGE_EXTS = (".png", ".pdf", ".svg")


def schedule_from(cfg_or_section: Any, total_steps: Optional[int] = None) -> Tuple[LRSchedule, int]:
    """(schedule, total_steps) from a RunConfig, an lr_scheduler section/dict, or a schedule.

    A RunConfig (anything with ``.lr_scheduler`` and ``.training.steps``) supplies its own
    total steps unless ``total_steps`` is given. A full config dict (with ``lr_scheduler``
    and ``training`` keys) works too.
    """
    if isinstance(cfg_or_section, LRSchedule):
        return cfg_or_section, total_steps or cfg_or_section.total_steps
    if hasattr(cfg_or_section, "lr_scheduler") and hasattr(cfg_or_section, "training"):
        steps = total_steps or cfg_or_section.training.steps
        return build_lr_scheduler(cfg_or_section.lr_scheduler, steps), steps
    if isinstance(cfg_or_section, dict) and "lr_scheduler" in cfg_or_section:
        training = cfg_or_section.get("training") or {}
        steps = total_steps or training.get("steps")
        if steps is None:
            raise ConfigError("training.steps", "required to draw the LR curve")
        return build_lr_scheduler(cfg_or_section["lr_scheduler"], steps), steps
    if total_steps is None:
        raise ConfigError("training.steps", "total_steps is required with a bare lr_scheduler "
                                            "section")
    return build_lr_scheduler(cfg_or_section, total_steps), total_steps


def key_steps(sched: LRSchedule, total_steps: int) -> List[int]:
    """Steps worth tabulating: 0, each boundary and the step before it, quarters, T-1, T."""
    marks = {0, total_steps - 1, total_steps}
    marks.update(total_steps * q // 4 for q in (1, 2, 3))
    for name, value in sched.boundaries().items():
        # *_steps entries are lengths/aliases, not positions; period is a length
        if isinstance(value, int) and not name.endswith("_steps") and name != "period":
            marks.update((value - 1, value))
    bounds = sched.boundaries()
    if "decay_start" in bounds and "decay_end" in bounds:
        marks.add((bounds["decay_start"] + bounds["decay_end"]) // 2)
    return sorted(s for s in marks if 0 <= s <= total_steps)


def lr_table(sched: LRSchedule, total_steps: int, steps: Optional[Iterable[int]] = None) -> str:
    """A text table ``step | lr | phase boundary`` at ``steps`` (default :func:`key_steps`)."""
    names: Dict[int, List[str]] = {}
    for name, value in sched.boundaries().items():
        if isinstance(value, int) and not name.endswith("_steps") and name != "period":
            names.setdefault(value, []).append(name)
    rows = [f"{sched.TYPE}  total_steps={total_steps}  peak_lr={sched.peak_lr:.6g}",
            f"{'step':>10}  {'lr':>14}  boundary"]
    for s in (key_steps(sched, total_steps) if steps is None else steps):
        rows.append(f"{s:>10d}  {sched.lr_at(s):>14.6e}  {', '.join(names.get(s, []))}".rstrip())
    return "\n".join(rows) + "\n"


def _curve(sched: LRSchedule, total_steps: int, max_points: int = 4000) -> Tuple[List[int], List[float]]:
    stride = max(1, total_steps // max_points)
    xs = list(range(0, total_steps + 1, stride))
    xs.extend(s for s in key_steps(sched, total_steps) if s % stride)  # keep the corners
    xs = sorted(set(xs))
    return xs, [sched.lr_at(s) for s in xs]


MATPLOTLIB_HINT = ("matplotlib is not installed, so {out} was not drawn: wrote the text table "
                   "{path} instead. Install the plot extra to get the image: "
                   "pip install -e '.[plot]' (or pip install matplotlib)")


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_lr(cfg_or_section: Any, total_steps: Optional[int], out_path: str,
            text: bool = False) -> str:
    """Draw the curve to ``out_path`` (PNG/PDF/SVG) with boundaries marked; returns the path.

    Falls back to a text table when matplotlib is missing, ``text`` is set or ``out_path``
    is not an image name: it is then written to ``out_path`` (``.txt`` replacing an image
    extension) and that path is returned.
    """
    sched, steps = schedule_from(cfg_or_section, total_steps)
    root, ext = os.path.splitext(out_path)
    image = ext.lower() in _IMAGE_EXTS
    if text or not image or not _have_matplotlib():
        path = root + ".txt" if image else out_path
        with open(path, "w", encoding="utf-8") as f:
            f.write(lr_table(sched, steps))
        if image and not text:
            warnings.warn(MATPLOTLIB_HINT.format(out=out_path, path=path), stacklevel=2)
        return path
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    xs, ys = _curve(sched, steps)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, ys, lw=1.5, color="tab:blue", label=sched.TYPE)
    colours = {"warmup_end": "tab:green", "decay_start": "tab:orange", "decay_end": "tab:red"}
    for name, value in sched.boundaries().items():
        if name in colours or name in ("cooldown_end", "first_min", "first_restart"):
            if isinstance(value, int) and 0 < value <= steps:
                ax.axvline(value, ls="--", lw=1, color=colours.get(name, "tab:gray"),
                           label=f"{name} = {value}")
    ax.set_xlabel("optimizer step (0-based)")
    ax.set_ylabel("learning rate")
    ax.set_title(f"{sched.TYPE}: peak {sched.peak_lr:.3g}, {steps} steps")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.plot_lr",
                                     description=__doc__.split("\n")[0])
    add_run_config_arguments(parser, mode=False)
    parser.add_argument("--out", default="lr.png", help="output .png/.pdf/.svg (or .txt)")
    parser.add_argument("--text", action="store_true", help="write a text table, not a plot")
    parser.add_argument("--steps", type=int, default=None, help="draw this many steps")
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args)
        sched, steps = schedule_from(cfg, args.steps)
        out = plot_lr(sched, steps, args.out, text=args.text)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if out.endswith(".txt"):
        with open(out, "r", encoding="utf-8") as f:
            sys.stdout.write(f.read())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
