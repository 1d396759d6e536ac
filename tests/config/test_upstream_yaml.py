"""Upstream MindFormers' own PyNative YAML files (tests/fixtures/upstream_yaml, sources in its
README) through ``run_mindformer.py --check``, as users run it.

Each file either passes (exit 0), or is refused (exit 2) on its first value that needs a
feature not implemented here; the refusals are the ones listed in
docs/migrating_from_mindformers.md. For a refused file, overriding exactly the refused values
with their no-op values makes it pass, which shows that every other key of the file loads.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPSTREAM = os.path.join(ROOT, "tests", "fixtures", "upstream_yaml")

#: upstream's config-loader test file: a Qwen3 model (loads), a Megatron blended dataset
#: (BlendedMegatronDatasetDataLoader) without its config.data_path, and placeholder callbacks
#: (callbackA/callbackB); naming a .bin/.idx prefix and no callbacks makes it load
TRAIN_CONFIG_NOOPS = ["train_dataset.dataloader.config.data_path=train_text_document",
                      "callbacks=[]"]


DS3_1B = "master_pretrain_deepseek3_1b_8p_pynative.yaml"
DS3_1B_DATA = "train_dataset.dataloader.config.data_path=train_text_document"


def _fields(overrides):
    return tuple(o.split("=", 1)[0] for o in overrides)


#: fixture -> (the documented refused fields, or None; overrides that make it load). The first
#: error must name one of them (which one comes first changes as features land).
CASES = {
    "master_monitor_test.yaml": (None, []),
    "master_profiler_test.yaml": (None, []),
    # MTP, YaRN, flash attention, recompute and group-limited routing exist: it loads as it is
    "master_pynative_ds3.yaml": (None, []),
    # use_pad_tokens: True is the padded MoE dispatch (models/dispatch.py)
    "r2.0.0_pynative_ds3.yaml": (None, []),
    "master_pynative_deepseek4.yaml": (("model.moe_router_topk_scaling_factor",), None),
    "master_train_config.yaml": (_fields(TRAIN_CONFIG_NOOPS), TRAIN_CONFIG_NOOPS),
    "r2.0.0_train_config.yaml": (_fields(TRAIN_CONFIG_NOOPS), TRAIN_CONFIG_NOOPS),
    "r1.9.0_train_config.yaml": (_fields(TRAIN_CONFIG_NOOPS), TRAIN_CONFIG_NOOPS),
    "master_f416b9f_train_config.yaml": (_fields(TRAIN_CONFIG_NOOPS), TRAIN_CONFIG_NOOPS),
    "master_11b9b76_train_config.yaml": (_fields(TRAIN_CONFIG_NOOPS), TRAIN_CONFIG_NOOPS),
    # upstream's 8-card DeepSeek-V3 1b PyNative pretrain config (FSDP optim_grads_params, MTP,
    # use_pad_tokens): every value loads; on one process the memory FAIL is the verdict (its
    # Megatron data prefix, a path of upstream's machine, is reported beside it)
    DS3_1B: (None, []),
}

#: files of full-size models (DeepSeek-V3; the train_config files' Qwen3 at upstream's default
#: size, 12B parameters): valid, but they do not fit one CPU process, so the memory planner's
#: FAIL is their only way to exit 1
FULL_SIZE = ("pynative_ds3", "train_config", "deepseek3_1b")


def full_size(name):
    return any(part in name for part in FULL_SIZE)


@pytest.fixture(scope="module", autouse=True)
def upstream_data(tmp_path_factory):
    """The data upstream's test harness provides: its YAML names the MindRecord file
    ``train_dataset`` relative to the working directory (and the loader test's Megatron
    dataset, a ``.bin``/``.idx`` prefix, is named by an override). ``--check`` verifies that data files exist, that their rows have the model's
    seq_length and that their ids fit the vocabulary, so tiny files (ids < 128) are written
    here, one directory per seq_length, and --check runs in the fixture's one."""
    global DATA_ROOT
    DATA_ROOT = tmp_path_factory.mktemp("upstream_data")
    yield DATA_ROOT


