"""Peak RSS of one training forward + backward without recompute, with ``recompute: {mode:
full}`` (every decoder layer recomputed through MindSpore's Cell.recompute) and with
``mode: select`` of each part (``core``: every layer's attention core, ``attention``: the whole
attention, ``mlp``: the MLP; core/recompute.py), on a mid-size GPT.

Each side runs in its own fresh subprocess (``--child``), alternating the modes for
``--rounds`` rounds; each reports ``ru_maxrss`` (whole process) and the peak minus the RSS just
before the step (model and inputs already allocated), plus the loss and gradient norm, which
must agree between the sides.

    python bench/bench_recompute.py            # hidden 256, 6 layers, batch 4 x 512 tokens

Writes output/bench/recompute.json (untracked;
bench/results/recompute.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.bench_attention import rss_mb  # noqa: E402
from bench.output import add_output_args, output_path, write_json  # noqa: E402

#: bench mode -> the ``select_module`` part it recomputes in every layer
SELECT_PARTS = {"core": "self_attention.core_attention", "attention": "self_attention",
                "mlp": "mlp"}
MODES = ("None", "full") + tuple(SELECT_PARTS)


def child(mode: str, args) -> None:
    import mindspore as ms
    from mindformers_core.models.build import build_model
    from mindformers_core.core.recompute import recompute_layers, selected_modules
    cfg = {"model_type": "gpt", "vocab_size": 256, "hidden_size": args.hidden,
           "num_layers": args.layers, "num_attention_heads": 4,
           "ffn_hidden_size": 4 * args.hidden, "seq_length": args.seq}
    model = build_model(cfg, seed=0)
    if mode in SELECT_PARTS:
        model.set_recompute([], selected_modules(
            "select", {f"layers.*.{SELECT_PARTS[mode]}": True}, args.layers))
    else:
        model.set_recompute(recompute_layers(mode, None, args.layers))
    rng = np.random.RandomState(0)
    ids = ms.Tensor(rng.randint(0, 256, (args.batch, args.seq)).astype(np.int32))
    labels = ms.Tensor(rng.randint(0, 256, (args.batch, args.seq)).astype(np.int32))
    mask = ms.Tensor(np.ones((args.batch, args.seq), np.float32))

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux
    model.logits(ids[:, :8])     # runtime warm-up outside the measured step
    base = rss_mb()
    value, grads = ms.value_and_grad(fn, None, model.trainable_params())(ids, labels, mask)
    norm = float(np.sqrt(sum((g.asnumpy().astype(np.float64) ** 2).sum() for g in grads)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"mode": mode, "peak_mb": peak, "step_mb": peak - base,
                      "loss": float(value.asnumpy()), "grad_norm": norm}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    add_output_args(ap, "recompute")
    args = ap.parse_args()
    if args.quick and not args.child:
        args.layers, args.seq, args.rounds = 4, 256, 1
    if args.child:
        child(args.child, args)
        return
    runs = {m: [] for m in MODES}
    flags = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--seq", str(args.seq),
             "--batch", str(args.batch)]
    for _ in range(args.rounds):
        for mode in runs:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode]
                                 + flags, capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": ROOT})
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = {m: min(r, key=lambda x: x["peak_mb"]) for m, r in runs.items()}
    drop = 1.0 - best["full"]["peak_mb"] / best["None"]["peak_mb"]
    step_drop = 1.0 - best["full"]["step_mb"] / best["None"]["step_mb"]
    same = all(r["loss"] == best["None"]["loss"]
               and abs(r["grad_norm"] / best["None"]["grad_norm"] - 1) < 1e-6
               for r in best.values())
    drops = {m: 1.0 - r["peak_mb"] / best["None"]["peak_mb"] for m, r in best.items()}
    for m, r in best.items():
        print(f"recompute {m:>9}: peak RSS {r['peak_mb']:7.0f} MB ({drops[m] * 100:5.1f}% "
              f"below none), step {r['step_mb']:6.0f} MB, loss {r['loss']:.6f}, "
              f"grad norm {r['grad_norm']:.6f}")
    print(f"full: peak RSS drop {drop * 100:.1f}% (step activations {step_drop * 100:.1f}%), "
          f"same loss/grad in every mode: {same}")
    write_json(output_path(args, "recompute"),
               {"config": vars(args), "runs": runs, "peak_drop": drop, "step_drop": step_drop,
                "peak_drop_by_mode": drops, "same_loss_and_grad": same}, indent=1)


if __name__ == "__main__":
    main()
