"""The digest covers the header (one changed byte of the train state is refused) and crafted
headers give a clear CheckpointError, never a traceback from the loader."""
import io
import json
import os
import struct

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.trainer import Trainer, run_training
from mindformers_core.checkpoint.store import (CheckpointError, load_checkpoint,
                                                 save_checkpoint)
from tests.trainer.tiny_run import tiny_run_cfg


COSINE = {"type": "CosineWithWarmUpLR", "learning_rate": 1.e-3, "warmup_steps": 2,
          "lr_end": 1.e-5}


def cfg(steps, **checkpoint):
    ck = {"enable_save": True, "save_interleaved_steps": 2, "save_max": 5}
    ck.update(checkpoint)
    return tiny_run_cfg(steps, lr=COSINE, checkpoint=ck)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    Trainer(cfg(4), str(out), stream=io.StringIO()).train()
    return str(out / "checkpoint" / "mindformers_core_step00000004.safetensors")


def resume(path, tmp_path, steps=4):
    return Trainer(cfg(steps, load_path=path), str(tmp_path), stream=io.StringIO())


def test_one_changed_byte_in_the_header_train_state_is_refused(trained, tmp_path):
    raw = open(trained, "rb").read()
    needle = b'\\"applied_steps\\": 4'
    assert raw.count(needle) == 1
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(raw.replace(needle, needle[:-1] + b"7"))
    with pytest.raises(CheckpointError, match="header or tensor data does not match its sha256"):
        load_checkpoint(str(bad))
    code = run_training(cfg(4, load_path=str(bad)), str(tmp_path / "out"), stream=io.StringIO())
    assert code == 1


def write_raw(path, header: bytes, body: bytes = b""):
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header + body)
    return str(path)


@pytest.mark.parametrize("header,message", [
    (b"[" * 200000 + b"]" * 200000, "nested too deeply"),
    (b"[1, 2]", "its header is a list, not a JSON object"),
    (b'{"__metadata__": {"format": 3}}', "__metadata__ must map names to strings"),
    (b'{"__metadata__": "x"}', "__metadata__ must map names to strings"),
    (b"\xff\xfe{}", "unreadable header"),
    (b"{not json}", "unreadable header"),
])
def test_crafted_headers_are_clear_errors(tmp_path, header, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(write_raw(tmp_path / "c.safetensors", header))


def resave(src, dst, step=None, state=None, tensors=None):
    """A crafted checkpoint with a *valid* digest (an edit made with our own writer)."""
    d = load_checkpoint(src)
    state = d.state if state is None else state
    tensors = d.tensors if tensors is None else tensors
    path = save_checkpoint(str(dst), "crafted", d.step if step is None else step, tensors,
                           state, d.config, d.dtypes, run_id=d.run_id)
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda st, t: st.pop("train_state"), "no train_state object"),
    (lambda st, t: st.pop("rng"), r"no rng state \(python and numpy\)"),
    (lambda st, t: st["train_state"].update(step=-5), "train_state.step must be a non-negative"),
    (lambda st, t: st["train_state"].update(step=1e9), "train_state.step must be a non-negative"),
    (lambda st, t: st["train_state"].update(applied_steps=True), "train_state.applied_steps"),
    (lambda st, t: t.pop(sorted(k for k in t if k.startswith("optim.adam_m"))[0]),
     r"optimizer tensor\(s\) \['adam_m\."),
    (lambda st, t: t.pop("rng.numpy_keys"), "tensor 'rng.numpy_keys' of the RNG state"),
    (lambda st, t: t.update({k: v.astype(np.float64) for k, v in t.items()
                             if k.startswith("model.")}), "is stored as float64, the model"),
])
def test_crafted_states_with_a_valid_digest_are_clear_errors(trained, tmp_path, edit, message):
    d = load_checkpoint(trained)
    state, tensors = json.loads(json.dumps(d.state)), dict(d.tensors)
    edit(state, tensors)
    path = resave(trained, tmp_path / "ck", state=state, tensors=tensors)
    with pytest.raises(CheckpointError, match=message):
        resume(path, tmp_path)


def test_step_in_header_must_be_a_count_and_within_the_run(trained, tmp_path):
    path = resave(trained, tmp_path / "neg", step=-5)
    with pytest.raises(CheckpointError, match=r"step '-5' is not a non-negative integer"):
        load_checkpoint(path)
    d = load_checkpoint(trained)
    state = json.loads(json.dumps(d.state))
    state["train_state"]["step"] = 10 ** 9
    path = resave(trained, tmp_path / "big", step=10 ** 9, state=state)
    with pytest.raises(CheckpointError, match=r"at step 1000000000, beyond training.steps=4"):
        resume(path, tmp_path)
    # the step in the header and the train state must agree
    path = resave(trained, tmp_path / "mismatch", step=3)
    with pytest.raises(CheckpointError, match="differs from the header's step 3"):
        resume(path, tmp_path)


def test_lr_jump_at_resume_is_reported(trained, tmp_path):
    out = io.StringIO()
    t = Trainer(load_config({**cfg(4).to_dict(), "lr_scheduler": {
        "type": "ConstantWarmUpLR", "learning_rate": 1.e-1, "warmup_steps": 0},
        "checkpoint": {"enable_save": True, "load_path": trained}}), str(tmp_path), stream=out)
    assert "WARNING: the learning rate jumps" in out.getvalue()
    del t
    quiet = io.StringIO()
    Trainer(cfg(6, load_path=trained), str(tmp_path / "q"), stream=quiet)
    assert "learning rate jumps" not in quiet.getvalue()


@pytest.mark.parametrize("edit,message", [
    (lambda st: st.update(optimizer_scalars={}), r"cannot be resumed: KeyError: .*global_step"),
    (lambda st: st["data"].update(kind="TokenFile"), r"cannot be resumed: ValueError: dataset "
                                                      r"state was saved with kind='TokenFile'"),
    (lambda st: st["rng"]["numpy"].pop("pos"), r"cannot be resumed: KeyError: 'pos'"),
])
def test_inconsistent_states_are_one_line_checkpoint_errors(trained, tmp_path, edit, message):
    d = load_checkpoint(trained)
    state = json.loads(json.dumps(d.state))
    edit(state)
    path = resave(trained, tmp_path / "ck", state=state)
    with pytest.raises(CheckpointError, match=message):
        resume(path, tmp_path)
