"""Newton-Schulz / Muon benchmark: our MindSpore NS vs numpy NS vs MindSpore's raw fp32 matmul.

All numbers come from one run, measured side by side (rounds interleave the contenders, and
each reports its best round), because the machine may be shared:

* ``matmul``: MindSpore fp32 ``ops.MatMul``: ``seq`` = the 15 matmuls of 5 NS steps (Gram,
  A (bI + cA), B X, in NS's layout) back to back with nothing else, i.e. the same work over the
  same duration as NS, which is the fair reference on a shared machine (the target ratio uses
  it); ``mix`` = the best time of each of the three shapes alone; ``peak`` = the best single
  matmul GFLOP/s of the run.
* ``ns``: ``newton_schulz.orthogonalize`` (5 default steps, fp32), GFLOP/s of its matmuls
  (5 * (4 s^2 l + 2 s^3) FLOPs for an s x l matrix, s the short side).
* ``numpy``: the textbook iteration in float32 numpy (transpose when tall,
  X <- aX + (bA + cA^2) X), same FLOP count.
* ``tiny DeepSeek-V3 set``: every Newton-Schulz piece Muon makes for the tiny DeepSeek-V3 preset
  (configs/model_presets/tiny_deepseek_v3.yaml), as Muon runs them (same-shape pieces batched) vs
  numpy one piece at a time; plus the time of one full ``Muon.step`` on that model.

Target (issue 6): NS reaches >= 80% of the fp32 matmul throughput for the 1024x4096 shapes.
With ``--convergence`` it also trains the tiny DeepSeek-V3 job (configs/muon_deepseek_v3_tiny.yaml)
with Muon (lr 2e-2, WSD) and with AdamW (lr 3e-3, WSD) and reports the steps each needs to bring
the 5-step mean excess loss (loss - corpus entropy floor) to ``--target-excess``.
Prints a table; writes output/bench/muon.json (untracked;
bench/results/muon.json with ``--save``, or ``--out PATH``).

    python bench/bench_muon.py              # 3 rounds
    python bench/bench_muon.py --rounds 5 --convergence
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import mindspore as ms  # noqa: E402
from mindspore import Tensor, ops  # noqa: E402

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.config.yaml_io import load_yaml_text  # noqa: E402
from mindformers_core.models.build import build_model  # noqa: E402
from mindformers_core.optim.muon import Muon  # noqa: E402
from mindformers_core.optim.muon_split import split_pieces  # noqa: E402
from mindformers_core.optim.newton_schulz import (DEFAULT_NS_COEFFICIENTS,  # noqa: E402
                                                  normalize_ns_schedule, ns_matmul_flops,
                                                  orthogonalize)

SCHEDULE = normalize_ns_schedule(list(DEFAULT_NS_COEFFICIENTS), 5)
SHAPES = [(1024, 1024), (1024, 4096), (4096, 1024)]
PRESET = os.path.join(ROOT, "configs", "model_presets", "tiny_deepseek_v3.yaml")
TARGET = 0.8


def numpy_ns(x: np.ndarray, schedule) -> np.ndarray:
    """Plain float32 numpy Newton-Schulz (the baseline)."""
    tall = x.shape[0] > x.shape[1]
    X = x.T if tall else x
    X = X / max(float(np.linalg.norm(X)), 1e-7)
    for a, b, c in schedule:
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if tall else X


def _best(fn, rounds_out: list) -> None:
    t0 = time.perf_counter()
    fn()
    rounds_out.append(time.perf_counter() - t0)


def _ms(fn):
    """Run a MindSpore closure and wait for its result (asnumpy syncs on CPU)."""
    def run():
        out = fn()
        (out[-1] if isinstance(out, (list, tuple)) else out).asnumpy()
    return run


def bench_shapes(rounds: int) -> list:
    mm = ops.MatMul()
    gram = ops.MatMul(transpose_b=True)
    rows = []
    for m, n in SHAPES:
        rng = np.random.default_rng(0)
        xn = rng.standard_normal((m, n)).astype(np.float32)
        s, l = min(m, n), max(m, n)
        x = Tensor(xn)
        wide = Tensor(np.ascontiguousarray(xn.T) if m > n else xn)      # (s, l)
        sq = Tensor(rng.standard_normal((s, s)).astype(np.float32))
        contenders = {
            "ns": (_ms(lambda: orthogonalize(x, SCHEDULE)), ns_matmul_flops((m, n), 5)),
            "numpy": (lambda: numpy_ns(xn, SCHEDULE), ns_matmul_flops((m, n), 5)),
            "mm_gram": (_ms(lambda: gram(wide, wide)), 2 * s * s * l),
            "mm_square": (_ms(lambda: mm(sq, sq)), 2 * s ** 3),
            "mm_update": (_ms(lambda: mm(sq, wide)), 2 * s * s * l),
            # the 15 matmuls of 5 NS steps back to back, nothing else: the same work for the
            # same duration as "ns", so both see the same machine load
            "mm_seq": (_ms(lambda: _matmul_sequence(x, sq, m > n, len(SCHEDULE))),
                       ns_matmul_flops((m, n), len(SCHEDULE))),
        }
        for fn, _ in contenders.values():      # warm-up (kernel selection, caches)
            fn()
        times = {k: [] for k in contenders}
        for _ in range(rounds):
            for k, (fn, _) in contenders.items():
                _best(fn, times[k])
        gflops = {k: contenders[k][1] / min(times[k]) / 1e9 for k in contenders}
        # the matmul mix of one NS step, weighted by FLOPs: 2 s^2 l + 2 s^3 + 2 s^2 l
        mix_time = (min(times["mm_gram"]) + min(times["mm_square"]) + min(times["mm_update"]))
        mix = (4 * s * s * l + 2 * s ** 3) / mix_time / 1e9
        rows.append({"shape": [m, n], "ns_gflops": gflops["ns"], "numpy_gflops": gflops["numpy"],
                     "matmul_gflops": {k[3:]: gflops[k] for k in gflops
                                       if k.startswith("mm_") and k != "mm_seq"},
                     "matmul_sequence_gflops": gflops["mm_seq"],
                     "matmul_mix_gflops": mix, "ns_time_s": min(times["ns"]),
                     "numpy_time_s": min(times["numpy"])})
    return rows


_MM = ops.MatMul()
_GRAM_WIDE = ops.MatMul(transpose_b=True)
_GRAM_TALL = ops.MatMul(transpose_a=True)


def _matmul_sequence(x, sq, tall, steps):
    """The matmuls of `steps` NS steps on x in NS's own layout (Gram on the short side)."""
    out = None
    for _ in range(steps):
        if tall:
            out = (_GRAM_TALL(x, x), _MM(sq, sq), _MM(x, sq))
        else:
            out = (_GRAM_WIDE(x, x), _MM(sq, sq), _MM(sq, x))
    return out


