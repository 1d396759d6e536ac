"""The ``parallelism:`` examples of upstream MindFormers' PyNative parallel-training guide
(docs/mindformers/docs/source_en/feature/parallel_training.md of github.com/mindspore-ai/docs,
"Distributed Parallel Training": its global example and the scenarios of its sections 1-5), each
at the world size the guide gives it, load as they are: the guide's ``parallelism`` block over a
tiny DeepSeek-V3 (the guide's snippets have no model; a 10-layer one where its pipeline example
places 10 layers and 8 where it places them evenly), with the ``model`` key the guide pairs
with context parallel on non-EOD data (``use_attn_mask_compression``). ``--check`` runs one of
them end to end, and so does the task-start guide's 8-device example. Its EOD-data variant
(``create_compressed_eod_mask: true``: attention that does not cross documents) loads at its
world as document masking (``models/documents.py``)."""
import copy
import os
import subprocess
import sys

import pytest
import yaml

from mindformers_core.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")

GLOBAL_EXAMPLE = """
parallelism:
  data_parallel_shard: -1
  reshard_after_forward_policy: "default"
  cpu_offload: False
  disable_gradient_division: True
  tensor_parallel: 1
  context_parallel: 1
  context_parallel_method: "colossal"
  context_parallel_async: False
  ulysses_degree_in_cp: null
  context_parallel_mask_type: "causal"
  pipeline_parallel: 1
  pipeline_parallel_interleave_num: 1
  pipeline_parallel_layers_per_stage: null
  pipeline_parallel_overlap_p2p: False
  pipeline_parallel_overlap_b_f: False
  expert_parallel: 1
  moe_token_dispatcher_type: "alltoall"
  npu_nums_per_device: 8
"""

#: name -> (world size the guide gives, its snippet)
SNIPPETS = {
    "global_example": (8, GLOBAL_EXAMPLE),
    "1.4A_fsdp8": (8, """
parallelism:
  data_parallel_shard: -1
  reshard_after_forward_policy: "default"
  cpu_offload: False
  disable_gradient_division: True
  tensor_parallel: 1
  context_parallel: 1
  pipeline_parallel: 1
  expert_parallel: 1
"""),
    "1.4B_hsdp16": (16, """
parallelism:
  data_parallel_shard: 8
  reshard_after_forward_policy: "default"
  cpu_offload: False
  disable_gradient_division: True
  tensor_parallel: 1
  context_parallel: 1
  pipeline_parallel: 1
"""),
    "2.4_dp_tp": (8, """
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 2
  context_parallel: 1
  pipeline_parallel: 1
  expert_parallel: 1
  reshard_after_forward_policy: "default"
  disable_gradient_division: True
"""),
    "3.5A_colossal": (8, """
model:
  use_attn_mask_compression: true
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 1
  context_parallel: 2
  context_parallel_method: "colossal"
  context_parallel_mask_type: "causal"
  pipeline_parallel: 1
"""),
    "3.5B_ulysses": (8, """
model:
  use_attn_mask_compression: true
parallelism:
  data_parallel_shard: -1
  context_parallel: 4
  context_parallel_method: "ulysses"
  ulysses_degree_in_cp: 4
  context_parallel_async: False
  tensor_parallel: 1
  pipeline_parallel: 1
"""),
    "3.5C_hybrid": (8, """
model:
  use_attn_mask_compression: true
parallelism:
  data_parallel_shard: -1
  context_parallel: 4
  context_parallel_method: "hybrid"
  ulysses_degree_in_cp: 2
  context_parallel_mask_type: "causal"
  tensor_parallel: 1
  pipeline_parallel: 1
"""),
    "4.4_auto": (8, """
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 4
  pipeline_parallel: 2
  pipeline_parallel_interleave_num: 2
  pipeline_parallel_layers_per_stage: auto
  pipeline_parallel_overlap_p2p: True
"""),
    "4.4_ranges": (8, """
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 4
  pipeline_parallel: 2
  pipeline_parallel_interleave_num: 2
  pipeline_parallel_layers_per_stage:
    - "0-1, 4-8"
    - "2-3, 9"
  pipeline_parallel_overlap_p2p: True
"""),
    "5.4A_ep_le_tp": (8, """
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 4
  expert_parallel: 2
  moe_token_dispatcher_type: "alltoall"
  context_parallel: 1
  pipeline_parallel: 1
"""),
    "5.4B_deredundancy": (16, """
parallelism:
  data_parallel_shard: -1
  tensor_parallel: 2
  expert_parallel: 8
  moe_token_dispatcher_type: "alltoall_deredundancy"
  npu_nums_per_device: 8
  context_parallel: 1
  pipeline_parallel: 1
"""),
}


