"""Upstream MindFormers' PyNative sections and keys outside `model:`: train_dataset's nested
layout, parallelism / checkpoint no-op keys, monitor, profiler, context, callbacks, recompute."""
import pytest

from mindformers_core.config import ConfigError
from mindformers_core.config.compat.callbacks import CallbacksConfig
from mindformers_core.config.checkpoint import CheckpointConfig
from mindformers_core.config.context import ContextConfig, parse_memory_size
from mindformers_core.config.dataset import DatasetConfig
from mindformers_core.config.monitor import MonitorConfig, norm_patterns
from mindformers_core.config.compat.disabled_sections import LoraConfig, RecomputeCommConfig, SwapConfig
from mindformers_core.config.run_config import load_config
from mindformers_core.config.parallelism import ParallelismConfig
from mindformers_core.config.profiler import ProfilerConfig
from mindformers_core.config.recompute import RecomputeConfig

NESTED = {"dataloader": {"type": "MindDataset", "dataset_files": "data.mindrecord",
                         "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
                         "shuffle": False},
          "drop_remainder": True, "num_parallel_workers": 8, "prefetch_size": 1,
          "numa_enable": False}


# ---- train_dataset ---------------------------------------------------------------------------
def test_nested_dataloader_layout_equals_flat_and_round_trips():
    nested = DatasetConfig.from_dict(NESTED, "train_dataset")
    flat = DatasetConfig.from_dict({"type": "MindDataset", "data_path": "data.mindrecord",
                                    "shuffle": False}, "train_dataset")
    assert nested == flat
    d = nested.to_dict()
    assert d["dataloader"] == {"type": "MindDataset", "shuffle": False,
                               "dataset_files": "data.mindrecord",
                               "column_names": NESTED["dataloader"]["column_names"]}
    assert "type" not in d and "data_path" not in d
    assert DatasetConfig.from_dict(d, "train_dataset") == nested
    assert "dataloader" not in flat.to_dict()


def test_dataset_files_list_of_one_and_upstream_defaults():
    cfg = DatasetConfig.from_dict({"dataloader": {"dataset_files": ["a.mindrecord"]}}, "d")
    assert (cfg.type, cfg.data_path, cfg.shuffle) == ("MindDataset", "a.mindrecord", False)
    several = DatasetConfig.from_dict({"dataloader": {"dataset_files": ["a", "b"]}}, "d")
    assert several.data_path == ["a", "b"]
    assert several.to_dict()["dataloader"]["dataset_files"] == ["a", "b"]
    assert DatasetConfig.from_dict({"type": "MindDataset", "data_path": "a"}, "d").shuffle


@pytest.mark.parametrize("data,msg", [
    ({"dataloader": {"type": "GPTDatasetLoader"}},
     r"^d\.dataloader\.type: 'GPTDatasetLoader' is not implemented here"),
    ({"dataloader": {"dataset_files": []}},
     r"^d\.dataloader\.dataset_files: must name at least one file"),
    ({"dataloader": {"dataset_files": ["a", 3]}},
     r"^d\.dataloader\.dataset_files\[1\]: expected a string, got int"),
    ({"dataloader": {"type": "TokenFile", "dataset_files": ["a", "b"]}},
     r"^d\.data_path: a list of files is read by type MindDataset only, not TokenFile "
     r"\(several TokenFile corpora: blend\)"),
    ({"type": "MindDataset", "data_path": ["a"]},
     r"^d\.data_path: a list must name two or more files, got \['a'\]"),
    ({"dataloader": {"dataset_file": "a"}},
     r"^d\.dataloader\.dataset_file: unknown key; .*did you mean 'dataset_files'\?"),
    ({"dataloader": {"dataset_files": "a", "column_names": ["input_ids", "attention_mask"]}},
     r"^d\.dataloader\.column_names: must name columns of"),
    ({"dataloader": {"dataset_files": "a", "python_multiprocessing": True}},
     r"^d\.dataloader\.python_multiprocessing: True needs multiprocess sample loading"),
    ({"dataloader": {"dataset_files": "a"}, "type": "MindDataset"},
     r"^d\.type: given both flat and inside dataloader:"),
    ({"dataloader": {"dataset_files": "a"}, "numa_enable": True},
     r"^d\.numa_enable: True needs NUMA-aware loading, which is not implemented"),
    ({"dataloader": {"dataset_files": "a"}, "drop_remainder": False},
     r"^d\.drop_remainder: False needs keeping a last partial batch"),
    ({"dataloader": {"dataset_files": "a"}, "num_parallel_workers": 0},
     r"^d\.num_parallel_workers: must be >= 1, got 0"),
    ({"dataloader": "x"}, r"^d\.dataloader: expected a mapping, got str"),
])
def test_dataset_errors(data, msg):
    with pytest.raises(ConfigError, match=msg):
        DatasetConfig.from_dict(data, "d")


