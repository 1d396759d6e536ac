"""Stage split (core/pipeline_split.py) and the pipeline config rules (config/pipeline.py)."""
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.core.pipeline_split import StageSplit, split_layers


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for key in ("MS_ROLE", "MS_WORKER_NUM", "RANK_ID"):
        monkeypatch.delenv(key, raising=False)


def msrun_world(monkeypatch, n):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", str(n))


def test_auto_is_even_in_virtual_stage_order():
    assert split_layers(8, 2) == [range(0, 4), range(4, 8)]
    # pp 2, interleave 2: virtual stages 0..3 = (s0 c0, s1 c0, s0 c1, s1 c1)
    assert split_layers(4, 2, 2) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    s = StageSplit.build(8, 2, 2)
    assert s.stage_layers(0) == [0, 1, 4, 5] and s.stage_layers(1) == [2, 3, 6, 7]


def test_explicit_uneven_and_interleaved():
    assert split_layers(5, 2, 1, ["0-1", "2-4"]) == [range(0, 2), range(2, 5)]
    assert split_layers(6, 2, 2, ["0,3-4", "1-2,5"]) == [range(0, 1), range(1, 3), range(3, 5),
                                                        range(5, 6)]


@pytest.mark.parametrize("args,msg", [
    ((5, 2, 1, None), r"Number of layers \(5\) is not divisible by total stages \(2\).Please "
                      r"configure the model distribution via 'pipeline_parallel_layers_per_stage'"),
    ((4, 2, 1, ["0-1"]), r"has 1 entries, but pipeline_parallel is 2"),
    ((4, 2, 2, ["0-1", "2-3"]), r"stage 0 lists 1 layer ranges \('0-1'\), but "
                                r"pipeline_parallel_interleave_num is 2"),
    ((4, 2, 1, ["0-1", "3-3"]), r"virtual stage 1 starts at layer 3, expected 2"),
    ((4, 2, 1, ["0-1", "2-2"]), r"the ranges cover layers 0..2, but the model has 4 layers"),
    ((4, 2, 1, ["0-1", "3-2"]), r"Invalid layer range format: 3-2. layer_start must be less "
                                r"than or equal to layer_end."),
    ((4, 2, 1, ["0-1", "a-3"]), r"Invalid layer range format: a-3. Layer IDs must be integers"),
    ((4, 2, 1, ["0-1", "2-3-4"]), r"Expected format is 'start-end' or 'single_layer'"),
])
def test_split_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        split_layers(*args)


def test_owners_embedding_first_head_and_mtp_last():
    s = StageSplit.build(4, 2, 1, ["0-0", "1-3"], shares_embedding=True)
    assert s.owner("embedding.word_embeddings.weight") == 0
    assert s.holders("embedding.word_embeddings.weight") == (0, 1)
    assert s.owner("decoder.layers.0.mlp.linear_fc1.weight") == 0
    assert s.owner("decoder.layers.3.input_layernorm.weight") == 1
    for name in ("decoder.final_layernorm.weight", "output_layer.weight",
                 "mtp.layers.0.enorm.weight"):
        assert s.owner(name) == 1
    names = ["embedding.word_embeddings.weight", "decoder.layers.0.a", "decoder.layers.2.a",
             "output_layer.weight"]
    assert s.stage_params(names, 0) == names[:2]
    assert s.stage_params(names, 1) == [names[0]] + names[2:]
    assert StageSplit.build(4, 2).holders("embedding.word_embeddings.weight") == (0,)


def base(**par):
    return {"training": {"steps": 4, "local_batch_size": 1, "global_batch_size": 4},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"num_layers": 4},
            "parallelism": {"pipeline_parallel": 2, **par}}


def test_pp2_loads_on_two_workers(monkeypatch):
    msrun_world(monkeypatch, 2)
    cfg = load_config(base(pipeline_parallel_interleave_num=2,
                           pipeline_parallel_layers_per_stage=["0,2", "1,3"]))
    assert cfg.plan().data_parallel == 1 and cfg.plan().num_accumulation_steps == 4


