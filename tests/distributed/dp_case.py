"""A data-parallel training case shared by the msrun worker script and the single-process
reference: a tiny model, a fixed global batch per step, the trainer's accumulation, the DP
reducer, global-norm clipping and the optimizer (optionally ZeRO-1 sharded).

Global batch per step: ``GLOBAL_BATCH`` sequences. One process takes them as
``GLOBAL_BATCH // LOCAL_BATCH`` micro-batches (accumulation); ``W`` ranks each take the
``LOCAL_BATCH`` rows of their rank (``W * LOCAL_BATCH == GLOBAL_BATCH``, one micro-batch).
Loss masks drop ~25% of the tokens at random, so the ranks hold unequal token counts and
the token weighting across ranks is exercised.
"""
from __future__ import annotations

import numpy as np

GLOBAL_BATCH = 4
LOCAL_BATCH = 2
SEQ = 16
VOCAB = 64
STEPS = 10

MODELS = {
    "gpt": {"model_type": "gpt", "vocab_size": VOCAB, "hidden_size": 32, "num_layers": 2,
            "num_attention_heads": 2, "seq_length": SEQ},
    # MLA (Muon's requirement); layer 1 is MoE with 4 grouped experts (3-D Muon weights)
    "mla": {"model_type": "deepseek_v3", "multi_latent_attention": True, "vocab_size": VOCAB,
            "hidden_size": 32, "num_layers": 2, "num_attention_heads": 2,
            "ffn_hidden_size": 64, "seq_length": SEQ, "q_lora_rank": 16, "kv_lora_rank": 16,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
            "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "n_shared_experts": 1},
}

OPTIMIZERS = {
    "adamw": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "muon": {"type": "Muon", "weight_decay": 0.1, "momentum": 0.95, "qk_clip_enabled": True,
             "qk_clip_threshold": 0.02},
}

#: name -> (optimizer, model, data_parallel_shard, comm_strategy) (ZeRO-1 / replicated state)
CASES = {
    "adamw_replicated": ("adamw", "gpt", 1, None),
    "adamw_sharded": ("adamw", "gpt", -1, None),
    "muon_replicated": ("muon", "mla", 1, "allgather"),
    "muon_sharded_allgather": ("muon", "mla", -1, "allgather"),
    "muon_sharded_deredundency": ("muon", "mla", -1, "allgather_deredundency"),
    # each rank sums its rows as micro-batches of one (the name's suffix): the all-reduce
    # takes the accumulated sums (on CPU the host kernel's buffer, optim/host/accumulate.py)
    "adamw_replicated_accumulated": ("adamw", "gpt", 1, None),
}
ACCUMULATED_SUFFIX = "_accumulated"


#: name -> (optimizer, model, data_parallel_shard_strategy, comm_strategy): fully sharded data
#: parallel over every rank (data_parallel_shard -1); the "*_optim" ones are the 1-process
#: references (on one process every strategy is the same run)
FSDP_CASES = {
    "adamw_gpt_optim": ("adamw", "gpt", "optim", None),
    "adamw_mla_optim": ("adamw", "mla", "optim", None),
    "muon_mla_optim": ("muon", "mla", "optim", "allgather"),
    "adamw_gpt_optim_grads": ("adamw", "gpt", "optim_grads", None),
    "adamw_gpt_optim_grads_params": ("adamw", "gpt", "optim_grads_params", None),
    "adamw_mla_optim_grads": ("adamw", "mla", "optim_grads", None),
    "adamw_mla_optim_grads_params": ("adamw", "mla", "optim_grads_params", None),
    "muon_mla_optim_grads": ("muon", "mla", "optim_grads", "allgather"),
    "muon_mla_optim_grads_params": ("muon", "mla", "optim_grads_params", "allgather"),
    "muon_mla_optim_grads_params_deredundency": ("muon", "mla", "optim_grads_params",
                                                 "allgather_deredundency"),
    # disable_gradient_division: False (the name's suffix): the reduced gradient / dp
    "adamw_gpt_optim_grads_params_divided": ("adamw", "gpt", "optim_grads_params", None),
}
DIVIDED_SUFFIX = "_divided"
#: the FSDP cases that shard (the others are their 1-process references)
FSDP_SHARDED = [n for n, (_, _, strategy, _) in FSDP_CASES.items() if strategy != "optim"]


def case_spec(name: str):
    """(optimizer, model, data_parallel_shard, data_parallel_shard_strategy, comm_strategy)."""
    if name in CASES:
        opt_name, model_name, shard, comm_strategy = CASES[name]
        return opt_name, model_name, shard, "optim", comm_strategy
    opt_name, model_name, strategy, comm_strategy = FSDP_CASES[name]
    return opt_name, model_name, -1, strategy, comm_strategy


def fsdp_reference(name: str) -> str:
    """The 1-process reference of a FSDP case."""
    opt_name, model_name, _, _ = FSDP_CASES[name]
    return f"{opt_name}_{model_name}_optim"


def case_config(name: str):
    from mindformers_core.config import load_config
    opt_name, model_name, shard, shard_strategy, strategy = case_spec(name)
    opt = dict(OPTIMIZERS[opt_name])
    if strategy is not None:
        opt["comm_strategy"] = strategy
    return load_config({
        "training": {"steps": STEPS, "local_batch_size": LOCAL_BATCH,
                     "global_batch_size": GLOBAL_BATCH, "max_norm": 1.0, "seed": 7},
        "optimizer": opt,
        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 2e-2,
                         "warmup_steps": 2, "lr_end": 1e-3},
        "model": MODELS[model_name],
        "parallelism": {"data_parallel_shard": shard,
                        "data_parallel_shard_strategy": shard_strategy,
                        "disable_gradient_division": not name.endswith(DIVIDED_SUFFIX)},
    })


