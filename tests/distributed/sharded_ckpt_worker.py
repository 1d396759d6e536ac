"""msrun worker of the sharded-checkpoint test: the real Trainer (``trainer_case``: data
parallel with ZeRO-1 optimizer-state sharding, a checkpoint every 2 steps).

    python tests/distributed/sharded_ckpt_worker.py OUT_DIR STOP_AT SINGLE_CKPT

``OUT_DIR/a``: from scratch to step STOP_AT (every rank writes its part of each checkpoint).
``OUT_DIR/b``: resumed from SINGLE_CKPT (a one-process checkpoint) to the end.
``OUT_DIR/c``: from scratch to step 2, where rank 1 cannot write its rank file (a directory
holds its name); each rank's error goes to ``OUT_DIR/c/error.rank{r}.txt``.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trainer_case import trainer_config  # noqa: E402


def main(out_dir: str, stop_at: int, single_ckpt: str) -> None:
    import mindspore as ms
    from mindformers_core.trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    run_a = os.path.join(out_dir, "a")
    Trainer(trainer_config(run_a, [f"training.stop_at_step={stop_at}"]), run_a).train()
    run_b = os.path.join(out_dir, "b")
    Trainer(trainer_config(run_b, [f"checkpoint.load_path={single_ckpt}"]), run_b).train()
    from mindformers_core.trainer.checkpoint import CheckpointError
    from mindformers_core.trainer.sharded_checkpoint import rank_file_name
    run_c = os.path.join(out_dir, "c")
    trainer = Trainer(trainer_config(run_c, ["training.stop_at_step=2"]), run_c)
    if trainer.rank == 1:
        os.makedirs(os.path.join(trainer.save_dir, rank_file_name(
            "mindformers_core_step00000002.safetensors", 1, 2)))
    try:
        trainer.train()
        message = "no error"
    except CheckpointError as exc:
        message = str(exc)
    with open(os.path.join(run_c, f"error.rank{trainer.rank}.txt"), "w") as fh:
        fh.write(message)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