# ---- parallelism -----------------------------------------------------------------------------
UPSTREAM_PAR = {"data_parallel_shard": -1, "data_parallel_shard_strategy": "optim_grads_params",
                "disable_gradient_division": True, "expert_parallel": 1,
                "tensor_parallel": 1, "context_parallel": 1, "context_parallel_method": "colossal",
                "pipeline_parallel": 1, "pipeline_parallel_schedule": "1f1b",
                "pipeline_parallel_microbatch_size": 1, "pipeline_parallel_interleave_num": 1,
                "pipeline_parallel_layers_per_stage": None, "sequence_parallel": True,
                "hsdp_shard_size": 1, "hsdp_optimizer_level": "level1", "hsdp_threshold": 64}


def test_upstream_parallelism_keys_load_on_one_process(monkeypatch):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    cfg = ParallelismConfig.from_dict(UPSTREAM_PAR, "parallelism")
    assert cfg.dp_shard(1) == (1, 1)
    assert ParallelismConfig.from_dict(cfg.to_dict(), "parallelism") == cfg


@pytest.mark.parametrize("key,value,msg", [
    ("pipeline_parallel_interleave_num", 2, r"must be 1 when pipeline_parallel is 1, got 2"),
    ("cpu_offload", True, r"True needs FSDP CPU offload"),
    ("hsdp_shard_size", 8, r"8 needs HSDP sharding"),
    ("pipeline_parallel_layers_per_stage", [[0, 1]],
     r"must be 'auto' or a list of one layer-range string per stage .*got \[\[0, 1\]\]"),
    ("pipeline_parallel_enable_dxdw_split", True, r"True needs pipeline dx/dw split"),
    ("context_parallel_method", "ring", r"must be one of \['colossal', 'ulysses', 'hybrid'\]"),
    ("data_parallel_shard_strategy", "zero3", r"must be one of \['no_shard', 'optim'"),
])
def test_parallelism_feature_values_are_refused(monkeypatch, key, value, msg):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    with pytest.raises(ConfigError, match=rf"^parallelism\.{key}: {msg}"):
        ParallelismConfig.from_dict({**UPSTREAM_PAR, key: value}, "parallelism")


@pytest.mark.parametrize("key,value", [
    ("enable_loss_parallel", True), ("enable_mc2", True), ("pipeline_parallel_overlap_p2p", True),
    ("pipeline_parallel_overlap_b_f", True), ("dense_fsdp_shard_size", 8)])
def test_performance_flags_are_accepted(monkeypatch, key, value):
    """Upstream's performance choices load with any value (the doctor WARNs that they change
    nothing here: tests/tools/test_doctor.py)."""
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    cfg = ParallelismConfig.from_dict({**UPSTREAM_PAR, key: value}, "parallelism")
    assert getattr(cfg, key) == value
    assert ParallelismConfig.from_dict(cfg.to_dict(), "parallelism") == cfg


def test_expert_parallel_is_a_feature_value_now(monkeypatch):
    """Expert parallelism is implemented: the section takes any size; its rules (experts,
    data parallel) are RunConfig's (tests/config/test_expert_parallel_config.py)."""
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    assert ParallelismConfig.from_dict({**UPSTREAM_PAR, "expert_parallel": 2},
                                       "parallelism").expert_parallel == 2


