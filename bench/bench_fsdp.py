"""Fully sharded data parallel bench: per-rank bytes and peak RSS, 1 process vs 2 msrun workers.

    python bench/bench_fsdp.py [--steps 3] [--save | --out PATH] [--set KEY=VALUE ...]
                               [--strategies optim optim_grads optim_grads_params] [--quick]

Runs the real Trainer (configs/markov_check.yaml with a GPT large enough for the weights to
dominate the resident set: hidden 512, 4 layers, vocabulary 8192, AdamW) for a few steps on

* 1 process (global batch 2 as 2 micro-batches),
* 2 msrun CPU workers (scripts/msrun_launcher.sh) under ``data_parallel_shard_strategy``
  ``optim`` (ZeRO-1), ``optim_grads`` and ``optim_grads_params`` (global batch 2),

one after the other, and prints per rank: the measured bytes of parameters (the optimizer's
Parameters as stored), reduced gradients (what the optimizer receives) and optimizer state
(``zero.optimizer_state_bytes``), the memory plan's numbers for the same items (what
``--check`` and the start-of-run log print), and the process's peak resident set (``VmHWM``).

Writes output/bench/fsdp.json (untracked;
bench/results/fsdp.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "distributed"))   # msrun_util
sys.path.insert(0, os.path.join(ROOT, "tests", "core"))          # rss_worker

from bench.output import add_output_args, output_path, write_json  # noqa: E402

MODEL = ["model.vocab_size=8192", "model.hidden_size=512", "model.num_layers=4",
         "model.num_attention_heads=8", "model.seq_length=64",
         "train_dataset.markov_vocab_size=256"]
RUN = ["training.local_batch_size=1", "training.global_batch_size=2", "training.jit=none",
       "checkpoint.enable_save=False", "training.log_interval=1"]
STRATEGIES = ("optim", "optim_grads", "optim_grads_params")
ITEMS = ("parameters", "gradients", "optimizer state")


def worker(out_dir: str, steps: int, overrides) -> None:
    """One rank (or the single process): train, then write its measured bytes and RSS."""
    import mindspore as ms
    from mindformers_core.config import load_config
    from mindformers_core.core.memory_plan import plan_memory
    from mindformers_core.distributed.zero import optimizer_state_bytes
    from mindformers_core.trainer import Trainer
    from rss_worker import peak_rss_bytes
    ms.runtime.launch_blocking()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = load_config(os.path.join(ROOT, "configs", "markov_check.yaml"),
                      overrides=[f"training.steps={steps}"] + MODEL + RUN + list(overrides))
    run_dir = os.path.join(out_dir, "run")
    trainer = Trainer(cfg, run_dir, overwrite=True)
    seen = {}

    def record(step, grads):
        seen["gradients"] = sum(int(g.nbytes) for g in grads if g is not None)
        return grads
    trainer.grad_hooks.append(record)
    trainer.train()
    plan = plan_memory(cfg, trainer.parallel.world_size)
    out = {"parameters": sum(int(p.nbytes) for p in trainer.optimizer.parameters),
           "gradients": seen["gradients"],
           "optimizer state": int(optimizer_state_bytes(trainer.optimizer)),
           "plan": {k: int(plan.items[k]) for k in ITEMS},
           "peak_rss": peak_rss_bytes(), "world": trainer.parallel.world_size}
    write_json(os.path.join(out_dir, f"rank{trainer.rank}.json"), out, indent=None)


def run(label: str, workers: int, steps: int, overrides) -> list:
    from msrun_util import launch
    with tempfile.TemporaryDirectory() as tmp:
        args = " ".join(f"--set {o}" for o in overrides)
        cmd = f"python {os.path.abspath(__file__)} --worker {tmp} --steps {steps} {args}"
        if workers == 1:
            proc = subprocess.run(cmd.split(), cwd=ROOT, capture_output=True, text=True)
        else:
            proc, _ = launch(cmd, os.path.join(tmp, "logs"), workers=workers)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(workers)]


def table(results: dict) -> list:
    """One row per run and rank: measured bytes, plan, peak RSS, and their ratios to 1 process."""
    one = results["1 process"][0]
    total_one = sum(one[k] for k in ITEMS)
    mib = 2.0 ** 20
    rows = []
    for label, ranks in results.items():
        for r, res in enumerate(ranks):
            total = sum(res[k] for k in ITEMS)
            rows.append({"run": label, "rank": r,
                         "bytes_vs_1_process": total / total_one,
                         "peak_rss_vs_1_process": res["peak_rss"] / one["peak_rss"],
                         "peak_rss_mib": res["peak_rss"] / mib,
                         **{f"{k}_mib": res[k] / mib for k in ITEMS},
                         "plan_mib": sum(res["plan"].values()) / mib})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="1 step, 1 process vs optim_grads_params only")
    add_output_args(ap, "fsdp")
    ap.add_argument("--worker")
    ap.add_argument("--set", action="append", default=[],
                    help="config overrides of every run (e.g. model.hidden_size=1024)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.set)
        return 0
    steps, strategies = (1, ["optim_grads_params"]) if args.quick else \
        (args.steps, args.strategies)
    results = {"1 process": run("1 process", 1, steps, args.set)}
    for s in strategies:
        results[f"2 workers {s}"] = run(s, 2, steps, args.set
                                        + [f"parallelism.data_parallel_shard_strategy={s}"])
    rows = table(results)
    print(f"{'run':<30}{'rank':>5}" + "".join(f"{k:>17}" for k in ITEMS)
          + f"{'sum/1 proc':>12}{'plan sum':>12}{'peak RSS':>11}{'RSS/1 proc':>11}")
    for row in rows:
        print(f"{row['run']:<30}{row['rank']:>5}"
              + "".join(f"{row[k + '_mib']:>13.1f} MiB" for k in ITEMS)
              + f"{row['bytes_vs_1_process']:>12.3f}{row['plan_mib']:>8.1f} MiB"
              + f"{row['peak_rss_mib']:>7.0f} MiB{row['peak_rss_vs_1_process']:>11.3f}")
    write_json(output_path(args, "fsdp"),
               {"settings": MODEL + RUN + args.set, "steps": steps, "runs": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
