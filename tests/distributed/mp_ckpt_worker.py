"""msrun worker of the model-parallel checkpoint test (``mp_ckpt_case``).

    python tests/distributed/mp_ckpt_worker.py OUT_DIR TP_SINGLE_CKPT

Each case of ``mp_ckpt_case.CASES`` trains from scratch into ``OUT_DIR/{case}`` (every rank
writes its part of the checkpoints at steps 4 and 6); then ``OUT_DIR/tp_resumed`` resumes the
one-process GPT checkpoint TP_SINGLE_CKPT under tensor parallel to the end.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(out_dir: str, tp_single_ckpt: str) -> None:
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from mp_ckpt_case import CASES, case_config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for name in CASES:
        run = os.path.join(out_dir, name)
        Trainer(case_config(name, run, True), run).train()
    run = os.path.join(out_dir, "tp_resumed")
    Trainer(case_config("tp", run, True, [f"checkpoint.load_path={tp_single_ckpt}"]),
            run).train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
