"""msrun worker: the ``tp_muon_case`` cases on a tp-2 mesh (dp = world // 2); writes this
rank's shards, optimizer state and counters.

    python tests/distributed/tp_muon_worker.py OUT_DIR CASE [CASE ...]

Writes ``OUT_DIR/{case}.rank{r}.npz`` (``param.*``, ``state.*``) and ``.json`` (tp index, dp
index, NS FLOPs, owners, clipped heads per step, communicator stats).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir, cases):
    import numpy as np
    import mindspore as ms
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.core.parallel_dims import make_mesh
    import tp_muon_case as C

    ms.runtime.launch_blocking()
    world = init_distributed()
    mesh = make_mesh(world.world_size, tp=2)
    comm = GroupCommunicator(mesh, world.rank)
    os.makedirs(out_dir, exist_ok=True)
    table = dict(C.CASES, **C.CASES_2D)
    for name in cases:
        comm.stats.reset()
        res = C.run(name, comm, tp=2, cases=table)
        arrays = {f"param.{k}": v for k, v in res["params"].items()}
        arrays.update({f"state.{k}": v for k, v in res["state"].items()})
        base = os.path.join(out_dir, f"{name}.rank{world.rank}")
        np.savez(base + ".npz", **arrays)
        with open(base + ".json", "w") as fh:
            json.dump({"tp": mesh.local_rank("tp", world.rank),
                       "dp": mesh.local_rank("dp", world.rank),
                       "ns_flops": res["ns_flops"], "owners": res["owners"],
                       "clipped": res["clipped"], "stats": comm.stats.to_dict()}, fh)
    world.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
