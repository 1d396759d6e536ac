"""msrun worker of the fully sharded data-parallel test: the ``dp_case.FSDP_CASES`` named on
the command line (``dp_worker.main``), then the Trainer run of ``trainer_case`` under
``FSDP_OVERRIDES`` into RUN_DIR.

    python tests/distributed/fsdp_worker.py OUT_DIR RUN_DIR CASE [CASE ...]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir, run_dir, cases):
    import mindspore as ms
    from dp_worker import main as run_cases
    from mindformers_core.trainer import Trainer
    from trainer_case import FSDP_OVERRIDES, trainer_config
    run_cases(out_dir, cases)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(trainer_config(run_dir, FSDP_OVERRIDES), run_dir).train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
