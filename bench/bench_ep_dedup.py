"""Expert-parallel exchange volume: the pair dispatch (``moe_token_dispatcher_type: alltoall``,
models/ep_dispatch.py) against the deredundant one (``alltoall_deredundancy``,
models/ep_dedup.py), per rank and MoE layer forward + backward, from the real exchange plans
of random top-k routings (no communication is run, so any machine gives the same numbers).

Two figures per layout:

    logical   the all-to-all payload CommStats counts ((ep - 1) / ep of each buffer, as
              distributed/collectives.py ``logical_bytes``): what the algorithm moves
    cpu wire  what the CPU emulation moves: each all-to-all is an AllReduce of a buffer ep
              times larger (``GroupCommunicator._stacked_gather``), so it follows the same
              buffers and shrinks with them

The measured 2-rank run (tests/distributed/test_ep_msrun.py
``test_deredundant_dispatch_moves_fewer_logical_bytes``) reads the same counters.

    python bench/bench_ep_dedup.py            # prints the table
    python bench/bench_ep_dedup.py --save     # + bench/results/ep_dedup.json
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.distributed.collectives import logical_bytes  # noqa: E402
from mindformers_core.models.dispatch import make_plan  # noqa: E402
from mindformers_core.models.ep_dedup import make_dedup_plan, unique_per_destination  # noqa: E402
from mindformers_core.models.ep_dispatch import make_ep_plan  # noqa: E402

#: name -> (experts, top-k, ep, hidden, tokens per rank and micro-batch)
LAYOUTS = {
    "tiny DeepSeek-V3 (tests)": (4, 2, 2, 64, 64),
    "E64 k6 ep8 H2048": (64, 6, 8, 2048, 4096),
    "DeepSeek-V3 E256 k8 ep8 H7168": (256, 8, 8, 7168, 4096),
    "DeepSeek-V3 E256 k8 ep64 H7168": (256, 8, 64, 7168, 4096),
}
FLOAT = 4   # bytes of a float32 row element


def volumes(e, k, ep, h, t, seed=0):
    """(pair logical, dedup logical, pair wire, dedup wire) bytes per rank, forward+backward."""
    rng = np.random.default_rng(seed)
    locals_ = [make_plan(np.argsort(-rng.normal(size=(t, e)), 1)[:, :k], e) for _ in range(ep)]
    counts = np.stack([np.minimum(p.tokens_per_expert, p.capacity) for p in locals_])
    unique = np.stack([unique_per_destination(p, ep) for p in locals_])
    pair_rows = ep * make_ep_plan(locals_[0], counts, 0).chunk
    dedup_rows = ep * make_dedup_plan(locals_[0], unique, 0).chunk
    el = e // ep
    # forward: pair = x out + y back; dedup = x out + [gate | mask] out + y back; the backward
    # runs the same all-to-alls on the gradients
    pair = [pair_rows * h * FLOAT] * 2
    dedup = [dedup_rows * h * FLOAT, dedup_rows * 2 * el * FLOAT, dedup_rows * h * FLOAT]
    logical = [2 * sum(logical_bytes("all_to_all", ep, b) for b in bufs) for bufs in (pair, dedup)]
    wire = [2 * sum(logical_bytes("all_reduce", ep, ep * b) for b in bufs)
            for bufs in (pair, dedup)]
    return logical + wire


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, "ep_dedup")
    args = parser.parse_args(argv)
    rows = {}
    print(f"{'layout':34s} {'pair MB':>10s} {'dedup MB':>10s} {'saved':>7s} "
          f"{'cpu wire pair MB':>17s} {'dedup MB':>10s}")
    for name, layout in LAYOUTS.items():
        lp, ld, wp, wd = volumes(*layout)
        rows[name] = {"layout": dict(zip(("experts", "top_k", "ep", "hidden", "tokens"), layout)),
                      "logical_bytes": {"alltoall": lp, "alltoall_deredundancy": ld},
                      "cpu_wire_bytes": {"alltoall": wp, "alltoall_deredundancy": wd},
                      "logical_saved": 1 - ld / lp}
        print(f"{name:34s} {lp / 2**20:10.2f} {ld / 2**20:10.2f} {1 - ld / lp:7.1%} "
              f"{wp / 2**20:17.2f} {wd / 2**20:10.2f}")
    print("written to", write_json(output_path(args, "ep_dedup"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
