"""Training step of our trainer vs the same model in torch eager, alternating, in one run.

For each benchmarked model (tiny / mid / large GPT; tiny and mid DeepSeek-V3 with AdamW and
Muon, the mid one the issue's H512 L4 S256 V4096 MLA model with 16 experts top-2) two worker
processes are started -- ours (the real ``Trainer``: dataset, model, optimizer, clipping,
2 micro-batches) and torch eager (``bench/torch_peer.py``: same architecture, fused AdamW or
Muon, clip 1.0, 2 micro-batches; the DeepSeek-V3 MoE sorted-token sparse, or for the tiny ones
the faster of that and the dense form, timed on the warm-up steps) -- and stepped alternately
(the order flips every round), so both sides see the same machine load; ratios survive
contention, absolute times do not. Our time is each step's ``step_time_s`` (the value of its
``metrics.jsonl`` row), torch's the wall time of its step; the median is over the last 2/3 of
the measured steps.

Printed per model: median step time, tokens/s, MFU (model matmul FLOPs of forward + backward
over the measured fp32 matmul peak: the faster of torch's and MindSpore's 1024^3 matmul),
ours/torch, and the peak RSS above each framework's own baseline (after import and a first op,
before the model exists).

    pip install torch==2.13.0        # the optional ``bench`` extra (setup.py)
    python bench/bench_peer.py                       # all models
    python bench/bench_peer.py --models mid_gpt --steps 8 --jit layer
    python bench/bench_peer.py --save                # write bench/results/peer.json

Without ``--save`` (or ``--out PATH``) the JSON goes to ``output/bench/peer.json`` (untracked).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

GPT = dict(model_type="gpt", num_attention_heads=4, rope_theta=10000.0, norm_epsilon=1e-6,
           initializer_range=0.02, params_dtype="float32", compute_dtype="float32",
           tie_word_embeddings=False)
DSV3 = dict(model_type="deepseek_v3", multi_latent_attention=True, vocab_size=64, hidden_size=64,
            num_layers=2, num_attention_heads=4, ffn_hidden_size=128, seq_length=32,
            rope_theta=10000.0, norm_epsilon=1e-6, initializer_range=0.02,
            params_dtype="float32", compute_dtype="float32", q_lora_rank=32, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            n_shared_experts=1, routed_scaling_factor=1.0, norm_topk_prob=True,
            moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3,
            moe_aux_loss_coeff=1e-4)

#: the issue's mid DeepSeek-V3 (configs/muon_deepseek_v3_tiny.yaml scaled up)
MID_DSV3 = dict(DSV3, vocab_size=4096, hidden_size=512, num_layers=4, num_attention_heads=8,
                ffn_hidden_size=1024, seq_length=256, q_lora_rank=128, kv_lora_rank=64,
                qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16,
                num_experts_per_tok=2, moe_intermediate_size=256, n_shared_experts=1)

#: name -> (model section, micro-batch size, optimizer); 2 micro-batches per step everywhere
MODELS = {
    "tiny_gpt": (dict(GPT, hidden_size=64, num_layers=2, ffn_hidden_size=128, seq_length=32,
                      vocab_size=32), 8, "AdamW"),
    "mid_gpt": (dict(GPT, hidden_size=256, num_layers=4, ffn_hidden_size=1024, seq_length=128,
                     vocab_size=4096), 8, "AdamW"),
    "large_gpt": (dict(GPT, hidden_size=512, num_layers=4, num_attention_heads=8,
                       ffn_hidden_size=2048, seq_length=256, vocab_size=8192), 4, "AdamW"),
    "tiny_dsv3_adamw": (DSV3, 4, "AdamW"),
    "tiny_dsv3_muon": (DSV3, 4, "Muon"),
    "mid_dsv3_adamw": (MID_DSV3, 4, "AdamW"),
    "mid_dsv3_muon": (MID_DSV3, 4, "Muon"),
}
#: torch MoE dispatch per model (torch_peer.RoutedMoE): "fastest" times both on the warm-up
#: steps and keeps the faster one (dense wins at tiny sizes, sparse at mid)
TORCH_MOE = {"tiny_dsv3_adamw": "fastest", "tiny_dsv3_muon": "fastest"}
MICRO_BATCHES = 2
PEAK_N = 1024


def _rss_mib() -> float:
    """Peak resident set size of this process so far (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _say(obj) -> None:
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _run_config(model: dict, batch: int, optimizer: str, jit: str) -> dict:
    opt = ({"type": "AdamW", "betas": [0.9, 0.95], "weight_decay": 0.01} if optimizer == "AdamW"
           else {"type": "Muon", "momentum": 0.95, "qk_clip_enabled": True})
    lr = 1e-3 if optimizer == "AdamW" else 2e-2
    return {
        "training": {"steps": 100000, "local_batch_size": batch,
                     "global_batch_size": batch * MICRO_BATCHES, "max_norm": 1.0, "seed": 42,
                     "jit": jit},
        "optimizer": opt,
        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": lr,
                         "warmup_ratio": 0.01, "lr_end": lr / 10},
        "model": model,
        "train_dataset": {"type": "SyntheticMarkov",
                          "markov_vocab_size": min(model["vocab_size"], 1024)},
        "checkpoint": {"enable_save": False},
    }


