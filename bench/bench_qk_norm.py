"""Cost of Qwen3's per-head q/k RMSNorm (``qk_layernorm``): forward + backward of one GPT with
and without it, interleaved in one process (ratios survive a busy machine; absolute times do
not), under ``training.jit: none`` and ``layer``.

    python bench/bench_qk_norm.py            # hidden 256, 4 layers, 4 heads (d 64), batch 2 x 256
    python bench/bench_qk_norm.py --quick

Writes output/bench/qk_norm.json (untracked; bench/results/qk_norm.json with ``--save``, or
``--out PATH``): the median step time of each side and their ratio per mode.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402


def step_fn(model):
    import mindspore as ms

    def objective(ids, labels, mask):
        loss_sum, n, _ = model(ids, labels, mask)
        return loss_sum / n

    return ms.value_and_grad(objective, None, model.trainable_params())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="hidden 128, seq 128, 6 repeats")
    add_output_args(parser, "qk_norm")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.seq, args.repeats = 128, 128, 6
    import mindspore as ms
    from mindformers_core.config.model import ModelConfig
    from mindformers_core.models import build_model
    from mindformers_core.trainer.run import apply_pynative_synchronize
    apply_pynative_synchronize(True)
    base = dict(model_type="gpt", vocab_size=256, hidden_size=args.hidden, num_layers=args.layers,
                num_attention_heads=4, ffn_hidden_size=4 * args.hidden, seq_length=args.seq)
    rng = np.random.default_rng(0)
    ids = ms.Tensor(rng.integers(0, 256, (2, args.seq)).astype(np.int32))
    mask = ms.Tensor(np.ones((2, args.seq), np.float32))
    rows = []
    for jit in ("none", "layer"):
        fns = {side: step_fn(build_model(ModelConfig.from_dict({**base, "qk_layernorm": on},
                                                               "model"), seed=0, jit=jit))
               for side, on in (("plain", False), ("qk_norm", True))}
        times = {side: [] for side in fns}
        for _ in range(args.repeats):
            for side, fn in fns.items():
                t0 = time.perf_counter()
                _, grads = fn(ids, ids, mask)
                grads[0].asnumpy()
                times[side].append(time.perf_counter() - t0)
        med = {side: float(np.median(t[2:])) for side, t in times.items()}   # first: compiles
        rows.append({"jit": jit, "plain_ms": 1e3 * med["plain"], "qk_norm_ms": 1e3 * med["qk_norm"],
                     "ratio": med["qk_norm"] / med["plain"]})
        print(f"jit {jit}: plain {1e3 * med['plain']:.1f} ms, qk_norm {1e3 * med['qk_norm']:.1f} "
              f"ms, ratio {med['qk_norm'] / med['plain']:.3f}")
    write_json(output_path(args, "qk_norm"),
               {"hidden": args.hidden, "layers": args.layers, "seq": args.seq, "batch": 2,
                "heads": 4, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
