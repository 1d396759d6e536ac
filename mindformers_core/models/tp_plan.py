"""Tensor-parallel layout of the GPT / DeepSeek-V3 parameters, vocabulary and token shards (pure).

Which parameter is split along which dim over the ``tp`` group (Megatron), by its (upstream)
name; every other parameter is replicated:

    embedding.word_embeddings.weight [V, H]      dim 0 (vocabulary parallel)
    output_layer.weight [V, H]                   dim 0 (column parallel over the vocabulary)
    *.self_attention.linear_qkv.weight           dim 0, blocks (N*d, G*d, G*d): each rank holds
                                                 its N/tp query heads, then its G/tp key and
                                                 value groups (column parallel over heads)
    *.self_attention.linear_q_proj.weight        dim 0 (MLA; per-head periodic rows, so a
    *.self_attention.linear_q_up_proj.weight     contiguous split is whole heads)
    *.self_attention.linear_kv_up_proj.weight
    *.self_attention.linear_proj.weight          dim 1 (row parallel)
    decoder.layers.<i>.mlp.linear_fc1.weight     dim 0 (a dense MLP, or a MoE layer's
    ...mlp.shared_experts.linear_fc1.weight      shared experts; the interleaved gate/up rows
                                                 2j, 2j+1 stay together when F % tp == 0)
    decoder.layers.<i>.mlp.linear_fc2.weight     dim 1
    ...mlp.shared_experts.linear_fc2.weight
    mtp.layers.<k>.transformer_layer.*           as a decoder layer's (a multi-token
                                                 prediction depth; its enorm / hnorm /
                                                 eh_proj / final_layernorm replicated)

Replicated and *partial*: every other trainable parameter outside a MoE block (the RMSNorm
gains, MLA's down-projections and their norms). Under sequence parallelism a norm sees only
this rank's tokens, and a replicated weight inside the tensor-parallel region feeds only this
rank's heads, so its local gradient is one rank's share and the gradients are summed over the
tp group. Replicated and *redundant*: the MoE router and routed experts, which every tp rank
runs on all tokens of the micro-batch (models/tp_model.py): their gradient is already complete
on every rank.

Vocabulary shard ``k`` of ``V`` over ``tp`` ranks: ids ``[k V/tp, (k+1) V/tp)``. Token shard
``k`` of the flattened ``B*S`` tokens of a micro-batch: ``[k T/tp, (k+1) T/tp)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple

from ..distributed.shard_spec import ShardSpec

__all__ = ["AttentionShape", "tp_shard_spec", "tp_shard_specs", "is_partial_replicated",
           "vocab_range", "token_range"]

_DENSE_MLP = re.compile(r"^(decoder\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\."
                        r"(shared_experts\.)?linear_fc([12])\.weight$")
_MOE_BLOCK = re.compile(r"\.mlp\.(router|experts)\.")
_COLUMN_HEADS = ("linear_q_proj", "linear_q_up_proj", "linear_kv_up_proj")


@dataclass(frozen=True)
class AttentionShape:
    """What the fused GPT qkv layout needs: heads N, key/value groups G, head dim d."""
    num_heads: int
    num_groups: int
    head_dim: int


def _leaf(name: str) -> Tuple[str, str]:
    """(module attribute, parameter attribute) of a dotted name: (..., 'linear_qkv', 'weight')."""
    parts = name.split(".")
    return (parts[-2] if len(parts) > 1 else ""), parts[-1]


def tp_shard_spec(name: str, shape: Sequence[int], tp: int,
                  attention: Optional[AttentionShape] = None,
                  group: str = "tp") -> Optional[ShardSpec]:
    """The :class:`ShardSpec` of parameter ``name`` (full ``shape``) over ``tp`` ranks, or None
    when it is replicated (module docstring)."""
    if tp == 1:
        return None
    module, attr = _leaf(name)
    if attr != "weight":
        return None
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return ShardSpec(shape, 0, group, tp)
    if ".self_attention." in name:
        if module == "linear_qkv":
            if attention is None:
                raise ValueError(f"{name}: the fused qkv layout needs the attention shape")
            a = attention
            return ShardSpec(shape, 0, group, tp, blocks=(a.num_heads * a.head_dim,
                                                          a.num_groups * a.head_dim,
                                                          a.num_groups * a.head_dim))
        if module in _COLUMN_HEADS:
            return ShardSpec(shape, 0, group, tp)
        if module == "linear_proj":
            return ShardSpec(shape, 1, group, tp)
        return None
    dense = _DENSE_MLP.match(name)
    if dense:
        return ShardSpec(shape, 0 if dense.group(3) == "1" else 1, group, tp)
    return None


def tp_shard_specs(named_shapes: Iterable[Tuple[str, Sequence[int]]], tp: int,
                   attention: Optional[AttentionShape] = None) -> Dict[str, ShardSpec]:
    """name -> ShardSpec of the sharded parameters only (absent = replicated)."""
    out = {}
    for name, shape in named_shapes:
        spec = tp_shard_spec(name, shape, tp, attention)
        if spec is not None:
            out[name] = spec
    return out


def is_partial_replicated(name: str) -> bool:
    """Whether a replicated parameter's local gradient is this rank's share (summed over tp):
    every replicated parameter but the MoE router and routed experts (module docstring)."""
    return _MOE_BLOCK.search(name) is None


def vocab_range(vocab_size: int, tp: int, index: int) -> Tuple[int, int]:
    """``[start, stop)`` of the vocabulary rows of tp rank ``index``."""
    return _equal_range("vocab_size", vocab_size, tp, index)


def token_range(num_tokens: int, tp: int, index: int) -> Tuple[int, int]:
    """``[start, stop)`` of the flattened tokens that sequence-parallel rank ``index`` holds."""
    return _equal_range("tokens", num_tokens, tp, index)


def _equal_range(what: str, n: int, parts: int, index: int) -> Tuple[int, int]:
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"index {index} is out of range for {parts} parts")
    if n % parts:
        raise ValueError(f"{what} ({n}) is not divisible by the tp size ({parts})")
    size = n // parts
    return index * size, (index + 1) * size
