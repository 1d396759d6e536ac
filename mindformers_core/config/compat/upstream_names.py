"""Upstream MindFormers' `model:` names next to this project's (Megatron-style) names.

Both schemes load. ``split_model_section(data, path, fields)`` turns the user's mapping into

* the canonical mapping (this project's field names) that ``ModelConfig`` is built from, and
* a :class:`ModelSpelling`: which upstream aliases the user wrote and the upstream-only keys
  (with their values), so that ``ModelConfig.to_dict()`` writes the user's scheme back.

Rules:

* ``MODEL_ALIASES``: upstream name -> canonical name. An alias applies only when its canonical
  name is a declared ``ModelConfig`` field (fields other packages add arrive with their merge).
  Writing both spellings of one field is an error naming both.
* ``UPSTREAM_ONLY``: upstream keys with no field here. Each is either a layout/kernel choice
  with identical math (any value of its type), informational, or a feature that does not exist
  yet, accepted only with its no-op value (``noop.require_noop``). A key that a later change
  declares as a real ``ModelConfig`` field is handled by that field instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

from ...errors import ConfigError
from .noop import require_noop
from ..schema import convert_value, unknown_key_error

__all__ = ["MODEL_ALIASES", "UPSTREAM_ONLY", "ModelSpelling", "split_model_section",
           "join_model_section", "check_upstream_only", "ARCHITECTURES", "spelling_in_use"]

#: upstream (MindFormers / Hugging Face) name -> this project's canonical name
MODEL_ALIASES: Dict[str, str] = {
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "rms_norm_eps": "norm_epsilon",
    "num_key_value_heads": "num_query_groups",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "moe_router_score_function": "scoring_func",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "scaling_factor": "rotary_scaling_factor",
    "mtp_num_layers": "num_nextn_predict_layers",
    "head_dim": "kv_channels",
}

#: model_type -> upstream ``architectures`` class names that describe the same network
ARCHITECTURES: Dict[str, Tuple[str, ...]] = {
    "gpt": ("GPTForCausalLM", "LlamaForCausalLM"),
    "deepseek_v3": ("DeepseekV3ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
}

_DTYPE = str
_F32 = ("float32",)


@dataclass(frozen=True)
class Upstream:
    """An upstream-only key: its type, its default, and the values accepted here.

    ``accepted`` None: every value of the type (layout/kernel choice, or informational);
    otherwise the values that keep the feature ``feature`` off.
    """
    tp: Any
    default: Any
    accepted: Optional[Tuple[Any, ...]] = None
    feature: str = ""


UPSTREAM_ONLY: Dict[str, Upstream] = {
    # architecture switches whose only implemented value is the no-op one
    "add_bias_linear": Upstream(bool, False, (False,), "biases in the linear layers"),
    "add_qkv_bias": Upstream(bool, False, (False,), "biases in the q/k/v projections"),
    "gated_linear_unit": Upstream(bool, True, (True,), "a non-gated MLP"),
    "hidden_act": Upstream(str, "silu", ("silu", "swiglu", "fusedswiglu"),
                           "an MLP activation other than SwiGLU"),
    "normalization": Upstream(str, "RMSNorm", ("RMSNorm",), "LayerNorm"),
    "attention_dropout": Upstream(float, 0.0, (0.0,), "attention dropout"),
    "hidden_dropout": Upstream(float, 0.0, (0.0,), "hidden dropout"),
    # precisions: norms, softmax, RoPE tables and the router already run in float32
    "layernorm_compute_dtype": Upstream(_DTYPE, "float32", _F32, "a non-float32 norm"),
    "softmax_compute_dtype": Upstream(_DTYPE, "float32", _F32, "a non-float32 softmax"),
    "rotary_dtype": Upstream(_DTYPE, "float32", _F32, "non-float32 RoPE tables"),
    "router_dense_type": Upstream(_DTYPE, "float32", _F32, "a non-float32 router"),
    # layout / kernel choices with identical math (the converter maps the weight layouts)
    "mla_qkv_concat": Upstream(bool, False),
    "moe_grouped_gemm": Upstream(bool, False),
    # upstream's compressed causal mask (its context parallel requires it): a memory layout
    # of the same causal mask (models/layers.py attention_tables builds it here)
    "use_attn_mask_compression": Upstream(bool, False),
    # informational, or only read by a feature that is off (as upstream)
    "architectures": Upstream(Optional[str], None),
    # MoE routing: the router options are model fields (config/moe.py); this one is not
    "moe_router_pre_softmax": Upstream(bool, False, (False,), "softmax-before-top-k routing"),
}


@dataclass
class ModelSpelling:
    """How the user wrote `model:`: the aliases used and the upstream-only keys given."""
    aliases: Dict[str, str] = field(default_factory=dict)      # canonical -> upstream name
    upstream_only: Dict[str, Any] = field(default_factory=dict)


def split_model_section(data: Dict[str, Any], path: str,
                        fields: Iterable[str]) -> Tuple[Dict[str, Any], ModelSpelling]:
    """``(canonical mapping, spelling)`` of the user's `model:` mapping (rules in the module
    doc). Raises ConfigError for both spellings of one field and for a value of an
    upstream-only key that needs a feature not implemented here."""
    declared = set(fields)
    known_extra = set(UPSTREAM_ONLY) - declared
    spelling = ModelSpelling()
    out: Dict[str, Any] = {}
    for key, value in data.items():
        canonical = MODEL_ALIASES.get(key)
        if canonical is not None and (canonical in declared or canonical in known_extra):
            if canonical in data:
                raise ConfigError(f"{path}.{key}", f"sets the same field as {canonical!r} "
                                                   f"(upstream and project spelling of one "
                                                   f"field); keep one of them")
            spelling.aliases[canonical] = key
        else:
            canonical = key
        if canonical in declared:
            out[canonical] = value
        elif canonical in known_extra:
            spec = UPSTREAM_ONLY[canonical]
            where = f"{path}.{key}"
            value = convert_value(spec.tp, value, where)
            if spec.accepted is not None:
                require_noop(where, value, spec.accepted, spec.feature)
            spelling.upstream_only[canonical] = value
        else:
            valid = declared | known_extra | {a for a, c in MODEL_ALIASES.items()
                                              if c in declared or c in known_extra}
            raise unknown_key_error(path, key, sorted(valid))
    return out, spelling


def check_upstream_only(spelling: ModelSpelling, path: str, cfg: Any) -> None:
    """Rules of upstream-only keys that depend on the built model (a ModelConfig)."""
    extra = spelling.upstream_only
    model_type = cfg.model_type
    arch = extra.get("architectures")
    if arch is not None and arch not in ARCHITECTURES.get(model_type, ()):
        raise ConfigError(f"{path}.architectures",
                          f"{arch!r} does not describe model_type {model_type!r} "
                          f"(expected one of {list(ARCHITECTURES.get(model_type, ()))})")


def join_model_section(canonical: Dict[str, Any], spelling: Optional[ModelSpelling]
                       ) -> Dict[str, Any]:
    """The user's scheme back from the canonical ``to_dict()`` (inverse of the split)."""
    if spelling is None:
        return canonical
    out: Dict[str, Any] = {}
    for key, value in canonical.items():
        out[spelling.aliases.get(key, key)] = value
    for key, value in spelling.upstream_only.items():
        out[spelling.aliases.get(key, key)] = value
    return out


def spelling_in_use(section: Dict[str, Any], key: str) -> str:
    """The key a `model:` mapping already uses for ``key``'s field (its other spelling), else
    ``key``: ``--set model.num_layers=2`` on a file that says ``num_hidden_layers`` sets that."""
    if key in section:
        return key
    others = [a for a, c in MODEL_ALIASES.items() if c == key] + \
        ([MODEL_ALIASES[key]] if key in MODEL_ALIASES else [])
    return next((o for o in others if o in section), key)