def two_workers(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")


def test_fsdp_strategies_load_when_the_state_is_sharded(monkeypatch):
    """Every upstream strategy and disable_gradient_division: False run on 2 workers (their
    refused combinations: tests/distributed/test_fsdp_config.py)."""
    two_workers(monkeypatch)
    for strategy in ("no_shard", "optim", "optim_grads", "optim_grads_params"):
        cfg = ParallelismConfig.from_dict({"data_parallel_shard_strategy": strategy,
                                           "disable_gradient_division": False}, "parallelism")
        assert cfg.dp_shard(2) == (1, 2)
        assert cfg.data_parallel_shard_strategy == strategy
        # the ZeRO-1 shards every reduction builds (tp, pp and cp included): no_shard none
        assert cfg.optimizer_shards(2) == (1 if strategy == "no_shard" else 2)


def test_project_default_strategy_is_zero1():
    assert ParallelismConfig().data_parallel_shard_strategy == "optim"


# ---- checkpoint ------------------------------------------------------------------------------
def test_checkpoint_upstream_nothing_values(monkeypatch):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    cfg = CheckpointConfig.from_dict({"load_path": "", "save_path": "", "prefix": None,
                                      "remove_redundancy": True, "load_balanced": False,
                                      "load_worker_number": 1}, "checkpoint")
    assert cfg.load_path is None and cfg.save_path is None
    assert cfg.prefix == CheckpointConfig().prefix
    assert CheckpointConfig.from_dict(cfg.to_dict(), "checkpoint") == cfg


@pytest.mark.parametrize("key,value,msg", [
    ("load_worker_number", 0, r"must be >= 1, got 0"),
    ("reshard_worker_num", -2, r"must be >= 1, got -2"),
])
def test_checkpoint_refusals(monkeypatch, key, value, msg):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    with pytest.raises(ConfigError, match=rf"^checkpoint\.{key}: {msg}"):
        CheckpointConfig.from_dict({key: value}, "checkpoint")


def test_distributed_checkpoint_options_act_under_msrun(monkeypatch):
    two_workers(monkeypatch)
    cfg = CheckpointConfig.from_dict({"remove_redundancy": True, "load_worker_number": 4,
                                      "reshard_worker_num": 2, "load_balanced": True,
                                      "save_global_layout_cache": False}, "checkpoint")
    assert (cfg.remove_redundancy, cfg.load_worker_number, cfg.reshard_worker_num,
            cfg.load_balanced) == (True, 4, 2, True)


# ---- monitor / profiler / context / callbacks / recompute ------------------------------------
def test_norm_patterns():
    assert norm_patterns(True) == [] and norm_patterns(False) is None
    assert norm_patterns("") is None and norm_patterns("embedding") == ["embedding"]
    assert norm_patterns(["a*", "b"]) == ["a*", "b"]


def test_monitor_loads_upstream_and_older_tensorboard_names():
    cfg = MonitorConfig.from_dict({"train_state": {"local_norm": "embedding", "device_loss": True},
                                   "tensorboard": {"tensorboard_dir": "", "queue_size": 10}},
                                  "monitor")
    assert cfg.train_state.local_norm == "embedding" and cfg.tensorboard.queue_size == 10
    assert MonitorConfig.from_dict({"tensorboard": {"output_dir": "/tb"}},
                                   "monitor").tensorboard.resolved() == ("/tb", 1, 1000)
    with pytest.raises(ConfigError, match=r"^monitor\.tensorboard\.tensorboard_log_interval: 3 "
                                          r"disagrees with log_interval: 2 \(the same field in "
                                          r"two spellings: write one\)"):
        MonitorConfig.from_dict({"tensorboard": {"log_interval": 2,
                                                 "tensorboard_log_interval": 3}}, "monitor")
    with pytest.raises(ConfigError, match=r"^monitor\.train_state\.local_norm: expected bool "
                                          r"or str or list of str, got int"):
        MonitorConfig.from_dict({"train_state": {"local_norm": 3}}, "monitor")
    with pytest.raises(ConfigError, match=r"^monitor\.train_state\.local_norms: unknown key; "
                                          r".*did you mean 'local_norm'\?"):
        MonitorConfig.from_dict({"train_state": {"local_norms": True}}, "monitor")


def test_profiler_window_and_spellings():
    cfg = ProfilerConfig.from_dict({"enable_profiling": True, "start_step": 2, "end_step": 4},
                                   "profiler")
    assert cfg.window() == (2, 4) and cfg.level() == 0
    old = ProfilerConfig.from_dict({"enable_profiler": True, "start_step": 10, "stop_step": 20,
                                    "profiler_level": "Level1"}, "profiler")
    assert (old.enable_profiling, old.window(), old.level()) == (True, (10, 20), 1)
    sched = ProfilerConfig.from_dict({"profiler_skip_first": 5, "profiler_warmup": 1,
                                      "profiler_active": 2, "profiler_repeat": 1}, "profiler")
    assert sched.window() == (7, 8)
    assert ProfilerConfig.from_dict(sched.to_dict(), "profiler").window() == (7, 8)


@pytest.mark.parametrize("data,msg", [
    ({"start_step": 3, "end_step": 2}, r"^profiler\.start_step: ProfilerConfig\.start_step must "
                                       r"be less than or equal to end_step, but got 3 and 2"),
    ({"start_step": 0}, r"^profiler\.start_step: ProfilerConfig\.start_step and end_step must "
                        r"be positive"),
    ({"profiler_repeat": 2}, r"^profiler\.profiler_repeat: 2 needs several profiling windows"),
    ({"profiler_skip_first": 1, "start_step": 1}, r"^profiler\.start_step: given together with "
                                                  r"the schedule keys"),
    ({"stop_step": 2, "end_step": 2}, r"^profiler\.stop_step: sets the same field as 'end_step'"),
    ({"profiler_level": "Level9"}, r"^profiler\.profiler_level: must be 0, 1, 2 or one of"),
    ({"mstx": True}, r"^profiler\.mstx: True needs mstx"),
])
def test_profiler_errors(data, msg):
    with pytest.raises(ConfigError, match=msg):
        ProfilerConfig.from_dict(data, "profiler")


def test_context():
    cfg = ContextConfig.from_dict({"mode": 1, "max_device_memory": "59GB",
                                   "device_target": "Ascend"}, "context")
    assert parse_memory_size(cfg.max_device_memory, "x") == 59 * 1024 ** 3
    assert parse_memory_size("1024MB", "x") == 1024 ** 3
    with pytest.raises(ConfigError, match=r"^context\.mode: must be 1 \(PyNative\), got 0"):
        ContextConfig.from_dict({"mode": 0}, "context")
    with pytest.raises(ConfigError, match=r"^context\.max_device_memory: expected a positive "
                                          r"size like '59GB'"):
        ContextConfig.from_dict({"max_device_memory": "lots"}, "context")
    with pytest.raises(ConfigError, match=r"^context\.device_target: must be one of"):
        ContextConfig.from_dict({"device_target": "TPU"}, "context")


def test_callbacks():
    cfg = CallbacksConfig.from_dict([{"type": "LossCallback"}, {"type": "MonitorCallback"}],
                                    "callbacks")
    assert cfg.types() == ["LossCallback", "MonitorCallback"]
    assert cfg.to_dict() == [{"type": "LossCallback"}, {"type": "MonitorCallback"}]
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.type: callback type 'callbackA' has "
                                          r"no counterpart in this module"):
        CallbacksConfig.from_dict([{"type": "callbackA", "param": 0}], "callbacks")
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.type: .*did you mean "
                                          r"'LossCallback'\?"):
        CallbacksConfig.from_dict([{"type": "LosCallback"}], "callbacks")
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.every: unknown key"):
        CallbacksConfig.from_dict([{"type": "LossCallback", "every": 2}], "callbacks")
    ok = CallbacksConfig.from_dict([{"type": "LossCallback", "log_interval": 1}], "callbacks")
    assert ok.to_dict() == [{"type": "LossCallback", "log_interval": 1}]
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.log_interval: 10 needs a loss line "
                                          r"every log_interval steps"):
        CallbacksConfig.from_dict([{"type": "LossCallback", "log_interval": 10}], "callbacks")
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.log_interval: not a parameter of "
                                          r"MonitorCallback"):
        CallbacksConfig.from_dict([{"type": "MonitorCallback", "log_interval": 1}], "callbacks")
    with pytest.raises(ConfigError, match=r"^callbacks: expected a list"):
        CallbacksConfig.from_dict({"type": "LossCallback"}, "callbacks")


