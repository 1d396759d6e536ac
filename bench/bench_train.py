"""End-to-end training throughput of the tiny GPT and tiny DeepSeek-V3 configs, per phase.

Runs the real ``Trainer`` (model, optimizer, schedule, dataset, metrics writer, checkpoints
from the config) and times each phase of every optimizer step by wrapping the trainer's own
components (timing wrappers only; the work is the trainer's):

    data        trainer.fetch_micro_batches (all micro-batches of the step)
    fwd_bwd     the value-and-grad call per micro-batch (model forward + backward)
    accumulate  accumulate_gradients minus fwd_bwd (host->device batches, fp32 grad sums, loss sync)
    grad_norm   global_grad_norm (the fp32 global L2 norm; clipping's input)
    schedule    group_lrs (per-group lr from the LR schedule)
    optimizer   optimizer.step (+ post_step: QK-Clip under Muon)
    moe_bias    model.update_expert_bias (DeepSeek-V3 aux-loss-free routing bias)
    other_step  the rest of train_step (token counting, DP reduce, clip multiply, metrics)
    logging     MetricsWriter.log (console line + metrics.jsonl row)
    checkpoint  Trainer.save (amortised over the measured steps; one save per run here)

The trainer's own overhead is everything except ``fwd_bwd`` and ``optimizer`` (the model and
optimizer kernels), as a percentage of the step time; the target is < 5 % for tiny DeepSeek-V3.
Per-phase figures are medians over the measured steps (the first ``--warmup`` steps are
dropped); ``*_mean`` figures are means (checkpoint cost is only visible amortised). Timing is
honest on CPU because the trainer runs PyNative synchronously there (launch_blocking).

    python bench/bench_train.py            # 8 warm-up + 30 measured steps per config
    python bench/bench_train.py --quick    # 3 + 10

Prints a table; writes output/bench/train.json (untracked;
bench/results/train.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402
from mindformers_core.config import load_config  # noqa: E402
from mindformers_core.config.yaml_io import load_yaml_text  # noqa: E402

PHASES = ("data", "fwd_bwd", "accumulate", "grad_norm", "schedule", "optimizer", "moe_bias",
          "other_step", "logging", "checkpoint")
KERNEL_PHASES = ("fwd_bwd", "optimizer")
OVERHEAD_TARGET_PCT = 5.0


def _preset(name: str) -> dict:
    with open(os.path.join(ROOT, "configs", "model_presets", f"{name}.yaml"), encoding="utf-8") as fh:
        return load_yaml_text(fh.read())["model"]


def bench_configs() -> Dict[str, dict]:
    """The benchmarked runs: (model preset, optimizer) pairs, batch 2 x 4 sequences of 64."""
    def run(model: str, optimizer: dict, lr: float) -> dict:
        return {
            "training": {"steps": 1000, "local_batch_size": 4, "global_batch_size": 8,
                         "max_norm": 1.0, "seed": 42},
            "optimizer": optimizer,
            "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": lr,
                             "warmup_ratio": 0.01, "lr_end": lr / 10},
            "model": _preset(model),
            "train_dataset": {"type": "SyntheticMarkov"},
            "checkpoint": {"enable_save": True, "save_max": 1},
        }
    adamw = {"type": "AdamW", "betas": [0.9, 0.95], "weight_decay": 0.01}
    muon = {"type": "Muon", "momentum": 0.95, "qk_clip_enabled": True}
    return {
        "tiny_gpt/AdamW": run("tiny_gpt", adamw, 1e-3),
        "tiny_deepseek_v3/AdamW": run("tiny_deepseek_v3", adamw, 1e-3),
        "tiny_deepseek_v3/Muon": run("tiny_deepseek_v3", muon, 2e-2),
    }


class PhaseTimer:
    """Accumulates wall time per phase for the current step (``_probe``: time of side
    measurements, removed from the step time)."""

    def __init__(self):
        self.current: Dict[str, float] = {p: 0.0 for p in PHASES + ("_probe", "_alt_norm")}

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[phase] += time.perf_counter() - t0
        return timed

    def reset(self) -> None:
        self.current = {p: 0.0 for p in PHASES + ("_probe", "_alt_norm")}

    def wrap_norm_with_probe(self, fn):
        """Time ``fn`` as ``grad_norm``; then, as a side measurement on the same gradients
        (excluded from the step), time a one-kernel alternative: the norm of all gradients
        concatenated. Side by side, same step: what the norm could cost."""
        def timed(grads):
            t0 = time.perf_counter()
            value = fn(grads)
            t1 = time.perf_counter()
            self.current["grad_norm"] += t1 - t0
            self.current["_alt_norm"] += _concat_norm_seconds(grads)
            self.current["_probe"] += time.perf_counter() - t1
            return value
        return timed


def _concat_norm_seconds(grads) -> float:
    """Seconds of ``||cat(g.reshape(-1) for g in grads)||_2`` in fp32, synced by .asnumpy()."""
    from mindspore import ops
    import mindspore as ms
    t0 = time.perf_counter()
    flat = [g.reshape(-1) if g.dtype == ms.float32 else g.astype(ms.float32).reshape(-1)
            for g in grads if g is not None]
    float(ops.norm(ops.cat(flat)).asnumpy())
    return time.perf_counter() - t0


@contextlib.contextmanager
def _patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def instrumented_run(cfg_dict: dict, warmup: int, measured: int) -> dict:
    """Train ``warmup + measured`` steps; per-step phase times of the measured ones."""
    import mindformers_core.core.lr as core_lr
    import mindformers_core.trainer.trainer as trainer_mod
    from mindformers_core.trainer import Trainer

    steps = warmup + measured
    cfg = load_config(cfg_dict, overrides=[f"checkpoint.save_interleaved_steps={steps}"])
    timer = PhaseTimer()
    records: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = Trainer(cfg, out_dir, stream=io.StringIO())
        trainer.stop_at_step = steps
        n_params = sum(int(p.size) for p in trainer.optimizer.parameters)
        tokens_per_step = cfg.training.global_batch_size * cfg.model.seq_length

        orig_step = trainer.train_step
        trainer.fetch_micro_batches = timer.wrap("data", trainer.fetch_micro_batches)
        trainer._grad_fn = timer.wrap("fwd_bwd", trainer._grad_fn)
        # the run's layout computes the norm (distributed/setup.py ParallelRun.grad_norm)
        trainer.parallel.grad_norm = timer.wrap_norm_with_probe(trainer.parallel.grad_norm)
        opt = trainer.optimizer
        opt.step = timer.wrap("optimizer", opt.step)
        if hasattr(opt, "post_step"):
            opt.post_step = timer.wrap("optimizer", opt.post_step)
        if hasattr(trainer.model, "update_expert_bias"):
            trainer.model.update_expert_bias = timer.wrap("moe_bias",
                                                          trainer.model.update_expert_bias)
        trainer.writer.log = timer.wrap("logging", trainer.writer.log)
        trainer.save = timer.wrap("checkpoint", trainer.save)
        step_wall: List[float] = []

        def timed_step():
            # a new step: close the previous one (its logging/checkpoint ran after train_step)
            if step_wall:
                records.append(dict(timer.current, step=step_wall[-1] + timer.current["logging"]
                                    + timer.current["checkpoint"]))
            timer.reset()
            t0 = time.perf_counter()
            metrics = orig_step()
            step_wall.append(time.perf_counter() - t0)
            return metrics

        trainer.train_step = timed_step
        accumulate = timer.wrap("accumulate", trainer_mod.accumulate_gradients)
        with _patched(trainer_mod, "accumulate_gradients", accumulate), \
                _patched(core_lr, "group_lrs", timer.wrap("schedule", core_lr.group_lrs)):
            trainer.train()
        records.append(dict(timer.current, step=step_wall[-1] + timer.current["logging"]
                            + timer.current["checkpoint"]))
    for r in records:
        r["step"] -= r.pop("_probe")
        r["accumulate"] -= r["fwd_bwd"]
        named = sum(r[p] for p in PHASES if p not in ("logging", "checkpoint", "other_step"))
        r["other_step"] = max(0.0, r["step"] - r["logging"] - r["checkpoint"] - named)
    kept = records[warmup:]
    return {"n_params": n_params, "tokens_per_step": tokens_per_step, "steps": kept}


def summarize(name: str, run: dict) -> dict:
    steps = run["steps"]
    med = {p: statistics.median(r[p] for r in steps) for p in PHASES + ("step",)}
    mean = {p: statistics.fmean(r[p] for r in steps) for p in PHASES + ("step",)}
    overhead_pct = [100.0 * (r["step"] - sum(r[p] for p in KERNEL_PHASES)) / r["step"]
                    for r in steps]
    mean_overhead = mean["step"] - sum(mean[p] for p in KERNEL_PHASES)
    alt_norm = statistics.median(r["_alt_norm"] for r in steps)
    # the same steps with the one-kernel norm in place of the measured one
    overhead_alt = [100.0 * (r["step"] - r["grad_norm"] + r["_alt_norm"]
                             - sum(r[p] for p in KERNEL_PHASES))
                    / (r["step"] - r["grad_norm"] + r["_alt_norm"]) for r in steps]
    return {
        "config": name,
        "params": run["n_params"],
        "measured_steps": len(steps),
        "step_ms": 1e3 * med["step"],
        "tokens_per_s": run["tokens_per_step"] / med["step"],
        "phase_ms_median": {p: 1e3 * med[p] for p in PHASES},
        "phase_ms_mean": {p: 1e3 * mean[p] for p in PHASES},
        "trainer_overhead_pct_median": statistics.median(overhead_pct),
        "trainer_overhead_pct_amortised": 100.0 * mean_overhead / mean["step"],
        "overhead_target_pct": OVERHEAD_TARGET_PCT,
        "concat_norm_ms_median": 1e3 * alt_norm,
        "trainer_overhead_pct_with_concat_norm": statistics.median(overhead_alt),
    }


def print_table(rows: List[dict]) -> None:
    cols = ["data", "fwd_bwd", "accumulate", "grad_norm", "schedule", "optimizer", "moe_bias",
            "other_step", "logging", "checkpoint"]
    head = f"{'config':<24} {'params':>8} {'step ms':>8} {'tok/s':>7} " + \
        " ".join(f"{c[:9]:>9}" for c in cols) + f" {'ovh% med':>8} {'ovh% amort':>10}"
    print("per-phase ms per optimizer step (median; checkpoint = mean, amortised)")
    print(head)
    for r in rows:
        vals = [r["phase_ms_mean"][c] if c == "checkpoint" else r["phase_ms_median"][c]
                for c in cols]
        print(f"{r['config']:<24} {r['params']:>8} {r['step_ms']:>8.1f} {r['tokens_per_s']:>7.0f} "
              + " ".join(f"{v:>9.2f}" for v in vals)
              + f" {r['trainer_overhead_pct_median']:>8.1f} {r['trainer_overhead_pct_amortised']:>10.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 warm-up + 10 measured steps")
    ap.add_argument("--warmup", type=int, default=None, help="steps dropped (default 8)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default 30)")
    ap.add_argument("--only", default=None, help="substring of the config names to run")
    add_output_args(ap, "train")
    args = ap.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 8)
    measured = args.steps if args.steps is not None else (10 if args.quick else 30)
    rows, errors = [], {}
    for name, cfg in bench_configs().items():
        if args.only and args.only not in name:
            continue
        try:
            run = instrumented_run(cfg, warmup, measured)
        except (NotImplementedError, ValueError) as exc:   # an optimizer not built yet
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: skipped ({errors[name]})")
            continue
        rows.append(summarize(name, run))
    print_table(rows)
    dsv3 = [r for r in rows if r["config"].startswith("tiny_deepseek_v3")]
    for r in dsv3:
        verdict = "OK" if r["trainer_overhead_pct_median"] < OVERHEAD_TARGET_PCT else "ABOVE TARGET"
        print(f"{r['config']}: trainer overhead {r['trainer_overhead_pct_median']:.1f}% of step "
              f"(median; {r['trainer_overhead_pct_amortised']:.1f}% amortised incl. checkpoint), "
              f"target < {OVERHEAD_TARGET_PCT:.0f}%: {verdict}")
    for r in rows:
        print(f"{r['config']}: global norm {r['phase_ms_median']['grad_norm']:.2f} ms; one-kernel "
              f"norm of the concatenated grads on the same steps {r['concat_norm_ms_median']:.2f} ms "
              f"-> overhead would be {r['trainer_overhead_pct_with_concat_norm']:.1f}%")
    path = write_json(output_path(args, "train"),
                      {"benchmark": "train", "warmup_steps": warmup, "measured_steps": measured,
                       "python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "results": rows, "skipped": errors})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
