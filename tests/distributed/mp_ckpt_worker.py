"""msrun worker of the model-parallel checkpoint test (``mp_ckpt_case``).

    python tests/distributed/mp_ckpt_worker.py OUT_DIR CASE [SINGLE_CKPT]

Case CASE of ``mp_ckpt_case.CASES`` trains from scratch into ``OUT_DIR/CASE`` (every rank
writes its part of the checkpoints at steps 4 and 6); then, with SINGLE_CKPT,
``OUT_DIR/CASE_resumed`` resumes that one-process checkpoint under the same layout to the end.
The layout matrix (layout_cases.mp_ckpt_job) runs every case in turn in the same workers.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir: str, name: str, single_ckpt=None) -> None:
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from mp_ckpt_case import case_config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    run = os.path.join(out_dir, name)
    Trainer(case_config(name, run, True), run).train()
    if single_ckpt:
        run = os.path.join(out_dir, f"{name}_resumed")
        Trainer(case_config(name, run, True, [f"checkpoint.load_path={single_ckpt}"]),
                run).train()


if __name__ == "__main__":
    main(*sys.argv[1:])
