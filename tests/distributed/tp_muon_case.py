"""Muon (and AdamW) on tensor-parallel shards vs one process on the full weights.

Every rank builds the same tiny DeepSeek-V3 in full (same seed), takes its shard of the weights
tensor parallel splits (``tp_specs``: the TP models' layout, ``models/tp_plan.py``),
and steps the optimizer built by ``TensorParallelSharding`` on the slices of the same full
gradients (seeded, one set per step). QK-Clip is on with a low threshold and max logits chosen
per head (some heads above it); each rank reports the logits of its local heads only. The
reference is the plain optimizer over the full weights, fed the full gradients and logits.
"""
from __future__ import annotations

import numpy as np

STEPS = 10
THRESHOLD = 5.0
MODEL = {"model_type": "deepseek_v3", "multi_latent_attention": True, "vocab_size": 64,
         "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4,
         "ffn_hidden_size": 64, "seq_length": 16, "q_lora_rank": 16, "kv_lora_rank": 16,
         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
         "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
         "moe_intermediate_size": 16, "n_shared_experts": 1}
MUON = {"type": "Muon", "weight_decay": 0.1, "momentum": 0.95, "qk_clip_enabled": True,
        "qk_clip_threshold": THRESHOLD, "lr": 2e-2}
ADAMW = {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "lr": 1e-2}

#: name -> (optimizer config, comm_strategy, send/recv forced, data_parallel_shard)
CASES = {
    "muon_allgather": (MUON, "allgather", None, 1),
    "muon_deredundency": (MUON, "allgather_deredundency", None, 1),
    "muon_deredundency_p2p": (MUON, "allgather_deredundency", True, 1),
    "adamw": (ADAMW, None, None, 1),
}
#: 4 workers, tp 2 x dp 2, ZeRO-1 over dp on top of the TP shards
CASES_2D = {
    "muon_allgather_zero": (MUON, "allgather", None, -1),
    "muon_deredundency_zero": (MUON, "allgather_deredundency", None, -1),
    "muon_deredundency_zero_p2p": (MUON, "allgather_deredundency", True, -1),
    "adamw_zero": (ADAMW, None, None, -1),
}


def tp_specs(model, tp: int):
    """name -> ShardSpec of the weights tensor parallel splits: the package's layout
    (``models.tp_plan.tp_shard_specs``, what ``apply_tensor_parallel`` records) of the full model."""
    from mindformers_core.models.tp_plan import tp_shard_specs
    return tp_shard_specs(((p.name, p.shape) for p in model.trainable_params()), tp)


def full_gradients(model, step: int):
    """Seeded full gradients of step ``step`` (the same on every rank)."""
    rng = np.random.default_rng(1000 + step)
    return {p.name: rng.standard_normal(p.shape).astype(np.float32)
            for p in model.trainable_params()}


def full_max_logits(num_layers: int, heads: int, step: int) -> np.ndarray:
    """[layers, heads]: about half the heads above ``THRESHOLD`` each step."""
    rng = np.random.default_rng(5000 + step)
    return (THRESHOLD * rng.uniform(0.3, 3.0, (num_layers, heads))).astype(np.float32)


def _config(opt_cfg, strategy):
    from mindformers_core.optim.build import as_optimizer_config
    cfg = {k: v for k, v in opt_cfg.items() if k != "lr"}
    if strategy is not None:
        cfg["comm_strategy"] = strategy
    return as_optimizer_config(cfg)


def run(name: str, comm=None, tp: int = 1, cases=None) -> dict:
    """Case ``name`` for STEPS steps. ``comm`` None: one process on the full weights.
    Returns this rank's parameters (its shards), state_dict, NS FLOPs, clipped heads."""
    import mindspore as ms
    from mindspore import Parameter, Tensor
    from mindformers_core.distributed.shard_spec import shard
    from mindformers_core.distributed.tp_sharding import TensorParallelSharding
    from mindformers_core.models import build_model
    from mindformers_core.optim.build import OPTIMIZERS, optimizer_kwargs
    from mindformers_core.optim.param_groups import get_param_groups

    ms.set_context(mode=ms.PYNATIVE_MODE)
    opt_cfg, strategy, p2p, dp_shard = (cases or CASES)[name]
    cfg = _config(opt_cfg, strategy)
    model = build_model(MODEL, seed=7)
    specs = tp_specs(model, tp) if comm is not None else {}
    index = comm.mesh.local_rank("tp", comm.rank) if comm is not None else 0

    def mine(pname, arr):
        return shard(specs[pname], arr, index) if pname in specs else arr

    params = {p.name: Parameter(Tensor(mine(p.name, p.asnumpy())), name=p.name)
              for p in model.trainable_params()}
    groups = [dict(g, params=[params[p.name] for p in g["params"]])
              for g in get_param_groups(model, cfg)]
    kwargs = optimizer_kwargs(cfg)
    kwargs["lr"] = opt_cfg["lr"]
    cls = OPTIMIZERS[cfg.type]
    if cfg.type == "Muon":
        kwargs["model"] = model
    if comm is None:
        opt = cls(groups, **kwargs)
    else:
        opt = TensorParallelSharding(specs, comm, data_parallel_shard=dp_shard,
                                     p2p=p2p).build(cls, groups, kwargs)
    heads, layers = MODEL["num_attention_heads"], MODEL["num_layers"]
    local_heads = heads // tp
    clipped = []
    for step in range(STEPS):
        full = full_gradients(model, step)
        grads = [Tensor(mine(p.name, full[p.name])) for p in opt.parameters]
        logits = full_max_logits(layers, heads, step)
        model.set_max_attention_logits(logits[:, index * local_heads:(index + 1) * local_heads])
        opt.step(grads)
        stats = getattr(opt, "last_qk_clip", None)
        clipped.append(stats.num_clipped_heads if stats is not None else 0)
    exchange = getattr(opt, "exchange", None)
    return {
        "params": {p.name: p.asnumpy().copy() for p in opt.parameters},
        "state": {k: v for k, v in opt.state_dict().items() if k != "global_step"},
        "ns_flops": float(getattr(exchange, "ns_flops_total", 0.0)),
        "owners": dict(getattr(exchange, "owner_by_name", {})),
        "clipped": clipped,
    }
