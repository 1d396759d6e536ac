"""msrun worker of tests/distributed/test_eval_layouts_msrun.py: the ``quick`` run of
``eval_tp_case`` under the overrides of ``eval_tp_case.LAYOUTS[NAME]``; rank 0 leaves
``OUT_DIR/NAME/metrics.jsonl`` and the run log ``OUT_DIR/NAME.log``.

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
    from eval_tp_case import LAYOUTS, run
    os.makedirs(out, exist_ok=True)
    _, text = run("quick", os.path.join(out, name), LAYOUTS[name][1])
    if text:
        with open(os.path.join(out, f"{name}.log"), "w", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
