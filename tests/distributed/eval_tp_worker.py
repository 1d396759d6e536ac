"""msrun worker of tests/distributed/test_eval_tp_msrun.py: every case of
``eval_tp_case.CASES`` under tensor parallel 2, in one launch; rank 0 leaves
``OUT_DIR/NAME/metrics.jsonl`` and the run log ``OUT_DIR/NAME.log``. Then both ranks decode
``eval_tp_case.untrained_sample`` together, then sample ``eval_tp_case.SAMPLING`` (temperature,
top-k, top-p), and rank 0 writes both ids to ``OUT_DIR/untrained.json``.

    python tests/distributed/eval_tp_worker.py OUT_DIR
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def main(out):
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from eval_tp_case import (CASES, PROMPT, SAMPLED_TOKENS, SAMPLING, TP, run,
                              untrained_model, untrained_sample)
    os.makedirs(out, exist_ok=True)
    for name in CASES:
        trainer, text = run(name, os.path.join(out, name), TP)
        if text:
            with open(os.path.join(out, f"{name}.log"), "w", encoding="utf-8") as fh:
                fh.write(text)
    model = untrained_model(trainer.parallel.group_comm)
    ids = untrained_sample(model)
    from mindformers_core.models.generation import generate
    sampled = generate(model, list(PROMPT), SAMPLED_TOKENS, **SAMPLING)
    if trainer.rank == 0:
        with open(os.path.join(out, "untrained.json"), "w") as fh:
            json.dump({"ids": ids, "sampled": sampled}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
