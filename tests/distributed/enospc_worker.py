"""msrun worker for the launcher's full-disk test: train the tiny config with the real Trainer;
rank 1's write of its rank file of the step-4 checkpoint fails with ENOSPC (the writer's test
seam, checkpoint/file_io.write_atomic's ``write_hook``). Every rank then stops with a
CheckpointError and exits 1 with the CLI's ``ERROR:`` line; rank 1 (the one whose disk was
full) takes 3 s longer to exit, so msrun sees the healthy rank 0 end first.

    python tests/distributed/enospc_worker.py OUT_DIR
"""
import errno
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trainer_case import trainer_config  # noqa: E402

FULL_AT = 4


def main(out_dir: str) -> int:
    import mindspore as ms
    from mindformers_core.checkpoint.store import CheckpointError
    from mindformers_core.trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(trainer_config(out_dir), out_dir)

    def disk_full(fh, data):
        if trainer.rank == 1 and trainer.state.step == FULL_AT:
            fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fh.write(data)

    save = trainer.save
    trainer.save = lambda write_hook=None: save(write_hook=disk_full)
    try:
        trainer.train()
    except CheckpointError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        if trainer.rank == 1:
            time.sleep(3)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
