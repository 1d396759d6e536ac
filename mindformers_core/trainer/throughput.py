"""Model size, FLOPs and utilisation (MFU), memory and ETA: the pure parts of the step line.

Parameter counts: ``embedding`` are the token-embedding table and the output layer (the
``vocab_size x hidden`` matrices; one matrix when they are tied), ``non_embedding`` the rest.

FLOPs per token (PaLM, appendix B; Megatron uses the same count): a forward + backward pass is
``6 * N`` FLOPs per token for every matrix parameter it multiplies with (``N`` = non-embedding
parameters plus the output layer; the embedding lookup multiplies nothing) plus
``12 * num_layers * hidden_size * seq_length`` for the attention scores and the weighted sum
(with the attention's own widths where they are not the hidden size: ``flops_per_token``).
For MoE models every expert is counted (an upper bound: a token uses ``num_experts_per_tok``).

MFU = achieved model FLOP/s / (peak FLOP/s per device * devices). Default peaks (override with
``logging.peak_flops``): ``CPU`` 1e11 (an assumed 100 GFLOP/s per process: 2 cores x 3 GHz x
16 fp32 FLOP/cycle with AVX2 FMA), ``Ascend`` 3.2e14 (Ascend 910 class, fp16/bf16 dense),
``GPU`` 9.89e14 (H100 SXM bf16 dense).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

from ..core.flops import PEAK_FLOPS, attention_widths, flops_per_token

__all__ = ["PEAK_FLOPS", "param_counts", "flops_per_token", "attention_widths", "mfu",
           "rss_bytes", "eta_seconds", "format_duration", "format_param_counts"]

_EMBED_SUFFIXES = ("embedding.word_embeddings.weight", "output_layer.weight")


def param_counts(named_sizes: Dict[str, int]) -> Dict[str, int]:
    """``{"total", "embedding", "non_embedding", "output_layer"}`` of ``name -> numel``."""
    total = sum(int(v) for v in named_sizes.values())
    embedding = sum(int(v) for k, v in named_sizes.items() if k.endswith(_EMBED_SUFFIXES))
    output = sum(int(v) for k, v in named_sizes.items() if k.endswith("output_layer.weight"))
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding,
            "output_layer": output}


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float, devices: int = 1) -> float:
    """Model FLOPs utilisation in [0, 1] (more means a wrong peak)."""
    return tokens_per_s * flops_per_tok / (peak_flops * max(1, devices))


def rss_bytes() -> Optional[int]:
    """Resident set size of this process (Linux ``/proc/self/statm``; else the peak from
    ``resource``; None when neither is available)."""
    try:
        with open("/proc/self/statm", "r", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None


def eta_seconds(steps_done: int, steps_left: int, elapsed_s: float) -> Optional[float]:
    """Remaining time at the mean step time of this session so far."""
    if steps_done <= 0:
        return None
    return steps_left * elapsed_s / steps_done


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_param_counts(counts: Dict[str, int], groups: Dict[str, int]) -> str:
    lines = [f"parameters       : {counts['total']:,} total = {counts['embedding']:,} embedding "
             f"+ {counts['non_embedding']:,} non-embedding"]
    for name, n in groups.items():
        lines.append(f"  group {name:<10}: {n:,}")
    return "\n".join(lines)
