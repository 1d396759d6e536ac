"""checkpoint.load_format: training (the trainer, the command line) and generation start from
Hugging Face safetensors (a file, or a sharded directory with model.safetensors.index.json) and
from upstream MindFormers checkpoints: weights only, through the converter's name tables, a
fine-tune start (step 0, fresh optimizer, new run id); the format is detected or given."""
import io
import json
import os
import sys

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from mindformers_core.checkpoint.foreign import HF_INDEX, detect_format
from mindformers_core.checkpoint.store import CheckpointError, list_checkpoints
from mindformers_core.checkpoint.weight_names import from_native
from mindformers_core.config import ConfigError
from mindformers_core.tools.convert_weights import model_tensors
from mindformers_core.trainer import Trainer
from tests.trainer.tiny_run import tiny_run_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def weights(c, seed=5):
    rng = np.random.default_rng(seed)
    from mindformers_core.models import build_model
    return {k: (rng.standard_normal(v.shape) * 0.1).astype(np.float32)
            for k, v in model_tensors(build_model(c.model)).items()}


def write_hf_dir(d, hf):
    """``hf`` as a two-shard Hugging Face directory."""
    os.makedirs(d, exist_ok=True)
    names = sorted(hf)
    parts = {"model-00001-of-00002.safetensors": names[::2],
             "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in parts.items():
        save_file({k: hf[k] for k in keys}, os.path.join(d, fname))
    with open(os.path.join(d, HF_INDEX), "w") as fh:
        json.dump({"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}},
                  fh)
    return str(d)


def assert_model_holds(t, w):
    got = model_tensors(t.model)
    assert sorted(got) == sorted(w)
    for k, v in w.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_training_starts_from_hf_weights(tmp_path, layout):
    c = tiny_run_cfg(2)
    w = weights(c)
    hf = {k: np.ascontiguousarray(v) for k, v in from_native(w, "hf", c.model).items()}
    if layout == "file":
        src = str(tmp_path / "model.safetensors")
        save_file(hf, src)
    else:
        src = write_hf_dir(tmp_path / "hf", hf)
    assert detect_format(src) == "hf"
    log = io.StringIO()
    t = Trainer(tiny_run_cfg(2, checkpoint={"load_path": src, "enable_save": True}),
                str(tmp_path / "run"), stream=log)
    assert_model_holds(t, w)
    assert t.state.step == 0 and t.resumed_from is None
    text = log.getvalue()
    assert f"checkpoint.load_path {src}: hf weights (checkpoint.load_format: auto)" in text
    assert f"initialised the model from the weights of {src}: a fine-tune start" in text
    t.train()
    assert t.state.step == 2
    assert [s for s, _ in list_checkpoints(str(tmp_path / "run" / "checkpoint"))] == [2]


def test_training_starts_from_an_upstream_mindformers_checkpoint(tmp_path):
    c = tiny_run_cfg(2)
    w = weights(c, seed=6)
    mf = {k: np.ascontiguousarray(v) for k, v in from_native(w, "mindformers", c.model).items()}
    # upstream's training checkpoint also holds its optimizer state and counters
    mf.update({f"adam_m.{k}": np.zeros_like(v) for k, v in mf.items()})
    mf["global_step"] = np.array([7], np.int32)
    src = str(tmp_path / "mf.safetensors")
    save_file(mf, src)
    t = Trainer(tiny_run_cfg(2, checkpoint={"load_path": src, "load_format": "mindformers"}),
                str(tmp_path / "run"), stream=io.StringIO())
    assert_model_holds(t, w)
    assert t.state.step == 0


def test_wrong_format_or_sizes_are_refused_naming_the_file(tmp_path):
    c = tiny_run_cfg(2)
    hf = {k: np.ascontiguousarray(v) for k, v in from_native(weights(c), "hf", c.model).items()}
    src = str(tmp_path / "model.safetensors")
    save_file(hf, src)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {src} does not match the model: "
                                              r"missing \['decoder"):
        Trainer(tiny_run_cfg(2, checkpoint={"load_path": src, "load_format": "native"}),
                str(tmp_path / "a"), stream=io.StringIO())
    with pytest.raises(CheckpointError, match=rf"^checkpoint {src}: parameter "
                                              r"embedding.word_embeddings.weight has shape "
                                              r"\(16, 8\), the model has \(32, 8\)"):
        Trainer(tiny_run_cfg(2, model={"vocab_size": 32}, checkpoint={"load_path": src}),
                str(tmp_path / "b"), stream=io.StringIO())
    with pytest.raises(ConfigError, match=r"^checkpoint.load_format: must be one of \['auto', "
                                          r"'native', 'hf', 'mindformers'\], got 'pt'"):
        tiny_run_cfg(2, checkpoint={"load_format": "pt"})
    os.remove(src)
    broken = write_hf_dir(tmp_path / "hf", hf)
    os.remove(os.path.join(broken, "model-00002-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match=r"names shard file\(s\) \['model-00002-of-00002"):
        Trainer(tiny_run_cfg(2, checkpoint={"load_path": broken}), str(tmp_path / "c"),
                stream=io.StringIO())


def test_command_line_training_and_generate_from_an_hf_directory(tmp_path, capsys):
    import run_mindformer
    from mindformers_core.config.tokenizer import TokenizerConfig
    from mindformers_core.data.tokenizer import build_tokenizer
    from mindformers_core.models import build_model
    from mindformers_core.models.generation import generate
    from mindformers_core.tools import generate as gen_tool
    from mindformers_core.tools.convert_weights import load_into_model
    c = tiny_run_cfg(2, model={"vocab_size": 256})   # the byte tokenizer's vocabulary
    w = weights(c)
    hf = {k: np.ascontiguousarray(v) for k, v in from_native(w, "hf", c.model).items()}
    src = write_hf_dir(tmp_path / "hf", hf)
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(c.to_dict()))
    assert run_mindformer.main(["--config", str(cfg_path), "--mode", "1", "--output_dir",
                                str(tmp_path / "out"), "--set",
                                f"checkpoint.load_path={src}"]) == 0
    assert f"initialised the model from the weights of {src}" in capsys.readouterr().out
    assert gen_tool.main(["--config", str(cfg_path), "--checkpoint", src, "--prompt", "ab",
                          "--max_new_tokens", "3"]) == 0
    model = build_model(c.model)
    load_into_model(model, w)
    tok = build_tokenizer(TokenizerConfig())
    assert capsys.readouterr().out == "ab" + tok.decode(generate(model, tok.encode("ab"), 3)) \
        + "\n"


def test_native_and_mindformers_names_are_told_apart_or_refused(tmp_path):
    from mindformers_core.tools.convert_checkpoint import main as convert_main
    c = tiny_run_cfg(2, checkpoint={"enable_save": True})
    Trainer(c, str(tmp_path / "run"), stream=io.StringIO()).train()
    ckpt = list_checkpoints(str(tmp_path / "run" / "checkpoint"))[-1][1]
    # this project's weights file says what it is
    w_only = str(tmp_path / "w.safetensors")
    assert convert_main(["merge", "--input", ckpt, "--output", w_only, "--weights-only"]) == 0
    assert detect_format(w_only) == "native"
    t = Trainer(tiny_run_cfg(2, checkpoint={"load_path": w_only}), str(tmp_path / "a"),
                stream=io.StringIO())
    from mindformers_core.checkpoint.store import load_checkpoint
    want = {k[len("model."):]: v for k, v in load_checkpoint(ckpt).tensors.items()
            if k.startswith("model.")}
    assert_model_holds(t, want)
    # a GPT's MindFormers names are this project's (other qkv rows): refused under auto
    mf = from_native(want, "mindformers", c.model)
    src = str(tmp_path / "mf.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in mf.items()}, src)
    with pytest.raises(CheckpointError, match=r"its tensor names are both this project's and "
                                              r"upstream MindFormers' .* set "
                                              r"checkpoint.load_format to native or mindformers"):
        Trainer(tiny_run_cfg(2, checkpoint={"load_path": src}), str(tmp_path / "b"),
                stream=io.StringIO())
    t = Trainer(tiny_run_cfg(2, checkpoint={"load_path": src, "load_format": "mindformers"}),
                str(tmp_path / "c"), stream=io.StringIO())
    assert_model_holds(t, want)
