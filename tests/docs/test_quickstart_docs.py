"""docs/quickstart.md and docs/recipes.md say what the shipped configs do: steps, batch,
warmup, the lr each shown step line applies, evaluation steps, parameter counts, times."""
import os
import re

import pytest

from mindformers_core.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(name):
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as fh:
        return fh.read()


@pytest.fixture(scope="module")
def quick():
    return load_config(os.path.join(ROOT, "configs", "quickstart.yaml"))


def test_quickstart_prose_matches_the_config(quick):
    text = _read("quickstart.md")
    m = re.search(r"The run is (\d+)\s+optimizer steps of (\d+) windows of (\d+) bytes", text)
    assert m and [int(x) for x in m.groups()] == [quick.training.steps,
                                                   quick.training.global_batch_size,
                                                   quick.model.seq_length]
    for field, value in re.findall(r"`training\.(\w+)` \((\d+)\)", text):
        assert getattr(quick.training, field) == int(value), field
    m = re.search(r"`train_dataset\.validation_split: ([\d.]+)`", text)
    assert float(m.group(1)) == quick.train_dataset.validation_split
    m = re.search(r"byte-level GPT \((\d+) hidden, (\d+) layers, vocabulary (\d+)\)", text)
    assert [int(x) for x in m.groups()] == [quick.model.hidden_size, quick.model.num_layers,
                                            quick.model.vocab_size]
    m = re.search(r"over the first (\d+) steps \(`warmup_ratio:\s+([\d.]+)` of (\d+)\)", text)
    assert m and int(m.group(1)) == quick.plan(1).warmup_steps
    assert float(m.group(2)) == quick.lr_scheduler.warmup_ratio
    assert int(m.group(3)) == quick.training.steps


def test_quickstart_log_excerpt_matches_the_config(quick):
    text = _read("quickstart.md")
    block = text[text.index("```text", text.index("## 2. Train")):]
    block = block[:block.index("```\n", 7)]
    plan = quick.plan(1)
    assert f"steps            : {plan.total_steps}\n" in block
    assert f"warmup steps     : {plan.warmup_steps}\n" in block
    assert f"global batch     : {plan.global_batch_size} " in block
    assert f"tokens per step  : {plan.tokens_per_step} (seq_length {plan.seq_length})" in block
    sched = quick.build_lr_scheduler()
    lines = re.findall(r"\{ step: \[\s*(\d+)/(\d+)\], .*?lr: ([\d.e+-]+), .*?consumed_samples: "
                       r"(\d+), global_batch_size: (\d+)", block)
    assert len(lines) >= 2
    for step, total, lr, consumed, gbs in lines:
        step = int(step)
        assert int(total) == quick.training.steps
        assert step % quick.training.log_interval == 0
        assert float(lr) == pytest.approx(sched.lr_at(step - 1), rel=1e-6), step
        assert int(gbs) == plan.global_batch_size and int(consumed) == step * int(gbs)
    for step in re.findall(r"eval at step (\d+):", block):
        assert int(step) % quick.training.eval_interval == 0 or int(step) == plan.total_steps
    assert f"sample (greedy, {quick.logging.sample_max_new_tokens} tokens):\n" \
           f"{quick.logging.sample_prompt}" in block


def test_quickstart_parameter_count_is_the_models(quick):
    from mindformers_core.models import build_model
    from mindformers_core.trainer.throughput import param_counts
    model = build_model(quick.model, seed=0)
    counts = param_counts({p.name: int(p.size) for p in model.get_parameters()})
    text = _read("quickstart.md")
    assert (f"parameters       : {counts['total']:,} total = {counts['embedding']:,} embedding "
            f"+ {counts['non_embedding']:,} non-embedding") in text


def test_recipe_table_steps_match_each_config():
    text = _read("recipes.md")
    rows = re.findall(r"^\| `configs/([\w/]+)\.yaml` \|.*\((\d+) steps\) \|$", text, re.M)
    assert {name for name, _ in rows} >= {"quickstart", "markov_check", "adamw_wsd",
                                          "muon_deepseek_v3_tiny"}
    for name, steps in rows:
        cfg = load_config(os.path.join(ROOT, "configs", f"{name}.yaml"))
        assert cfg.training.steps == int(steps), name