def _matmul_flops(model: dict, tokens: int) -> float:
    """Forward + backward matmul FLOPs of one step (3x the forward; attention scores included,
    the full S x S computed; each token's top-k routed experts: the useful work, whatever a
    dispatch computes beyond it)."""
    h, v, s, L = model["hidden_size"], model["vocab_size"], model["seq_length"], model["num_layers"]
    n = model["num_attention_heads"]
    weights = h * v  # output layer
    attn_per_tok = 0
    for i in range(L):
        if model["model_type"] == "deepseek_v3":
            dn, dr, dv = model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]
            qr, kvr = model["q_lora_rank"], model["kv_lora_rank"]
            weights += h * qr + qr * n * (dn + dr) + h * (kvr + dr) + kvr * n * (dn + dv) + n * dv * h
            attn_per_tok += 2 * s * n * (dn + dr + dv)
        else:
            d = h // n
            weights += h * 3 * n * d + n * d * h
            attn_per_tok += 2 * s * n * 2 * d
        if model["model_type"] == "deepseek_v3" and i >= model["first_k_dense_replace"]:
            f, e = model["moe_intermediate_size"], model["n_routed_experts"]
            k = model["num_experts_per_tok"]
            weights += k * 3 * h * f + h * e + model["n_shared_experts"] * 3 * h * f
        else:
            weights += 3 * h * model["ffn_hidden_size"]
    return 3.0 * tokens * (2.0 * weights + attn_per_tok)


# ---------------------------------------------------------------------------- workers
def _worker_ours(name: str, jit: str, threads: int) -> None:
    import io
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor, ops

    ms.set_context(mode=ms.PYNATIVE_MODE)
    if threads:
        ms.set_context(runtime_num_threads=threads)
    from mindformers_core.trainer.run import apply_pynative_synchronize
    apply_pynative_synchronize(True)
    a = Tensor(np.random.rand(PEAK_N, PEAK_N).astype(np.float32))
    ops.matmul(a, a).asnumpy()
    base = _rss_mib()
    t0 = time.perf_counter()
    for _ in range(5):
        ops.matmul(a, a).asnumpy()
    peak = 5 * 2 * PEAK_N ** 3 / (time.perf_counter() - t0)
    del a
    from mindformers_core.config import load_config
    from mindformers_core.trainer import Trainer
    model, batch, optimizer = MODELS[name]
    cfg = load_config(_run_config(model, batch, optimizer, jit))
    out = tempfile.mkdtemp(prefix="bench_peer_")
    trainer = Trainer(cfg, out, stream=io.StringIO())
    _say({"ready": True, "peak_flops": peak, "baseline_rss_mib": base})
    for line in sys.stdin:
        if line.strip() != "step":
            break
        m = trainer.train_step()   # step_time_s: the value of its metrics.jsonl row
        _say({"time": m.step_time_s, "loss": m.loss})
    _say({"peak_rss_mib": _rss_mib()})


def _worker_torch(name: str, threads: int, warmup: int) -> None:
    import torch
    import torch_peer as tp
    torch.manual_seed(0)
    if threads:
        torch.set_num_threads(threads)
    a = torch.rand(PEAK_N, PEAK_N)
    a @ a
    base = _rss_mib()
    t0 = time.perf_counter()
    for _ in range(5):
        a @ a
    peak = 5 * 2 * PEAK_N ** 3 / (time.perf_counter() - t0)
    del a
    model_cfg, batch, optimizer = MODELS[name]
    dispatch = TORCH_MOE.get(name, "sparse")
    kinds = ("sparse", "dense") if dispatch == "fastest" else (dispatch,)
    if model_cfg["model_type"] != "deepseek_v3":
        kinds = (None,)                       # no MoE: nothing to choose
    peers = []
    for kind in kinds:
        model = tp.LM(dict(model_cfg, torch_moe=kind or "sparse"))
        peers.append((kind, model, tp.build_optimizer(
            model, optimizer, 1e-3 if optimizer == "AdamW" else 2e-2), []))
    s, v = model_cfg["seq_length"], model_cfg["vocab_size"]
    micro = [(torch.randint(0, v, (batch, s)), torch.randint(0, v, (batch, s)),
              torch.ones(batch, s)) for _ in range(MICRO_BATCHES)]
    _say({"ready": True, "peak_flops": peak, "baseline_rss_mib": base})
    n = 0
    for line in sys.stdin:
        if line.strip() != "step":
            break
        if n == warmup and len(peers) > 1:    # keep the faster dispatch (its last warm-up)
            peers = [min(peers, key=lambda p: p[3][-1])]
        kind, model, opt, times = peers[n % len(peers)] if n < warmup else peers[0]
        t0 = time.perf_counter()
        loss = tp.train_step(model, opt, micro)
        times.append(time.perf_counter() - t0)
        n += 1
        _say({"time": times[-1], "loss": loss, "torch_moe": kind})
    _say({"peak_rss_mib": _rss_mib()})


