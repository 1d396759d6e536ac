"""msrun worker of the sharded-checkpoint test: the real Trainer (``trainer_case``: data
parallel with ZeRO-1 optimizer-state sharding, a checkpoint every 2 steps).

    python tests/distributed/sharded_ckpt_worker.py OUT_DIR STOP_AT SINGLE_CKPT

``OUT_DIR/a``: from scratch to step STOP_AT (every rank writes its part of each checkpoint).
``OUT_DIR/b``: resumed from SINGLE_CKPT (a one-process checkpoint) to the end.
``OUT_DIR/d``: run A's step-STOP_AT checkpoint resumed to the end with ``load_balanced``
(each rank reads one rank file), ``load_worker_number: 2`` and ``remove_redundancy`` (its
step-6 checkpoint holds each piece once).
``OUT_DIR/c``: from scratch to step 2, where rank 1 cannot write its rank file (a directory
holds its name); each rank's error goes to ``OUT_DIR/c/error.rank{r}.txt``.
``OUT_DIR/e``: a balanced load of a copy of run A's step-STOP_AT checkpoint whose rank file 1
has a flipped byte; each rank's error goes to ``error.rank{r}.txt`` and the rank files it read
to ``read.rank{r}.json``.
"""
import json
import shutil
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
    run_d = os.path.join(out_dir, "d")
    step = os.path.join(run_a, "checkpoint", f"mindformers_core_step{stop_at:08d}.safetensors")
    Trainer(trainer_config(run_d, [f"checkpoint.load_path={step}", "checkpoint.load_balanced=True",
                                   "checkpoint.load_worker_number=2",
                                   "checkpoint.remove_redundancy=True"]), run_d).train()
    from mindformers_core.checkpoint.store import CheckpointError
    from mindformers_core.checkpoint.sharded import rank_file_name
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
    damaged_balanced_load(os.path.join(run_a, "checkpoint"), os.path.join(out_dir, "e"),
                          f"mindformers_core_step{stop_at:08d}.safetensors", trainer.rank,
                          trainer.parallel.group_comm)


def damaged_balanced_load(src: str, run_e: str, name: str, rank: int, comm) -> None:
    from mindformers_core.checkpoint.balanced_load import WorldFileSharing
    from mindformers_core.checkpoint.store import CheckpointError, load_checkpoint
    from mindformers_core.checkpoint.sharded import rank_file_name
    sharing = WorldFileSharing(comm)
    files = [rank_file_name(name, r, 2) for r in range(2)]
    if rank == 0:
        os.makedirs(run_e)
        for f in [name] + files:
            shutil.copy(os.path.join(src, f), os.path.join(run_e, f))
        with open(os.path.join(run_e, files[1]), "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([last[0] ^ 1]))
    sharing.gather({})   # the copy exists for every rank
    read = sharing.files_to_read([os.path.getsize(os.path.join(run_e, f)) for f in files])
    try:
        load_checkpoint(os.path.join(run_e, name), read_workers=2, sharing=sharing)
        message = "no error"
    except CheckpointError as exc:
        message = str(exc)
    with open(os.path.join(run_e, f"error.rank{rank}.txt"), "w") as fh:
        fh.write(message)
    with open(os.path.join(run_e, f"read.rank{rank}.json"), "w") as fh:
        json.dump(read, fh)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
