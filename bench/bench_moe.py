"""MoE cost at a fixed top-k: forward + backward of an all-MoE tiny DeepSeek-V3 at E = 4 vs
E = 64 experts (k = 2, the same tokens), timed side by side in one run.

With token dispatch the work follows k, not E, so the time ratio E=64 / E=4 should stay below
1.6 (the dense "every expert on every token" form measured 2.7). The two models are timed in
alternation (A B A B ...), so machine contention hits both alike; the ratio of the medians is
the figure.

``--options`` also times the CPU dispatch strategies on one MoE layer (same tokens, E = 4 and
64), the measurement behind ``models.dispatch.expert_ffn``'s choice:

    dense      every expert on every token, weighted by a [T, E] combine matrix (the old form)
    loop       pairs sorted by expert, one matmul pair per expert over its gathered rows
    padded     one [E, C, H] bucket per expert (C = the largest segment) + two mint.bmm
    blocks     what expert_ffn runs on CPU (models.dispatch.block_expert_ffn)
    segsum     the blocks, combined by a segment sum (scatter-add) over tokens instead of a gather

    python bench/bench_moe.py              # 20 rounds
    python bench/bench_moe.py --quick      # 6 rounds
    python bench/bench_moe.py --options    # + the dispatch strategies

Prints a table; writes output/bench/moe.json (untracked;
bench/results/moe.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, mint, ops  # noqa: E402

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.models import build_model  # noqa: E402
from mindformers_core.models.dispatch import block_expert_ffn, make_plan, swiglu_halves  # noqa: E402
from mindformers_core.trainer.run import apply_pynative_synchronize  # noqa: E402

TARGET_RATIO = 1.6
EXPERTS = (4, 64)


def model_config(num_experts: int) -> dict:
    """The tiny DeepSeek-V3 recipe's model (configs/muon_deepseek_v3_tiny.yaml), every layer MoE."""
    return {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 64, "num_layers": 2,
            "num_attention_heads": 4, "ffn_hidden_size": 128, "seq_length": 32,
            "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16, "first_k_dense_replace": 0, "n_routed_experts": num_experts,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
            "moe_aux_loss_coeff": 1e-4}


def model_step(num_experts: int, batch: int, seq: int):
    """A closure running one forward + backward of the model on fixed tokens."""
    model = build_model(model_config(num_experts), seed=0)
    rng = np.random.RandomState(0)
    ids = Tensor(rng.randint(0, 64, (batch, seq)).astype(np.int32))
    mask = Tensor(np.ones((batch, seq), np.float32))

    def loss(a, b, c):
        s, n, aux = model(a, b, c)
        return s / n + aux
    grad = ms.value_and_grad(loss, None, model.trainable_params())

    def step():
        value, grads = grad(ids, ids, mask)
        value.asnumpy()
        grads[-1].asnumpy()
    return step


def alternate(steps: dict, rounds: int) -> dict:
    """Median seconds per closure, timed in alternation after one warm-up call each."""
    for fn in steps.values():
        fn()
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


# ------------------------------------------------------------------ dispatch strategies
def _layer_inputs(num_experts: int, tokens: int, h: int = 64, f: int = 64, k: int = 2):
    rng = np.random.RandomState(num_experts)
    w1 = ms.Parameter(Tensor((rng.standard_normal((num_experts, h, 2 * f)) * 0.1).astype(np.float32)), "w1")
    w2 = ms.Parameter(Tensor((rng.standard_normal((num_experts, f, h)) * 0.1).astype(np.float32)), "w2")
    x = Tensor(rng.standard_normal((tokens, h)).astype(np.float32))
    # routing as in the model: a function of the token, over a 64-word vocabulary (so repeated
    # words make the load uneven, max/mean ~ 4 at E = 64)
    words = rng.randint(0, 64, tokens)
    idx = np.argsort(-rng.standard_normal((64, num_experts)), 1, kind="stable")[words, :k]
    gate = Tensor(rng.rand(tokens, k).astype(np.float32))
    return w1, w2, x, idx.astype(np.int32), gate, f


def _dense(w1, w2, x, idx, gate, f):
    e, t = w1.shape[0], x.shape[0]
    onehot = Tensor(np.eye(e, dtype=np.float32)[idx])                      # [T, k, E]
    combine = (onehot * gate[..., None]).sum(1)
    hidden = mint.bmm(x[None].broadcast_to((e, t, x.shape[1])), w1)
    y = mint.bmm(swiglu_halves(hidden, f), w2)
    return (y * combine.transpose(1, 0)[..., None]).sum(0)