@pytest.mark.parametrize("world,par,field,msg", [
    (2, {"pipeline_parallel_schedule": "gpipe"}, "parallelism.pipeline_parallel_schedule",
     r"'gpipe' needs the GPipe schedule, which is not implemented"),
    (2, {"pipeline_parallel_interleave_num": 0}, "parallelism.pipeline_parallel_interleave_num",
     r"must be >= 1, got 0"),
    (2, {"pipeline_parallel_microbatch_size": 0}, "parallelism.pipeline_parallel_microbatch_size",
     r"must be >= 1, got 0"),
    (2, {"pipeline_parallel_layers_per_stage": ["0-1", "2-2"]},
     "parallelism.pipeline_parallel_layers_per_stage",
     r"the ranges cover layers 0..2, but the model has 4 layers"),
    (2, {"pipeline_parallel_interleave_num": 4}, "parallelism.pipeline_parallel_layers_per_stage",
     r"Number of layers \(4\) is not divisible by total stages \(8\)"),
])
def test_pipeline_config_errors(monkeypatch, world, par, field, msg):
    msrun_world(monkeypatch, world)
    with pytest.raises(ConfigError, match=rf"^{field}: {msg}"):
        load_config(base(**par))


def test_evaluation_during_a_pipeline_run_is_accepted(monkeypatch):
    """Evaluation runs through the stages (distributed/pipeline_eval.py; msrun:
    tests/distributed/test_eval_tp_msrun.py)."""
    msrun_world(monkeypatch, 2)
    d = base()
    d["training"]["eval_interval"] = 2
    d["train_dataset"] = {"type": "SyntheticMarkov"}
    d["eval_dataset"] = {"type": "SyntheticMarkov"}
    assert load_config(d).training.eval_interval == 2


def test_interleaved_needs_micro_batches_divisible_by_pp(monkeypatch):
    msrun_world(monkeypatch, 2)
    d = base(pipeline_parallel_interleave_num=2)
    d["training"]["global_batch_size"] = 3
    with pytest.raises(ConfigError, match=r"^training.global_batch_size: number of microbatches "
                                          r"\(3\) is not divisible by pipeline-model-parallel-size "
                                          r"\(2\) when using interleaved schedule"):
        load_config(d)


def test_memory_plan_uses_the_configs_stages_and_in_flight_bound(monkeypatch):
    from mindformers_core.core.memory_plan import (
        Layout, config_stage_layers, estimate_memory, layer_activation_bytes,
        optimizer_state_from_config, param_counts, settings_from_config, stage_items)
    msrun_world(monkeypatch, 2)
    uneven = load_config(base(pipeline_parallel_layers_per_stage=["0-0", "1-3"]))
    plan = estimate_memory(uneven, Layout(pp=2))
    assert (plan.stage, plan.stage_layers) == (1, 3)   # the 3-layer stage is the busiest
    assert config_stage_layers(uneven, uneven.model, Layout(pp=2)) == ([[0], [1, 2, 3]], 1)
    # another layout than the config's: the contiguous split
    assert config_stage_layers(uneven, uneven.model, Layout(pp=4)) == ([[0], [1], [2], [3]], 1)
    # interleave 2, 4 micro-batches: stage 0 holds min((2-1)*2 + 2 + 1, 8) = 5 chunks of half
    # its layers, 1F1B holds 2 micro-batches of all of them
    plain = load_config(base())
    inter = load_config(base(pipeline_parallel_interleave_num=2))
    settings = settings_from_config(plain, Layout(pp=2))
    layer = sum(layer_activation_bytes(plain.model, Layout(pp=2), settings, False).values())
    one = estimate_memory(plain, Layout(pp=2))
    assert one.stage == 0 and one.items["activations"] == 2 * 2 * layer
    items, _ = stage_items(inter.model, param_counts(inter.model), Layout(pp=2), settings,
                           optimizer_state_from_config(inter.optimizer, "float32"), 0, [0, 2],
                           False, vpp=2)
    assert items["activations"] == 2 * layer * 5 // 2


