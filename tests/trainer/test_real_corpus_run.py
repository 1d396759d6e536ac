"""The practitioner's path end to end: train a BPE tokenizer on real text, build two Megatron
.bin/.idx corpora with it, blend them, train 20 steps with held-out evaluation and TensorBoard,
then generate 20 tokens from the checkpoint. And the shipped quickstart's acceptance."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is absent")


def _rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


@pytest.mark.slow
def test_bpe_indexed_blend_train_generate(tmp_path, capsys):
    from mindformers_core.config import load_config
    from mindformers_core.data.text_corpus import pydoc_documents
    from mindformers_core.data.tokenizer import HFTokenizer
    from mindformers_core.tools import generate as gen_tool
    from mindformers_core.tools import make_token_data, train_tokenizer
    from mindformers_core.trainer import Trainer

    docs = pydoc_documents()
    text_dir = {"a": tmp_path / "text_a", "b": tmp_path / "text_b"}
    for name, part in (("a", docs[:40]), ("b", docs[40:])):
        text_dir[name].mkdir()
        for i, doc in enumerate(part):
            (text_dir[name] / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
    tok_path = str(tmp_path / "tokenizer.json")
    assert train_tokenizer.main([str(text_dir["a"]), str(text_dir["b"]), "--output", tok_path,
                                 "--vocab-size", "512"]) == 0
    vocab = HFTokenizer(tok_path).vocab_size
    assert 257 < vocab <= 512
    for name in ("a", "b"):
        assert make_token_data.main([str(text_dir[name]), "--output", str(tmp_path / name),
                                     "--tokenizer", tok_path, "--format", "idx"]) == 0
    out = capsys.readouterr().out
    assert f"vocab {vocab}) from 40 files" in out and "tokens/s" in out
    cfg = {
        "training": {"steps": 20, "local_batch_size": 4, "global_batch_size": 4, "seed": 1,
                     "eval_interval": 10, "eval_steps": 2},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 5e-3,
                         "warmup_steps": 2, "lr_end": 5e-4},
        "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 2,
                  "num_attention_heads": 4, "seq_length": 32},
        "train_dataset": {"type": "IndexedDataset", "validation_split": 0.05,
                          "eod_mask_loss": True,
                          "blend": [[0.7, str(tmp_path / "a")],
                                    [0.3, str(tmp_path / "b")]]},
        "tokenizer": {"type": "hf", "path": tok_path},
        "logging": {"tensorboard": True, "sample_prompt": "The with statement",
                    "sample_max_new_tokens": 8},
        "checkpoint": {"enable_save": True, "save_interleaved_steps": 10},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    run_dir = tmp_path / "run"
    stream = io.StringIO()
    Trainer(load_config(str(path)), str(run_dir), stream=stream).train()
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert [r["step"] for r in rows if "eval_ppl" in r] == [10, 20]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert "sample (greedy, " in stream.getvalue()
    events = [f for f in os.listdir(run_dir / "tensorboard") if "tfevents" in f]
    assert events
    from tb_events import read_events
    tb = read_events(str(run_dir / "tensorboard"))
    assert [s for s, _ in tb["loss"]] == list(range(1, 21))
    np.testing.assert_allclose([v for _, v in tb["eval_loss"]],
                               [r["eval_loss"] for r in rows if "eval_loss" in r], rtol=1e-6)
    capsys.readouterr()
    assert gen_tool.main(["--config", str(path), "--checkpoint", str(run_dir / "checkpoint"),
                          "--prompt", "The with statement", "--max_new_tokens", "20",
                          "--temperature", "0.7", "--top_k", "50", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("The with statement") and len(text) > len("The with statement\n")


@pytest.mark.slow
def test_quickstart_trains_on_real_text_held_out_loss_falls_and_prints_a_sample(tmp_path):
    """The README's command 1 as shipped: held-out rows fall >= 20% first -> last eval."""
    proc = subprocess.run([sys.executable, "run_mindformer.py", "--config",
                           "configs/quickstart.yaml", "--mode", "1", "--output_dir",
                           str(tmp_path), "--set", "checkpoint.enable_save=False"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    evals = [r["eval_loss"] for r in _rows(tmp_path) if "eval_ppl" in r]
    assert len(evals) >= 2 and evals[-1] <= 0.8 * evals[0], evals
    assert "sample (greedy, 80 tokens):\nThe with statement" in proc.stdout
