"""Rules of tensor and sequence parallelism (``parallelism.tensor_parallel > 1``), pure.

Each rule raises ValueError with upstream's text (MindFormers for ``sequence_parallel``,
Megatron's ``TransformerConfig`` wording for the divisibility rules); ``check_tensor_parallel``
(RunConfig) wraps it as ``ConfigError("<section>.<field>", message)``.

Why each size must divide:

* ``num_attention_heads`` and ``num_query_groups``: attention heads (and GQA key/value groups)
  are split across the tp ranks, whole heads per rank;
* ``ffn_hidden_size`` (dense MLP) and, for DeepSeek-V3, the shared experts' width
  (``moe_shared_expert_intermediate_size``, default ``n_shared_experts *
  moe_intermediate_size``): SwiGLU units are split across ranks (the routed experts are not
  split: ``models/tp_model.py``);
* ``vocab_size``: the embedding, the output layer and the cross-entropy are vocabulary
  parallel, ``vocab_size / tp`` rows per rank;
* ``local_batch_size * seq_length``: sequence parallel splits the flattened ``B * S`` tokens
  of a micro-batch into ``tp`` equal shards.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["SEQUENCE_PARALLEL_MESSAGE",
           "check_sequence_parallel", "check_divisible_by_tp", "check_sequence_tokens",
           "tp_divisibility_problems", "check_tensor_parallel"]

SEQUENCE_PARALLEL_MESSAGE = ("PyNative tensor parallelism requires sequence_parallel=True when "
                             "tensor_parallel > 1, but got tensor_parallel={tp}.")

def check_sequence_parallel(tp: int, sequence_parallel: bool) -> None:
    """Upstream's PyNative rule: TP > 1 runs only with sequence parallel."""
    if tp > 1 and not sequence_parallel:
        raise ValueError(SEQUENCE_PARALLEL_MESSAGE.format(tp=tp))


def check_divisible_by_tp(name: str, value: int, tp: int) -> None:
    """``value`` (the config field ``name``) must be a multiple of the tp size."""
    if value % tp:
        raise ValueError(f"{name} ({value}) must be a multiple of tensor_model_parallel_size "
                         f"({tp}).")


def check_sequence_tokens(local_batch_size: int, seq_length: int, tp: int) -> None:
    """Sequence parallel splits the B * S tokens of a micro-batch into tp equal shards."""
    tokens = local_batch_size * seq_length
    if tokens % tp:
        raise ValueError(f"With sequence parallelism, the tokens of a micro-batch "
                         f"local_batch_size ({local_batch_size}) * seq_length ({seq_length}) = "
                         f"{tokens} must be divisible by tensor_model_parallel_size ({tp}).")


def tp_divisibility_problems(model_cfg, tp: int) -> Optional[tuple]:
    """``(field, message)`` of the first model size that tp does not divide, else None."""
    sizes = [("num_attention_heads", model_cfg.num_attention_heads)]
    if not model_cfg.resolved_multi_latent_attention():
        sizes.append(("num_query_groups", model_cfg.resolved_num_query_groups()))
    if model_cfg.model_type != "deepseek_v3" or model_cfg.first_k_dense_replace > 0:
        sizes.append(("ffn_hidden_size", model_cfg.resolved_ffn_hidden_size()))
    if model_cfg.model_type == "deepseek_v3":
        sizes.append(("moe_shared_expert_intermediate_size",
                      model_cfg.resolved_shared_expert_intermediate_size()))
    sizes.append(("vocab_size", model_cfg.vocab_size))
    for name, value in sizes:
        try:
            check_divisible_by_tp(name, int(value), tp)
        except ValueError as err:
            return name, str(err)
    return None


def check_tensor_parallel(cfg) -> None:
    """Every tensor-parallel rule of a RunConfig, as ConfigError naming the field."""
    from ..errors import ConfigError
    par = cfg.parallelism
    tp = par.tensor_parallel
    if tp == 1:
        return
    try:
        check_sequence_parallel(tp, par.sequence_parallel)
    except ValueError as err:
        raise ConfigError("parallelism.sequence_parallel", str(err)) from None
    # every refusal of a layout names the parallelism field it collides with (config/layout.py)
    layout = f" (parallelism.tensor_parallel: {tp})"
    problem = tp_divisibility_problems(cfg.model, tp)
    if problem is not None:
        raise ConfigError(f"model.{problem[0]}", problem[1] + layout)
    try:
        check_sequence_tokens(cfg.training.local_batch_size, cfg.model.seq_length, tp)
    except ValueError as err:
        raise ConfigError("training.local_batch_size", str(err) + layout) from None
    if cfg.model_jit_mode() == "model":
        raise ConfigError("training.jit", f"model compiles the whole forward as one graph, which "
                                          f"cannot hold the tensor-parallel collectives "
                                          f"(tensor_parallel {tp}); use layer or none"
                                          + layout)
    if cfg.recompute_layers():
        raise ConfigError("recompute.mode", f"recompute is not implemented with "
                                            f"parallelism.tensor_parallel > 1 ({tp}); turn "
                                            f"recompute off")
    capacity = cfg.model.moe_expert_capacity_factor
    if par.expert_parallel > 1 and capacity is not None:
        # each tp rank dispatches its T/tp tokens (models/tp_model.py), so a capacity would drop
        # pairs per token shard, not per micro-batch as one process does
        raise ConfigError("parallelism.expert_parallel",
                          f"expert_parallel({par.expert_parallel}) with parallelism."
                          f"tensor_parallel({tp}) runs dropless only, but model."
                          f"moe_expert_capacity_factor is {capacity}; unset it or set "
                          f"parallelism.expert_parallel: 1")
