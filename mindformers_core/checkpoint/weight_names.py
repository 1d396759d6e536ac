"""Model weights between this project's parameter names and upstream checkpoint layouts: the
one name table of each format, read in both directions (``tools/convert_weights.py`` is its
command line; ``checkpoint/foreign.py`` loads such files for training and generation).

Formats (``fmt``), for ``model_type`` gpt (Llama-style), qwen3 and deepseek_v3:

* ``native``: this project's names and layouts (models/attention.py, models/mlp.py).
* ``hf``: Hugging Face ``transformers`` Llama / Qwen3 / DeepSeek-V3 names (``model.embed_tokens``,
  ``model.layers.N.self_attn.q_proj`` ..., ``mlp.gate_proj/up_proj/down_proj``,
  ``mlp.gate.weight`` + ``e_score_correction_bias``, ``mlp.experts.E.*``, ``lm_head``).
  Unfused q/k/v and gate/up; Qwen3's per-head norms are ``self_attn.q_norm`` / ``k_norm``
  (here and in MindFormers: ``self_attention.q_layernorm`` / ``k_layernorm``, [head_dim]).
  DeepSeek-V3's rope rows (the last ``dr`` of each q head and of
  ``kv_a_proj_with_mqa``) are in HF's interleaved order (``rope_interleave: true``, its
  default); here RoPE rotates halves, so those rows are permuted ``[0,2,4,..,1,3,5,..]``.
* ``mindformers``: upstream MindFormers' checkpoint names. ``qkv_concat=True`` (its PyNative
  model, ``mla_qkv_concat: True``): MLA's down projections fused as ``linear_qkv`` =
  ``[q_down (or q_proj); kv_down]``, ``linear_qb``, ``linear_kvb``, ``k_layernorm``, and the
  expert bias at ``mlp.expert_bias`` (here ``mlp.router.expert_bias``; both are read);
  the MTP layers' transformer layer (``mtp.layers.K.transformer_layer.*``) is named and laid
  out as a decoder layer;
  ``qkv_concat=False`` (its mcore DeepSeek-V3 converter): this project's MLA names with the
  experts flattened, ``weight1`` [E*H, 2F], ``weight2`` [E*F, H]. GPT's fused ``linear_qkv``
  is grouped per query group ``[q of the group's heads; k; v]`` (here: all q, all k, all v).
  Dense ``linear_fc1`` interleaves gate/up rows in both projects.

Every conversion is a pure function of a ``{name: ndarray}`` dict and the model config;
``to_native(from_native(w)) == w`` exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["FORMATS", "Geometry", "to_native", "from_native", "rope_half_order",
           "grouped_qkv_order"]

FORMATS = ("native", "hf", "mindformers")
Weights = Dict[str, np.ndarray]


@dataclass(frozen=True)
class Geometry:
    """The sizes a conversion needs (from a ModelConfig)."""
    mla: bool
    num_layers: int
    heads: int
    groups: int
    head_dim: int
    dn: int
    dr: int
    dv: int
    q_lora_rank: Optional[int]
    kv_lora_rank: int
    moe_layers: Tuple[int, ...]
    num_experts: int
    moe_ffn: int
    n_shared: int
    hidden: int
    tied: bool
    qk_norm: bool = False       # standard attention's per-head q/k norms (Qwen3)

    @property
    def q_rows_key(self) -> str:
        """Native projection holding the per-head q rows (q_b, or q when not compressed)."""
        return ("self_attention.linear_q_proj.weight" if self.q_lora_rank is None
                else "self_attention.linear_q_up_proj.weight")

    @property
    def q_input_key(self) -> str:
        """Native projection reading the hidden state for q (q_a, or q when not compressed)."""
        return ("self_attention.linear_q_proj.weight" if self.q_lora_rank is None
                else "self_attention.linear_q_down_proj.weight")

    @property
    def hf_q_rows_key(self) -> str:
        return ("self_attn.q_proj.weight" if self.q_lora_rank is None
                else "self_attn.q_b_proj.weight")

    @classmethod
    def of(cls, cfg) -> "Geometry":
        moe = tuple(range(cfg.first_k_dense_replace, cfg.num_layers)) \
            if cfg.model_type == "deepseek_v3" else ()
        return cls(mla=cfg.resolved_multi_latent_attention(), num_layers=cfg.num_layers,
                   heads=cfg.num_attention_heads, groups=cfg.resolved_num_query_groups(),
                   head_dim=cfg.resolved_kv_channels(),
                   dn=cfg.qk_nope_head_dim, dr=cfg.qk_rope_head_dim, dv=cfg.v_head_dim,
                   q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
                   moe_layers=moe, num_experts=cfg.n_routed_experts,
                   moe_ffn=cfg.resolved_moe_intermediate_size(), n_shared=cfg.n_shared_experts,
                   hidden=cfg.hidden_size, tied=cfg.tie_word_embeddings,
                   qk_norm=not cfg.resolved_multi_latent_attention()
                   and cfg.resolved_qk_layernorm())


# ------------------------------------------------------------------ row permutations (pure)
def rope_half_order(rows: int, period: int, offset: int, dr: int) -> np.ndarray:
    """Row order taking HF's interleaved rope rows to rotate-half rows: in every period of
    ``period`` rows, rows ``offset .. offset+dr`` become ``[even ones, odd ones]``."""
    order = np.arange(rows)
    per = np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)]) + offset
    for start in range(0, rows, period):
        order[start + offset:start + offset + dr] = start + per
    return order


def grouped_qkv_order(heads: int, groups: int, d: int) -> np.ndarray:
    """Row order taking the block qkv layout (all q, all k, all v) to the per-group layout
    (for each group: its heads' q, its k, its v)."""
    rep = heads // groups
    q0, k0, v0 = 0, heads * d, heads * d + groups * d
    order: List[int] = []
    for g in range(groups):
        order += range(q0 + g * rep * d, q0 + (g + 1) * rep * d)
        order += range(k0 + g * d, k0 + (g + 1) * d)
        order += range(v0 + g * d, v0 + (g + 1) * d)
    return np.asarray(order)


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """[F, H] gate and up -> [2F, H] with rows (gate_0, up_0, gate_1, ...)."""
    return np.stack([gate, up], axis=1).reshape(-1, gate.shape[-1])


def _deinterleave(fc1: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    return fc1[0::2], fc1[1::2]


# ------------------------------------------------------------------ name tables
_COMMON_HF = {"embedding.word_embeddings.weight": "model.embed_tokens.weight",
              "decoder.final_layernorm.weight": "model.norm.weight",
              "output_layer.weight": "lm_head.weight"}
_LAYER_HF = {"input_layernorm.weight": "input_layernorm.weight",
             "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
             "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
             "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
             "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
             "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
             "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
             "mlp.router.weight": "mlp.gate.weight",
             "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias"}
#: standard attention's per-head norms (Qwen3); MLA's q_layernorm is its q latent norm above
_QK_NORM_HF = {"self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
               "self_attention.k_layernorm.weight": "self_attn.k_norm.weight"}
_LAYER_MF_FUSED = {"self_attention.linear_q_up_proj.weight": "self_attention.linear_qb.weight",
                   "self_attention.linear_kv_up_proj.weight": "self_attention.linear_kvb.weight",
                   "self_attention.kv_layernorm.weight": "self_attention.k_layernorm.weight",
                   # upstream's PyNative MoE keeps the expert bias on the MLP, not its router
                   "mlp.router.expert_bias": "mlp.expert_bias"}
#: names read as this project's in either MindFormers layout (written: the table above)
_MF_ALIASES = {"mlp.expert_bias": "mlp.router.expert_bias"}


def _layer_hf_table(g: Geometry) -> Dict[str, str]:
    """Native -> HF names of a layer's tensors that only change name."""
    return {**_LAYER_HF, **_QK_NORM_HF} if g.qk_norm else _LAYER_HF


def _rename(w: Weights, table: Dict[str, str]) -> Weights:
    return {table.get(k, k): v for k, v in w.items()}


def _split_layers(w: Weights, prefix: str) -> Tuple[Weights, Dict[int, Weights]]:
    """(non-layer tensors, {layer: {suffix: tensor}}) for names ``{prefix}{i}.{suffix}``."""
    top: Weights = {}
    layers: Dict[int, Weights] = {}
    for name, value in w.items():
        if name.startswith(prefix):
            idx, suffix = name[len(prefix):].split(".", 1)
            layers.setdefault(int(idx), {})[suffix] = value
        else:
            top[name] = value
    return top, layers


def _join_layers(top: Weights, layers: Dict[int, Weights], prefix: str) -> Weights:
    out = dict(top)
    for i in sorted(layers):
        for suffix, value in layers[i].items():
            out[f"{prefix}{i}.{suffix}"] = value
    return out


def _pop(d: Weights, key: str, where: str) -> np.ndarray:
    if key not in d:
        raise KeyError(f"{where}: missing tensor {key!r}")
    return d.pop(key)


# ------------------------------------------------------------------ HF
def _layer_to_hf(i: int, lw: Weights, g: Geometry) -> Weights:
    lw = dict(lw)
    where = f"layer {i}"
    if g.mla:
        q = _pop(lw, g.q_rows_key, where)
        lw[g.hf_q_rows_key] = q[np.argsort(rope_half_order(q.shape[0], g.dn + g.dr, g.dn, g.dr))]
        kva = _pop(lw, "self_attention.linear_kv_down_proj.weight", where)
        inv = np.argsort(rope_half_order(kva.shape[0], kva.shape[0], g.kv_lora_rank, g.dr))
        lw["self_attn.kv_a_proj_with_mqa.weight"] = kva[inv]
    else:
        qkv = _pop(lw, "self_attention.linear_qkv.weight", where)
        nq, nk = g.heads * g.head_dim, g.groups * g.head_dim
        lw["self_attn.q_proj.weight"] = qkv[:nq]
        lw["self_attn.k_proj.weight"] = qkv[nq:nq + nk]
        lw["self_attn.v_proj.weight"] = qkv[nq + nk:]
    for native, hf in (("mlp.", "mlp."), ("mlp.shared_experts.", "mlp.shared_experts.")):
        if f"{native}linear_fc1.weight" in lw:
            gate, up = _deinterleave(lw.pop(f"{native}linear_fc1.weight"))
            lw[f"{hf}gate_proj.weight"], lw[f"{hf}up_proj.weight"] = gate, up
            lw[f"{hf}down_proj.weight"] = lw.pop(f"{native}linear_fc2.weight")
    if "mlp.experts.weight1" in lw:
        w1, w2 = lw.pop("mlp.experts.weight1"), lw.pop("mlp.experts.weight2")
        f = w1.shape[-1] // 2
        for e in range(w1.shape[0]):
            lw[f"mlp.experts.{e}.gate_proj.weight"] = np.ascontiguousarray(w1[e, :, :f].T)
            lw[f"mlp.experts.{e}.up_proj.weight"] = np.ascontiguousarray(w1[e, :, f:].T)
            lw[f"mlp.experts.{e}.down_proj.weight"] = np.ascontiguousarray(w2[e].T)
    return _rename(lw, _layer_hf_table(g))


def _layer_from_hf(i: int, lw: Weights, g: Geometry) -> Weights:
    lw = _rename(lw, {v: k for k, v in _layer_hf_table(g).items()})
    where = f"layer {i}"
    if g.mla:
        q = _pop(lw, g.hf_q_rows_key, where)
        lw[g.q_rows_key] = q[rope_half_order(q.shape[0], g.dn + g.dr, g.dn, g.dr)]
        kva = _pop(lw, "self_attn.kv_a_proj_with_mqa.weight", where)
        lw["self_attention.linear_kv_down_proj.weight"] = \
            kva[rope_half_order(kva.shape[0], kva.shape[0], g.kv_lora_rank, g.dr)]
    else:
        lw["self_attention.linear_qkv.weight"] = np.concatenate(
            [_pop(lw, f"self_attn.{n}_proj.weight", where) for n in "qkv"], axis=0)
    for hf, native in (("mlp.shared_experts.", "mlp.shared_experts."), ("mlp.", "mlp.")):
        if f"{hf}gate_proj.weight" in lw:
            lw[f"{native}linear_fc1.weight"] = _interleave(lw.pop(f"{hf}gate_proj.weight"),
                                                           lw.pop(f"{hf}up_proj.weight"))
            lw[f"{native}linear_fc2.weight"] = lw.pop(f"{hf}down_proj.weight")
    if i in g.moe_layers:
        w1, w2 = [], []
        for e in range(g.num_experts):
            gate = _pop(lw, f"mlp.experts.{e}.gate_proj.weight", where)
            up = _pop(lw, f"mlp.experts.{e}.up_proj.weight", where)
            w1.append(np.concatenate([gate, up], axis=0).T)
            w2.append(_pop(lw, f"mlp.experts.{e}.down_proj.weight", where).T)
        lw["mlp.experts.weight1"] = np.ascontiguousarray(np.stack(w1))
        lw["mlp.experts.weight2"] = np.ascontiguousarray(np.stack(w2))
    return lw


# ------------------------------------------------------------------ MindFormers
def _layer_to_mf(i: int, lw: Weights, g: Geometry, qkv_concat: bool) -> Weights:
    lw = dict(lw)
    where = f"layer {i}"
    if not g.mla:
        qkv = _pop(lw, "self_attention.linear_qkv.weight", where)
        lw["self_attention.linear_qkv.weight"] = qkv[grouped_qkv_order(g.heads, g.groups,
                                                                       g.head_dim)]
    elif qkv_concat:   # (and the expert bias under its upstream name, _LAYER_MF_FUSED)
        lw["self_attention.linear_qkv.weight"] = np.concatenate(
            [_pop(lw, g.q_input_key, where),
             _pop(lw, "self_attention.linear_kv_down_proj.weight", where)], axis=0)
        lw = _rename(lw, _LAYER_MF_FUSED)
    if not qkv_concat and "mlp.experts.weight1" in lw:
        w1, w2 = lw["mlp.experts.weight1"], lw["mlp.experts.weight2"]
        lw["mlp.experts.weight1"] = w1.reshape(-1, w1.shape[-1])
        lw["mlp.experts.weight2"] = w2.reshape(-1, w2.shape[-1])
    return lw


def _layer_from_mf(i: int, lw: Weights, g: Geometry, qkv_concat: bool) -> Weights:
    lw = dict(lw)
    where = f"layer {i}"
    if not g.mla:
        qkv = _pop(lw, "self_attention.linear_qkv.weight", where)
        lw["self_attention.linear_qkv.weight"] = \
            qkv[np.argsort(grouped_qkv_order(g.heads, g.groups, g.head_dim))]
    lw = _rename(lw, _MF_ALIASES)
    if g.mla and qkv_concat:
        lw = _rename(lw, {v: k for k, v in _LAYER_MF_FUSED.items()})
        fused = _pop(lw, "self_attention.linear_qkv.weight", where)
        nq = g.heads * (g.dn + g.dr) if g.q_lora_rank is None else g.q_lora_rank
        lw[g.q_input_key], lw["self_attention.linear_kv_down_proj.weight"] = fused[:nq], fused[nq:]
    if not qkv_concat and "mlp.experts.weight1" in lw:
        e, h, f = g.num_experts, g.hidden, g.moe_ffn
        lw["mlp.experts.weight1"] = lw["mlp.experts.weight1"].reshape(e, h, 2 * f)
        lw["mlp.experts.weight2"] = lw["mlp.experts.weight2"].reshape(e, f, h)
    return lw


# ------------------------------------------------------------------ entry points
_NATIVE_PREFIX = "decoder.layers."
_HF_PREFIX = "model.layers."
_MTP_PREFIX, _MTP_LAYER = "mtp.layers.", "transformer_layer."


def _by_layer(w: Weights, prefix: str, out_prefix: str,
              fn: Callable[[int, Weights], Weights], top_table: Dict[str, str]) -> Weights:
    top, layers = _split_layers(w, prefix)
    return _join_layers(_rename(top, top_table), {i: fn(i, lw) for i, lw in layers.items()},
                        out_prefix)


def _by_mtp_layer(w: Weights, fn: Callable[[int, Weights], Weights]) -> Weights:
    """``fn`` applied to each MTP layer's transformer layer (``mtp.layers.K.transformer_layer.*``,
    named as a decoder layer's tensors, in both projects)."""
    mtp: Dict[int, Weights] = {}
    out: Weights = {}
    for name, value in w.items():
        if name.startswith(_MTP_PREFIX) and f".{_MTP_LAYER}" in name:
            idx, rest = name[len(_MTP_PREFIX):].split(".", 1)
            if rest.startswith(_MTP_LAYER):
                mtp.setdefault(int(idx), {})[rest[len(_MTP_LAYER):]] = value
                continue
        out[name] = value
    for k in sorted(mtp):
        for suffix, value in fn(k, mtp[k]).items():
            out[f"{_MTP_PREFIX}{k}.{_MTP_LAYER}{suffix}"] = value
    return out


def from_native(w: Weights, fmt: str, cfg, qkv_concat: bool = True) -> Weights:
    """This project's weights (model parameter names) in format ``fmt``."""
    g = Geometry.of(cfg)
    if fmt == "native":
        return dict(w)
    if fmt == "hf":
        return _by_layer(w, _NATIVE_PREFIX, _HF_PREFIX, lambda i, lw: _layer_to_hf(i, lw, g),
                         _COMMON_HF)
    if fmt == "mindformers":
        w = _by_mtp_layer(w, lambda k, lw: _layer_to_mf(k, lw, g, qkv_concat))
        return _by_layer(w, _NATIVE_PREFIX, _NATIVE_PREFIX,
                         lambda i, lw: _layer_to_mf(i, lw, g, qkv_concat), {})
    raise ValueError(f"unknown format {fmt!r}; expected one of {list(FORMATS)}")


def to_native(w: Weights, fmt: str, cfg, qkv_concat: bool = True) -> Weights:
    """Weights of format ``fmt`` with this project's parameter names and layouts."""
    g = Geometry.of(cfg)
    if fmt == "native":
        return dict(w)
    if fmt == "hf":
        return _by_layer(w, _HF_PREFIX, _NATIVE_PREFIX, lambda i, lw: _layer_from_hf(i, lw, g),
                         {v: k for k, v in _COMMON_HF.items()})
    if fmt == "mindformers":
        w = _by_mtp_layer(w, lambda k, lw: _layer_from_mf(k, lw, g, qkv_concat))
        return _by_layer(w, _NATIVE_PREFIX, _NATIVE_PREFIX,
                         lambda i, lw: _layer_from_mf(i, lw, g, qkv_concat), {})
    raise ValueError(f"unknown format {fmt!r}; expected one of {list(FORMATS)}")