def _loop(w1, w2, x, idx, gate, f):
    plan = make_plan(idx, w1.shape[0])
    k = idx.shape[1]
    rows = ops.gather(x, Tensor((plan.order // k).astype(np.int32)), 0)
    ys = []
    for e in range(w1.shape[0]):
        lo, hi = int(plan.offsets[e]), int(plan.offsets[e + 1])
        if hi > lo:
            ys.append(mint.matmul(swiglu_halves(mint.matmul(rows[lo:hi], w1[e]), f), w2[e]))
    y = mint.cat(ys, 0) * ops.gather(gate.reshape(-1), Tensor(plan.order.astype(np.int32)), 0)[:, None]
    return ops.unsorted_segment_sum(y, Tensor((plan.order // k).astype(np.int32)), x.shape[0])


def _padded(w1, w2, x, idx, gate, f):
    plan = make_plan(idx, w1.shape[0])
    t, h = x.shape
    e, c, k = plan.num_experts, plan.capacity, idx.shape[1]
    expert = idx.reshape(-1)[plan.order]
    slot = expert * c + np.arange(plan.order.size) - plan.offsets[expert]
    src = np.zeros(e * c, np.int32)
    src[slot] = plan.order // k
    pair_slot = np.empty(plan.order.size, np.int32)
    pair_slot[plan.order] = slot
    buckets = ops.gather(x, Tensor(src), 0).reshape(e, c, h)
    y = mint.bmm(swiglu_halves(mint.bmm(buckets, w1), f), w2).reshape(e * c, h)
    return (ops.gather(y, Tensor(pair_slot), 0).reshape(t, k, h) * gate[..., None]).sum(1)


def _blocks(w1, w2, x, idx, gate, f):
    return block_expert_ffn(x, gate, make_plan(idx, w1.shape[0]), w1, w2, f)


def _segsum(w1, w2, x, idx, gate, f):
    plan = make_plan(idx, w1.shape[0])
    t, h = x.shape
    nb, b = plan.block_expert.size, plan.block_rows
    experts = Tensor(plan.block_expert)
    src = np.where(plan.row_token < t, plan.row_token, 0).astype(np.int32)
    blocks = ops.gather(x, Tensor(src), 0).reshape(nb, b, h)
    hidden = ops.BatchMatMul()(blocks, ops.gather(w1, experts, 0))
    y = ops.BatchMatMul()(swiglu_halves(hidden, f), ops.gather(w2, experts, 0)).reshape(nb * b, h)
    w_rows = ops.scatter_nd(Tensor(plan.pair_row[:, None].astype(np.int32)), gate.reshape(-1),
                            (nb * b,))
    return ops.unsorted_segment_sum(y * w_rows[:, None], Tensor(plan.row_token), t + 1)[:t]


STRATEGIES = {"dense": _dense, "loop": _loop, "padded": _padded, "blocks": _blocks,
              "segsum": _segsum}


def strategy_step(name: str, num_experts: int, tokens: int):
    w1, w2, x, idx, gate, f = _layer_inputs(num_experts, tokens)
    r = Tensor(np.random.RandomState(1).standard_normal(x.shape).astype(np.float32))

    def loss(x_, g_):
        return (STRATEGIES[name](w1, w2, x_, idx, g_, f) * r).sum()
    grad = ms.value_and_grad(loss, (0, 1), [w1, w2])

    def step():
        value, grads = grad(x, gate)
        value.asnumpy()
        grads[1][0].asnumpy()
    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 rounds instead of 20")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--options", action="store_true", help="also time the CPU dispatch strategies")
    add_output_args(ap, "moe")
    args = ap.parse_args(argv)
    rounds = args.rounds or (6 if args.quick else 20)
    ms.set_device("CPU")
    apply_pynative_synchronize(True)

    med = alternate({e: model_step(e, args.batch, args.seq) for e in EXPERTS}, rounds)
    ratio = med[EXPERTS[1]] / med[EXPERTS[0]]
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
              "tokens": args.batch * args.seq, "top_k": 2, "rounds": rounds,
              "fwd_bwd_ms_e4": med[4] * 1e3, "fwd_bwd_ms_e64": med[64] * 1e3,
              "ratio_e64_over_e4": ratio, "target_ratio": TARGET_RATIO,
              "passes": bool(ratio < TARGET_RATIO)}
    print(f"all-MoE tiny DeepSeek-V3, {args.batch} x {args.seq} tokens, k = 2, fwd+bwd "
          f"(median of {rounds}, alternated)")
    print(f"  E = 4 : {med[4] * 1e3:8.1f} ms")
    print(f"  E = 64: {med[64] * 1e3:8.1f} ms   ratio {ratio:.2f} (target < {TARGET_RATIO})")
    if args.options:
        tokens = args.batch * args.seq * 2
        steps = {(n, e): strategy_step(n, e, tokens) for n in STRATEGIES for e in EXPERTS}
        opt = alternate(steps, rounds)
        result["strategies"] = [{"strategy": n, "tokens": tokens,
                                 "ms_e4": opt[(n, 4)] * 1e3, "ms_e64": opt[(n, 64)] * 1e3,
                                 "ratio": opt[(n, 64)] / opt[(n, 4)]} for n in STRATEGIES]
        print(f"one MoE layer, {tokens} tokens, fwd+bwd ms:   E=4      E=64    ratio")
        for row in result["strategies"]:
            print(f"  {row['strategy']:8s}                        {row['ms_e4']:7.2f}  "
                  f"{row['ms_e64']:7.2f}  {row['ratio']:6.2f}")
    write_json(output_path(args, "moe"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