def _tiny_model():
    with open(PRESET) as f:
        return build_model(load_yaml_text(f.read())["model"], seed=0)


def bench_tiny_set(rounds: int) -> dict:
    model = _tiny_model()
    params = model.trainable_params()
    opt = Muon(params, model=model, qk_clip_enabled=False)
    rng = np.random.default_rng(1)
    grads = [Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in params]
    pieces = []
    for i, p in enumerate(opt.parameters):
        if opt.muon_mask[i]:
            pieces.extend(split_pieces(opt.split_rule(i), grads[i]))
    buckets = {}
    for t in pieces:
        buckets.setdefault(tuple(t.shape[-2:]), []).append(t)
    np_pieces = [t.asnumpy() for t in pieces]
    flops = sum(ns_matmul_flops(t.shape, 5) for t in pieces)

    def ours():
        out = []
        for items in buckets.values():
            out.extend(opt.orthogonalize_many(items))
        return out

    def numpy_all():
        for x in np_pieces:
            if x.ndim == 3:
                for xi in x:
                    numpy_ns(xi, SCHEDULE)
            else:
                numpy_ns(x, SCHEDULE)

    def step():
        opt.step(grads)
        params[0].asnumpy()

    contenders = {"ns_batched": _ms(ours), "numpy": numpy_all, "muon_step": step}
    for fn in contenders.values():
        fn()
    times = {k: [] for k in contenders}
    for _ in range(rounds):
        for k, fn in contenders.items():
            _best(fn, times[k])
    return {"num_pieces": len(pieces), "num_ns_calls": sum(1 for _ in buckets), "flops": flops,
            "pieces": sorted({str(tuple(t.shape)) for t in pieces}),
            "ns_gflops": flops / min(times["ns_batched"]) / 1e9,
            "numpy_gflops": flops / min(times["numpy"]) / 1e9,
            "ns_time_s": min(times["ns_batched"]), "numpy_time_s": min(times["numpy"]),
            "muon_step_time_s": min(times["muon_step"])}


CONVERGENCE_CONFIG = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
ADAMW_SECTION = "optimizer={type: AdamW, betas: [0.9, 0.95], eps: 1.e-8, weight_decay: 0.1}"


def _steps_to_excess(rows, target: float, window: int = 5):
    """First step whose mean excess loss over the last `window` steps is <= target."""
    excess = [r["excess_loss"] for r in rows]
    for k in range(window, len(excess) + 1):
        if sum(excess[k - window:k]) / window <= target:
            return rows[k - 1]["step"]
    return None


