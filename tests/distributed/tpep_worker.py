"""msrun worker: the tp 2 x ep 2 Trainer runs of ``tpep_case.CASES`` and this rank's layout.

    python tests/distributed/tpep_worker.py OUT_DIR CASE [CASE ...]

Writes ``OUT_DIR/CASE/`` (the run directory, rank 0's metrics.jsonl) and this rank's layout
(``rank_layout.save_layout``, with the case's wall time). ``tpep_case.CKPT_CASE`` also
writes its sharded checkpoints and resumes the one at step ``SAVE_AT`` into
``OUT_DIR/CASE_resumed``.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir, cases):
    import mindspore as ms
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.trainer import Trainer
    from rank_layout import save_layout
    from tpep_case import CKPT_CASE, SAVE_AT, case_config, checkpoint_at, checkpoint_overrides

    ms.runtime.launch_blocking()
    comm = init_distributed()
    os.makedirs(out_dir, exist_ok=True)
    for name in cases:
        t0 = time.monotonic()
        ms.set_context(mode=ms.PYNATIVE_MODE)
        run = os.path.join(out_dir, name)
        extra = checkpoint_overrides(run) if name == CKPT_CASE else []
        trainer = Trainer(case_config(name, True, extra), run, overwrite=True)
        trainer.train()
        save_layout(out_dir, name, comm.rank, trainer, seconds=time.monotonic() - t0)
        if name == CKPT_CASE:   # resume its own step-SAVE_AT checkpoint under the same layout
            resumed = os.path.join(out_dir, f"{name}_resumed")
            load = [f"checkpoint.load_path={checkpoint_at(run, SAVE_AT)}"]
            Trainer(case_config(name, True, load), resumed, overwrite=True).train()
    comm.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