DATA_ROOT = None


def data_dir(name):
    import numpy as np
    import yaml
    from mindformers_core.config.model import ModelConfig
    from mindformers_core.config.model_types import MODEL_TYPE_DEFAULTS
    from mindformers_core.data.indexed import write_indexed
    from mindformers_core.tools.make_token_data import write_mindrecord
    with open(os.path.join(UPSTREAM, name), encoding="utf-8") as fh:
        model = yaml.safe_load(fh)["model"]
    # the file's seq_length, or its model_type's default (4096 for qwen3)
    defaults = MODEL_TYPE_DEFAULTS.get(model.get("model_type"), {})
    seq_length = int(model.get("seq_length", defaults.get("seq_length", ModelConfig.seq_length)))
    d = DATA_ROOT / f"seq{seq_length}"
    if not d.exists():
        d.mkdir()
        tokens = np.random.default_rng(0).integers(0, 128, seq_length * 2 + 1)
        write_mindrecord(tokens, str(d / "train_dataset"), seq_length)
        write_indexed(str(d / "train_text_document"), [tokens], "uint16")
    return str(d)


def check(name, overrides=(), world=None):
    """``--check`` of the fixture on one process, or as one of ``world`` msrun workers."""
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MS_WORKER_NUM")}
    if world is not None:
        env["MS_WORKER_NUM"] = str(world)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
            os.path.join(UPSTREAM, name), "--mode", "1", "--check"]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, cwd=data_dir(name), env=env,
                          timeout=120)


def test_every_fixture_is_listed():
    assert sorted(CASES) == sorted(f for f in os.listdir(UPSTREAM) if f.endswith(".yaml"))
    assert len(CASES) == 11


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_file_check(name):
    refusal, _ = CASES[name]
    r = check(name)
    if refusal is None:
        assert r.stdout.startswith("config OK"), r.stderr
        assert "steps            : 10" in r.stdout
        fails = [line for line in r.stdout.splitlines() if line.startswith("[FAIL]")]
        if full_size(name):   # valid, but does not fit one CPU process
            assert r.returncode == 1 and [f.split()[1] for f in fails] == ["memory"], r.stdout
        else:
            assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    field = line[len("error: "):].split(": ", 1)[0]
    assert line.startswith("error: ") and field.split("[")[0] in refusal, line
    # a refusal says why: a feature that is not implemented, a contradiction (two spellings
    # of one field), or a value the file leaves out (the Megatron loader's data_path)
    assert re.search(r"not implemented|has no counterpart|must match|must be one of|required|"
                     r"keep one of them", line), line


def test_upstream_deepseek_v3_1b_config_checks_on_its_8_cards():
    """At its documented world (8 workers: dp 8, FSDP optim_grads_params with MTP, sequence
    parallel over tp 1) the file is valid and fits: exit 0, nothing FAILs, no field defaulted
    away; the data is the harness's Megatron prefix."""
    r = check(DS3_1B, [DS3_1B_DATA], world=8)
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stdout + r.stderr
    assert "steps            : 10" in r.stdout
    assert "0 FAIL" in r.stdout and "optim_grads_params" in r.stdout
    # as it is, its data prefix (upstream's machine's) is the one error
    r = check(DS3_1B, world=8)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[0].startswith(
        "error: train_dataset.data_path: index file not found"), r.stderr


@pytest.mark.parametrize("name", sorted(n for n, (ref, ov) in CASES.items()
                                        if ref is not None and ov is not None))
def test_refused_file_loads_once_refused_values_are_no_ops(name):
    _, overrides = CASES[name]
    r = check(name, overrides)
    assert r.stdout.startswith("config OK"), r.stderr
    fails = [line for line in r.stdout.splitlines() if line.startswith("[FAIL]")]
    if full_size(name):
        assert r.returncode == 1 and any(f.startswith("[FAIL] memory") for f in fails), r.stdout
    else:
        assert r.returncode == 0, r.stderr