def compare_convergence(steps: int, target: float, out_dir: str) -> dict:
    """Muon (lr 2e-2) vs AdamW (lr 3e-3), both WSD, same data and seed, on the tiny
    DeepSeek-V3 synthetic-corpus job; steps until the 5-step mean excess loss <= target."""
    from mindformers_core.config import load_config
    from mindformers_core.trainer import Trainer
    runs = {}
    for name, extra in (("muon", ["lr_scheduler.learning_rate=2.e-2"]),
                        ("adamw", [ADAMW_SECTION, "lr_scheduler.learning_rate=3.e-3"])):
        run_dir = os.path.join(out_dir, f"convergence_{name}")
        os.makedirs(run_dir, exist_ok=True)
        cfg = load_config(CONVERGENCE_CONFIG, overrides=[f"training.steps={steps}",
                                                         "checkpoint.enable_save=False"] + extra)
        t0 = time.perf_counter()
        Trainer(cfg, run_dir).train()
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        runs[name] = {"steps_to_target": _steps_to_excess(rows, target),
                      "final_excess_loss": rows[-1]["excess_loss"],
                      "wall_s": time.perf_counter() - t0,
                      "excess_loss": [r["excess_loss"] for r in rows]}
    return {"target_excess_loss": target, "steps": steps, **runs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    add_output_args(ap, "muon")
    ap.add_argument("--convergence", action="store_true",
                    help="also train Muon vs AdamW on the tiny DeepSeek-V3 job (minutes)")
    ap.add_argument("--convergence-steps", type=int, default=150)
    ap.add_argument("--target-excess", type=float, default=0.3)
    args = ap.parse_args(argv)
    # Synchronous PyNative: on CPU it removes the async queue's per-op wait (matters for the
    # many small kernels of the tiny set; neutral for the large matmuls).
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    rows = bench_shapes(args.rounds)
    peak = max(max(r["matmul_gflops"].values()) for r in rows)
    tiny = bench_tiny_set(args.rounds)

    print(f"{'shape':>12} {'NS GF/s':>9} {'numpy GF/s':>11} {'mm seq GF/s':>12} "
          f"{'mm mix GF/s':>12} {'NS/seq':>7} {'NS/mix':>7} {'NS/peak':>8}")
    for r in rows:
        r["ns_over_matmul_sequence"] = r["ns_gflops"] / r["matmul_sequence_gflops"]
        r["ns_over_matmul_mix"] = r["ns_gflops"] / r["matmul_mix_gflops"]
        r["ns_over_peak"] = r["ns_gflops"] / peak
        shape = "x".join(map(str, r["shape"]))
        print(f"{shape:>12} {r['ns_gflops']:9.1f} {r['numpy_gflops']:11.1f} "
              f"{r['matmul_sequence_gflops']:12.1f} {r['matmul_mix_gflops']:12.1f} "
              f"{r['ns_over_matmul_sequence']:7.2f} {r['ns_over_matmul_mix']:7.2f} "
              f"{r['ns_over_peak']:8.2f}")
    print(f"MindSpore fp32 matmul peak in this run: {peak:.1f} GFLOP/s")
    print(f"tiny DeepSeek-V3 set: {tiny['num_pieces']} pieces in {tiny['num_ns_calls']} batched NS "
          f"calls: {tiny['ns_gflops']:.2f} GF/s ({tiny['ns_time_s'] * 1e3:.1f} ms) vs numpy "
          f"{tiny['numpy_gflops']:.2f} GF/s ({tiny['numpy_time_s'] * 1e3:.1f} ms); "
          f"full Muon.step {tiny['muon_step_time_s'] * 1e3:.1f} ms")
    target_rows = [r for r in rows if 4096 in r["shape"]]
    met = all(r["ns_over_matmul_sequence"] >= TARGET for r in target_rows)
    seq_ratios = ", ".join("%.2f" % r["ns_over_matmul_sequence"] for r in target_rows)
    peak_ratios = ", ".join("%.2f" % r["ns_over_peak"] for r in target_rows)
    print(f"target NS >= {TARGET:.0%} of fp32 matmul (1024x4096 shapes): "
          f"{'MET' if met else 'NOT MET'} ({seq_ratios} of the same matmuls run back to back; "
          f"{peak_ratios} of the best single matmul)")
    result = {"schedule_steps": len(SCHEDULE), "rounds": args.rounds, "matmul_peak_gflops": peak,
              "shapes": rows, "tiny_deepseek_v3": tiny, "target_ratio": TARGET,
              "target_met": met, "cpu_count": os.cpu_count(),
              "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if args.convergence:
        with tempfile.TemporaryDirectory(prefix="bench_muon_") as run_root:
            conv = compare_convergence(args.convergence_steps, args.target_excess, run_root)
        result["convergence"] = conv
        m, a = conv["muon"]["steps_to_target"], conv["adamw"]["steps_to_target"]
        print(f"steps to 5-step mean excess loss <= {args.target_excess}: Muon {m}, AdamW {a} "
              f"(final excess {conv['muon']['final_excess_loss']:.3f} vs "
              f"{conv['adamw']['final_excess_loss']:.3f})")
    write_json(output_path(args, "muon"), result)
    return result


if __name__ == "__main__":
    main()