def test_recompute_full_and_select_are_real_and_the_rest_is_refused():
    RecomputeConfig.from_dict({"mode": "None", "full_recompute_layer": None}, "recompute")
    RecomputeConfig.from_dict({"full_recompute": False, "select_recompute": False}, "recompute")
    full = RecomputeConfig.from_dict({"mode": "full", "full_recompute_layer": ["0-3"]},
                                     "recompute")
    assert full.layers(6) == [0, 1, 2, 3] and full.modules(6) == {}
    assert RecomputeConfig.from_dict({"mode": "full"}, "recompute").layers(3) == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"^recompute\.full_recompute_layer: layer 5 is out "
                                          r"of range \[0, 4\)"):
        RecomputeConfig.from_dict({"mode": "full", "full_recompute_layer": [5]},
                                  "recompute").layers(4)
    # upstream's select mode (the fixture master_pynative_deepseek4.yaml's section)
    select = RecomputeConfig.from_dict({"mode": "select", "select_module": {
        "layers.*.self_attention.*": ["0-1"], "layers.*.mlp.*": [0]}}, "recompute")
    assert select.layers(4) == []
    assert select.modules(4) == {0: ("self_attention", "mlp"), 1: ("self_attention",)}
    with pytest.raises(ConfigError, match=r"^recompute\.select_module: 'layers\.\*\.moe' "
                                          r"selects no recomputable part"):
        RecomputeConfig.from_dict({"mode": "selective", "select_module": {"layers.*.moe": [0]}},
                                  "recompute").modules(4)
    with pytest.raises(ConfigError, match=r"^recompute\.select_module: mode 'select' needs "
                                          r"select_module"):
        RecomputeConfig.from_dict({"mode": "select"}, "recompute").modules(4)
    with pytest.raises(ConfigError, match=r"^recompute\.select_module: is read by mode: select "
                                          r"only, got mode 'None'"):
        RecomputeConfig.from_dict({"select_module": {"layers.*.mlp.*": ["0-9"]}}, "recompute")
    with pytest.raises(ConfigError, match=r"^recompute\.mode: mode must be one of 'full', "
                                          r"'select', 'selective', 'None', got 'partial'"):
        RecomputeConfig.from_dict({"mode": "partial"}, "recompute")
    # the keys that are not implemented: only their off values
    with pytest.raises(ConfigError, match=r"^recompute\.exclude_op: \['add'\] needs excluding "
                                          r"operators from recompute, which is not implemented"):
        RecomputeConfig.from_dict({"mode": "full", "exclude_op": ["add"]}, "recompute")
    with pytest.raises(ConfigError, match=r"^recompute\.select_recompute: True needs older "
                                          r"branches' select_recompute \(use mode: select"):
        RecomputeConfig.from_dict({"select_recompute": True}, "recompute")
    with pytest.raises(ConfigError, match=r"^recompute\.full_recompute: True needs older "
                                          r"branches' full_recompute \(use mode: full\)"):
        RecomputeConfig.from_dict({"full_recompute": True}, "recompute")