def test_stage_payloads_merge_into_the_whole_model():
    import numpy as np
    from mindformers_core.distributed.pipeline_checkpoint import (merge_stage_payloads,
                                                                  stage_map, stage_payload)
    split = StageSplit.build(2, 2, shares_embedding=True)
    names = ["embedding.word_embeddings.weight", "decoder.layers.0.w", "decoder.layers.1.w",
             "decoder.final_layernorm.weight"]
    # each rank's payload: its own stage's values (s), the others' empty placeholders
    payloads = [{**{f"model.{n}": np.full(2, float(s)) if split.owner(n) == s else np.zeros(0)
                    for n in names},
                 f"optim.exp_avg.{names[1 + s]}": np.full(2, 10.0 + s), "rng.seed": np.zeros(1)}
                for s in (0, 1)]
    # the shared table is trained on both stages (equal slots; 8.0 marks the last stage's)
    payloads[0]["optim.exp_avg.embedding.word_embeddings.weight"] = np.full(2, 7.0)
    payloads[1]["optim.exp_avg.embedding.word_embeddings.weight"] = np.full(2, 8.0)
    parts = [stage_payload(split, s, payloads[s]) for s in (0, 1)]
    assert "rng.seed" not in parts[1] and "model.decoder.layers.0.w" not in parts[1]
    # its owner (stage 0) sends the table's slots, so under pp x tp no shard comes twice
    assert "optim.exp_avg.embedding.word_embeddings.weight" not in parts[1]
    full = {n: (2,) for n in names}
    merged = merge_stage_payloads(payloads[0], parts, full)
    for n in names:
        np.testing.assert_array_equal(merged[f"model.{n}"], np.full(2, split.owner(n)))
    assert merged["optim.exp_avg.decoder.layers.1.w"][0] == 11.0
    assert merged["optim.exp_avg.embedding.word_embeddings.weight"][0] == 7.0
    assert stage_map(split, names) == {names[0]: 0, names[1]: 0, names[2]: 1, names[3]: 1}


def test_a_shared_tp_sliced_table_joins_from_its_owner_stage_once():
    """pp2 x tp2 with a table both stages hold (MTP or tied embeddings): each stage's tp ranks
    hold vocabulary slices of it and its slots; the stage payloads, the senders and the join
    give the whole table and slots once (the last stage's copies used to come as the same
    shards twice)."""
    import numpy as np
    from mindformers_core.distributed.pipeline_checkpoint import (join_shards, sender_entries,
                                                                  stage_payload)
    from mindformers_core.distributed.shard_spec import ShardSpec, shard
    split = StageSplit.build(2, 2, shares_embedding=True)
    table = "embedding.word_embeddings.weight"
    spec = ShardSpec((4, 3), 0, "tp", 2)
    specs = {table: spec}
    w, m = np.arange(12, dtype=np.float32).reshape(4, 3), -np.ones((4, 3), np.float32)
    coords = [{"pp": s, "tp": k, "dp": 0, "edp": 0} for s in (0, 1) for k in (0, 1)]
    parts = [sender_entries(stage_payload(split, c["pp"], {
        f"model.{table}": shard(spec, w, c["tp"]), f"optim.exp_avg.{table}":
        shard(spec, m, c["tp"])}), specs, c) for c in coords]
    _, whole = join_shards(parts, coords, specs)
    np.testing.assert_array_equal(whole[f"model.{table}"], w)
    np.testing.assert_array_equal(whole[f"optim.exp_avg.{table}"], m)


