"""Data-parallel bench: Muon comm strategies and ZeRO-1 optimizer-state memory per rank.

    python bench/bench_dp.py [--worlds 1 2 4 8] [--model tiny_mla|tiny_deepseek_v3]
                             [--measure] [--save | --out PATH]

Model part (any world size, one process): the real optimizer is built sharded for every rank
``r`` of ``W`` (``build_optimizer(..., shard_layout=ZeroSharding(Communicator(r, W), -1))``;
set-up only, no collective runs), which gives each rank's rows, NS owners and persistent state bytes. Per
optimizer step and rank it reports

* NS FLOPs (``shard_layout.ns_flops``): allgather runs NS on every gathered matrix;
  allgather_deredundency only on the matrices the rank owns (3-D expert shards and
  replicated weights run locally under both);
* bytes received (``comm.CommStats`` model): gradient all-reduce ``2 (W-1)/W * 4P``,
  parameter all-gather, U all-gather, and for deredundancy the return of the owners'
  updates (CPU fallback: all-gather padded to the largest owner) -- plus, for reference,
  upstream's P2P form (owner receives the other ranks' rows; each rank receives its rows of
  the updates it does not own);
* optimizer-state bytes (moments + fp32 masters that are not the parameters).

``--measure`` also launches 2 msrun CPU workers (scripts/msrun_launcher.sh) for 3 steps of
each strategy and prints the measured per-rank counters next to the model's.

Writes output/bench/dp.json (untracked;
bench/results/dp.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

MODELS = {
    "tiny_mla": {"model_type": "deepseek_v3", "multi_latent_attention": True, "vocab_size": 64,
                 "hidden_size": 32, "num_layers": 2, "num_attention_heads": 2,
                 "ffn_hidden_size": 64, "seq_length": 16, "q_lora_rank": 16, "kv_lora_rank": 16,
                 "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                 "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 16, "n_shared_experts": 1},
}


def _preset(name):
    import yaml
    with open(os.path.join(ROOT, "configs", "model_presets", f"{name}.yaml")) as fh:
        return yaml.safe_load(fh)["model"]


def _config(model: dict, optimizer: str, strategy: str = "allgather", shard: int = -1):
    from mindformers_core.config import load_config
    opt = {"type": "AdamW"} if optimizer == "adamw" else \
        {"type": "Muon", "comm_strategy": strategy, "qk_clip_enabled": False}
    return load_config({"training": {"steps": 10, "local_batch_size": 1, "global_batch_size": 8},
                        "optimizer": opt,
                        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
                        "model": model, "parallelism": {"data_parallel_shard": shard}})


def _build(cfg, shard_layout=None):
    from mindformers_core.models import build_model
    from mindformers_core.optim import build_optimizer
    model = build_model(cfg.model, seed=0)
    return model, build_optimizer(cfg.optimizer, model, shard_layout=shard_layout)


def model_rank(model_cfg: dict, world: int, rank: int) -> dict:
    """Per-step counters of one rank of ``world`` (set-up only, see the module docstring)."""
    from mindformers_core.distributed.comm import Communicator
    from mindformers_core.distributed.shard_layout import ns_flops
    from mindformers_core.distributed.zero import ZeroSharding, optimizer_state_bytes
    from mindformers_core.optim.muon_split import piece_shapes
    out = {}
    _, adamw = _build(_config(model_cfg, "adamw"), ZeroSharding(Communicator(rank, world), -1))
    out["adamw_state_bytes"] = optimizer_state_bytes(adamw)
    _, muon = _build(_config(model_cfg, "muon"), ZeroSharding(Communicator(rank, world), -1))
    n_params = sum(int(p.size) for p in muon.parameters)
    out["muon_state_bytes"] = optimizer_state_bytes(muon)
    grad_bytes = 2.0 * (world - 1) / world * 4 * n_params
    if world == 1:
        flops = sum(ns_flops(piece_shapes(muon.split_rule(i), p.shape, p.name), muon.ns_steps)
                    for i, p in enumerate(muon.parameters) if muon.muon_mask[i])
        out.update(ns_flops_allgather=flops, ns_flops_deredundency=flops,
                   bytes_allgather=0.0, bytes_deredundency_cpu=0.0, bytes_deredundency_p2p=0.0)
        return out
    layout = muon.layout
    param_bytes = (world - 1) * 4 * sum(e.padded_size for e in layout.entries if e.sharded)
    flops_ag = flops_dr = 0.0
    u_gather = 0.0
    owned_total = [0.0] * world
    p2p = 0.0
    for i, p in enumerate(muon.parameters):
        if not muon.muon_mask[i]:
            continue
        if muon.exchange.matrix_levels[i]:
            f = ns_flops(muon.piece_shapes_of(p.name), muon.ns_steps)
            flops_ag += f
            owner = muon.ns_owner[i]
            flops_dr += f if owner == rank else 0.0
            u_gather += (world - 1) * 4 * layout.entries[i].padded_size
            owned_total[owner] += 4 * int(p.size)
            # P2P: the owner receives the other ranks' rows of U; every rank receives its
            # rows of the updates it does not own
            mine = 4 * math.prod(layout.entries[i].shard_shape)
            p2p += (4 * int(p.size) - mine) if owner == rank else mine
        else:
            shape = layout.entries[i].shard_shape   # expert shard or replicated: local NS
            f = ns_flops(piece_shapes(muon.split_rule(i), shape, p.name), muon.ns_steps)
            flops_ag += f
            flops_dr += f
    base = grad_bytes + param_bytes
    out.update(ns_flops_allgather=flops_ag, ns_flops_deredundency=flops_dr,
               bytes_allgather=base + u_gather,
               bytes_deredundency_cpu=base + u_gather + (world - 1) * max(owned_total),
               bytes_deredundency_p2p=base + p2p,
               owned_matrices=sum(1 for r in muon.ns_owner.values() if r == rank))
    return out


def measure(model_name: str, steps: int = 3) -> dict:
    """2 msrun CPU workers: measured per-rank counters per step (averaged over ``steps``)."""
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = f"python {os.path.abspath(__file__)} --worker {tmp} --model {model_name} --steps {steps}"
        proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), cmd,
                               "2", str(port), os.path.join(tmp, "logs"), "True", "300"],
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"measurement job failed:\n{proc.stderr[-3000:]}")
        return {r: json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in (0, 1)}


def worker(out_dir: str, model_name: str, steps: int) -> None:
    """msrun worker: a few steps of each strategy on random data; per-step counters."""
    import numpy as np
    import mindspore as ms
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.distributed.grad_reduce import (DataParallelGradReducer, RouteComm,
                                                          reduce_gradients)
    from mindformers_core.distributed.zero import optimizer_state_bytes
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    comm = init_distributed()
    reducer = DataParallelGradReducer(comm)
    model_cfg = MODELS.get(model_name) or _preset(model_name)
    res = {}
    for label, opt_name, strategy in (("adamw", "adamw", "allgather"),
                                      ("allgather", "muon", "allgather"),
                                      ("deredundency", "muon", "allgather_deredundency")):
        cfg = _config(model_cfg, opt_name, strategy)
        model, opt = _build(cfg, reducer.optimizer_sharding(cfg))
        params = opt.parameters
        routes, route_comm = reducer.grad_routes(params), RouteComm(comm)
        grad_fn = ms.value_and_grad(lambda a, b, c: model(a, b, c)[0], None, list(params))
        rng = np.random.default_rng(comm.rank)
        seq, vocab = cfg.model.seq_length, cfg.model.vocab_size
        comm.stats.reset()
        flops0 = getattr(opt, "ns_flops_total", 0.0)
        for _ in range(steps):
            ids = ms.Tensor(rng.integers(0, vocab, (1, seq)).astype(np.int32))
            _, grads = grad_fn(ids, ids, ms.Tensor(np.ones((1, seq), np.float32)))
            grads, _, _ = reduce_gradients(grads, routes, route_comm, reducer.token_group,
                                           0.0, 1.0)
            opt.step(grads)
        res[label] = {"bytes": comm.stats.total_bytes / steps,
                      "by_op": {k: v / steps for k, v in comm.stats.bytes.items()},
                      "ns_flops": (getattr(opt, "ns_flops_total", 0.0) - flops0) / steps,
                      "state_bytes": optimizer_state_bytes(opt)}
    write_json(os.path.join(out_dir, f"rank{comm.rank}.json"), res, indent=None)
    comm.barrier()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--model", default="tiny_mla")
    ap.add_argument("--measure", action="store_true")
    add_output_args(ap, "dp")
    ap.add_argument("--worker")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.model, args.steps)
        return 0
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model_cfg = MODELS.get(args.model) or _preset(args.model)
    rows = []
    for world in args.worlds:
        ranks = [model_rank(model_cfg, world, r) for r in range(world)]
        rows.append({"world": world, "ranks": ranks})
    one = rows[0]["ranks"][0] if rows[0]["world"] == 1 else model_rank(model_cfg, 1, 0)
    print(f"model {args.model}; per optimizer step, per rank (max over ranks)")
    print(f"{'W':>3} {'NS GFLOP ag':>12} {'NS GFLOP dr':>12} {'MB ag':>8} {'MB dr cpu':>10} "
          f"{'MB dr p2p':>10} {'AdamW state MB':>15} {'Muon state MB':>14} {'vs 1 rank':>9}")
    for row in rows:
        rk = row["ranks"]

        def mx(key):
            return max(r[key] for r in rk)
        print(f"{row['world']:>3} {mx('ns_flops_allgather') / 1e9:>12.4f} "
              f"{mx('ns_flops_deredundency') / 1e9:>12.4f} {mx('bytes_allgather') / 1e6:>8.3f} "
              f"{mx('bytes_deredundency_cpu') / 1e6:>10.3f} {mx('bytes_deredundency_p2p') / 1e6:>10.3f} "
              f"{mx('adamw_state_bytes') / 1e6:>15.4f} {mx('muon_state_bytes') / 1e6:>14.4f} "
              f"{mx('adamw_state_bytes') / one['adamw_state_bytes']:>9.3f}")
    result = {"model": args.model, "model_rows": rows}
    if args.measure:
        meas = measure(args.model, args.steps)
        result["measured_2_workers"] = meas
        print("\nmeasured, 2 msrun CPU workers (per step, per rank):")
        for label in ("adamw", "allgather", "deredundency"):
            for r in (0, 1):
                m = meas[r][label]
                print(f"  {label:>12} rank {r}: NS {m['ns_flops'] / 1e9:.4f} GFLOP, "
                      f"{m['bytes'] / 1e6:.3f} MB received {m['by_op']}, "
                      f"state {m['state_bytes'] / 1e6:.4f} MB")
    write_json(output_path(args, "dp"), result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
