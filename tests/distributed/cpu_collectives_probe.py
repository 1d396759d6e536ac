"""Reproducer of the CPU collective capabilities that collectives.CAPABILITIES records.

    bash scripts/msrun_launcher.sh "python tests/distributed/cpu_collectives_probe.py" 4

Each worker prints ``PROBE <name> ok|FAIL <message>`` (in LOG_DIR/worker_<rank>.log):
sub-group AllReduce SUM against the exact sums, 20 rounds interleaved with world traffic
(groups tp {0,1} {2,3}, dp {0,2} {1,3}), then each MindSpore collective on a sub-group and on the
world group. Not collected by pytest: a measurement to rerun on a new MindSpore release.
"""
import os
import sys

import numpy as np


def main():
    from mindspore import Tensor, ops
    from mindspore.mint import distributed as dist
    from mindspore.communication import create_group, get_group_size, get_rank, init
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    r, w = get_rank(), get_group_size()
    tp = [r - r % 2, r - r % 2 + 1]
    dp = [r % 2, r % 2 + 2]
    create_group("tp_%d_%d" % tuple(tp), tp)
    create_group("dp_%d_%d" % tuple(dp), dp)
    ntp, ndp = "tp_%d_%d" % tuple(tp), "dp_%d_%d" % tuple(dp)
    sums = [ops.AllReduce(group=ntp), ops.AllReduce(), ops.AllReduce(group=ndp)]
    bad = 0
    for k in range(20):
        x = Tensor(np.full(4, (r + 1) * 10 + k, np.float32))
        outs = [op(x) for op in sums]        # no sync between the three
        for out, members in zip(outs, (tp, range(w), dp)):
            bad += int(not np.all(out.asnumpy() == sum((q + 1) * 10 + k for q in members)))
    print(f"PROBE subgroup_allreduce_sum {'ok' if bad == 0 else 'FAIL'} {bad} wrong of 60",
          flush=True)
    x = Tensor(np.ones((w, 2), np.float32))
    peer = r ^ 1
    probes = {
        "allreduce_max_world": lambda: ops.AllReduce(ops.ReduceOp.MAX)(x),
        "allgather_world": lambda: ops.AllGather()(x),
        "allgather_subgroup": lambda: ops.AllGather(ntp)(x),
        "broadcast_world": lambda: ops.Broadcast(0)((x,))[0],
        "broadcast_subgroup": lambda: ops.Broadcast(tp[0], ntp)((x,))[0],
        "reducescatter_world": lambda: ops.ReduceScatter()(x),
        "alltoall_world": lambda: ops.AlltoAll(w, 0, 0)(x),
        "send_recv_world": lambda: (ops.Send(0, peer)(x) if r % 2 == 0 else
                                    ops.Receive(0, peer, [w, 2], x.dtype)(x)),
        "mint_send_recv_world": lambda: (dist.send(x, peer) or x if r % 2 == 0 else
                                         dist.recv(ops.zeros_like(x), peer) or x),
    }
    for name, fn in probes.items():
        try:
            out = fn()
            (out[0] if isinstance(out, tuple) else out).asnumpy()
            print(f"PROBE {name} ok", flush=True)
        except Exception as e:  # noqa: BLE001 - the message is the measurement
            lines = [ln for ln in str(e).splitlines() if ln.strip() and ln.strip()[0].isalpha()]
            msg = (lines or [type(e).__name__])[0][:200]
            print(f"PROBE {name} FAIL {type(e).__name__}: {msg}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
