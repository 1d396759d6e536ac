"""The documented WSD extension (docs/checkpoints.md): keep a stable-phase checkpoint with
checkpoint.keep_steps and resume from it; resuming from the decayed newest checkpoint is
reported as an lr jump."""
import io
import json
import os

from mindformers_core.trainer import Trainer
from mindformers_core.checkpoint.store import list_checkpoints
from tests.trainer.tiny_run import tiny_run_cfg


WSD = {"type": "WarmUpStableDecayLR", "learning_rate": 1.e-2, "warmup_steps": 2,
       "decay_start_ratio": 0.5, "lr_end": 1.e-5}


def wsd(out, steps, **checkpoint):
    ck = {"enable_save": True, "save_interleaved_steps": 100, "save_max": 1, "keep_steps": [5]}
    ck.update(checkpoint)
    return tiny_run_cfg(steps, training={"seed": 1}, lr=WSD, checkpoint=ck)


def rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def test_extend_a_wsd_run_from_its_kept_stable_phase_checkpoint(tmp_path):
    first = tmp_path / "first"
    Trainer(wsd(first, 10), str(first), stream=io.StringIO()).train()
    ckpts = dict(list_checkpoints(str(first / "checkpoint")))
    assert sorted(ckpts) == [5, 10]             # save_max 1 keeps step 10; keep_steps keeps 5

    # the newest checkpoint is after the decay: extending from it jumps the lr up
    log = io.StringIO()
    Trainer(wsd(first, 20, load_path=ckpts[10], keep_steps=[10]), str(first), stream=log)
    assert "WARNING: the learning rate jumps" in log.getvalue()

    # the documented recipe: resume from the stable-phase checkpoint
    log = io.StringIO()
    t = Trainer(wsd(first, 20, load_path=ckpts[5], keep_steps=[10]), str(first), stream=log)
    assert "learning rate jumps" not in log.getvalue()
    t.train()
    extended = rows(first)
    fresh = tmp_path / "fresh"
    Trainer(wsd(fresh, 20, keep_steps=[10]), str(fresh), stream=io.StringIO()).train()
    # the extended run is the 20-step run: same lr at every step, same losses
    assert [r["lr"] for r in extended] == [r["lr"] for r in rows(fresh)]
    assert [r["loss"] for r in extended] == [r["loss"] for r in rows(fresh)]
