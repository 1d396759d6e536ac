"""Cost of ``lr_at`` per schedule type (target: < 5 microseconds per call).

    python bench/bench_lr.py [--calls 20000]

Prints a table and writes output/bench/lr.json (untracked; bench/results/lr.json with
``--save``, or ``--out PATH``). Steps sweep 0 .. 2*total_steps so every phase (warmup, stable,
decay, hold) is timed; ``group_lrs`` for 4 groups is timed as well.
"""
import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.core.lr import build_lr_scheduler, group_lrs  # noqa: E402

T = 10_000
SECTIONS = {
    "ConstantWarmUpLR": {"learning_rate": 1e-3, "warmup_ratio": 0.01},
    "LinearWithWarmUpLR": {"learning_rate": 1e-3, "warmup_ratio": 0.01},
    "CosineWithWarmUpLR": {"learning_rate": 1e-3, "warmup_ratio": 0.01, "lr_end": 1e-5},
    "CosineWithRestartsAndWarmUpLR": {"learning_rate": 1e-3, "warmup_steps": 100,
                                      "num_cycles": 3.0},
    "PolynomialWithWarmUpLR": {"learning_rate": 1e-3, "warmup_steps": 100, "power": 2.0},
    "WarmUpStableDecayLR": {"learning_rate": 1e-3, "warmup_steps": 100,
                            "decay_start_ratio": 0.8, "decay_style": "1-sqrt"},
    "ConstantWithCoolDownLR": {"learning_rate": 1e-3, "warmup_steps": 100, "keep_steps": 5000,
                               "decay_steps": 3000, "final_steps": 500, "lr_end1": 1e-5},
    "CosineAnnealingLR": {"base_lr": 1e-3, "t_max": 5000},
    "CosineAnnealingWarmRestarts": {"base_lr": 1e-3, "t_0": 100, "t_mult": 2},
    "InverseSqrtLR": {"learning_rate": 1e-3, "warmup_steps": 400},
    "LearningRateWiseLayer": {"lr_scale": 0.5, "base_lr": {"type": "CosineWithWarmUpLR",
                                                           "learning_rate": 1e-3}},
}


def time_calls(fn, steps, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for s in steps:
            fn(s)
        best = min(best, time.perf_counter() - t0)
    return best / len(steps) * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--fail-slow", action="store_true",
                        help="exit 1 when a schedule misses the 5 us target (a timing gate is "
                             "only meaningful on an idle machine, so it is opt-in)")
    add_output_args(parser, "lr")
    args = parser.parse_args(argv)
    stride = max(1, 2 * T // args.calls)
    steps = list(range(0, 2 * T, stride))[: args.calls]
    rows = []
    for kind, extra in SECTIONS.items():
        sched = build_lr_scheduler({"type": kind, **extra}, T)
        rows.append({"schedule": kind, "us_per_call": time_calls(sched.lr_at, steps)})
    cos = build_lr_scheduler({"type": "CosineWithWarmUpLR", "learning_rate": 1e-3,
                              "warmup_ratio": 0.01}, T)
    groups = [{"lr_mult": 1.0}, {"lr_mult": 20.0}, {"max_lr": 2e-3, "min_lr": 1e-5}, {}]
    rows.append({"schedule": "group_lrs(4 groups, CosineWithWarmUpLR)",
                 "us_per_call": time_calls(lambda s: group_lrs(cos, groups, s), steps)})
    width = max(len(r["schedule"]) for r in rows)
    print(f"{'schedule':<{width}}  us/call  (< 5 us target for lr_at)")
    for r in rows:
        flag = "" if r["us_per_call"] < 5 or r["schedule"].startswith("group_lrs") else "  SLOW"
        print(f"{r['schedule']:<{width}}  {r['us_per_call']:7.3f}{flag}")
    worst = max(r["us_per_call"] for r in rows if not r["schedule"].startswith("group_lrs"))
    path = write_json(output_path(args, "lr"),
                      {"benchmark": "lr_at", "total_steps": T, "calls": len(steps),
                       "python": platform.python_version(), "machine": platform.machine(),
                       "target_us": 5.0, "within_target": worst < 5.0, "results": rows})
    print(f"wrote {path}")
    return 1 if args.fail_slow and worst >= 5.0 else 0


if __name__ == "__main__":
    sys.exit(main())