# ---------------------------------------------------------------------------- driver
class Worker:
    def __init__(self, side: str, name: str, jit: str, threads: int, warmup: int):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--models", name,
               "--jit", jit, "--threads", str(threads), "--warmup", str(warmup)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT, os.path.join(ROOT, "bench"), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"worker {self.proc.args} ended early (rc {self.proc.wait()})")

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self._read()

    def finish(self) -> float:
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        rss = self._read()["peak_rss_mib"]
        self.proc.wait()
        return rss


def bench_model(name: str, warmup: int, steps: int, jit: str, threads: int = 0) -> dict:
    model, batch, optimizer = MODELS[name]
    # the torch side times its dispatches on the warm-up steps: at least one each
    warmup = max(warmup, 4) if TORCH_MOE.get(name) == "fastest" else warmup
    workers = {side: Worker(side, name, jit, threads, warmup) for side in ("ours", "torch")}
    times = {k: [] for k in workers}
    torch_moe = None
    for r in range(warmup + steps):
        order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
        for side in order:
            got = workers[side].step()
            if r >= warmup:
                times[side].append(got["time"])
                torch_moe = got.get("torch_moe", torch_moe)
    tokens = batch * MICRO_BATCHES * model["seq_length"]
    flops = _matmul_flops(model, tokens)
    peak = max(w.info["peak_flops"] for w in workers.values())
    out = {"model": name, "optimizer": optimizer, "jit": jit, "threads": threads,
           "torch_moe": torch_moe,
           "tokens_per_step": tokens,
           "step_flops": flops, "peak_flops": peak}
    for side, w in workers.items():
        med = statistics.median(times[side][len(times[side]) // 3:])   # the last 2/3
        rss = w.finish()
        out[side] = {"step_s": med, "steps_s": times[side], "tokens_per_s": tokens / med,
                     "mfu": flops / med / peak, "peak_rss_above_baseline_mib":
                     rss - w.info["baseline_rss_mib"], "matmul_peak_flops": w.info["peak_flops"]}
    out["ratio"] = out["ours"]["step_s"] / out["torch"]["step_s"]
    out["rss_ratio"] = (out["ours"]["peak_rss_above_baseline_mib"]
                        / max(out["torch"]["peak_rss_above_baseline_mib"], 1e-9))
    return out


def _print_row(r: dict) -> None:
    o, t = r["ours"], r["torch"]
    print(f"{r['model']:<16} {r['jit']:<6} {r['torch_moe'] or '-':<6} {t['step_s'] * 1e3:9.1f} {o['step_s'] * 1e3:9.1f} "
          f"{r['ratio']:6.2f}x {t['tokens_per_s']:9.0f} {o['tokens_per_s']:9.0f} "
          f"{100 * t['mfu']:6.1f}% {100 * o['mfu']:6.1f}% "
          f"{t['peak_rss_above_baseline_mib']:7.0f} {o['peak_rss_above_baseline_mib']:7.0f} "
          f"{r['rss_ratio']:5.2f}x", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jit", default="layer", choices=["none", "layer", "model"],
                    help="training.jit of our side (model: dense models only; MoE models "
                         "then run with layer)")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads of both sides (0: each framework's default); 1 keeps "
                         "the ratio fair on a machine shared with other jobs")
    add_output_args(ap, "peer")
    ap.add_argument("--quick", action="store_true",
                    help="tiny and mid GPT only, 1 warm-up + 3 measured steps")
    ap.add_argument("--worker", choices=["ours", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.warmup, args.steps = "tiny_gpt,mid_gpt", 1, 3
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    if args.worker == "ours":
        _worker_ours(names[0], args.jit, args.threads)
        return 0
    if args.worker == "torch":
        _worker_torch(names[0], args.threads, args.warmup)
        return 0
    try:
        import torch  # noqa: F401  (the optional bench extra)
    except ImportError:
        print("bench_peer: torch is not installed (pip install torch==2.13.0); skipped")
        return 0
    print(f"{'model':<16} {'jit':<6} {'moe':<6} {'torch ms':>9} {'ours ms':>9} {'ratio':>7} "
          f"{'torch t/s':>9} {'ours t/s':>9} {'MFU tch':>7} {'MFU ours':>8} "
          f"{'RSS tch':>7} {'RSS ours':>8} {'RSSx':>6}   (RSS: MiB above baseline)")
    rows = []
    for name in names:
        jit = args.jit
        if jit == "model" and MODELS[name][0]["model_type"] == "deepseek_v3":
            jit = "layer"
        rows.append(bench_model(name, args.warmup, args.steps, jit, args.threads))
        _print_row(rows[-1])
    path = write_json(output_path(args, "peer"),
                      {"machine": platform.platform(), "cpus": os.cpu_count(), "results": rows},
                      indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
