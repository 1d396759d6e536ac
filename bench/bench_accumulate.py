"""Gradient accumulation at the mid GPT's parameter shapes: the host kernel
(``optim/host/accumulate.py``, one C call per micro-batch into one owned buffer) vs
MindSpore's per-tensor adds (the fallback), alternating in one process (the order flips every
round; ratios survive a busy machine, absolute times do not).

    python bench/bench_accumulate.py            # 2 and 4 micro-batches, 20 rounds
    python bench/bench_accumulate.py --quick    # 6 rounds

The gradients are fp32 tensors of the model's parameter shapes (H256 L4 F1024 V4096, untied
output); only the summing is timed. Writes output/bench/accumulate.json (untracked; ``--save``:
bench/results/accumulate.json, ``--out PATH``: PATH): the median ms per optimizer step of each
side and the saving.
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

from bench.output import add_output_args, output_path, write_json  # noqa: E402


def per_tensor_adds(micros):
    acc = None
    for grads in micros:
        acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]
    return acc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="6 rounds")
    add_output_args(parser, "accumulate")
    args = parser.parse_args(argv)
    rounds = 6 if args.quick else args.rounds
    import mindspore as ms
    from bench.bench_peer import MODELS
    from mindformers_core.config.model import ModelConfig
    from mindformers_core.models import build_model
    from mindformers_core.optim.host.accumulate import (GradientSum, host_add_kernel,
                                                        host_add_unavailable_reason)
    from mindformers_core.trainer.run import apply_pynative_synchronize
    apply_pynative_synchronize(True)
    kernel = host_add_kernel()
    if kernel is None:
        print(f"host add kernel unavailable: {host_add_unavailable_reason()}")
        return 1
    model_dict = MODELS["mid_gpt"][0]
    shapes = [tuple(p.shape) for p in
              build_model(ModelConfig.from_dict(model_dict, "model"), seed=0).trainable_params()]
    rng = np.random.default_rng(0)
    pool = [[ms.Tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
            for _ in range(max(args.micro))]

    def host_sums(micros):
        total = GradientSum(kernel)
        for grads in micros:
            total.add(grads)
        return total.sums

    sides = {"per_tensor_adds": per_tensor_adds, "host_kernel": host_sums}
    rows = []
    for n in args.micro:
        micros = pool[:n]
        times = {side: [] for side in sides}
        for r in range(rounds + 1):   # round 0 warms both sides up
            for side in (sides if r % 2 else reversed(list(sides))):
                t0 = time.perf_counter()
                sums = sides[side](micros)
                sums[-1].asnumpy()
                del sums   # each side pays for freeing its own sums, as once per step
                if r:
                    times[side].append(time.perf_counter() - t0)
        med = {side: 1e3 * statistics.median(t) for side, t in times.items()}
        rows.append({"micro_batches": n, **{f"{s}_ms": v for s, v in med.items()},
                     "saved_ms": med["per_tensor_adds"] - med["host_kernel"]})
        print(f"{n} micro-batches, {len(shapes)} tensors, {sum(map(np.prod, shapes)):.0f} "
              f"params: per-tensor adds {med['per_tensor_adds']:.2f} ms, host kernel "
              f"{med['host_kernel']:.2f} ms per step")
    result = {"model": model_dict, "tensors": len(shapes), "rounds": rounds, "rows": rows}
    print(f"wrote {write_json(output_path(args, 'accumulate'), result, indent=1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
