"""msrun worker: run data-parallel cases (``dp_case.CASES``) and write this rank's results.

    python tests/distributed/dp_worker.py OUT_DIR CASE [CASE ...]

Writes ``OUT_DIR/{case}.rank{r}.npz`` (losses, norms, ``param.*``, ``state.*``) and
``OUT_DIR/{case}.rank{r}.json`` (optimizer-state bytes, comm stats, NS FLOPs, NS owners).
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
    from mindformers_core.distributed.comm import init_distributed
    from dp_case import run_case

    ms.runtime.launch_blocking()   # synchronous dispatch: the fast mode on CPU
    comm = init_distributed()
    os.makedirs(out_dir, exist_ok=True)
    for name in cases:
        res = run_case(name, comm)
        arrays = {"losses": np.array(res["losses"]), "norms": np.array(res["norms"])}
        arrays.update({f"param.{k}": v for k, v in res["params"].items()})
        arrays.update({f"state.{k}": v for k, v in res["state_dict"].items()})
        base = os.path.join(out_dir, f"{name}.rank{comm.rank}")
        np.savez(base + ".npz", **arrays)
        with open(base + ".json", "w") as fh:
            json.dump({"world": comm.world_size, "state_bytes": res["state_bytes"],
                       "comm": res["comm"], "ns_flops": res["ns_flops"],
                       "ns_owner": res["ns_owner"]}, fh)
    comm.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
