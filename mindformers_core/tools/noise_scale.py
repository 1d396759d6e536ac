"""Gradient noise scale and critical batch size (McCandlish et al. 2018, "An Empirical
Model of Large-Batch Training"; docs/batch_size_and_lr_scaling.md).

With G the true gradient, Sigma the covariance of the per-example gradient and g_B the mean
gradient of B examples drawn independently, E|g_B|^2 = |G|^2 + tr(Sigma) / B. Measuring the
squared norm at two batch sizes b < B and solving the 2x2 system gives unbiased estimators

    |G|^2     ~ (B * |g_B|^2 - b * |g_b|^2) / (B - b)
    tr(Sigma) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

and the simple noise scale B_simple = tr(Sigma) / |G|^2 (examples per batch), which estimates
the critical batch size: steps S and examples E needed to reach a loss trade off as
S / S_min = 1 + B_noise / B and E / E_min = 1 + B / B_noise. Both estimators are noisy per
draw: the squared norms are AVERAGED over K draws first and the ratio taken once (a mean of
ratios is biased).

Where the gradients come from (``measure_gradient_norms``): one draw holds ``B / b``
micro-batches of ``b`` sequences. Each micro-batch gradient (token mean of the LM loss, MoE
aux loss excluded) is a small-batch sample; their token-weighted mean is the big-batch
gradient. This is exactly the data-parallel form: under msrun with W ranks each rank computes
its own micro-batches and |g_b|^2 (the per-rank norm, what a DP run logs before the
all-reduce); the sums of gradients, token counts and per-rank squared norms are all-reduced, and
|g_B|^2 is the norm of the all-reduced gradient. One process (W = 1) plays every rank in turn.
B_noise is in sequences of ``model.seq_length`` tokens; the token figure multiplies by it.

    python -m mindformers_core.tools.noise_scale --config x.yaml --mode 1 --small 2 --big 16 \
        --steps 20 [--load CKPT] [--set k=v ...] [--seed N]

The noise scale grows as the loss falls, so measure it on trained weights: ``--load`` (or
``checkpoint.load_path``) takes a trainer checkpoint file or directory (its newest checkpoint).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .cli import add_run_config_arguments, load_run_config, refuse_graph_mode

__all__ = ["NoiseScaleEstimate", "estimate_noise_scale", "critical_batch_advice",
           "measure_gradient_norms", "load_model_weights", "main"]


@dataclass
class NoiseScaleEstimate:
    """Moments averaged over the draws and the estimators of the module docstring."""
    b_small: int
    b_big: int
    mean_sq_norm_small: float      # mean |g_b|^2 over all small-batch samples
    mean_sq_norm_big: float        # mean |g_B|^2 over all big-batch samples
    grad_sq_norm: float            # |G|^2 estimate
    trace_sigma: float             # tr(Sigma) estimate (per example)
    b_simple: float                # tr(Sigma) / |G|^2; inf when |G|^2 is not resolved (<= 0)
    n_small: int
    n_big: int

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


def _sample_array(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name}: need at least one squared gradient norm")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name}: squared norms must be finite and >= 0")
    return arr


def estimate_noise_scale(small_sq_norms: Sequence[float], big_sq_norms: Sequence[float],
                         b_small: int, b_big: int) -> NoiseScaleEstimate:
    """B_simple from samples of |g_b|^2 (batch ``b_small``) and |g_B|^2 (batch ``b_big``).

    The two sample sets may have different sizes; each is averaged, then the estimators of the
    module docstring are applied to the averages.
    """
    if isinstance(b_small, bool) or isinstance(b_big, bool) or int(b_small) != b_small \
            or int(b_big) != b_big or not 0 < b_small < b_big:
        raise ValueError(f"need integer batch sizes 0 < small < big, got small={b_small!r}, "
                         f"big={b_big!r}")
    small = _sample_array("small_sq_norms", small_sq_norms)
    big = _sample_array("big_sq_norms", big_sq_norms)
    s, b = float(small.mean()), float(big.mean())
    g_sq = (b_big * b - b_small * s) / (b_big - b_small)
    trace = (s - b) / (1.0 / b_small - 1.0 / b_big)
    b_simple = trace / g_sq if g_sq > 0 else math.inf
    return NoiseScaleEstimate(int(b_small), int(b_big), s, b, g_sq, trace, b_simple,
                              int(small.size), int(big.size))


def critical_batch_advice(est: NoiseScaleEstimate, current_batch: int,
                          seq_length: Optional[int] = None) -> str:
    """What B_noise says about ``current_batch`` (global batch, sequences)."""
    unit = "sequences"
    tok = (lambda n: f" (~{n * seq_length:,.0f} tokens)") if seq_length else (lambda n: "")
    if not math.isfinite(est.b_simple) or est.grad_sq_norm <= 0:
        return ("|G|^2 is not resolved (the estimate is <= 0: noise dominates at these batch "
                "sizes); raise --steps or --big, or measure later in training when B_noise is "
                "smaller relative to the batch.")
    if est.b_simple <= 0:
        return ("tr(Sigma) came out <= 0 (|g_small|^2 < |g_big|^2 on average): too few draws; "
                "raise --steps.")
    bn = est.b_simple
    steps_factor = 1.0 + bn / current_batch     # S / S_min
    data_factor = 1.0 + current_batch / bn      # E / E_min
    lines = [f"B_noise ~ {bn:,.1f} {unit}{tok(bn)}; global batch {current_batch}{tok(current_batch)}: "
             f"steps x{steps_factor:.2f} of the minimum, examples x{data_factor:.2f} of the "
             "minimum."]
    if current_batch < 0.5 * bn:
        lines.append("The batch is well below B_noise: a larger batch cuts steps almost "
                     "linearly at little extra data; scale the peak lr with the sqrt rule "
                     "(AdamW/Muon) when you grow it (tools.batch_scaling).")
    elif current_batch > 2.0 * bn:
        lines.append("The batch is well above B_noise: most of the extra examples per step are "
                     f"wasted compute; a batch near {bn:,.0f} {unit} is compute-efficient. "
                     "B_noise grows as the loss falls: re-measure later (ramp the batch).")
    else:
        lines.append("The batch is near B_noise (the critical batch): a good trade of steps "
                     "against compute. B_noise grows during training: re-measure later.")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Gradients of the real model
# ----------------------------------------------------------------------------------------------
def _sq_norm(tensors) -> float:
    """Squared global L2 norm in float64 (sum over parameters of sum(g*g))."""
    return float(sum(float((t * t).sum().asnumpy()) for t in tensors))


def load_model_weights(model, path: str) -> int:
    """Set ``model``'s parameters from a trainer checkpoint (file or directory); returns its
    step. Raises ``checkpoint.store.CheckpointError`` when it does not match the model."""
    from mindspore import Tensor
    from ..checkpoint.store import CheckpointError, resolve_checkpoint
    data = resolve_checkpoint(path)
    saved = {k[len("model."):]: v for k, v in data.tensors.items() if k.startswith("model.")}
    for param in model.get_parameters():
        arr = saved.get(param.name)
        if arr is None or tuple(arr.shape) != tuple(param.shape):
            got = "missing" if arr is None else f"shape {tuple(arr.shape)}"
            raise CheckpointError(f"checkpoint {data.path} does not match the model: "
                                  f"{param.name} is {got}, the model has {tuple(param.shape)}")
        param.set_data(Tensor(arr).astype(param.dtype))
    return data.step


def measure_gradient_norms(model, dataset, b_small: int, b_big: int, draws: int,
                           comm=None) -> Tuple[List[float], List[float]]:
    """(|g_b|^2 samples, |g_B|^2 samples) over ``draws`` draws (see the module docstring).

    ``dataset.next_batch(n)`` supplies this rank's micro-batches; the draws consume fresh data.
    ``comm``: a ``distributed.comm.Communicator`` (default: one process, no communication);
    ``b_big`` must be a multiple of ``b_small * comm.world_size``.
    """
    import mindspore as ms
    from mindspore import Tensor
    from ..distributed.comm import Communicator

    comm = Communicator() if comm is None else comm
    world = comm.world_size

    if b_big % (b_small * world) != 0 or b_big <= b_small:
        raise ValueError(f"--big ({b_big}) must be a multiple of --small ({b_small}) x data "
                         f"parallel ({world}) and larger than --small")
    if draws < 1:
        raise ValueError(f"--steps must be >= 1, got {draws}")
    micro_per_rank = b_big // (b_small * world)
    params = list(model.trainable_params())

    def token_mean_loss(ids, labels, mask):
        loss_sum, n_tokens, _ = model(ids, labels, mask)
        return loss_sum / n_tokens

    grad_fn = ms.value_and_grad(token_mean_loss, grad_position=None, weights=params)
    small, big = [], []
    for _ in range(draws):
        acc, tokens, small_sq = None, 0.0, 0.0
        for _ in range(micro_per_rank):
            batch = dataset.next_batch(b_small)
            n = float(np.asarray(batch["loss_mask"], np.float64).sum())
            if n <= 0:
                raise ValueError("a micro-batch has no loss tokens; check train_dataset")
            _, grads = grad_fn(Tensor(batch["input_ids"]), Tensor(batch["labels"]),
                               Tensor(batch["loss_mask"]))
            grads = [g.astype(ms.float32) for g in grads]
            small_sq += _sq_norm(grads)
            # token-weighted sum: sum_i n_i * g_i / sum_i n_i is the big batch's token mean
            weighted = [g * n for g in grads]
            acc = weighted if acc is None else [a + w for a, w in zip(acc, weighted)]
            tokens += n
        acc = [comm.all_reduce_sum(a) for a in acc]
        tokens, small_sq = (float(x) for x in comm.all_reduce_sum(
            np.array([tokens, small_sq], np.float32)))
        small.append(small_sq / (micro_per_rank * world))
        big.append(_sq_norm([a / tokens for a in acc]))
    return small, big


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.noise_scale",
                                     description="Gradient noise scale B_simple of a run config.")
    add_run_config_arguments(parser)
    parser.add_argument("--small", type=int, required=True, help="small batch b (sequences)")
    parser.add_argument("--big", type=int, required=True, help="big batch B (sequences)")
    parser.add_argument("--steps", type=int, default=10, help="draws K to average over")
    parser.add_argument("--seed", type=int, default=None, help="default training.seed")
    parser.add_argument("--load", default=None, metavar="CKPT",
                        help="measure at these weights (default checkpoint.load_path, if set)")
    args = parser.parse_args(argv)
    refused = refuse_graph_mode(args)
    if refused is not None:
        return refused
    from ..config import ConfigError
    try:
        cfg = load_run_config(args)
        if not 0 < args.small < args.big:
            raise ValueError(f"need 0 < --small < --big, got {args.small}, {args.big}")
        from ..data import build_dataset
        from ..distributed.comm import init_distributed
        from ..models import build_model
        from ..trainer.run import apply_pynative_synchronize, choose_pynative_synchronize
        apply_pynative_synchronize(choose_pynative_synchronize(cfg))
        seed = cfg.training.seed if args.seed is None else args.seed
        comm = init_distributed()
        world, rank = comm.world_size, comm.rank
        from ..optim.mup import mup_width_mult
        # the run's own model: with optimizer.mup set, muP's readout multiplier and init
        model = build_model(cfg.model, seed=seed,
                            mup_width_mult=mup_width_mult(cfg.model.hidden_size, cfg.optimizer.mup))
        load = args.load or cfg.checkpoint.load_path
        at = f"checkpoint step {load_model_weights(model, load)}" if load else "initial weights"
        dataset = build_dataset(cfg.train_dataset, cfg.model, seed=seed, rank=rank, world=world)
        small, big = measure_gradient_norms(model, dataset, args.small, args.big, args.steps,
                                            comm)
        est = estimate_noise_scale(small, big, args.small, args.big)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:   # CheckpointError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if rank == 0:
        seq = cfg.model.seq_length
        print(f"gradient noise scale: small b={est.b_small}, big B={est.b_big}, "
              f"draws={args.steps}, data parallel={world}, at {at}")
        print(f"  mean |g_b|^2 = {est.mean_sq_norm_small:.6g}   mean |g_B|^2 = "
              f"{est.mean_sq_norm_big:.6g}")
        print(f"  |G|^2 ~ {est.grad_sq_norm:.6g}   tr(Sigma) ~ {est.trace_sigma:.6g}")
        print(f"  B_simple = tr(Sigma)/|G|^2 ~ {est.b_simple:.4g} sequences "
              f"(~{est.b_simple * seq:.4g} tokens at seq_length {seq})")
        print(critical_batch_advice(est, cfg.training.global_batch_size, seq))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
