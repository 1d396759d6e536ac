"""AdamW step: ours vs torch.optim.AdamW (fused=True and foreach), alternating, paired processes.

For each size (default 10M and 50M fp32 parameters) the parameters have the shapes of a GPT
(token embedding, output layer, per layer qkv / proj / fc1 / fc2 matrices and two norm
vectors, a final norm: :func:`gpt_shapes`), so per-tensor overheads count as in training.
Each contender runs in its own worker process (importing torch into a MindSpore process
made MindSpore's CPU kernels ~6x slower in synchronous PyNative, measured with MindSpore 2.10
and torch 2.13, so one process would not time either side as it runs in training). Both get
the same random fp32 parameters and gradients and the same thread count (``--threads``,
default 1: a fair ratio on a machine shared with other jobs); ours dispatches synchronously
as the trainer does on CPU (``trainer/pynative.py``) unless ``--asynchronous``. Round r times
one step of each contender, the order rotating every round, every step ending with a host
sync; reported per contender: the median ns/param, and per torch variant the median of the
per-round ratios ours/torch (pairing rounds cancels most of a shared machine's drift). After
the timing the workers' updated parameters are compared (max relative difference), so the
bench cannot time a no-op.

torch is the optional ``bench`` extra (setup.py), never a runtime dependency; without it the
bench prints that it is skipped.

    python bench/bench_adamw_torch.py                       # 10M and 50M, 1 thread
    python bench/bench_adamw_torch.py --sizes 1e7 --rounds 5 --threads 2
    python bench/bench_adamw_torch.py --save                # bench/results/adamw_torch.json

Without ``--save`` (or ``--out PATH``) the JSON goes to ``output/bench/adamw_torch.json``
(untracked).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


def gpt_shapes(n: int) -> List[Tuple[int, ...]]:
    """Parameter shapes of an untied GPT with about ``n`` parameters: hidden h = 64 below 2M,
    256 below 20M, else 512; vocab 32h, ffn 4h, and as many layers as bring the total closest
    to ``n``."""
    h = 64 if n < 2e6 else 256 if n < 2e7 else 512
    v, f = 32 * h, 4 * h
    per_layer = [(3 * h, h), (h, h), (f, h), (h, f), (h,), (h,)]
    layer_numel = sum(int(np.prod(s)) for s in per_layer)
    layers = max(1, round((n - 2 * v * h - h) / layer_numel))
    return [(v, h)] + per_layer * layers + [(h,), (v, h)]


def _arrays(shapes, seed: int, scale: float = 1.0) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s, dtype=np.float32) * np.float32(scale)) for s in shapes]


def _ours(shapes, threads: int, asynchronous: bool):
    import mindspore as ms
    from mindspore import Parameter, Tensor
    ms.set_context(mode=ms.PYNATIVE_MODE)
    if threads:
        ms.set_context(runtime_num_threads=threads)
    if not asynchronous:  # as the trainer on CPU (trainer/pynative.py), before the first op
        from mindformers_core.trainer.pynative import apply_pynative_synchronize
        apply_pynative_synchronize(True)
    from mindformers_core.optim.adamw import AdamW
    params = [Parameter(Tensor(a), name=f"p{k}") for k, a in enumerate(_arrays(shapes, 0, 0.02))]
    grads = [Tensor(a) for a in _arrays(shapes, 1, 0.01)]
    opt = AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    one = Tensor(np.ones(1, np.float32))

    def step():
        opt.step(grads)
        (one + 0).asnumpy()  # PyNative runs ops in order: this waits for the step
    return step, lambda: np.concatenate([p.asnumpy().reshape(-1) for p in params])


def _torch(shapes, variant: str, threads: int):
    import torch
    if threads:
        torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.from_numpy(a)) for a in _arrays(shapes, 0, 0.02)]
    for p, g in zip(params, _arrays(shapes, 1, 0.01)):
        p.grad = torch.from_numpy(g)
    kw = {"fused": True} if variant == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kw)
    return opt.step, lambda: np.concatenate([p.detach().numpy().reshape(-1) for p in params])


def _worker(side: str, n: int, threads: int, asynchronous: bool) -> None:
    """Serve ``step`` lines on stdin with one timed step each; ``done`` sends the values."""
    shapes = gpt_shapes(n)
    step, values = (_ours(shapes, threads, asynchronous) if side == "ours"
                    else _torch(shapes, side.split("_", 1)[1], threads))
    _say({"ready": True})
    for line in sys.stdin:
        if line.strip() != "step":
            break
        t0 = time.perf_counter()
        step()
        _say({"time": time.perf_counter() - t0})
    path = os.path.join(tempfile.mkdtemp(prefix="bench_adamw_"), "values.npy")
    np.save(path, values())
    _say({"values": path})


def _say(obj) -> None:
    print("@@" + json.dumps(obj), flush=True)


class _Worker:
    def __init__(self, side: str, n: int, threads: int, asynchronous: bool):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--sizes", str(n),
               "--threads", str(threads)] + (["--asynchronous"] if asynchronous else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.ask(None)

    def ask(self, line):
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        for out in self.proc.stdout:
            if out.startswith("@@"):
                return json.loads(out[2:])
        raise RuntimeError(f"worker {self.proc.args} ended early (rc {self.proc.wait()})")

    def finish(self) -> np.ndarray:
        path = self.ask("done")["values"]
        self.proc.wait()
        return np.load(path)


def bench_size(n: int, rounds: int, warmup: int, threads: int = 1,
               asynchronous: bool = False) -> Dict:
    shapes = gpt_shapes(n)
    numel = sum(int(np.prod(s)) for s in shapes)
    names = ["ours", "torch_fused", "torch_foreach"]
    workers = {k: _Worker(k, n, threads, asynchronous) for k in names}
    times: Dict[str, List[float]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = workers[name].ask("step")["time"]
            if r >= warmup:
                times[name].append(t)
    final = {k: w.finish() for k, w in workers.items()}
    out = {"params": numel, "tensors": len(shapes), "rounds": rounds, "threads": threads,
           "pynative_synchronize": not asynchronous}
    for name in names:
        out[f"{name}_ns_per_param"] = statistics.median(times[name]) / numel * 1e9
    for key in names[1:]:
        out[f"ratio_to_{key}"] = statistics.median(
            a / b for a, b in zip(times["ours"], times[key]))
        out[f"max_rel_diff_to_{key}"] = float(
            np.max(np.abs(final["ours"] - final[key])) / np.max(np.abs(final[key])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e7, 5e7])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads of both sides (0: each framework's default)")
    ap.add_argument("--asynchronous", action="store_true",
                    help="PyNative's asynchronous dispatch (the trainer dispatches "
                         "synchronously on CPU: trainer/pynative.py)")
    add_output_args(ap, "adamw_torch")
    ap.add_argument("--worker", choices=["ours", "torch_fused", "torch_foreach"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="10M only, 3 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds, args.warmup = [1e7], 3, 1
    if args.worker:
        _worker(args.worker, int(args.sizes[0]), args.threads, args.asynchronous)
        return 0
    try:
        import torch
    except ImportError:
        print("bench_adamw_torch: torch is not installed (pip install torch==2.13.0); skipped")
        return 0
    from importlib.metadata import version
    rows = []
    print(f"{'params':>10} {'tensors':>7} {'ours ns/p':>9} {'fused':>7} {'foreach':>7} "
          f"{'x fused':>7} {'x foreach':>9} {'max rel diff':>12}  (threads {args.threads})")
    for size in args.sizes:
        r = bench_size(int(size), args.rounds, args.warmup, args.threads, args.asynchronous)
        rows.append(r)
        print(f"{r['params']:>10} {r['tensors']:>7} {r['ours_ns_per_param']:>9.2f} "
              f"{r['torch_fused_ns_per_param']:>7.2f} {r['torch_foreach_ns_per_param']:>7.2f} "
              f"{r['ratio_to_torch_fused']:>7.2f} {r['ratio_to_torch_foreach']:>9.2f} "
              f"{r['max_rel_diff_to_torch_fused']:>12.1e}", flush=True)
    path = write_json(output_path(args, "adamw_torch"),
                      {"machine": platform.platform(), "cpus": os.cpu_count(),
                       "threads": args.threads,
                       "pynative_synchronize": not args.asynchronous, "torch": torch.__version__,
                       "mindspore": version("mindspore"), "rows": rows}, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
