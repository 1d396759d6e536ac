"""Sample text from a trained checkpoint.

    python -m mindformers_core.tools.generate --config configs/quickstart.yaml \\
        --checkpoint output/checkpoint --prompt "The with statement" \\
        [--max_new_tokens 64] [--temperature 0.8] [--top_k 40] [--top_p 0.95] [--seed 0]

``--checkpoint``: a checkpoint file, or a directory (its newest complete checkpoint), or
weights of another format (``checkpoint.load_format``, detected by default: Hugging Face
safetensors, a file or a directory with ``model.safetensors.index.json``, or an upstream
MindFormers checkpoint; ``checkpoint/foreign.py``). The model is built from ``--config`` (plus ``--set`` overrides) and must match the checkpoint; the
prompt is encoded with the config's tokenizer (``tokenizer:``; byte-level for ``PydocText``
or when the config has none). ``--temperature 0`` (the default) is greedy decoding; otherwise
tokens are sampled from the tempered softmax restricted by ``--top_k`` / ``--top_p``
(``models/generation.py``, with the key/value cache of ``models/kv_cache.py`` while the text
fits ``seq_length``). Prints the prompt followed by the continuation. A sharded checkpoint of
any layout (its index) is merged on reading (``checkpoint/sharded.py``). Under msrun (with
the config the run trained with, whose layout fits the launch) every worker decodes the whole
model alone and rank 0 prints.

Exit codes: 0 ok, 2 a configuration error, 1 an unusable checkpoint.
"""
from __future__ import annotations

import argparse
import os
import sys

from .cli import add_run_config_arguments, load_run_config, refuse_graph_mode

__all__ = ["main", "generate_text"]


def generate_text(cfg, checkpoint: str, prompt: str, max_new_tokens: int = 64,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  seed: int = 0) -> str:
    """The continuation of ``prompt`` by the model of ``checkpoint`` (text, prompt excluded)."""
    from ..config.tokenizer import TokenizerConfig, run_tokenizer_config
    from ..data.tokenizer import build_tokenizer, check_vocab_fits
    from ..models import build_model
    from ..models.generation import generate
    from ..checkpoint.foreign import resolve_start
    from ..checkpoint.store import CheckpointError
    from ..checkpoint.weights import load_model_weights
    if not os.path.exists(checkpoint):
        raise CheckpointError(f"--checkpoint {checkpoint}: no such file or directory (did the "
                              "run save one? checkpoint.enable_save: True)")
    tok_cfg = run_tokenizer_config(cfg) or TokenizerConfig()
    tokenizer = build_tokenizer(tok_cfg)
    check_vocab_fits(cfg.model.vocab_size, tokenizer.vocab_size,
                     tok_cfg.path if tok_cfg.type == "hf" else tok_cfg.type)
    model = build_model(cfg.model, seed=cfg.training.seed)
    load_model_weights(model, resolve_start(checkpoint, cfg.checkpoint.load_format, cfg.model))
    ids = generate(model, tokenizer.encode(prompt), max_new_tokens, temperature, top_k, top_p,
                   seed)
    return tokenizer.decode(ids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.generate",
                                description=__doc__.split("\n\n")[0])
    add_run_config_arguments(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint file or directory")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top_k", type=int, default=0, help="0 = no top-k filter")
    p.add_argument("--top_p", type=float, default=1.0, help="1.0 = no nucleus filter")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    code = refuse_graph_mode(args)
    if code is not None:
        return code
    if args.max_new_tokens < 1:
        p.error("--max_new_tokens must be >= 1")
    from ..config import ConfigError
    from ..checkpoint.store import CheckpointError
    try:
        cfg = load_run_config(args)
        import mindspore as ms
        from ..trainer.run import apply_pynative_synchronize, choose_pynative_synchronize
        ms.set_context(mode=ms.PYNATIVE_MODE)
        apply_pynative_synchronize(choose_pynative_synchronize(cfg))
        text = generate_text(cfg, args.checkpoint, args.prompt, args.max_new_tokens,
                             args.temperature, args.top_k, args.top_p, args.seed)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ConfigError, ValueError) as exc:   # the config; sampling arguments out of range
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ..launch_env import env_rank
    if env_rank() == 0:   # msrun: every worker decoded the same text
        print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