def snippet_config(name):
    """The tiny DeepSeek-V3 (8 routed experts, so ep 8 has one per rank; 10 layers under the
    guide's pipeline examples) with the snippet's sections on top: its ``parallelism`` as it
    is, its ``model`` / ``train_dataset`` keys added."""
    world, text = SNIPPETS[name]
    with open(BASE, encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    layers = {"4.4_auto": 8, "4.4_ranges": 10}.get(name, 2)   # the guide's layer counts
    cfg["model"].update(n_routed_experts=8, num_layers=layers)
    cfg["training"].update(local_batch_size=1, global_batch_size=16)
    snippet = yaml.safe_load(text)
    for section, body in snippet.items():
        if section == "parallelism":
            cfg[section] = copy.deepcopy(body)
        else:
            cfg[section].update(body)
    return world, cfg


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_guides_parallel_examples_load_at_their_world(monkeypatch, name):
    world, cfg = snippet_config(name)
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", str(world))
    run = load_config(cfg)
    dims = run.parallel_dims()
    par = run.parallelism
    assert dims.world == world
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (
        par.tensor_parallel, par.pipeline_parallel, par.context_parallel, par.expert_parallel)
    if par.tensor_parallel > 1:   # "SP is automatically enabled with TP"
        assert par.sequence_parallel and dims.sequence_parallel


def test_the_guides_deredundancy_example_passes_check(tmp_path):
    """The guide's 16-device tp2 x ep8 ``alltoall_deredundancy`` example through
    ``run_mindformer.py --check`` as one of 16 msrun workers: config OK, exit 0."""
    world, cfg = snippet_config("5.4B_deredundancy")
    path = tmp_path / "snippet.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, MS_ROLE="MS_WORKER", MS_WORKER_NUM=str(world))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
                        str(path), "--mode", "1", "--check"], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stdout + r.stderr
    assert "0 FAIL" in r.stdout


def test_the_guides_eod_mask_keys_load_as_document_masking(monkeypatch):
    """Section 3.3's EOD-data keys ask for attention that does not cross documents (a
    compressed per-document mask): at the hybrid example's world they load as
    ``reset_attention_mask`` (models/documents.py), which the cp cores honour
    (tests/models/test_document_masking.py, the msrun cases of cp_worker.py)."""
    world, cfg = snippet_config("3.5C_hybrid")
    cfg["train_dataset"] = {"dataloader": {
        "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
        "sizes": [64, 0, 0], "config": {
            "seq_length": cfg["model"]["seq_length"], "split": "1, 0, 0",
            "data_path": ["1", "train_text_document"],
            "create_compressed_eod_mask": True, "create_attention_mask": False}}}
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", str(world))
    run = load_config(cfg)
    assert run.train_dataset.reset_attention_mask and run.parallel_dims().cp > 1


#: upstream's task-start guide (feature/start_task.md of the same repository), its single-node
#: 8-device FSDP example: no model, optimizer or lr_scheduler section (upstream's defaults)
START_TASK = """
training:
  steps: 10
  local_batch_size: 1
  global_batch_size: 8
  seed: 42

parallelism:
  data_parallel_shard: -1
  data_parallel_shard_strategy: "optim_grads_params"
  tensor_parallel: 1
  context_parallel: 1
  pipeline_parallel: 1
  expert_parallel: 1

train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: "GPTDataset"
    sizes: [1000, 0, 0]
    column_names: ["input_ids", "labels", "loss_mask", "position_ids"]
    shuffle: false
    config:
      seq_length: 4096
      split: "1, 0, 0"
      eod: 1
      pad: -1
      create_attention_mask: False
      create_compressed_eod_mask: False
      data_path:
        - '1'
        - "/path/megatron_data_text_document"
  drop_remainder: True
  num_parallel_workers: 8
"""


def test_the_task_start_guides_example_checks_on_8_workers(tmp_path):
    """As it is it stops on the model it leaves out (the default model's seq_length against its
    4096); over a tiny GPT of that length, with the harness's Megatron prefix for its
    machine's path, ``--check`` on 8 workers says config OK, names the defaulted optimizer and
    lr_scheduler, and exits 0."""
    import numpy as np

    from mindformers_core.data.indexed import write_indexed
    (tmp_path / "start.yaml").write_text(START_TASK)
    write_indexed(str(tmp_path / "text_document"),
                  [np.random.default_rng(0).integers(0, 64, 4096 * 2 + 1)], "uint16")
    env = dict(os.environ, MS_ROLE="MS_WORKER", MS_WORKER_NUM="8")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")

    def check(*sets):
        args = [a for kv in sets for a in ("--set", kv)]
        return subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"),
                               "--config", "start.yaml", "--mode", "1", "--check", *args],
                              capture_output=True, text=True, cwd=str(tmp_path), env=env,
                              timeout=120)
    r = check()
    assert r.returncode == 2 and "must match model.seq_length" in r.stderr, r.stderr
    r = check("train_dataset.dataloader.config.data_path=text_document",
              "model.model_type=gpt", "model.seq_length=4096")
    assert r.returncode == 0 and r.stdout.startswith("config OK"), r.stdout + r.stderr
    assert "defaulted        : optimizer, lr_scheduler" in r.stdout


def test_upstreams_one_string_stage_ranges_are_the_list(monkeypatch):
    """Upstream's config also writes the stages' ranges as one string, ``|`` between stages."""
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "8")
    _, cfg = snippet_config("4.4_ranges")
    listed = load_config(copy.deepcopy(cfg))
    cfg["parallelism"]["pipeline_parallel_layers_per_stage"] = "0-1,4-8|2-3,9"
    joined = load_config(cfg)
    assert joined.parallelism.pipeline_parallel_layers_per_stage == ["0-1,4-8", "2-3,9"]
    assert joined.parallel_dims() == listed.parallel_dims()
