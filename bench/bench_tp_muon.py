"""Tensor-parallel Muon: Newton-Schulz work and bytes per rank of the two comm strategies.

    python bench/bench_tp_muon.py [--tp 2 4] [--save | --out PATH]

One process, no collective runs: for every rank ``r`` of a ``tp``-rank mesh, the tiny
DeepSeek-V3 (configs/muon_deepseek_v3_tiny.yaml) is sharded as a tensor-parallel run shards it
(``apply_tensor_parallel``: q/kv up-projections and fc1 on dim 0, linear_proj and fc2 on
dim 1) and the real Muon is built over rank r's shards by ``TensorParallelSharding`` from
``model.shard_specs()``. Per optimizer step and rank it reports

* NS FLOPs (``shard_layout.ns_flops`` of the full shapes' pieces): allgather orthogonalises
  every matrix on every rank; allgather_deredundency only the split weights the rank owns,
  plus the replicated ones (every rank);
* bytes received: allgather, the U all-gather of the split Muon weights, ``(tp-1)`` times the
  local shard bytes; deredundency on CPU (no send/recv) the same gather plus the all-gather
  of the owners' full updates padded to the largest owner; deredundency with send/recv
  (Ascend): the owner receives the other shards of U of its weights, each rank receives its
  shard of every update it does not own.

Writes output/bench/tp_muon.json (untracked;
bench/results/tp_muon.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

MODEL = "configs/muon_deepseek_v3_tiny.yaml"


def rank_row(tp: int, rank: int, strategy: str) -> dict:
    from mindformers_core.config import load_config
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.shard_layout import ns_flops
    from mindformers_core.distributed.shard_spec import local_shape
    from mindformers_core.distributed.tp_sharding import TensorParallelSharding
    from mindformers_core.models import build_model
    from mindformers_core.models.tp_model import apply_tensor_parallel
    from mindformers_core.optim.build import build_optimizer

    cfg = load_config(os.path.join(ROOT, MODEL), overrides=[
        f"optimizer.comm_strategy={strategy}"])
    comm = GroupCommunicator(make_mesh(tp, tp=tp), rank, backend="cpu")
    # rank r's shards and their layout, as a tensor-parallel run holds them (no collective
    # runs while a model is sharded or an optimizer built)
    model = apply_tensor_parallel(build_model(cfg.model, seed=0, jit="none"), comm)
    specs = model.shard_specs()
    opt = build_optimizer(cfg.optimizer, model, shard_layout=TensorParallelSharding(specs, comm))
    ex = opt.exchange
    flops = gather = owned_bytes = p2p = 0.0
    for i, p in enumerate(opt.parameters):
        if not opt.muon_mask[i]:
            continue
        f = ns_flops(opt.piece_shapes_of(p.name), opt.ns_steps)
        full = 4.0 * math.prod(opt.full_shape(i))
        if not ex.matrix_levels[i]:
            flops += f
            continue
        local = 4.0 * math.prod(local_shape(specs[p.name]))
        mine = ex.owner[i] == rank
        flops += f if strategy == "allgather" or mine else 0.0
        gather += (tp - 1) * local
        owned_bytes += full if mine else 0.0
        p2p += (full - local) if mine else local
    return {"ns_flops": flops, "gather": gather, "owned": owned_bytes, "p2p": p2p}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    add_output_args(ap, "tp_muon")
    args = ap.parse_args(argv)
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    #: column -> (header, unit divisor)
    columns = {"ns_flops_allgather": ("NS GFLOP ag", 1e9), "ns_flops_deredundency":
               ("NS GFLOP dr", 1e9), "bytes_allgather": ("MB ag", 1e6),
               "bytes_deredundency_cpu": ("MB dr cpu", 1e6),
               "bytes_deredundency_p2p": ("MB dr p2p", 1e6)}
    print(f"{MODEL}: per optimizer step, per rank (max over ranks)")
    print("tp  " + "  ".join(f"{h:>12}" for h, _ in columns.values()))
    rows = []
    for tp in args.tp:
        ag = [rank_row(tp, r, "allgather") for r in range(tp)]
        dr = [rank_row(tp, r, "allgather_deredundency") for r in range(tp)]
        widest = max(d["owned"] for d in dr)
        row = {"tp": tp,
               "ns_flops_allgather": max(a["ns_flops"] for a in ag),
               "ns_flops_deredundency": max(d["ns_flops"] for d in dr),
               "bytes_allgather": max(a["gather"] for a in ag),
               "bytes_deredundency_cpu": max(d["gather"] + (tp - 1) * widest for d in dr),
               "bytes_deredundency_p2p": max(d["p2p"] for d in dr)}
        rows.append(row)
        print(f"{tp:<3} " + "  ".join(f"{row[k] / div:>12.4f}" for k, (_, div) in columns.items()))
    write_json(output_path(args, "tp_muon"), rows, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
