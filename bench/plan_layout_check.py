"""The layout advisor against measurement on this CPU: predicted memory and step-time order of
the layouts it proposes for a GPT and a DeepSeek-V3 on 4 msrun workers, with a per-rank memory
cap that rules out plain data parallelism, vs the runs (2-3 steps each).

    python bench/plan_layout_check.py [--models gpt,dsv3] [--layouts 4] [--steps 3]

Every msrun job takes /work/wt/notes/msrun.lock (CPU contention fires MindSpore's collective
timeouts). Per run: rank 0's largest ``rss_mb`` in metrics.jsonl against the advisor's
``memory_bytes_per_rank``, and the median ``step_time_s`` after the first step against
``step_time_s``; then the number of adjacent swaps (inversions) between the predicted and the
measured order. Results: bench/results/plan_layout_check.json (docs/plan_layout.md). Measured
step times on this shared, loaded machine are noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.config import load_config   # noqa: E402
from mindformers_core.core.device_profiles import get_profile   # noqa: E402
from mindformers_core.tools.layout_search import candidate_overrides, search   # noqa: E402

LOCK = "/work/wt/notes/msrun.lock"
#: the models: a config, the overrides that make activations matter, the per-rank cap
MODELS = {
    "gpt": ("configs/data_parallel.yaml",
            ["model.hidden_size=256", "model.num_layers=4", "model.seq_length=256",
             "model.vocab_size=4096", "model.num_attention_heads=8",
             "training.local_batch_size=4", "training.global_batch_size=16"], "680MiB"),
    "dsv3": ("configs/muon_deepseek_v3_tiny.yaml",
             ["model.seq_length=256", "model.hidden_size=128", "model.num_layers=4",
              "model.n_routed_experts=8", "training.local_batch_size=4",
              "training.global_batch_size=16", "train_dataset.type=SyntheticMarkov"], "660MiB"),
}
RUN = ["training.steps={steps}", "checkpoint.enable_save=False"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(config, overrides, out_dir, workers=4, timeout=600):
    """(largest rss_mb of rank 0, median step_time_s after the first step) of one msrun job."""
    cmd = (f"python run_mindformer.py --config {config} --mode 1 --output_dir {out_dir} "
           + " ".join("--set " + shlex.quote(o) for o in overrides))
    # the time limit starts once the lock is held (other jobs may hold it for long)
    proc = subprocess.run(["flock", LOCK, "timeout", str(timeout), "bash",
                           "scripts/msrun_launcher.sh", cmd, str(workers), str(_port()),
                           os.path.join(out_dir, "logs"), "True", "300"], cwd=ROOT,
                          capture_output=True, text=True)
    path = os.path.join(out_dir, "metrics.jsonl")
    if proc.returncode != 0 or not os.path.exists(path):
        return None, None, (proc.stdout + proc.stderr)[-1500:]
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    rss = max(r.get("rss_mb", 0.0) for r in rows)
    times = [r["step_time_s"] for r in rows[1:]] or [rows[-1]["step_time_s"]]
    return rss, statistics.median(times), ""


def inversions(order):
    return sum(1 for i in range(len(order)) for j in range(i + 1, len(order))
               if order[i] > order[j])


def check_model(name, layouts_n, steps, out_root):
    config, overrides, cap = MODELS[name]
    cfg = load_config(config, overrides=overrides)
    from mindformers_core.tools.plan_layout import parse_device_memory
    limit = parse_device_memory(cap)
    profile = get_profile("cpu")
    capped, _ = search(cfg, 4, profile, limit, source=config, overrides=overrides, top=1)
    every, _ = search(cfg, 4, profile, float("inf"), source=config, overrides=overrides,
                      top=100)
    # the capped top layout, then the fastest of each other kind (sizes, FSDP or not)
    kind = lambda e: (e.candidate.tp, e.candidate.pp, e.candidate.ep, e.candidate.cp,
                      e.candidate.strategy == "optim_grads_params")
    found = list(capped)
    for e in every:
        if len(found) >= layouts_n:
            break
        if all(kind(e) != kind(f) for f in found):
            found.append(e)
    results = []
    for i, e in enumerate(found):
        out_dir = os.path.join(out_root, f"{name}_{i}")
        t0 = time.monotonic()
        rss, step, err = run_layout(config, overrides + candidate_overrides(e.candidate)
                                    + [o.format(steps=steps) for o in RUN], out_dir)
        results.append({"layout": e.candidate.describe(), "recompute": e.candidate.recompute,
                        "predicted_memory_mb": e.memory_bytes / 2 ** 20,
                        "measured_rss_mb": rss, "predicted_step_s": e.cost.step_s,
                        "measured_step_s": step, "wall_s": time.monotonic() - t0,
                        "error": err})
        print(json.dumps(results[-1]), flush=True)
    ran = sorted((r for r in results if r["measured_step_s"] is not None),
                 key=lambda r: r["predicted_step_s"])
    measured_rank = sorted(range(len(ran)), key=lambda k: ran[k]["measured_step_s"])
    return {"model": name, "cap": cap, "layouts": results,
            "order_inversions": inversions([measured_rank.index(k) for k in range(len(ran))]),
            "capped_top": results[0]["layout"] if capped else None,
            "top_memory_error": (results[0]["predicted_memory_mb"] /
                                 results[0]["measured_rss_mb"] - 1)
            if capped and results[0]["measured_rss_mb"] else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt,dsv3")
    p.add_argument("--layouts", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="/tmp/plan_layout_check")
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results",
                                                     "plan_layout_check.json"))
    args = p.parse_args(argv)
    report = [check_model(m, args.layouts, args.steps, args.out)
              for m in args.models.split(",")]
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    for r in report:
        print(f"{r['model']}: top under {r['cap']} {r['capped_top']}, memory error "
              f"{r['top_memory_error']}, order inversions {r['order_inversions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
