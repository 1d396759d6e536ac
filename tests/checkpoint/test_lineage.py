"""A directory resume continues the current line of training (checkpoint/lineage.py): after a
resume from an older step with a new lr into the same directory, the next directory resume
takes the new branch's newest checkpoint, not the abandoned branch's newer one; two branches
that cannot be ordered are refused naming both; old checkpoints without a lineage still load."""
import io
import json
import os

import numpy as np
import pytest

from mindformers_core.checkpoint.lineage import resume_order, start_lineage
from mindformers_core.checkpoint.store import (CheckpointError, checkpoint_name,
                                               list_checkpoints, load_checkpoint,
                                               resolve_checkpoint, save_checkpoint)
from mindformers_core.trainer import Trainer
from tests.trainer.tiny_run import LR, tiny_run_cfg


def cfg(steps, lr=1.e-3, stop_at=None, **ck):
    checkpoint = {"enable_save": True, "save_interleaved_steps": 2, "save_max": 5, **ck}
    return tiny_run_cfg(steps, checkpoint=checkpoint, lr={**LR, "learning_rate": lr},
                        training={"stop_at_step": stop_at} if stop_at else None)


def run(c, out):
    log = io.StringIO()
    t = Trainer(c, str(out), stream=log)
    t.train()
    return t, log.getvalue()


def rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def test_directory_resume_takes_the_new_branch_not_the_abandoned_one(tmp_path):
    ckdir = tmp_path / "checkpoint"
    first, _ = run(cfg(6), tmp_path)                       # branch A: steps 2, 4, 6
    assert [s for s, _ in list_checkpoints(str(ckdir))] == [2, 4, 6]
    step2 = str(ckdir / checkpoint_name("mindformers_core", 2))
    a6 = load_checkpoint(str(ckdir / checkpoint_name("mindformers_core", 6)))
    # branch B: back to step 2 with another lr, stopped at step 4 (writes 4', keeps A's 6)
    second, _ = run(cfg(8, lr=5.e-4, stop_at=4, load_path=step2), tmp_path)
    assert second.run_id == first.run_id
    b4 = load_checkpoint(str(ckdir / checkpoint_name("mindformers_core", 4)))
    assert b4.lineage["parent"] == {"name": os.path.basename(step2), "step": 2,
                                    "run_id": first.run_id}
    assert b4.lineage["chain"][0] == a6.lineage["chain"][0] and len(b4.lineage["chain"]) == 2
    assert [s for s, _ in list_checkpoints(str(ckdir))] == [2, 4, 6]   # A's step 6 is still there
    # the directory resume: the new branch's newest (step 4), not the abandoned step 6
    logs = []
    data = resolve_checkpoint(str(ckdir), log=logs.append)
    assert data.step == 4 and data.lineage == b4.lineage
    assert any("not resuming" in line and checkpoint_name("mindformers_core", 6) in line
               and "abandoned branch" in line for line in logs), logs
    # and a training run resumed from the directory continues branch B
    third, text = run(cfg(8, lr=5.e-4, load_path=str(ckdir)), tmp_path)
    assert f"resumed from {ckdir / checkpoint_name('mindformers_core', 4)}: step 4" in text
    assert third.state.step == 8
    assert [r["step"] for r in rows(tmp_path)][-4:] == [5, 6, 7, 8]


T = {"model.w": np.zeros(2, np.float32)}


def _save(d, step, lineage, run_id="r"):
    return save_checkpoint(str(d), "p", step, T, {}, {}, run_id=run_id, lineage=lineage)


class _Loaded:
    def __init__(self, path, step, lineage, run_id="r"):
        self.path, self.step, self.lineage, self.run_id = path, step, lineage, run_id


def test_two_branches_from_one_checkpoint_are_an_ambiguity_naming_both(tmp_path):
    a = start_lineage("A", None)
    p2 = _save(tmp_path, 2, a)
    b = start_lineage("B", _Loaded(p2, 2, a))
    c = start_lineage("C", _Loaded(p2, 2, a))
    pb = _save(tmp_path, 6, b)
    pc = _save(tmp_path, 4, c)
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(str(tmp_path))
    msg = str(err.value)
    assert msg.startswith(f"checkpoint.load_path: {tmp_path} holds two lines of training and "
                          "it is not clear which one to continue: "
                          f"{pb} (step 6, session B) and {pc} (step 4, session C)"), msg
    assert msg.endswith("set checkpoint.load_path to the file to resume")
    # a file is taken as given
    assert resolve_checkpoint(pc).step == 4


def test_checkpoints_without_a_lineage_load_as_one_line(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path), "p", step, T, {}, {}, run_id="old")
    assert resolve_checkpoint(str(tmp_path)).step == 3
    # a resume of an old checkpoint branches off the old run's line
    old2 = str(tmp_path / checkpoint_name("p", 2))
    data = load_checkpoint(old2)
    assert data.lineage is None
    new = start_lineage("N", data)
    assert new["chain"] == [["run:old", 0], ["N", 2]]
    _save(tmp_path, 4, new, run_id="old")
    found = list_checkpoints(str(tmp_path))
    assert [os.path.basename(p) for p in resume_order(found, str(tmp_path))] == [
        checkpoint_name("p", s) for s in (4, 2, 1)]   # the old step 3 is abandoned
