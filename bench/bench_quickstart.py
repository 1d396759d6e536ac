"""The README's command 1: ``python run_mindformer.py --config configs/quickstart.yaml --mode 1``.

Runs it in a fresh interpreter (as a user does) and records its wall time, the CPU time of the
process (user + system: less sensitive than wall time to other jobs on a shared machine), the
held-out loss of the first and the last evaluation and how much it fell, the median step
tokens/s, and whether the end-of-run sample was printed.

    python bench/bench_quickstart.py [--quick] [--save | --out PATH]

Writes output/bench/quickstart.json (untracked;
bench/results/quickstart.json with ``--save``, or ``--out PATH``).

``--quick`` runs 100 of the 300 steps (same schedule shape: ``training.steps=100``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402


def run(steps=None) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "run_mindformer.py", "--config", "configs/quickstart.yaml",
               "--mode", "1", "--output_dir", out, "--set", "checkpoint.enable_save=False"]
        if steps is not None:
            cmd += ["--set", f"training.steps={steps}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"quickstart exited {proc.returncode}: {proc.stdout[-1500:]}")
        with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
    evals = [r["eval_loss"] for r in rows if "eval_tokens" in r]
    return {
        "steps": len(rows),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "first_eval_loss": evals[0],
        "last_eval_loss": evals[-1],
        "eval_fall_pct": 100.0 * (1.0 - evals[-1] / evals[0]),
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows),
        "sample_printed": "sample (greedy, " in proc.stdout,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100 steps instead of 300")
    add_output_args(p, "quickstart")
    args = p.parse_args(argv)
    res = run(100 if args.quick else None)
    res["cpu_count"] = os.cpu_count()
    for key, value in res.items():
        print(f"{key:<22} {value:.4g}" if isinstance(value, float) else f"{key:<22} {value}")
    write_json(output_path(args, "quickstart"), res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