def test_deepseek4_refusals_are_named():
    """DeepSeek-V4 needs model features that do not exist here (its own model type, hyper
    connections) and TP/PP/EP, and it writes both spellings of the routed scaling factor:
    each is refused with its field."""
    r = check("master_pynative_deepseek4.yaml")   # its ns_steps 8 is replaced as upstream
    assert r.returncode == 2
    assert ("model.moe_router_topk_scaling_factor: sets the same field as "
            "'routed_scaling_factor'") in r.stderr


#: shrinks only the sizes of upstream's DeepSeek-V3 test config (and points it at a data file)
DS3_TINY = ["training.steps=3", "model.vocab_size=256", "model.seq_length=32",
            "model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=4",
            "model.max_position_embeddings=32", "model.num_attention_heads=2",
            "model.kv_lora_rank=16", "model.q_lora_rank=24", "model.qk_rope_head_dim=8",
            "model.v_head_dim=16", "model.qk_nope_head_dim=16", "model.moe_intermediate_size=32",
            "model.moe_shared_expert_intermediate_size=32",
            "model.num_experts_per_tok=2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["master_pynative_ds3.yaml", "r2.0.0_pynative_ds3.yaml"])
def test_upstream_deepseek_v3_config_trains_3_steps_on_cpu(tmp_path, name):
    """Upstream's PyNative DeepSeek-V3 test configs as they are (flash attention, MTP, YaRN,
    full recompute, group-limited routing; r2.0.0 also ``use_pad_tokens: True``, the padded
    dispatch), only their sizes shrunk."""
    import json

    import numpy as np

    from mindformers_core.tools.make_token_data import write_mindrecord
    data = str(tmp_path / "train.mindrecord")
    write_mindrecord(np.random.default_rng(0).integers(0, 256, 4000), data, 32)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MS_WORKER_NUM")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
            os.path.join(UPSTREAM, name), "--mode", "1",
            "--output_dir", str(out)]
    for item in DS3_TINY + [f"train_dataset.dataloader.dataset_files={data}"]:
        args += ["--set", item]
    r = subprocess.run(args, capture_output=True, text=True, cwd=str(tmp_path), env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    from mindformers_core.config import load_config
    model = load_config(os.path.join(UPSTREAM, name)).model
    assert model.use_pad_tokens == name.startswith("r2.0.0")
    with open(out / "metrics.jsonl") as fh:
        steps = [json.loads(x) for x in fh]
    assert [s["step"] for s in steps] == [1, 2, 3]
    # an untrained model on uniform random bytes: the loss is ln(256)
    for s in steps:
        assert s["loss"] == pytest.approx(np.log(256), rel=0.05)
        assert s["aux_loss"] > 0 and not s["skipped"]
        assert (s["mtp_loss"] > 0) if model.num_nextn_predict_layers else "mtp_loss" not in s


def test_migration_doc_lists_every_upstream_key():
    """docs/migrating_from_mindformers.md names every alias and upstream-only key."""
    from mindformers_core.config.compat.parallel_noop import SHARD_STRATEGIES
    from mindformers_core.config.parallelism import ParallelismConfig
    from mindformers_core.config.compat.upstream_names import MODEL_ALIASES, UPSTREAM_ONLY
    with open(os.path.join(ROOT, "docs", "migrating_from_mindformers.md"), encoding="utf-8") as fh:
        doc = fh.read()
    keys = list(MODEL_ALIASES) + list(MODEL_ALIASES.values()) + list(UPSTREAM_ONLY)
    keys += [f for f in ParallelismConfig.field_names()] + list(SHARD_STRATEGIES)
    missing = [k for k in keys if not re.search(rf"`{re.escape(k)}\b", doc)]
    assert not missing
