"""Micro-benchmarks that calibrate the CPU profile of the layout advisor (core/device_profiles.py).

    python -m mindformers_core.tools.calibrate_device --out cpu_profile.json            # matmul
    bash scripts/msrun_launcher.sh "python -m mindformers_core.tools.calibrate_device \\
        --comm --out cpu_profile.json" 2                                               # + all-reduce

Measures, in this process, the sustained float32 matmul rate of one MindSpore process
(``matmul_flops``: 512 x 512 matmuls in PyNative, synchronised) and the fixed cost of one
small PyNative op (``op_overhead_s``); with ``--comm`` under msrun, the communicator's world
all-reduce (distributed/comm.py) at two sizes, fitted as ``latency + bytes / bandwidth``. Rank 0
writes the JSON that ``plan_layout --calibration`` reads (the keys of
:class:`~mindformers_core.core.device_profiles.DeviceProfile` it sets).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

__all__ = ["matmul_rate", "op_overhead", "allreduce_fit", "main"]


def _timed(fn, repeat: int) -> float:
    fn()   # warm-up: kernel selection, first allocation
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def matmul_rate(n: int = 512, repeat: int = 20) -> float:
    """FLOP/s of ``n x n`` float32 matmuls (2 n^3 FLOPs each) in this process."""
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    a = ms.Tensor(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32))
    seconds = _timed(lambda: ops.matmul(a, a).asnumpy(), repeat)
    return 2.0 * n ** 3 / seconds


def op_overhead(repeat: int = 200) -> float:
    """Seconds of one tiny PyNative op (launch and synchronisation, not arithmetic)."""
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    x = ms.Tensor(np.ones((4, 4), np.float32))
    return _timed(lambda: ops.add(x, x).asnumpy(), repeat)


def allreduce_fit(comm, sizes=(1 << 10, 1 << 22), repeat: int = 10) -> Dict[str, float]:
    """``{"latency_s", "bandwidth_Bps"}`` of the world all-reduce: two sizes, a line through
    them (time = latency + algorithm bytes / bandwidth, algorithm bytes 2 (W-1)/W n)."""
    import numpy as np
    w = comm.world_size
    points = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        comm.barrier()
        points.append((2 * (w - 1) / w * nbytes, _timed(lambda: comm.all_reduce_sum(x), repeat)))
    (b0, t0), (b1, t1) = points
    slope = max((t1 - t0) / (b1 - b0), 1e-15)
    return {"latency_s": max(t0 - slope * b0, 0.0) / max(1, 2 * (w - 1)),
            "bandwidth_Bps": 1.0 / slope}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.calibrate_device",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    p.add_argument("--comm", action="store_true", help="also time the all-reduce (under msrun)")
    args = p.parse_args(argv)
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    out = {"matmul_flops": matmul_rate(), "op_overhead_s": op_overhead(),
           "cores": os.cpu_count() or 1}
    rank = 0
    if args.comm:
        from ..distributed.comm import init_distributed
        comm = init_distributed()
        rank = comm.rank
        fit = allreduce_fit(comm)
        out.update({"intra_latency_s": fit["latency_s"], "intra_bandwidth_Bps": fit["bandwidth_Bps"],
                    "calibrated_workers": comm.world_size})
    if rank == 0:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
