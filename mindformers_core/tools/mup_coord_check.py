"""muP coordinate check (Yang et al. 2022, "Tensor Programs V";
docs/tools.md).

Train the config's model at several widths for a few AdamW steps, once in standard
parameterisation (SP) and once in muP, and record the mean |activation| of every layer on a
fixed batch. Under muP the curves are flat in width; under SP they grow with width, because
Adam's per-coordinate update ~lr moves a fan-in-d dot product by ~lr * d.

Widths scale ``hidden_size``; the head dimension stays fixed (more heads), so the attention
logit scale needs no 1/d_k change. ``ffn_hidden_size``, the MoE expert width and the MLA
LoRA ranks scale with the width as well. The base width ``d0`` is ``optimizer.mup.
base_hidden_size`` when set, else the smallest width; ``w = d / d0``.

muP here (Adam, Tensor Programs V), the same path a run with ``optimizer.mup`` takes:
  - the model: ``build_model(..., mup_width_mult=w)``: hidden matrices init std x 1/sqrt(w)
    (std ~ 1/sqrt(fan_in) relative to the base model) and logits x 1/w (readout multiplier);
  - the optimizer: per-group lr and eps from ``get_mup_config_overrides(optimizer, w, "adamw")``
    (hidden matrices lr x 1/w, eps x 1/w; embeddings, output layer, norms keep the base lr)
    through the project's ``AdamW``.
SP: the model as built (std = ``initializer_range`` everywhere) and one lr for every group.
Both runs: same seed, same batches, constant lr = the schedule's peak (``--lr`` overrides),
the config's betas / eps / weight decay (AdamW).

    python -m mindformers_core.tools.mup_coord_check --config x.yaml [--widths 64 128 256 512]
        [--steps 4] [--out coord.png] [--lr 1e-2] [--set k=v ...]

The PNG needs matplotlib; without it (or with an ``--out`` that is not .png/.pdf/.svg) the
text table is written instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .cli import add_run_config_arguments, load_run_config, refuse_graph_mode

__all__ = ["CoordCheckResult", "width_model_config", "run_coord_check", "train_and_measure",
           "format_coord_table", "plot_coord_check", "main"]

PARAMETERIZATIONS = ("sp", "mup")


@dataclass
class CoordCheckResult:
    """``acts[param][width][layer]`` = mean |activation| after ``steps`` steps."""
    widths: List[int]
    base_width: int
    steps: int
    lr: float
    layers: List[str] = field(default_factory=list)
    acts: Dict[str, Dict[int, Dict[str, float]]] = field(default_factory=dict)
    losses: Dict[str, Dict[int, float]] = field(default_factory=dict)

    def drift(self, param: str) -> Dict[str, float]:
        """Per layer: max / min of mean |activation| over the widths (1 = flat)."""
        out = {}
        for layer in self.layers:
            vals = [self.acts[param][w][layer] for w in self.widths]
            out[layer] = max(vals) / min(vals) if min(vals) > 0 else float("inf")
        return out

    def max_drift(self, param: str) -> float:
        return max(self.drift(param).values())


def _scaled(value: Optional[int], factor: float) -> Optional[int]:
    return None if value is None else max(1, int(round(value * factor)))


def width_model_config(model_cfg, width: int):
    """``model_cfg`` at ``hidden_size = width`` (head dim fixed, FFN / MoE / LoRA scaled, untied)."""
    from ..config.model import ModelConfig
    f = width / model_cfg.hidden_size
    heads = model_cfg.num_attention_heads * width / model_cfg.hidden_size
    if heads != int(heads) or heads < 1:
        raise ValueError(f"width {width}: hidden_size {model_cfg.hidden_size} with "
                         f"{model_cfg.num_attention_heads} heads cannot keep its head dim "
                         f"({model_cfg.hidden_size // model_cfg.num_attention_heads}) at this "
                         "width; pick widths that are multiples of the head dim")
    d = model_cfg.to_dict()
    groups = model_cfg.num_query_groups
    d.update(hidden_size=width, num_attention_heads=int(heads),
             num_query_groups=None if groups is None else max(1, int(round(groups * f))),
             ffn_hidden_size=_scaled(model_cfg.ffn_hidden_size, f),
             moe_intermediate_size=_scaled(model_cfg.moe_intermediate_size, f),
             moe_shared_expert_intermediate_size=_scaled(
                 model_cfg.moe_shared_expert_intermediate_size, f),
             q_lora_rank=_scaled(model_cfg.q_lora_rank, f),
             kv_lora_rank=_scaled(model_cfg.kv_lora_rank, f),
             tie_word_embeddings=False)
    return ModelConfig.from_dict(d, "model")


def _groups(model, opt_cfg, parameterization: str, width_mult: float):
    from ..optim.mup import get_mup_config_overrides
    from ..optim.param_groups import build_config_overrides, get_param_groups
    base = dataclasses.replace(opt_cfg, mup=None)
    if parameterization == "sp" or width_mult == 1.0:
        return get_param_groups(model, base)
    overrides = dict(build_config_overrides(base, model))
    overrides.update(get_mup_config_overrides(base, width_mult, "adamw"))
    return get_param_groups(model, base, overrides)


def train_and_measure(cfg, width: int, base_width: int, parameterization: str,
                      batches: Sequence[dict], lr: float, seed: int):
    """Train ``len(batches)`` steps at constant ``lr``; returns (acts per layer, last loss)."""
    import mindspore as ms
    from mindspore import Tensor
    from ..models import build_model
    from ..optim.adamw import AdamW

    if parameterization not in PARAMETERIZATIONS:
        raise ValueError(f"parameterization must be one of {PARAMETERIZATIONS}, "
                         f"got {parameterization!r}")
    w = width / base_width
    model = build_model(width_model_config(cfg.model, width), seed=seed,
                        mup_width_mult=w if parameterization == "mup" else None)
    opt_cfg = cfg.optimizer
    groups = _groups(model, opt_cfg, parameterization, w)
    betas = tuple(opt_cfg.betas) if opt_cfg.type == "AdamW" else tuple(opt_cfg.adamw_betas)
    eps = float(opt_cfg.eps if opt_cfg.type == "AdamW" else opt_cfg.adamw_eps)
    opt = AdamW(groups, lr=lr, betas=tuple(float(b) for b in betas), eps=eps,
                weight_decay=float(opt_cfg.weight_decay))
    params = list(opt.parameters)

    def mean_loss(ids, labels, mask):
        loss_sum, n_tokens, aux = model(ids, labels, mask)
        return loss_sum / n_tokens + aux

    grad_fn = ms.value_and_grad(mean_loss, grad_position=None, weights=params)
    loss = float("nan")
    for batch in batches:
        value, grads = grad_fn(Tensor(batch["input_ids"]), Tensor(batch["labels"]),
                               Tensor(batch["loss_mask"]))
        opt.set_lr(lr)
        opt.step(grads)
        loss = float(value.asnumpy())
    return _activations(model, batches[0]["input_ids"]), loss


def _activations(model, input_ids) -> Dict[str, float]:
    """mean |x| of the embedding output, each layer's output (residual stream) and the logits."""
    from mindspore import Tensor
    acts: Dict[str, float] = {}

    def hook(name):
        def record(cell, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            acts[name] = float(np.abs(out.asnumpy().astype(np.float64)).mean())
        return record

    # the embedding is a table read by a pure function (models/layers.py ``embed``), not a
    # called Cell: its output is computed directly; the decoder layers are Cells (hooks)
    ids = Tensor(input_ids)
    emb = model.embed_tokens(ids, model.embedding.word_embeddings.weight)
    acts["embedding"] = float(np.abs(emb.asnumpy().astype(np.float64)).mean())
    handles = []
    for i, layer in enumerate(model.decoder.layers):
        handles.append(layer.register_forward_hook(hook(f"layer{i}")))
    try:
        logits = model.logits(ids)
    finally:
        for h in handles:
            h.remove()
    acts["logits"] = float(np.abs(logits.asnumpy().astype(np.float64)).mean())
    return acts


def run_coord_check(cfg, widths: Sequence[int], steps: int = 4, lr: Optional[float] = None,
                    batch_size: Optional[int] = None, base_width: Optional[int] = None,
                    seed: Optional[int] = None) -> CoordCheckResult:
    """SP and muP at every width on the same batches (see the module docstring)."""
    from ..data import build_dataset
    from ..trainer.run import apply_pynative_synchronize, choose_pynative_synchronize

    widths = sorted(int(w) for w in widths)
    if len(widths) < 2:
        raise ValueError(f"need at least two widths, got {widths}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if base_width is None:
        base_width = cfg.optimizer.mup.base_hidden_size if cfg.optimizer.mup else widths[0]
    lr = float(cfg.build_lr_scheduler().peak_lr if lr is None else lr)
    seed = cfg.training.seed if seed is None else seed
    batch_size = batch_size or cfg.training.local_batch_size
    apply_pynative_synchronize(choose_pynative_synchronize(cfg))
    ds = build_dataset(cfg.train_dataset, cfg.model, seed=seed)
    batches = [ds.next_batch(batch_size) for _ in range(steps)]
    result = CoordCheckResult(widths=widths, base_width=int(base_width), steps=steps, lr=lr)
    for param in PARAMETERIZATIONS:
        result.acts[param], result.losses[param] = {}, {}
        for w in widths:
            acts, loss = train_and_measure(cfg, w, base_width, param, batches, lr, seed)
            result.acts[param][w], result.losses[param][w] = acts, loss
    result.layers = list(result.acts["sp"][widths[0]])
    return result


def format_coord_table(result: CoordCheckResult) -> str:
    """mean |activation| per layer (rows) and width (columns), SP then muP, with the drift."""
    lines = [f"muP coordinate check: {result.steps} AdamW steps at lr {result.lr:g}, base width "
             f"{result.base_width}; mean |activation| after training"]
    head = f"{'':>6} {'layer':<10}" + "".join(f"{w:>11d}" for w in result.widths) + \
        f"{'max/min':>10}"
    for param in PARAMETERIZATIONS:
        lines += ["", head]
        drift = result.drift(param)
        for layer in result.layers:
            vals = "".join(f"{result.acts[param][w][layer]:>11.4g}" for w in result.widths)
            lines.append(f"{param:>6} {layer:<10}{vals}{drift[layer]:>10.2f}")
        losses = "".join(f"{result.losses[param][w]:>11.4g}" for w in result.widths)
        lines.append(f"{param:>6} {'loss':<10}{losses}")
    ratio = result.widths[-1] / result.widths[0]
    lines += ["", f"largest drift over the {ratio:g}x width sweep: SP {result.max_drift('sp'):.2f}x, "
                  f"muP {result.max_drift('mup'):.2f}x (muP is correct when its curves are flat)"]
    return "\n".join(lines) + "\n"


def plot_coord_check(result: CoordCheckResult, out_path: str) -> str:
    """Two log-log panels (SP, muP): mean |activation| vs width, one line per layer.

    Falls back to the text table (``.txt``) without matplotlib or for a non-image name.
    """
    root, ext = os.path.splitext(out_path)
    try:
        import matplotlib
    except ImportError:
        matplotlib = None
    if matplotlib is None or ext.lower() not in (".png", ".pdf", ".svg"):
        path = root + ".txt" if ext.lower() in (".png", ".pdf", ".svg") else out_path
        with open(path, "w", encoding="utf-8") as f:
            f.write(format_coord_table(result))
        return path
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, param in zip(axes, PARAMETERIZATIONS):
        for layer in result.layers:
            ax.plot(result.widths, [result.acts[param][w][layer] for w in result.widths],
                    marker="o", label=layer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width (hidden_size)")
        ax.set_title(f"{param.upper()}: max drift {result.max_drift(param):.2f}x")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"mean |activation| after {result.steps} steps")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.mup_coord_check",
                                     description="muP coordinate check on a run config.")
    add_run_config_arguments(parser)
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=None, help="default: the schedule's peak")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: training.local_batch_size")
    parser.add_argument("--out", default="coord.png", help=".png/.pdf/.svg plot, or .txt")
    args = parser.parse_args(argv)
    refused = refuse_graph_mode(args)
    if refused is not None:
        return refused
    from ..config import ConfigError
    try:
        cfg = load_run_config(args)
        result = run_coord_check(cfg, args.widths, args.steps, lr=args.lr,
                                 batch_size=args.batch_size)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_coord_table(result), end="")
    print(f"wrote {plot_coord_check(result, args.out)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