def test_recompute_with_compiled_layers_is_an_error_naming_both_fields():
    from mindformers_core.config import load_config
    base = {"training": {"steps": 2, "local_batch_size": 1, "global_batch_size": 1},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "recompute": {"mode": "full"}}
    cfg = load_config(base)
    assert cfg.model_jit_mode() == "none" and cfg.recompute_layers()   # jit not written
    base["training"]["jit"] = "layer"
    with pytest.raises(ConfigError, match=r"^training\.jit: 'layer' compiles the layers, but "
                                          r"recompute \(recompute\.mode: full"):
        load_config(base)
    base["recompute"] = {"mode": "select", "select_module": {"layers.*.mlp.*": [0]}}
    with pytest.raises(ConfigError, match=r"^training\.jit: 'layer' compiles the layers, but "
                                          r"recompute \(recompute\.mode: select, 1 layers\)"):
        load_config(base)
    del base["training"]["jit"]
    cfg = load_config(base)
    assert cfg.model_jit_mode() == "none" and cfg.recompute_modules() == {0: ("mlp",)}


def test_disabled_sections_off_values_only():
    RecomputeCommConfig.from_dict({"enable": False, "select_module": None}, "recompute_comm")
    SwapConfig.from_dict({"enable": False, "default_prefetch": 1, "layer_swap": None}, "swap")
    LoraConfig.from_dict({"target_modules": "", "lora_rank": 8}, "lora_config")
    with pytest.raises(ConfigError, match=r"^recompute_comm\.enable: True needs communication "
                                          r"recompute"):
        RecomputeCommConfig.from_dict({"enable": True}, "recompute_comm")
    with pytest.raises(ConfigError, match=r"^swap\.layer_swap: .* needs activation swap"):
        SwapConfig.from_dict({"layer_swap": [{"backward_prefetch": 1}]}, "swap")
    with pytest.raises(ConfigError, match=r"^lora_config\.target_modules: '.\*linear.\*' needs "
                                          r"LoRA fine-tuning"):
        LoraConfig.from_dict({"target_modules": ".*linear.*"}, "lora_config")


def test_run_config_takes_null_lora_config_and_writes_back_only_given_sections():
    base = {"training": {"steps": 10}, "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3,
                             "warmup_steps": 0}}
    cfg = load_config({**base, "lora_config": None, "swap": {"enable": False}})
    d = cfg.to_dict()
    assert "swap" in d and "lora_config" in d and "recompute_comm" not in d
    assert load_config(d) == cfg
