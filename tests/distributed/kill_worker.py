"""msrun worker for the fault test: train a tiny config with the real Trainer; rank 1 kills
itself with SIGKILL during step ``KILL_AT`` (after the checkpoint of the step before).

    python tests/distributed/kill_worker.py OUT_DIR KILL_AT
"""
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trainer_case import trainer_config  # noqa: E402


def main(out_dir: str, kill_at: int) -> None:
    import mindspore as ms
    from mindformers_core.trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(trainer_config(out_dir), out_dir)

    def die(step, grads):
        if trainer.rank == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return grads

    trainer.grad_hooks.append(die)
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
