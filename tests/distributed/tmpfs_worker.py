"""msrun worker for the real full-disk test: the checkpoints go to a size-limited tmpfs
(mounted by the test). After the step-2 checkpoint is complete, rank 0 fills the tmpfs with a
file that leaves half of that checkpoint's size free, so the step-4 save really runs out of
space (ENOSPC from the kernel, no seam). Every rank then stops with the CLI's ``ERROR:`` line.

    python tests/distributed/tmpfs_worker.py OUT_DIR CHECKPOINT_DIR
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trainer_case import trainer_config  # noqa: E402


def used_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main(out_dir: str, ckpt_dir: str) -> int:
    import mindspore as ms
    from mindformers_core.checkpoint.store import CheckpointError
    from mindformers_core.trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(trainer_config(out_dir, [f"checkpoint.save_path={ckpt_dir}"]), out_dir)
    save = trainer.save

    def save_then_fill(write_hook=None):
        path = save(write_hook=write_hook)
        if trainer.rank == 0 and trainer.state.step == 2:
            st = os.statvfs(ckpt_dir)
            free = st.f_bavail * st.f_frsize
            leave = used_bytes(ckpt_dir) // 2
            with open(os.path.join(ckpt_dir, "filler.bin"), "wb") as fh:
                fh.write(b"\0" * max(0, free - leave))
        return path

    trainer.save = save_then_fill
    try:
        trainer.train()
    except CheckpointError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
