"""Several MindRecord files as one dataset (upstream's ``dataset_files: [a, b]``): the rows
of each file in order (data/concat.py), checked against the token windows each was written
from; --check describes every file."""
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from mindformers_core.config import ConfigError, load_config
from mindformers_core.data.run_data import build_run_datasets
from mindformers_core.tools.make_token_data import write_mindrecord

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S = 8


def _run(dataloader):
    return {"training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 2},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"vocab_size": 256, "seq_length": S},
            "train_dataset": {"dataloader": dataloader}}


def test_rows_of_the_files_in_order(tmp_path):
    rng = np.random.default_rng(0)
    streams = [rng.integers(0, 100, 3 * S + 1), rng.integers(100, 200, 2 * S + 1)]
    files = []
    for i, tokens in enumerate(streams):
        files.append(str(tmp_path / f"part{i}.mindrecord"))
        write_mindrecord(tokens, files[-1], S)
    # windows of S + 1 tokens at stride S of each stream, the first file's first
    want = np.concatenate([np.stack([t[j * S:j * S + S + 1] for j in range((len(t) - 1) // S)])
                           for t in streams])
    cfg = load_config(_run({"type": "MindDataset", "dataset_files": files}))
    assert cfg.train_dataset.data_path == files
    assert cfg.to_dict()["train_dataset"]["dataloader"]["dataset_files"] == files
    train, _ = build_run_datasets(cfg)
    assert train.num_samples == 5
    idx = [4, 0, 3, 2, 4]                       # across both files, a repeat, out of order
    got = train.source.get(idx)
    np.testing.assert_array_equal(got["input_ids"], want[idx, :-1])
    np.testing.assert_array_equal(got["labels"], want[idx, 1:])
    with pytest.raises(IndexError, match=r"sample index outside \[0, 5\)"):
        train.source.get([5])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_run({"type": "MindDataset", "dataset_files": files})))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
                        str(path), "--mode", "1", "--check"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.stdout.startswith("config OK"), r.stderr
    assert f"MindDataset {files[0]} (+ .db): 3 rows" in r.stdout
    assert f"MindDataset {files[1]} (+ .db): 2 rows" in r.stdout
    os.remove(files[1])
    with pytest.raises(ConfigError, match=r"^train_dataset\.data_path\[1\]: MindRecord file "
                                          r"not found"):
        build_run_datasets(cfg)
