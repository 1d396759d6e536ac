"""msrun worker: the expert-parallel Trainer runs of ``ep_case.CASES`` (``expert_parallel: 2``)
and this rank's model layout.

    python tests/distributed/ep_worker.py OUT_DIR CASE [CASE ...] [--global-batch N]

Writes ``OUT_DIR/CASE/`` (the run directory, rank 0's metrics.jsonl) and
``OUT_DIR/CASE.rank{r}.json`` (``model.shard_specs()``, the local expert shapes, the
optimizer-state shapes of the expert weights, the router's expert bias) and
``OUT_DIR/CASE.rank{r}.npz`` (this rank's final expert weights).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir, cases, global_batch=4):
    import mindspore as ms
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.trainer import Trainer
    from ep_case import case_config
    from rank_layout import save_layout

    ms.runtime.launch_blocking()
    comm = init_distributed()
    os.makedirs(out_dir, exist_ok=True)
    for name in cases:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        trainer = Trainer(case_config(name, 2, global_batch), os.path.join(out_dir, name),
                          overwrite=True)
        trainer.train()
        from mindformers_core.models.expert_parallel import shard_experts
        try:   # a model is split once
            shard_experts(trainer.model, trainer.parallel.group_comm)
            again = None
        except ValueError as exc:
            again = str(exc)
        # the expert-parallel communicator's counters: logical bytes (what the algorithm
        # moves) and the backend's wire bytes (the CPU emulation's AllReduce)
        ep_comm = next(cell.ep_comm for _, cell in trainer.model.cells_and_names()
                       if getattr(cell, "ep_comm", None) is not None)
        save_layout(out_dir, name, comm.rank, trainer, split_again=again,
                    ep_comm={"logical": ep_comm.stats.to_dict(),
                             "wire": ep_comm.transport.to_dict()})
    comm.barrier()


if __name__ == "__main__":
    args = sys.argv[2:]
    batch = 4
    if "--global-batch" in args:
        k = args.index("--global-batch")
        batch, args = int(args[k + 1]), args[:k] + args[k + 2:]
    main(sys.argv[1], args, batch)
