"""tools/convert_checkpoint never replaces an existing output without --overwrite and never
writes over a file of its own input, even with it (merge and split)."""
import hashlib
import json
import os

import pytest

from mindformers_core.tools.convert_checkpoint import main
from mindformers_core.checkpoint.store import load_checkpoint, save_checkpoint
from mindformers_core.checkpoint.sharded import rank_file_name
from tests.trainer.test_sharded_checkpoint import full_data

NAME = "ck_step00000007.safetensors"


def sha(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@pytest.fixture
def sharded(tmp_path):
    """A step-7 single file in one/ and its 2-rank split in sharded/; a step-4 file in four/."""
    d = full_data()
    one = save_checkpoint(str(tmp_path / "one"), "ck", 7, d.tensors, d.state, d.config,
                          d.dtypes, run_id=d.run_id)
    save_checkpoint(str(tmp_path / "four"), "ck", 4, d.tensors, d.state, d.config, d.dtypes,
                    run_id=d.run_id)
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"world": 2, "coords": [{"dp": 0}, {"dp": 1}],
                               "zero_shards": 2}))
    assert main(["split", "--input", one, "--layout", str(lay),
                 "--output", str(tmp_path / "sharded")]) == 0
    return tmp_path


def test_merge_onto_an_existing_file_is_refused_unless_overwrite(sharded, capsys):
    target = str(sharded / "four" / "ck_step00000004.safetensors")
    before = sha(target)
    assert main(["merge", "--input", str(sharded / "sharded"), "--output", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --output: {target} already exists; refusing to replace "
                          "it. Choose another output path or pass --overwrite"), err
    assert sha(target) == before and load_checkpoint(target).step == 4
    assert main(["merge", "--input", str(sharded / "sharded"), "--output", target,
                 "--overwrite"]) == 0
    assert load_checkpoint(target).step == 7


@pytest.mark.parametrize("victim", [NAME, rank_file_name(NAME, 1, 2)])
def test_merge_never_writes_over_its_own_input(sharded, capsys, victim):
    target = str(sharded / "sharded" / victim)
    before = sha(target)
    for extra in ([], ["--overwrite"]):
        assert main(["merge", "--input", str(sharded / "sharded"), "--output", target]
                    + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --output {target} is a file of the input checkpoint; "
                              "refusing to write over it"), err
        assert sha(target) == before
    assert load_checkpoint(str(sharded / "sharded" / NAME)).step == 7


def test_split_refuses_existing_outputs_and_its_own_input(sharded, capsys):
    lay = str(sharded / "layout.json")
    index = sharded / "sharded" / NAME
    before = {n: sha(sharded / "sharded" / n) for n in os.listdir(sharded / "sharded")}
    # the same layout into the same directory: those files exist (and are the input's)
    for extra in ([], ["--overwrite"]):
        assert main(["split", "--input", str(index), "--layout", lay,
                     "--output", str(sharded / "sharded")] + extra) == 2
        assert "is a file of the input checkpoint" in capsys.readouterr().err
    assert {n: sha(sharded / "sharded" / n) for n in os.listdir(sharded / "sharded")} == before
    # into another directory holding a rank file of that name
    other = sharded / "other"
    other.mkdir()
    (other / rank_file_name(NAME, 0, 2)).write_bytes(b"keep me")
    assert main(["split", "--input", str(index), "--layout", lay, "--output", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --output: {other / rank_file_name(NAME, 0, 2)} already "
                          "exists; refusing to replace it"), err
    assert (other / rank_file_name(NAME, 0, 2)).read_bytes() == b"keep me"
    assert not (other / NAME).exists()
    assert main(["split", "--input", str(index), "--layout", lay, "--output", str(other),
                 "--overwrite"]) == 0
    assert load_checkpoint(str(other / NAME)).step == 7
