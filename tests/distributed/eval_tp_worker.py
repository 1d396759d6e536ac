"""msrun worker of tests/distributed/test_eval_tp_msrun.py: every case of
``eval_tp_case.CASES`` under tensor parallel 2, in one launch; rank 0 leaves
``OUT_DIR/NAME/metrics.jsonl`` and the run log ``OUT_DIR/NAME.log``, then both ranks decode
``eval_tp_case.untrained_sample`` together and rank 0 writes its ids to
``OUT_DIR/untrained.json``.

    python tests/distributed/eval_tp_worker.py OUT_DIR
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def main():
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from eval_tp_case import CASES, TP, run, untrained_sample
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in CASES:
        trainer, text = run(name, os.path.join(out, name), TP)
        if text:
            with open(os.path.join(out, f"{name}.log"), "w", encoding="utf-8") as fh:
                fh.write(text)
    ids = untrained_sample(trainer.parallel.group_comm)
    if trainer.rank == 0:
        with open(os.path.join(out, "untrained.json"), "w") as fh:
            json.dump(ids, fh)


if __name__ == "__main__":
    main()
