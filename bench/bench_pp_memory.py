"""Pipeline-parallel memory bench: what a pp2 rank holds against one process.

    python bench/bench_pp_memory.py [--hidden 512] [--layers 8] [--steps 2] [--save | --out PATH]

Runs the same Trainer config (configs/markov_check.yaml, a GPT of ``--layers`` layers of width
``--hidden``, AdamW, global batch 4 as 4 micro-batches) on one process and on 2 msrun CPU
workers with ``pipeline_parallel: 2`` (one stage each), and reports per rank

* held parameter bytes: the sum over ``model.get_parameters()`` of the data each parameter
  holds now (distributed/pipeline_release.py ``held_parameter_bytes``: a released parameter
  counts 0), next to the whole model's;
* the memory plan's parameter bytes of the busiest stage (core/memory_plan.py);
* optimizer state bytes (``optimizer.state_dict()`` arrays: moments of the stage's parameters);
* the resident set size after the steps and its peak (``ru_maxrss``; the peak includes the
  seeded build of the whole model, which every rank runs before it releases the other stages'
  parameters).

Memory numbers do not depend on the machine's load, so the two runs go one after the other.

Writes output/bench/pp_memory.json (untracked;
bench/results/pp_memory.json with ``--save``, or ``--out PATH``).
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

from bench.output import add_output_args, output_path, write_json  # noqa: E402


def overrides(hidden: int, layers: int, steps: int, pp: int):
    return [f"training.steps={steps}", "training.local_batch_size=1",
            "training.global_batch_size=4", "model.seq_length=32",
            f"model.hidden_size={hidden}", f"model.num_layers={layers}",
            "model.num_attention_heads=4", "checkpoint.enable_save=False",
            f"parallelism.pipeline_parallel={pp}"]


def worker(out_dir: str, hidden: int, layers: int, steps: int, pp: int) -> None:
    """One rank: train, then write what it holds to ``pp{pp}.rank{r}.json``."""
    import resource
    import mindspore as ms
    import numpy as np
    from mindformers_core.config import load_config
    from mindformers_core.core.memory_plan import plan_memory
    from mindformers_core.distributed.pipeline_release import held_parameter_bytes
    from mindformers_core.trainer import Trainer
    from mindformers_core.trainer.throughput import rss_bytes
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = load_config(os.path.join(ROOT, "configs", "markov_check.yaml"),
                      overrides=overrides(hidden, layers, steps, pp))
    trainer = Trainer(cfg, os.path.join(out_dir, f"run_pp{pp}"), overwrite=True)
    trainer.train()
    optim = sum(int(np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v).nbytes)
                for v in trainer.optimizer.state_dict().values()
                if isinstance(v, np.ndarray) or hasattr(v, "asnumpy"))
    row = {"pp": pp, "rank": trainer.rank,
           "held_param_bytes": held_parameter_bytes(trainer.model),
           "model_param_bytes": 4 * sum(trainer.parameter_sizes().values()),
           "planned_param_bytes": plan_memory(cfg, pp).items["parameters"],
           "optimizer_state_bytes": optim,
           "rss_bytes": rss_bytes(),
           "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    write_json(os.path.join(out_dir, f"pp{pp}.rank{trainer.rank}.json"), row, indent=None)


def run(hidden: int, layers: int, steps: int) -> list:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, os.path.abspath(__file__), "--worker", tmp, "--hidden",
                str(hidden), "--layers", str(layers), "--steps", str(steps)]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(base + ["--pp", "1"], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=1800)
        cmd = " ".join(["python"] + base[1:] + ["--pp", "2"])
        proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), cmd,
                               "2", str(port), os.path.join(tmp, "logs"), "True", "600"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"pp2 job failed:\n{proc.stderr[-3000:]}")
        for name in ("pp1.rank0", "pp2.rank0", "pp2.rank1"):
            with open(os.path.join(tmp, f"{name}.json")) as fh:
                rows.append(json.load(fh))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--worker")
    ap.add_argument("--pp", type=int, default=1)
    add_output_args(ap, "pp_memory")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.hidden, a.layers, a.steps, a.pp)
        return
    rows = run(a.hidden, a.layers, a.steps)
    mib = 2.0 ** 20
    print(f"GPT hidden {a.hidden}, {a.layers} layers, AdamW, {a.steps} steps")
    print(f"{'run':<10} {'held params MiB':>16} {'of model MiB':>13} {'plan MiB':>9} "
          f"{'optim MiB':>10} {'RSS MiB':>9} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"pp{r['pp']} rank{r['rank']:<3} {r['held_param_bytes'] / mib:>16.1f} "
              f"{r['model_param_bytes'] / mib:>13.1f} {r['planned_param_bytes'] / mib:>9.1f} "
              f"{r['optimizer_state_bytes'] / mib:>10.1f} "
              f"{r['rss_bytes'] / mib:>9.0f} {r['peak_rss_bytes'] / mib:>13.0f}")
    write_json(output_path(a, "pp_memory"), rows, indent=1)


if __name__ == "__main__":
    main()
