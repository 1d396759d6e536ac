"""tools/generate: a checkpoint of a real (short) text run -> the same continuation as the
trained model gives; the sampling flags; errors with their exit codes."""
import io
import os

import pytest

from mindformers_core.config import load_config
from mindformers_core.models.generation import generate
from mindformers_core.tools import generate as tool
from mindformers_core.trainer import Trainer


def _cfg_dict(out):
    return {
        "training": {"steps": 3, "local_batch_size": 2, "global_batch_size": 2, "seed": 5},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 0},
        "model": {"vocab_size": 256, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 16},
        "train_dataset": {"type": "PydocText"},
        "checkpoint": {"enable_save": True, "save_path": os.path.join(str(out), "ckpt")},
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    import yaml
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg_dict(out)), encoding="utf-8")
    t = Trainer(load_config(str(path)), str(out), stream=io.StringIO())
    t.train()
    return t, str(path), os.path.join(str(out), "ckpt")


def test_generate_cli_continues_the_prompt_like_the_trained_model(trained, capsys):
    t, cfg_path, ckpt = trained
    tok = t.progress.tokenizer
    want = tok.decode(generate(t.model, tok.encode("The with"), 12))
    assert tool.main(["--config", cfg_path, "--checkpoint", ckpt, "--prompt", "The with",
                      "--max_new_tokens", "12"]) == 0
    assert capsys.readouterr().out == "The with" + want + "\n"
    want = tok.decode(generate(t.model, tok.encode("if"), 8, temperature=0.8, top_k=20,
                               top_p=0.9, seed=4))
    assert tool.main(["--config", cfg_path, "--checkpoint", ckpt, "--prompt", "if",
                      "--max_new_tokens", "8", "--temperature", "0.8", "--top_k", "20",
                      "--top_p", "0.9", "--seed", "4"]) == 0
    assert capsys.readouterr().out == "if" + want + "\n"


def test_generate_cli_errors(trained, tmp_path, capsys):
    _, cfg_path, ckpt = trained
    assert tool.main(["--config", cfg_path, "--checkpoint", str(tmp_path / "none"),
                      "--prompt", "x"]) == 1
    assert capsys.readouterr().err.startswith(f"error: --checkpoint {tmp_path / 'none'}: no such "
                                              "file or directory")
    assert tool.main(["--config", cfg_path, "--checkpoint", ckpt, "--prompt", "x",
                      "--set", "model.vocab_size=100"]) == 2
    assert "error: model.vocab_size: 100 is below the vocabulary of the tokenizer (byte: 256" \
        in capsys.readouterr().err
    assert tool.main(["--config", cfg_path, "--checkpoint", ckpt, "--prompt", "x",
                      "--set", "model.hidden_size=32"]) == 1
    assert "parameter embedding.word_embeddings.weight has shape (256, 16), the model has " \
        "(256, 32)" in capsys.readouterr().err
    assert tool.main(["--config", cfg_path, "--checkpoint", ckpt, "--prompt", "x",
                      "--top_p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
