"""The held-out evaluation run of ``test_eval_msrun.py``: tests/trainer/test_evaluate.py's
``text_cfg`` (4 steps of a tiny GPT on PydocText with 2% held out, an evaluation every 2 steps
over 3 batches, global batch 4) with seed 9, on 2 workers x local batch 2 or 1 process x 4."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "trainer"))


def run(run_dir: str, local_batch: int) -> None:
    """The Trainer on that config into ``run_dir`` (the layout matrix's case ``eval_dp`` with
    local batch 2 on each of 2 workers; the 1-process reference with 4)."""
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from test_evaluate import text_cfg
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = text_cfg(run_dir, training={"seed": 9, "local_batch_size": local_batch})
    Trainer(cfg, run_dir).train()