def global_batches(steps: int = STEPS, seed: int = 1234):
    """``steps`` global batches: dicts of input_ids, labels [B, SEQ] int32, loss_mask fp32."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        tokens = rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ + 1)).astype(np.int32)
        mask = (rng.random((GLOBAL_BATCH, SEQ)) > 0.25).astype(np.float32)
        out.append({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask})
    return out


def _rows(batch, start, stop):
    return {k: v[start:stop] for k, v in batch.items()}


def run_case(name: str, comm, steps: int = STEPS, state_dict: bool = True) -> dict:
    """Train case ``name`` for ``steps`` steps on this process's share of the global batch
(the trainer's step: accumulate, reduce, clip, group lrs, optimizer, MoE expert-bias update).

    Returns losses, pre-clip grad norms, final parameters, the full optimizer state_dict
    (collective when sharded), per-rank optimizer-state bytes, comm stats and NS FLOPs."""
    import mindspore as ms
    from mindformers_core.core.lr import group_lrs
    from mindformers_core.distributed.grad_reduce import (DataParallelGradReducer, RouteComm,
                                                          gradient_norm, reduce_gradients)
    from mindformers_core.distributed.zero import optimizer_state_bytes
    from mindformers_core.models import build_model
    from mindformers_core.optim import build_optimizer
    from mindformers_core.distributed.fsdp import apply_fsdp
    from mindformers_core.optim.clip_grad import clip_by_norm
    from mindformers_core.trainer.accumulate import (accumulate_gradients, count_loss_tokens,
                                                     make_grad_fn)
    from mindformers_core.optim.host.accumulate import host_add_kernel

    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = case_config(name)
    world, rank = comm.world_size, comm.rank
    model = build_model(cfg.model, seed=cfg.training.seed)
    sched = cfg.build_lr_scheduler()
    # the trainer's FSDP hook: on one process, or under optim, the reducer and model as they are
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.collectives import GroupCommunicator
    group_comm = GroupCommunicator(make_mesh(world), rank) if world > 1 else None
    reducer, model = apply_fsdp(cfg, DataParallelGradReducer(comm), model, group_comm)
    # sharded at construction (ZeRO-1 per parallelism.data_parallel_shard, QK-Clip MAX)
    opt = build_optimizer(cfg.optimizer, model, lr_scheduler=sched,
                          shard_layout=reducer.optimizer_sharding(cfg))
    grad_fn = make_grad_fn(model, opt.parameters)
    # the run's one reduction and norm (distributed/setup.py ParallelRun), from the routes
    routes, route_comm = reducer.grad_routes(opt.parameters), RouteComm(comm, group_comm)
    initial = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    comm.stats.reset()
    losses, norms, clipped_heads = [], [], 0
    for step, batch in enumerate(global_batches(steps)):
        if world == 1:
            micro = [_rows(batch, j * LOCAL_BATCH, (j + 1) * LOCAL_BATCH)
                     for j in range(GLOBAL_BATCH // LOCAL_BATCH)]
        else:
            per = GLOBAL_BATCH // world
            micro = [_rows(batch, rank * per, (rank + 1) * per)]
            if name.endswith(ACCUMULATED_SUFFIX):
                micro = [_rows(micro[0], j, j + 1) for j in range(per)]
        local = count_loss_tokens(micro)
        total = reducer.global_token_count(local)
        grads, loss_sum, _ = accumulate_gradients(grad_fn, micro, total)
        grads, loss_sum, _ = reduce_gradients(grads, routes, route_comm, reducer.token_group,
                                              loss_sum, local)
        grad_bytes = sum(int(g.nbytes) for g in grads if g is not None)
        norm = gradient_norm(grads, routes, route_comm.group_sum)
        grads, _ = clip_by_norm(grads, norm, cfg.training.max_norm)
        opt.set_group_lrs(group_lrs(sched, opt.param_groups, step))
        opt.step(grads)
        reducer.sync_moe_stats(model)      # as the trainer: global expert loads, then the
        model.update_expert_bias()         # aux-loss-free bias update (MoE layer of "mla")
        losses.append(loss_sum / total)
        norms.append(float(norm))
        stats = getattr(opt, "last_qk_clip", None)
        clipped_heads += stats.num_clipped_heads if stats is not None else 0
    out = {
        "losses": losses, "norms": norms,
        # every Parameter, also the MoE router's expert_bias (not trained by the optimizer)
        "params": {p.name: p.asnumpy().copy() for p in model.get_parameters()},
        "param_change": max(float(np.max(np.abs(p.asnumpy() - initial[p.name])))
                            for p in model.trainable_params()),
        "state_bytes": optimizer_state_bytes(opt),
        "param_bytes": sum(int(p.nbytes) for p in opt.parameters),
        "grad_bytes": grad_bytes,
        # layouts of the parameters stored as shards (optim_grads_params), to merge them
        "shard_specs": {k: [list(v.full_shape), v.split_dim, v.num_shards]
                        for k, v in model.shard_specs().items()},
        "comm": comm.stats.to_dict(),
        "ns_flops": float(getattr(opt, "ns_flops_total", 0.0)),
        "ns_owner": dict(getattr(opt, "ns_owner_by_name", {})),
        "qk_clipped_heads": int(clipped_heads),
        "host_add_kernel": host_add_kernel() is not None,
    }
    if state_dict:
        out["state_dict"] = {k: v for k, v in opt.state_dict().items() if k != "global_step"}
    return out