def test_stage_payload_merge_refuses_a_placeholder_or_a_missing_entry():
    import numpy as np
    from mindformers_core.distributed.pipeline_checkpoint import (merge_stage_payloads,
                                                                  stage_payload)
    split = StageSplit.build(2, 2)
    names = ["decoder.layers.0.w", "decoder.layers.1.w"]
    full = {n: (2,) for n in names}
    rank0 = {"model.decoder.layers.0.w": np.ones(2), "model.decoder.layers.1.w": np.zeros(0)}
    stage1 = {"model.decoder.layers.1.w": np.zeros(0)}   # the owner sent an empty copy
    with pytest.raises(RuntimeError, match=r"pipeline checkpoint: parameter decoder.layers.1.w "
                       r"came from no stage with its shape \(2,\) \(got \(0,\)\)"):
        merge_stage_payloads(rank0, [stage_payload(split, 0, rank0), stage1], full)
    with pytest.raises(RuntimeError, match=r"parameter decoder.layers.1.w came from no stage "
                       r"with its shape \(2,\) \(got None\)"):
        merge_stage_payloads(rank0, [stage_payload(split, 0, rank0)], full)


def test_shards_of_a_stage_join_along_their_split_dim():
    """pp x tp x ep: the tp slices (by tp coordinate) and the experts (by ep coordinate),
    weights and optimizer slots, join into the whole tensors; other entries pass through."""
    import numpy as np
    from mindformers_core.distributed.pipeline_checkpoint import join_shards
    from mindformers_core.distributed.shard_spec import ShardSpec, shard
    name, col = "decoder.layers.1.mlp.experts.weight1", "decoder.layers.1.linear_fc1.weight"
    spec, tp_spec = ShardSpec((4, 3, 2), 0, "ep", 2), ShardSpec((3, 4), 1, "tp", 2)
    whole_w = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    whole_m, whole_c = -whole_w, np.arange(12, dtype=np.float32).reshape(3, 4)
    specs = {name: spec, col: tp_spec}
    # rank k: tp k, ep 1 - k (the ep coordinate need not follow the tp one)
    parts = [{f"model.{name}": shard(spec, whole_w, 1 - k), f"optim.exp_avg.{name}":
              shard(spec, whole_m, 1 - k), f"model.{col}": shard(tp_spec, whole_c, k)}
             for k in (0, 1)]
    coords = [{"tp": k, "ep": 1 - k} for k in (0, 1)]
    parts[0]["model.decoder.layers.1.dense"] = np.ones(2)
    rest, whole = join_shards(parts, coords, specs)
    np.testing.assert_array_equal(whole[f"model.{name}"], whole_w)
    np.testing.assert_array_equal(whole[f"optim.exp_avg.{name}"], whole_m)
    np.testing.assert_array_equal(whole[f"model.{col}"], whole_c)
    assert list(rest[0]) == ["model.decoder.layers.1.dense"] and rest[1] == {}
    # the ranks in reverse order give the same tensors
    _, again = join_shards(parts[::-1], coords[::-1], specs)
    np.testing.assert_array_equal(again[f"model.{name}"], whole_w)
    with pytest.raises(RuntimeError, match=r"pipeline checkpoint: shard 0 of "
                       r"model.decoder.layers.1.mlp.experts.weight1 came twice"):
        join_shards(parts, [{"tp": 0, "ep": 0}, {"tp": 1, "ep": 0}], specs)
    with pytest.raises(RuntimeError, match=r"pipeline checkpoint: model.decoder.layers.1.mlp."
                       r"experts.weight1 has shards \[1\] of 2"):
        join_shards(parts[:1], coords[:1], specs)


def test_each_piece_of_a_stage_is_sent_by_one_rank():
    """Over the ranks of a stage (tp 2 x dp 2, ep 2 folded: edp = (tp + 2 dp) // 2) every
    replicated entry, tp slice and expert is sent exactly once per distinct piece."""
    import numpy as np
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.pipeline_checkpoint import sender_entries
    from mindformers_core.distributed.shard_spec import ShardSpec
    specs = {"e": ShardSpec((4, 2), 0, "ep", 2), "c": ShardSpec((2, 4), 1, "tp", 2)}
    payload = {"model.e": np.zeros(1), "optim.m.e": np.zeros(1), "model.c": np.zeros(1),
               "model.n": np.zeros(1), "optim.step": np.zeros(1)}
    mesh = make_mesh(4, tp=2, ep=2)
    sent = {r: sorted(sender_entries(payload, specs, mesh.coords(r))) for r in range(4)}
    assert sent[0] == sorted(payload)                       # tp 0, dp 0, ep 0
    assert sent[1] == ["model.c", "model.e", "optim.m.e"]   # tp 1 of dp 0: ep 1
    assert sent[2] == [] and sent[3] == []                  # dp 1: edp 1
    ep_of = {r: mesh.coords(r)["ep"] for r in (0, 1)}
    assert sorted(ep_of.values()) == [0, 1]


