"""msrun worker: the trainer-level MTP run (``trainer_case`` with one MTP depth, no
checkpoints) on this rank; rank 0 writes metrics.jsonl into OUT_DIR.

    python tests/distributed/mtp_worker.py OUT_DIR
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trainer_case import MTP_OVERRIDES, trainer_config  # noqa: E402


def main(out_dir: str) -> None:
    import mindspore as ms
    from mindformers_core.trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(trainer_config(out_dir, MTP_OVERRIDES), out_dir).train()


if __name__ == "__main__":
    main(sys.argv[1])
