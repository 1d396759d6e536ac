"""How Muon cuts a weight's update into the matrices it orthogonalises ("pieces").

Upstream MindFormers 2.1 (`make_model_muon_fns` + `muon_utils`) orthogonalises
fused projections piece by piece, each piece scaled by sqrt(max(A, B)) of its own (A, B). A
"periodic (a, b)" split of a weight whose rows repeat [a rows | b rows] per head gathers **all**
a-rows into one piece and all b-rows into another (two pieces, not one per head). Our parameter
names and row layouts (models/attention.py, models/mlp.py; weights are [out, in]) map to the
upstream rules as follows:

* `linear_q_up_proj` (upstream `linear_qb`) and `linear_q_proj` (no q_lora; upstream's periodic
  slab of `linear_qkv`): per head [dn q_nope | dr q_rope] rows -> periodic (dn, dr):
  (N*dn, r) and (N*dr, r).
* `linear_kv_up_proj` (`linear_kvb`): per head [dn k_nope | dv v] -> periodic (dn, dv).
* `linear_kv_down_proj` (the kv slabs of upstream's `linear_qkv`): [kv_lora_rank c_kv | dr k_pe]
  rows -> blocks (kv_lora_rank, dr).
* `linear_qkv` (GPT, block layout [Q | K | V]): blocks (N*d, G*d, G*d).
* `*linear_fc1` (dense MLP and shared experts): interleaved gate/up rows -> periodic (1, 1):
  (F, H) and (F, H).
* `experts.weight1` [E, H, 2F] ([gate F | up F] columns): halves of the last dim, (E, H, F) x 2.
* `experts.weight2` [E, F, H]: one (E, F, H) batch.
* `experts.weight` [E, A, B] (one matrix per expert): one (E, A, B) batch, i.e. each expert's
  matrix orthogonalised and scaled by sqrt(max(A, B)) on its own.
* anything else: the whole matrix.

With `muon_split_qkv=False` every 2-D weight is one piece (the 3-D expert rule is kept: its two
halves are different matrices, gate and up). A piece is 2-D (A, B) or 3-D (batch, A, B); Muon
batches pieces of the same (A, B) across all weights into one Newton-Schulz call.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import List, Sequence, Tuple

from mindspore import Tensor, ops

__all__ = ["SplitRule", "split_rule_for", "piece_shapes", "split_pieces", "merge_pieces"]

Shape = Tuple[int, ...]


@dataclass(frozen=True)
class SplitRule:
    """kind: "whole" | "periodic" (parts=(a, b)) | "blocks" (parts=row counts) | "halves"."""
    kind: str = "whole"
    parts: Tuple[int, ...] = ()


_WHOLE = SplitRule()

_Q_PERIODIC = ("*self_attention.linear_q_up_proj.weight", "*self_attention.linear_q_proj.weight")
_KV_UP = ("*self_attention.linear_kv_up_proj.weight",)
_KV_DOWN = ("*self_attention.linear_kv_down_proj.weight",)
_QKV = ("*self_attention.linear_qkv.weight",)
_FC1 = ("*linear_fc1.weight",)
_EXPERT_W1 = ("experts.weight1", "*.experts.weight1")


def _match(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def split_rule_for(name: str, shape: Sequence[int], cfg, split_qkv: bool = True) -> SplitRule:
    """The split of parameter `name` (shape `shape`) for a model whose transformer config is `cfg`.

    `cfg` is `model.get_gpt_transformer_config()` (Megatron field names: qk_head_dim,
    qk_pos_emb_head_dim, v_head_dim, kv_lora_rank, num_attention_heads, num_query_groups,
    kv_channels, multi_latent_attention). Raises ValueError when the shape does not fit the layout.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) == 3:
        if _match(name, _EXPERT_W1):
            rule = SplitRule("halves")
        else:
            return _WHOLE
    elif not split_qkv:
        return _WHOLE
    elif getattr(cfg, "multi_latent_attention", False) and _match(name, _Q_PERIODIC):
        rule = SplitRule("periodic", (cfg.qk_head_dim, cfg.qk_pos_emb_head_dim))
    elif getattr(cfg, "multi_latent_attention", False) and _match(name, _KV_UP):
        rule = SplitRule("periodic", (cfg.qk_head_dim, cfg.v_head_dim))
    elif getattr(cfg, "multi_latent_attention", False) and _match(name, _KV_DOWN):
        rule = SplitRule("blocks", (cfg.kv_lora_rank, cfg.qk_pos_emb_head_dim))
    elif not getattr(cfg, "multi_latent_attention", False) and _match(name, _QKV):
        d, n, g = cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups
        rule = SplitRule("blocks", (n * d, g * d, g * d))
    elif _match(name, _FC1):
        rule = SplitRule("periodic", (1, 1))
    else:
        return _WHOLE
    piece_shapes(rule, shape, name)  # validates
    return rule


def piece_shapes(rule: SplitRule, shape: Sequence[int], name: str = "?") -> List[Shape]:
    """Shapes of the pieces `split_pieces` returns for a weight of `shape` (no tensors needed)."""
    shape = tuple(int(s) for s in shape)
    if rule.kind == "whole":
        return [shape]
    if rule.kind == "halves":
        e, h, f2 = shape
        if f2 % 2:
            raise ValueError(f"Muon split: {name} shape {shape} has an odd last dim; "
                             "expected [E, H, 2F] (gate | up).")
        return [(e, h, f2 // 2), (e, h, f2 // 2)]
    rows, cols = shape
    if rule.kind == "periodic":
        a, b = rule.parts
        if rows % (a + b):
            raise ValueError(f"Muon split: {name} has {rows} rows, not a multiple of the "
                             f"per-head period {a} + {b}.")
        n = rows // (a + b)
        return [(n * a, cols), (n * b, cols)]
    if rule.kind == "blocks":
        if sum(rule.parts) != rows:
            raise ValueError(f"Muon split: {name} has {rows} rows, but its row blocks "
                             f"{list(rule.parts)} sum to {sum(rule.parts)}.")
        return [(r, cols) for r in rule.parts]
    raise ValueError(f"unknown split kind {rule.kind!r}")


def split_pieces(rule: SplitRule, x: Tensor) -> List[Tensor]:
    """Cut `x` (the weight-shaped update) into its pieces (see the module table)."""
    if rule.kind == "whole":
        return [x]
    if rule.kind == "halves":
        return list(ops.split(x, x.shape[-1] // 2, axis=-1))
    rows, cols = x.shape
    if rule.kind == "periodic":
        a, b = rule.parts
        n = rows // (a + b)
        pa, pb = ops.split(x.reshape(n, a + b, cols), (a, b), axis=1)
        return [pa.reshape(n * a, cols), pb.reshape(n * b, cols)]
    return list(ops.split(x, tuple(rule.parts), axis=0))


def merge_pieces(rule: SplitRule, pieces: Sequence[Tensor], shape: Sequence[int]) -> Tensor:
    """Inverse of `split_pieces`: the weight-shaped tensor of `shape`."""
    if rule.kind == "whole":
        return pieces[0]
    if rule.kind == "halves":
        return ops.cat(tuple(pieces), axis=-1)
    rows, cols = shape
    if rule.kind == "periodic":
        a, b = rule.parts
        n = rows // (a + b)
        merged = ops.cat((pieces[0].reshape(n, a, cols), pieces[1].reshape(n, b, cols)), axis=1)
        return merged.reshape(rows, cols)
    return ops.cat(tuple(pieces), axis=0)
