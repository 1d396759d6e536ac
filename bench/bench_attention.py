"""Plain vs blockwise (``use_flash_attention``) causal attention on CPU: forward + backward time
and the peak RSS of a process that runs only one of them.

Time: rounds interleave the two paths (plain, blockwise, plain, ...) in one process and each
reports its best round, so a shared machine slows both alike. Memory: each path runs alone in a
fresh subprocess (``--child``), which reports ``ru_maxrss`` after one forward + backward, minus
its RSS before the attention (inputs already allocated).

    python bench/bench_attention.py                    # S = 1024, 4096
    python bench/bench_attention.py --seq 1024 --block 256

Writes output/bench/attention.json (untracked;
bench/results/attention.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402


def _inputs(b, n, s, d):
    import mindspore as ms
    rng = np.random.RandomState(0)
    q, k, v, w = (ms.Tensor(rng.standard_normal((b, n, s, d)).astype(np.float32))
                  for _ in range(4))
    bias = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, 0.0).astype(np.float32)
    mask = ms.Tensor(np.ascontiguousarray(np.broadcast_to(bias, (b, n, s, s))))
    return q, k, v, w, mask


def _step_fn(path, block, mask, w, scale):
    import mindspore as ms
    from mindformers_core.models.blockwise_attention import blockwise_causal_attention
    from mindformers_core.models.layers import causal_attention

    def loss(q, k, v):
        if path == "plain":
            ctx = causal_attention(q, k, v, scale, mask)[0]
        else:
            ctx = blockwise_causal_attention(q, k, v, scale, block)[0]
        return (ctx * w).sum()
    grad = ms.grad(loss, grad_position=(0, 1, 2))
    return lambda q, k, v: [g.asnumpy() for g in grad(q, k, v)]


def rss_mb() -> float:
    """Current resident set size of this process (MiB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def child(path, b, n, s, d, block) -> None:
    q, k, v, w, mask = _inputs(b, n, s, d)
    if path != "plain":
        mask = None    # the blockwise path never reads the [S, S] bias
    fn = _step_fn(path, block, mask, w, d ** -0.5)
    # the first backward allocates MindSpore's runtime and pools: warm up at the full size
    # with the other path's memory never touched (same op kinds, a short sequence)
    sq, sk, sv, sw, smask = _inputs(b, n, 2 * block, d)
    _step_fn(path, block, smask if path == "plain" else None, sw, d ** -0.5)(sq, sk, sv)
    base = rss_mb()
    fn(q, k, v)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"peak_mb": peak, "base_mb": base, "delta_mb": peak - base}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("PATH", "SEQ"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    add_output_args(ap, "attention")
    args = ap.parse_args()
    if args.quick and not args.child:
        args.seq, args.rounds = [512], 1
    if args.child:
        child(args.child[0], args.batch, args.heads, int(args.child[1]), args.dim, args.block)
        return
    # memory first: the children must not inherit what importing MindSpore here sets up
    mem = {}
    for s in args.seq:
        for p in ("plain", "blockwise"):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", p, str(s), "--batch",
                 str(args.batch), "--heads", str(args.heads), "--dim", str(args.dim),
                 "--block", str(args.block)], capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONPATH": ROOT})
            mem[(p, s)] = json.loads(out.stdout.strip().splitlines()[-1])["delta_mb"]
    results = []
    for s in args.seq:
        q, k, v, w, mask = _inputs(args.batch, args.heads, s, args.dim)
        fns = {p: _step_fn(p, args.block, mask, w, args.dim ** -0.5)
               for p in ("plain", "blockwise")}
        best = {p: float("inf") for p in fns}
        for p in fns:
            fns[p](q, k, v)    # warm up
        for _ in range(args.rounds):
            for p, fn in fns.items():
                t0 = time.perf_counter()
                fn(q, k, v)
                best[p] = min(best[p], time.perf_counter() - t0)
        row = {"seq": s, "block": args.block, "plain_s": best["plain"],
               "blockwise_s": best["blockwise"], "speedup": best["plain"] / best["blockwise"],
               "plain_delta_mb": mem[("plain", s)], "blockwise_delta_mb": mem[("blockwise", s)]}
        results.append(row)
        print(f"S={s:5d} block={args.block}: plain {row['plain_s'] * 1e3:8.1f} ms "
              f"(+{row['plain_delta_mb']:.0f} MB)  blockwise {row['blockwise_s'] * 1e3:8.1f} ms "
              f"(+{row['blockwise_delta_mb']:.0f} MB)  speedup {row['speedup']:.2f}x")
    write_json(output_path(args, "attention"), {"config": vars(args), "results": results}, indent=1)


if __name__ == "__main__":
    main()
