"""msrun worker: run data-parallel cases (``dp_case.CASES``) and write this rank's results.

    python tests/distributed/dp_worker.py OUT_DIR CASE [CASE ...] [--resume CKPT_DIR RUN_DIR]

Writes ``OUT_DIR/{case}.rank{r}.npz`` (losses, norms, ``param.*``, ``state.*``) and
``OUT_DIR/{case}.rank{r}.json`` (optimizer-state bytes, comm stats, NS FLOPs, NS owners).
``--resume``: then resume the Trainer run of ``trainer_case`` from CKPT_DIR into RUN_DIR on
this world size (the fault test's last checkpoint).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir, cases, resume=None):
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
                       "ns_owner": res["ns_owner"],
                       "qk_clipped_heads": res["qk_clipped_heads"],
                       "host_add_kernel": res["host_add_kernel"],
                       "param_bytes": res["param_bytes"], "grad_bytes": res["grad_bytes"],
                       "shard_specs": res["shard_specs"]}, fh)
    if resume:
        from mindformers_core.trainer import Trainer
        from trainer_case import trainer_config
        ckpt, run_dir = resume
        ms.set_context(mode=ms.PYNATIVE_MODE)
        Trainer(trainer_config(run_dir, [f"checkpoint.load_path={ckpt}"]), run_dir).train()
    comm.barrier()


if __name__ == "__main__":
    args = sys.argv[2:]
    resume = None
    if "--resume" in args:
        k = args.index("--resume")
        resume, args = args[k + 1:k + 3], args[:k]
    main(sys.argv[1], args, resume)
