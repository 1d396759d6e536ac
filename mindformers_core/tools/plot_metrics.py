"""Loss, held-out loss and lr curves of a run from its ``metrics.jsonl``, to a PNG.

    python -m mindformers_core.tools.plot_metrics output/metrics.jsonl --out output/curves.png

For runs without TensorBoard. Two panels: training loss per step (and its 20-step moving
mean) with the held-out ``eval_loss`` of the evaluation steps; the applied lr below. Needs
matplotlib (``pip install -e .[plot]``). ``read_metrics`` is the curve data, usable without
matplotlib.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List

__all__ = ["read_metrics", "moving_mean", "plot_metrics", "main"]


def read_metrics(path: str) -> Dict[str, List]:
    """``step``, ``loss``, ``lr`` of every training row, ``eval_step``/``eval_loss`` of the
    evaluation rows; lines cut by a kill mid-write are skipped."""
    out: Dict[str, List] = {"step": [], "loss": [], "lr": [], "eval_step": [], "eval_loss": []}
    with open(path, "r", encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("loss") is not None:
                out["step"].append(int(row["step"]))
                out["loss"].append(float(row["loss"]))
                out["lr"].append(float(row["lr"]))
            if "eval_tokens" in row:   # an evaluation step (other rows carry the latest value)
                out["eval_step"].append(int(row["step"]))
                out["eval_loss"].append(float(row["eval_loss"]))
    return out


def moving_mean(values: List[float], window: int) -> List[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_metrics(path: str, out: str, window: int = 20) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise SystemExit("plot_metrics needs matplotlib: pip install -e .[plot]") from None
    data = read_metrics(path)
    if not data["step"]:
        raise ValueError(f"{path} has no training rows")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(data["step"], data["loss"], color="0.75", lw=0.8, label="loss")
    top.plot(data["step"], moving_mean(data["loss"], window), color="C0",
             label=f"loss ({window}-step mean)")
    if data["eval_step"]:
        top.plot(data["eval_step"], data["eval_loss"], "o-", color="C3", label="held-out loss")
    top.set_ylabel("nats / token")
    top.legend()
    top.grid(alpha=0.3)
    bottom.plot(data["step"], data["lr"], color="C2")
    bottom.set_ylabel("lr")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.plot_metrics",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="metrics.jsonl of a run")
    p.add_argument("--out", required=True, help="image to write (.png, .pdf, .svg)")
    p.add_argument("--window", type=int, default=20, help="moving-mean window (steps)")
    args = p.parse_args(argv)
    try:
        print(f"wrote {plot_metrics(args.metrics, args.out, args.window)}")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
