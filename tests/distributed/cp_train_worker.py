"""msrun worker of the context-parallel Trainer tests: the real Trainer for each case named.

    python tests/distributed/cp_train_worker.py OUT_DIR CASE...

Writes ``OUT_DIR/CASE/metrics.jsonl`` (rank 0) and ``OUT_DIR/CASE.rank{r}.json`` (this rank's
coordinates, data rank and the max attention logits it ended with: the MAX-reduced ones).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def main(out, names):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from cp_case import config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    for name in names:
        run_dir = os.path.join(out, name)
        trainer = Trainer(config(name, run_dir), run_dir, overwrite=True)
        trainer.train()
        with open(os.path.join(out, f"{name}.rank{trainer.rank}.json"), "w") as fh:
            json.dump({"coords": trainer.parallel.coords(), "data_rank": trainer.data_rank,
                       "max_logits": trainer.model.get_max_attention_logits().tolist()}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
