"""Minimal reproducer: what a ``mindspore.jit`` layer keeps for its backward, by capture mode.

Four SwiGLU blocks ``h + W3 (silu(W1 h) * (W2 h))`` on [1024, 256] activations (FFN 1024,
float32, CPU), one ``value_and_grad`` over their weights, four times; each mode runs in a fresh
process and reports its peak RSS (``VmHWM``) above the same process's footprint after import
and a first op, and a checksum of the gradients (equal in every mode that computes them
correctly). Nothing of this project is imported: the numbers are MindSpore 2.10's own.

    python bench/jit_memory_repro.py            # none, ast, bytecode, trace

Measured (2 shared cores, one thread, MindSpore 2.10.0, Python 3.11): PyNative 133 MiB, ast
graphs 262 MiB, bytecode graphs 200 MiB, trace 180 MiB with a different (wrong) gradient
checksum (it replays the graph traced at the first call with that call's weights). PyNative
saves about 21 MiB per block for the backward (h, W1 h, W2 h, silu and the product) besides
the 12 MiB of weights and their gradients; an ast-built graph keeps about twice that.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, ops

MODES = ("none", "ast", "bytecode", "trace")


def _hwm_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


MATMUL_T = ops.MatMul(transpose_b=True)


def block(h, w1, w2, w3):
    g, u = MATMUL_T(h, w1), MATMUL_T(h, w2)
    return h + MATMUL_T(ops.sigmoid(g) * g * u, w3)


def worker(mode: str, layers: int = 4, tokens: int = 1024, hidden: int = 256,
           ffn: int = 1024) -> dict:
    ms.set_context(mode=ms.PYNATIVE_MODE, runtime_num_threads=1)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((tokens, hidden)).astype(np.float32))
    (x * 1).asnumpy()
    base = _hwm_mib()
    weights = [[Parameter(Tensor((rng.standard_normal(s) * 0.02).astype(np.float32)),
                          name=f"w{i}_{j}")
                for j, s in enumerate([(ffn, hidden), (ffn, hidden), (hidden, ffn)])]
               for i in range(layers)]
    run = block if mode == "none" else ms.jit(block, capture_mode=mode)

    def loss(inp):
        h = inp
        for w in weights:
            h = run(h, *w)
        return (h * h).mean()

    grad_fn = ms.value_and_grad(loss, grad_position=None,
                                weights=[p for w in weights for p in w])
    for _ in range(4):
        value, grads = grad_fn(x)
        checksum = float(value.asnumpy()) + sum(float(abs(g).sum().asnumpy()) for g in grads)
    return {"mode": mode, "peak_above_base_mib": _hwm_mib() - base, "checksum": checksum}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("@@" + json.dumps(worker(args.worker)))
        return 0
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--worker", mode], capture_output=True,
                             text=True, timeout=600, check=True).stdout
        r = json.loads([line for line in out.splitlines() if line.startswith("@@")][-1][2:])
        print(f"{r['mode']:<9} peak RSS above baseline {r['peak_above_base_mib']:6.0f} MiB   "
              f"gradient checksum {r['checksum']:.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
