"""A real one-process Trainer resumes from sharded checkpoints (dp2 ZeRO-1 rows, tp2 shards,
two pipeline stages, written from its own checkpoint by ``split_checkpoint``) and continues with
exactly the steps of the uninterrupted run; a sharded checkpoint with a missing rank file is
one clear error at start-up. A one-process run still writes the single-file format."""
import io
import json
import os

import pytest

from mindformers_core.trainer import Trainer, run_training
from mindformers_core.checkpoint.store import (FORMAT, checkpoint_name, list_checkpoints,
                                                 load_checkpoint)
from mindformers_core.checkpoint.file_io import read_header
from mindformers_core.distributed.shard_spec import ShardSpec
from mindformers_core.checkpoint.sharded import (RankLayout, rank_file_name,
                                                         split_checkpoint)
from tests.trainer.tiny_run import tiny_run_cfg


def cfg(steps, **checkpoint):
    ck = {"enable_save": True, "save_interleaved_steps": 2, "save_max": 5}
    ck.update(checkpoint)
    return tiny_run_cfg(steps, checkpoint=ck)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return {r["step"]: r for r in (json.loads(line) for line in fh if line.strip())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    Trainer(cfg(4), str(out), stream=io.StringIO()).train()
    step2 = str(out / "checkpoint" / checkpoint_name("mindformers_core", 2))
    return {"metrics": metrics(out), "step2": step2}


def layouts(data):
    params = sorted(k[len("model."):] for k in data.tensors if k.startswith("model."))
    two_d = [n for n in params if data.tensors[f"model.{n}"].ndim == 2
             and data.tensors[f"model.{n}"].shape[0] % 2 == 0]
    tp = {n: ShardSpec(data.tensors[f"model.{n}"].shape, 0, "tp", 2) for n in two_d}
    half = len(params) // 2
    return {
        "zero_dp2": ({}, [RankLayout({"dp": r}, None, 2) for r in range(2)]),
        "tp2": (tp, [RankLayout({"tp": r}) for r in range(2)]),
        "pp2": ({}, [RankLayout({"pp": 0}, params[:half]), RankLayout({"pp": 1}, params[half:])]),
    }


@pytest.mark.parametrize("layout", ["zero_dp2", "tp2", "pp2"])
def test_sharded_checkpoint_resumes_with_the_same_steps(reference, tmp_path, layout):
    data = load_checkpoint(reference["step2"])
    specs, ranks = layouts(data)[layout]
    assert specs or layout != "tp2"
    index = split_checkpoint(data, str(tmp_path / "sharded"),
                             checkpoint_name("mindformers_core", 2), specs, ranks)
    run = tmp_path / "run"
    trainer = Trainer(cfg(4, load_path=index), str(run), stream=io.StringIO())
    assert trainer.resumed_from == index
    trainer.train()
    got, want = metrics(run), reference["metrics"]
    assert sorted(got) == [3, 4]
    for s in (3, 4):   # bit-identical resume: the same floats
        assert got[s]["loss"] == want[s]["loss"] and got[s]["grad_norm"] == want[s]["grad_norm"]
    # a one-process run writes the single-file format, as before
    last = list_checkpoints(str(run / "checkpoint"))[-1][1]
    assert read_header(last, os.path.getsize(last))["__metadata__"]["format"] == FORMAT


def test_missing_rank_file_stops_the_resume_with_one_line(reference, tmp_path):
    data = load_checkpoint(reference["step2"])
    specs, ranks = layouts(data)["zero_dp2"]
    name = checkpoint_name("mindformers_core", 2)
    index = split_checkpoint(data, str(tmp_path / "sharded"), name, specs, ranks)
    os.remove(tmp_path / "sharded" / rank_file_name(name, 1, 2))
    out = io.StringIO()
    code = run_training(cfg(4, load_path=index), str(tmp_path / "run"), stream=out)
    assert code == 1
    assert (f"ERROR: sharded checkpoint {index} is incomplete: rank file mindformers_core_"
            "step00000002.rank00001-of-00002.safetensors (rank 1 of 2) is missing") \
        in out.getvalue()
