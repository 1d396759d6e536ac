"""convert_weights on a training checkpoint: --to hf really renames (model weights only, the
optimizer and RNG state dropped), the HF file comes back bit for bit, and a config whose sizes
do not match the file is refused naming the tensor and both shapes."""
import io

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from mindformers_core.checkpoint.store import list_checkpoints, load_checkpoint
from mindformers_core.checkpoint.weight_names import from_native
from mindformers_core.tools.convert_weights import main
from mindformers_core.trainer import Trainer
from tests.trainer.tiny_run import tiny_run_cfg

MODEL = {"model_type": "gpt", "vocab_size": 16, "hidden_size": 8, "num_layers": 1,
         "num_attention_heads": 2, "seq_length": 4}


def write_cfg(path, **model):
    path.write_text(yaml.safe_dump({
        "training": {"steps": 1}, "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1.e-3, "warmup_steps": 0},
        "model": {**MODEL, **model}}))
    return str(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    Trainer(tiny_run_cfg(2, checkpoint={"enable_save": True}), str(out),
            stream=io.StringIO()).train()
    return list_checkpoints(str(out / "checkpoint"))[-1][1]


def test_to_hf_on_a_training_checkpoint_renames_and_drops_the_optimizer(tmp_path, ckpt, capsys):
    config = write_cfg(tmp_path / "c.yaml")
    data = load_checkpoint(ckpt)
    assert any(k.startswith("optim.") for k in data.tensors)
    weights = {k[len("model."):]: v for k, v in data.tensors.items() if k.startswith("model.")}
    out = str(tmp_path / "hf.safetensors")
    assert main(["--config", config, "--to", "hf", "--input", ckpt, "--output", out]) == 0
    hf = load_file(out)
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.post_attention_layernorm.weight"} <= set(hf)
    assert all(k.startswith(("model.embed_tokens.", "model.layers.", "model.norm.", "lm_head."))
               for k in hf), sorted(hf)
    assert f"wrote {out} (native -> hf, {len(weights)} model tensors)" in capsys.readouterr().out
    from mindformers_core.config import load_config
    want = from_native(weights, "hf", load_config(config).model)
    assert sorted(hf) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(hf[k], v, err_msg=k)
    # and back: the checkpoint's weights exactly (the directory form of the input too)
    back = str(tmp_path / "native.safetensors")
    assert main(["--config", config, "--from", "hf", "--input", out, "--output", back]) == 0
    got = load_file(back)
    assert sorted(got) == sorted(weights)
    for k, v in weights.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_config_of_other_sizes_is_refused_naming_the_tensor_and_both_shapes(tmp_path, ckpt,
                                                                             capsys):
    config = write_cfg(tmp_path / "c.yaml", vocab_size=32)
    out = tmp_path / "hf.safetensors"
    assert main(["--config", config, "--to", "hf", "--input", ckpt, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: tensor embedding.word_embeddings.weight: {ckpt} has shape "
                          "(16, 8), the model of --config has (32, 8)"), err
    assert not out.exists()


def test_a_training_checkpoint_is_not_hf_input(tmp_path, ckpt, capsys):
    config = write_cfg(tmp_path / "c.yaml")
    assert main(["--config", config, "--from", "hf", "--input", ckpt,
                 "--output", str(tmp_path / "x.safetensors")]) == 2
    assert f"error: --from hf: {ckpt} is a mindformers_core training checkpoint" in \
        capsys.readouterr().err
