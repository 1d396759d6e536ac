"""Optimizer step benchmark: our AdamW vs MindSpore's fused nn.Adam vs numpy AdamW.

For each size (default 1M, 10M, 50M parameters, split into 8 equal 2-D tensors, like a few
large weight matrices) and each precision mode:

* ``fp32``: fp32 parameters (their own masters), fp32 grads;
* ``bf16+master``: bf16 parameters with fp32 masters, fp32 grads (upstream casts bf16 grads to
  fp32 in backward hooks, so the optimizer receives fp32 grads);

the bench times ``AdamW.step`` (fused path) and MindSpore's fused ``nn.Adam`` on fp32 copies of
the same parameters in alternating rounds (the ratio is the median of per-round ratios, robust
to a shared machine's drifting load), and a plain in-place numpy AdamW; times are medians of
``--repeats`` steps after warm-up, every timed step ending with a host sync. It reports ns/parameter, the ratio to
``nn.Adam``, and the ratio to the memory-bandwidth bound: 28 bytes/param (read p, m, v, g; write
p, m, v in fp32) at the bandwidth of a large ``np.copyto`` measured in the same run. It also
reports optimizer-state bytes per parameter for each precision mode. The comparison with
torch's fused AdamW is ``bench_adamw_torch.py`` (its own processes: torch imported into a
MindSpore process slows MindSpore's kernels). Prints a table; writes
output/bench/optimizer.json (untracked; bench/results/optimizer.json with ``--save``, or
``--out PATH``).

    python bench/bench_optimizer.py                 # 1M, 10M, 50M
    python bench/bench_optimizer.py --sizes 1e6 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import mindspore as ms  # noqa: E402
from mindspore import Parameter, Tensor, nn  # noqa: E402

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.optim.adamw import AdamW  # noqa: E402

BYTES_PER_PARAM = 28  # fp32 read p, m, v, g + write p, m, v
N_TENSORS = 8
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


def _sync():
    """Host sync: PyNative runs ops in order, so waiting on a new tiny op waits on all."""
    (Tensor(np.ones(1, np.float32)) + 0).asnumpy()


def _median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
        _sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(nbytes: int = 512 * 2 ** 20, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted) of one large np.copyto."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timeit(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * nbytes / best


def _timeit(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _arrays(n: int, seed: int):
    rng = np.random.default_rng(seed)
    rows = max(1, n // N_TENSORS // 1024)
    shape = (rows, n // N_TENSORS // rows)
    return [rng.standard_normal(shape, dtype=np.float32) for _ in range(N_TENSORS)]


def _ours(n: int, mode: str):
    dtype = ms.float32 if mode == "fp32" else ms.bfloat16
    params = [Parameter(Tensor(a).astype(dtype), name=f"{mode}{k}")
              for k, a in enumerate(_arrays(n, 0))]
    grads = [Tensor(a * 0.01) for a in _arrays(n, 1)]
    opt = AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    return lambda: opt.step(grads)


def _nn_adam(n: int):
    params = [Parameter(Tensor(a), name=f"a{k}") for k, a in enumerate(_arrays(n, 0))]
    grads = tuple(Tensor(a * 0.01) for a in _arrays(n, 1))
    opt = nn.Adam(params, learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS)
    before = params[0].asnumpy()[0, :4].copy()
    opt(grads)
    _sync()
    if np.array_equal(params[0].asnumpy()[0, :4], before):
        raise RuntimeError("nn.Adam did not move the parameters: its timing is meaningless")
    return lambda: opt(grads)


def bench_interleaved(n: int, repeats: int) -> dict:
    """Median step time of nn.Adam and of our AdamW (fp32, bf16+master), timed in alternation
    (round r times each contender once), plus the median of the per-round ratios to nn.Adam:
    pairing rounds cancels most of the drift of a shared, loaded machine."""
    fns = {"nn_adam": _nn_adam(n), "fp32": _ours(n, "fp32"), "bf16+master": _ours(n, "bf16+master")}
    times = {k: [] for k in fns}
    for r in range(repeats + 2):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            _sync()
            if r >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    for k in ("fp32", "bf16+master"):
        out["ratio_" + k] = statistics.median(a / b for a, b in zip(times[k], times["nn_adam"]))
    return out


def bench_numpy(n: int, repeats: int) -> float:
    """In-place float32 numpy AdamW (decay, EMAs, bias-corrected update)."""
    ps, gs = _arrays(n, 0), [a * 0.01 for a in _arrays(n, 1)]
    ms_, vs = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
    tmp = [np.empty_like(p) for p in ps]
    state = {"t": 0}

    def step():
        state["t"] += 1
        t = state["t"]
        bc1, bc2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t
        for p, g, m, v, d in zip(ps, gs, ms_, vs, tmp):
            p *= np.float32(1 - LR * WD)
            m *= np.float32(BETAS[0])
            m += np.float32(1 - BETAS[0]) * g
            v *= np.float32(BETAS[1])
            np.multiply(g, g, out=d)
            d *= np.float32(1 - BETAS[1])
            v += d
            np.sqrt(v, out=d)
            d *= np.float32(1 / np.sqrt(bc2))
            d += np.float32(EPS)
            np.divide(m, d, out=d)
            d *= np.float32(LR / bc1)
            p -= d

    return _median_time(step, max(1, min(repeats, 3)), warmup=1)


def state_bytes_per_param() -> dict:
    """Optimizer-state bytes per parameter (masters that are not the param itself, remainders,
    moments) for each precision mode, measured on a real optimizer."""
    modes = {
        "fp32 params": (ms.float32, {}),
        "bf16 params + fp32 masters": (ms.bfloat16, {}),
        "bf16 params + fp32 masters + bf16 m,v": (
            ms.bfloat16, dict(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")),
        "bf16 params + remainders": (ms.bfloat16, dict(store_param_remainders=True)),
        "bf16 params + remainders + bf16 m,v": (
            ms.bfloat16, dict(store_param_remainders=True, exp_avg_dtype="bf16",
                              exp_avg_sq_dtype="bf16")),
    }
    out = {}
    for label, (dtype, kw) in modes.items():
        p = Parameter(Tensor(np.ones((16, 16), np.float32)).astype(dtype), name="w")
        opt = AdamW([p], **kw)
        total = 0
        for name, arr in opt.state_dict().items():
            if name == "global_step":
                continue
            prefix = name.split(".")[0]
            if prefix == "adam_m":
                total += arr.size * (2 if opt.exp_avg_dtype == ms.bfloat16 else 4)
            elif prefix == "adam_v":
                total += arr.size * (2 if opt.exp_avg_sq_dtype == ms.bfloat16 else 4)
            else:  # main_param (fp32) or param_remainder (int16): as stored
                total += arr.nbytes
        out[label] = total / p.size
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 5e7])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--bandwidth-mb", type=int, default=512,
                    help="size of the array copied to measure memory bandwidth")
    ap.add_argument("--pynative-synchronize", action="store_true",
                    help="run kernels in the calling thread (no executor hand-offs)")
    add_output_args(ap, "optimizer")
    args = ap.parse_args(argv)
    if args.pynative_synchronize:
        ms.set_context(pynative_synchronize=True)
    bw = measure_bandwidth(args.bandwidth_mb * 2 ** 20)
    bound_ns = BYTES_PER_PARAM / bw * 1e9
    rows = []
    for size in args.sizes:
        n = int(size) // (N_TENSORS * 1024) * (N_TENSORS * 1024) or N_TENSORS * 1024
        timed = bench_interleaved(n, args.repeats)
        t_adam = timed["nn_adam"]
        t_np = bench_numpy(n, args.repeats)
        for mode in ("fp32", "bf16+master"):
            t = timed[mode]
            rows.append({
                "params": n, "mode": mode,
                "ours_ns_per_param": t / n * 1e9,
                "nn_adam_ns_per_param": t_adam / n * 1e9,
                "numpy_ns_per_param": t_np / n * 1e9,
                "ratio_to_nn_adam": timed["ratio_" + mode],
                "ratio_to_bandwidth_bound": (t / n * 1e9) / bound_ns,
            })
        del timed
    result = {"pynative_synchronize": bool(args.pynative_synchronize),
              "bandwidth_GBps": bw / 1e9, "bound_ns_per_param": bound_ns,
              "bytes_per_param_moved": BYTES_PER_PARAM, "repeats": args.repeats,
              "rows": rows, "state_bytes_per_param": state_bytes_per_param()}
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s -> bound {bound_ns:.2f} ns/param "
          f"({BYTES_PER_PARAM} B/param)")
    print(f"{'params':>10} {'mode':>12} {'ours ns/p':>10} {'nn.Adam':>8} {'numpy':>8} "
          f"{'x nn.Adam':>9} {'x bound':>8}")
    for r in rows:
        print(f"{r['params']:>10} {r['mode']:>12} {r['ours_ns_per_param']:>10.2f} "
              f"{r['nn_adam_ns_per_param']:>8.2f} {r['numpy_ns_per_param']:>8.2f} "
              f"{r['ratio_to_nn_adam']:>9.2f} {r['ratio_to_bandwidth_bound']:>8.2f}")
    print("optimizer state bytes/param:")
    for k, v in result["state_bytes_per_param"].items():
        print(f"  {k:<42} {v:5.1f}")
    write_json(output_path(args, "optimizer"), result)
    return result


if __name__ == "__main__":
    main()
