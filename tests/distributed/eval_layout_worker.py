"""msrun worker of tests/distributed/test_eval_layouts_msrun.py: the quickstart run of
``eval_layout_case`` under layout ``eval_layout_case.LAYOUTS[NAME]``; rank 0 leaves
``OUT_DIR/NAME/metrics.jsonl`` (and the final checkpoint under ``OUT_DIR/NAME/checkpoint``
when the layout saves), the run log ``OUT_DIR/NAME.log`` and, sampled under the layout after
training, ``OUT_DIR/NAME.sampled.json`` (``eval_layout_case.sample``); a ``no_eval`` layout then runs
without evaluation into ``OUT_DIR/NAME_no_eval``; a ``generate`` layout runs
``tools.generate`` on every worker (``OUT_DIR/NAME.generate.rankR.txt``).

    python tests/distributed/eval_layout_worker.py OUT_DIR NAME
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def main(out: str, name: str):
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    import json
    from eval_layout_case import LAYOUTS, no_eval_overrides, run, sample
    case = LAYOUTS[name]
    os.makedirs(out, exist_ok=True)
    trainer, text = run(case.model, os.path.join(out, name), case.overrides(), case.schedule)
    sampled = sample(trainer)   # every rank: a collective under the layout
    if text:
        with open(os.path.join(out, f"{name}.log"), "w", encoding="utf-8") as fh:
            fh.write(text)
        with open(os.path.join(out, f"{name}.sampled.json"), "w", encoding="utf-8") as fh:
            json.dump(sampled, fh)
    if case.generate:   # tools.generate on every worker: rank 0 prints
        generate_on_workers(out, name, case)
    if case.no_eval:
        run(case.model, os.path.join(out, f"{name}_no_eval"),
            list(case.layout) + no_eval_overrides(case.schedule), case.schedule)


def generate_on_workers(out: str, name: str, case):
    """``tools.generate`` on this worker from the case's final checkpoint, once every rank's
    run is over; its stdout goes to ``OUT_DIR/NAME.generate.rankR.txt``."""
    import contextlib
    import io
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.launch_env import env_rank
    from mindformers_core.tools.generate import main as generate
    from eval_layout_case import ROOT, generate_argv
    init_distributed().barrier()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = generate(generate_argv(os.path.join(ROOT, "configs", "quickstart.yaml"),
                                      os.path.join(out, name, "checkpoint"), case.layout,
                                      case.schedule))
    with open(os.path.join(out, f"{name}.generate.rank{env_rank()}.txt"), "w",
              encoding="utf-8") as fh:
        fh.write(f"{code}\n{buf.getvalue()}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
