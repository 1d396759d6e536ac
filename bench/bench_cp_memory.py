"""Context-parallel memory bench: the step's activation bytes of a cp rank against one process.

    python bench/bench_cp_memory.py [--seq 4096] [--hidden 64] [--layers 2] [--method colossal]
                                    [--save | --out PATH]

Trains the same Trainer config (configs/markov_check.yaml: a GPT of ``--layers`` layers of
width ``--hidden``, 4 heads, sequence ``--seq``, AdamW, one sequence per step, 2 steps) on one
process and under ``context_parallel`` 2 and 4 on 2 and 4 msrun CPU workers (dp 1), and
reports per rank

* the steps' peak: the peak resident set size while the steps run minus the resident set size
  just before them (Linux: ``/proc/self/clear_refs`` resets the peak, ``VmHWM`` reads it), so
  what the model, the optimizer and the data loader already hold does not count. (Measured
  after a warm-up step instead, it shows only what outgrows the memory pool step 1 left.)
* the activation bytes: that peak minus the same run's at ``--baseline-seq`` tokens, where
  the activations are next to nothing and what stays is the first step's one-time
  allocations (the communicator's buffers, the kernels' workspaces, the pool's slack), about
  100 MiB a process here. At this shape the tiny model's parameters, gradients and AdamW
  moments are under 2 MiB: the rest is the forward's saved activations, the backward's
  workspace and the attention scores;
* the memory plan's activation bytes for the rank (core/memory_plan.py, which divides the
  sequence by cp) and its total.

Each side's activation ratio to one process's is printed next to the issue's bound (0.6 at cp2, 0.35 at
cp4). Memory does not depend on the machine's load, so the runs go one after the other.

Writes output/bench/cp_memory.json (untracked; bench/results/cp_memory.json with ``--save``,
or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

#: the issue's bound on a cp rank's activation bytes against one process's
BOUND = {2: 0.6, 4: 0.35}


def overrides(seq: int, hidden: int, layers: int, cp: int, method: str):
    return ["training.steps=2", "training.local_batch_size=1", "training.global_batch_size=1",
            f"model.seq_length={seq}", f"model.hidden_size={hidden}",
            f"model.num_layers={layers}", "model.num_attention_heads=4",
            "checkpoint.enable_save=False", "training.log_interval=1",
            f"parallelism.context_parallel={cp}"] + (
        [f"parallelism.context_parallel_method={method}"] if cp > 1 else [])


def peak_rss_bytes() -> int:
    """``VmHWM``: the peak resident set size since the last :func:`reset_peak`."""
    with open("/proc/self/status", encoding="ascii") as fh:
        return int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1)) * 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")


def worker(out_dir: str, seq: int, hidden: int, layers: int, cp: int, method: str) -> None:
    """One rank: build, reset the peak, train, write the step's peak to ``cp{cp}.rank{r}``."""
    import mindspore as ms
    from mindformers_core.config import load_config
    from mindformers_core.core.memory_plan import plan_memory
    from mindformers_core.trainer import Trainer
    from mindformers_core.trainer.throughput import rss_bytes
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = load_config(os.path.join(ROOT, "configs", "markov_check.yaml"),
                      overrides=overrides(seq, hidden, layers, cp, method))
    trainer = Trainer(cfg, os.path.join(out_dir, f"run_cp{cp}"), overwrite=True)
    plan = plan_memory(cfg, cp)
    before = rss_bytes()
    reset_peak()
    trainer.train()
    row = {"cp": cp, "seq": seq, "rank": trainer.rank, "seq_per_rank": seq // cp,
           "step_peak_bytes": peak_rss_bytes() - before,
           "planned_activation_bytes": plan.items["activations"],
           "planned_total_bytes": plan.total}
    write_json(os.path.join(out_dir, f"cp{cp}.rank{trainer.rank}.json"), row, indent=None)


def launch(base, cp: int, tmp: str, env) -> None:
    if cp == 1:
        subprocess.run(base + ["--cp", "1"], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=1800)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = " ".join(["python"] + base[1:] + ["--cp", str(cp)])
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), cmd,
                           str(cp), str(port), os.path.join(tmp, f"logs{cp}"), "True", "600"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"cp{cp} job failed:\n{proc.stderr[-3000:]}")


def run(seqs, hidden: int, layers: int, method: str) -> list:
    rows = []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for seq in seqs:
        with tempfile.TemporaryDirectory() as tmp:
            base = [sys.executable, os.path.abspath(__file__), "--worker", tmp, "--seq",
                    str(seq), "--hidden", str(hidden), "--layers", str(layers), "--method",
                    method]
            for cp in (1, 2, 4):
                launch(base, cp, tmp, env)
                for rank in range(cp):
                    with open(os.path.join(tmp, f"cp{cp}.rank{rank}.json")) as fh:
                        rows.append(json.load(fh))
    return rows


def summary(rows: list, seq: int, baseline_seq: int) -> list:
    """Per cp: the largest rank's activation bytes (its peak at ``seq`` minus its peak at
    ``baseline_seq``) and plan, and their ratios to one process's."""
    def of(cp, length):
        return [r for r in rows if r["cp"] == cp and r["seq"] == length]
    acts = {}
    for cp in sorted({r["cp"] for r in rows}):
        base = {r["rank"]: r["step_peak_bytes"] for r in of(cp, baseline_seq)}
        mine = of(cp, seq)
        acts[cp] = (max(r["step_peak_bytes"] for r in mine),
                    max(r["step_peak_bytes"] - base[r["rank"]] for r in mine),
                    max(r["planned_activation_bytes"] for r in mine), mine[0]["seq_per_rank"])
    out = []
    for cp, (peak, act, plan, per_rank) in acts.items():
        out.append({"cp": cp, "seq_per_rank": per_rank, "step_peak_bytes": peak,
                    "activation_bytes": act, "measured_ratio": act / acts[1][1],
                    "planned_activation_bytes": plan, "planned_ratio": plan / acts[1][2],
                    "bound": BOUND.get(cp)})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--baseline-seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--method", default="colossal", choices=("colossal", "ulysses"))
    ap.add_argument("--worker")
    ap.add_argument("--cp", type=int, default=1)
    add_output_args(ap, "cp_memory")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.seq, a.hidden, a.layers, a.cp, a.method)
        return
    rows = run((a.seq, a.baseline_seq), a.hidden, a.layers, a.method)
    table = summary(rows, a.seq, a.baseline_seq)
    mib = 2.0 ** 20
    print(f"GPT hidden {a.hidden}, {a.layers} layers, 4 heads, sequence {a.seq}, "
          f"{a.method}, one sequence per step")
    print(f"{'cp':>3} {'seq/rank':>9} {'peak MiB':>9} {'activations MiB':>16} {'ratio':>6} "
          f"{'plan MiB':>9} {'plan ratio':>11} {'bound':>6}")
    for r in table:
        bound = "" if r["bound"] is None else f"{r['bound']:.2f}"
        print(f"{r['cp']:>3} {r['seq_per_rank']:>9} {r['step_peak_bytes'] / mib:>9.1f} "
              f"{r['activation_bytes'] / mib:>16.1f} {r['measured_ratio']:>6.2f} "
              f"{r['planned_activation_bytes'] / mib:>9.1f} {r['planned_ratio']:>11.2f} "
              f"{bound:>6}")
    write_json(output_path(a, "cp_memory"), {"args": vars(a), "ranks": rows,
                                            "summary": table}, indent=1)


if __name__ == "__main__":
    main()