def test_under_cp_x_pp_each_piece_is_sent_once_over_the_stages_cp_ranks():
    """cp x pp (a stage of tp 2 x cp 2): a replicated entry from (tp 0, cp 0) only, a tp
    slice from the cp 0 ranks, FSDP rows over ``dp_cp`` (its two cp ranks) from tp 0; the
    rows' index is the rank's dp_cp coordinate, so joining them rebuilds the weight."""
    import numpy as np
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.pipeline_checkpoint import join_shards, sender_entries
    from mindformers_core.distributed.shard_spec import ShardSpec
    specs = {"c": ShardSpec((2, 4), 1, "tp", 2), "r": ShardSpec((4, 2), 0, "dp_cp", 2)}
    mesh = make_mesh(8, tp=2, cp=2, pp=2)
    stage0 = [r for r in range(8) if mesh.coords(r)["pp"] == 0]
    whole = np.arange(8, dtype=np.float32).reshape(4, 2)
    parts = {r: sender_entries({"model.c": np.zeros((2, 2)), "model.n": np.zeros(1),
                                "model.r": whole[2 * mesh.coords(r)["dp_cp"]:][:2]},
                               specs, mesh.coords(r)) for r in stage0}
    sent = {r: sorted(p) for r, p in parts.items()}
    by = {(mesh.coords(r)["tp"], mesh.coords(r)["cp"]): sent[r] for r in stage0}
    assert by == {(0, 0): ["model.c", "model.n", "model.r"], (1, 0): ["model.c"],
                  (0, 1): ["model.r"], (1, 1): []}
    rows = [r for r in stage0 if "model.r" in parts[r]]
    _, joined = join_shards([{"model.r": parts[r]["model.r"]} for r in rows],
                            [mesh.coords(r) for r in rows], specs)
    np.testing.assert_array_equal(joined["model.r"], whole)


def test_pipeline_parallel_is_the_trainers_reducer_and_keeps_only_its_stage(monkeypatch):
    """PipelineParallel satisfies the reduction protocol the run's layout calls, and attach() leaves the rank its stage's parameter bytes while
    the parameter counts still describe the whole model."""
    import os
    import numpy as np
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.pipeline_parallel import PipelineParallel
    from mindformers_core.distributed.pipeline_release import held_parameter_bytes
    from mindformers_core.models import build_model
    from mindformers_core.distributed.setup import GradReduction
    msrun_world(monkeypatch, 2)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = load_config(os.path.join(root, "configs", "markov_check.yaml"), overrides=[
        "parallelism.pipeline_parallel=2", "training.global_batch_size=4",
        "training.local_batch_size=1", "model.hidden_size=32", "model.num_layers=4"])
    pp = PipelineParallel(cfg, GroupCommunicator(make_mesh(2, pp=2), 1))
    assert isinstance(pp, GradReduction)
    assert (pp.stage, pp.data_rank, pp.mean_over_ranks(2.5)) == (1, 0, 2.5)
    model = build_model(cfg.model, seed=1)
    whole = {p.name: int(np.prod(p.shape)) for p in model.get_parameters()}
    pp.attach(model)
    assert pp.parameter_sizes() == whole
    mine = [n for n in whole if n.startswith(("decoder.layers.2.", "decoder.layers.3."))
            or not n.startswith(("decoder.layers.", "embedding."))]
    assert held_parameter_bytes(model) == 4 * sum(whole[n] for n in mine)
    assert sorted(p.name for p in model.trainable_params()) == sorted(mine)
    held = sum(whole[n] for n in mine)
    assert f"this stage holds {held:,} of the model's {sum(whole.values()):,} parameters" \
        in pp.describe(4)
