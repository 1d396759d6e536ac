"""What a run reports around the training steps: the plan's parameter counts, the output
files, held-out evaluation, the step line's extra fields, TensorBoard and the final sample.

:class:`RunProgress` is owned by the trainer and called at four points:

* ``start()``: logs the parameter counts (total, per optimizer group, embedding vs
  non-embedding) and the output files;
* ``after_step(metrics)``: evaluates every ``eval_interval`` steps and after the last, and
  adds to the step's row / line: ``eval_loss`` / ``eval_ppl`` (the latest evaluation), ``mfu``,
  ``rss_mb`` (and ``device_mem_mb`` where MindSpore reports it) and ``eta``;
* ``write_row(row)``: TensorBoard, the same scalars as ``metrics.jsonl``;
* ``finish()``: the final evaluation's summary line, the greedy sample of
  ``logging.sample_prompt``, and the output files again.

The held-out loss and perplexity of an evaluation step are keys of that step's
``metrics.jsonl`` row (``eval_loss``, ``eval_ppl``, ``eval_tokens``); other rows carry the
latest ``eval_loss``.
"""
from __future__ import annotations

import math
import os
import time
from typing import List, Optional

from .evaluate import EvalResult, evaluate, reset_running_stats
from .throughput import (PEAK_FLOPS, attention_widths, eta_seconds, flops_per_token,
                         format_duration, format_param_counts, mfu, param_counts, rss_bytes)

__all__ = ["RunProgress", "device_memory_bytes"]


def device_memory_bytes() -> Optional[int]:
    """Device memory in use (MindSpore's allocator) on accelerators; None on CPU."""
    import mindspore as ms
    if ms.get_context("device_target") == "CPU":
        return None
    try:
        return int(ms.runtime.memory_allocated())
    except (AttributeError, RuntimeError):
        return None


class RunProgress:
    def __init__(self, trainer, held_out=None, tokenizer=None):
        self.t = trainer
        self.held_out = held_out
        self.tokenizer = tokenizer
        tr = trainer.cfg.training
        self.eval_interval = tr.eval_interval
        self.eval_steps = tr.eval_steps
        self.evals: List[EvalResult] = []
        self.tb = None
        self._t0 = time.perf_counter()
        self._steps_this_session = 0
        mc = trainer.cfg.model
        self.counts = param_counts(trainer.parameter_sizes())
        self.flops_per_token = flops_per_token(self.counts, mc.num_layers, mc.hidden_size,
                                               mc.seq_length, mc.vocab_size,
                                               mc.tie_word_embeddings, attention_widths(mc))
        import mindspore as ms
        target = ms.get_context("device_target")
        peak = trainer.cfg.logging.peak_flops
        self.peak_flops = float(peak if peak is not None else PEAK_FLOPS.get(target, 1e11))
        self.peak_source = "logging.peak_flops" if peak is not None else f"default for {target}"

    # ------------------------------------------------------------------ files
    def output_files(self) -> List[str]:
        out = self.t.output_dir or "."
        files = [os.path.join(out, name) for name in
                 ("metrics.jsonl", "resolved_config.yaml", "run_plan.yaml")]
        files.append(self.t.save_dir + os.sep)
        tb = self.t.cfg.tensorboard_target()
        if tb is not None:
            files.append(os.path.join(out, tb.logdir) + os.sep)
        return files

    def _log_files(self, when: str) -> None:
        self.t.log(f"output files ({when}):\n  " + "\n  ".join(self.output_files()))

    def group_counts(self) -> dict:
        groups = self.t.optimizer.param_groups
        # a pipeline rank's optimizer holds its stage's parameters only
        tag = " (this stage)" if self.t.parallel.dims.pp > 1 else ""
        return {str(g.get("name", i)) + tag: sum(int(p.size) for p in g["params"])
                for i, g in enumerate(groups)}

    # ------------------------------------------------------------------ hooks
    def start(self) -> None:
        self.t.log(format_param_counts(self.counts, self.group_counts()))
        self.t.log(f"model FLOPs/token: {self.flops_per_token:.4g} (6N + 12*L*H*S); MFU peak "
                   f"{self.peak_flops:.3g} FLOP/s per device ({self.peak_source})")
        self._log_files("start")
        tb = self.t.cfg.tensorboard_target()
        if tb is not None and self.t.rank == 0:
            from .tensorboard import TensorBoardWriter
            # os.path.join keeps an absolute logdir as is
            self.tb = TensorBoardWriter(os.path.join(self.t.output_dir or ".", tb.logdir),
                                        log_interval=tb.log_interval, queue_size=tb.queue_size,
                                        field=tb.field)

    def _evaluate(self, step: int) -> EvalResult:
        result = evaluate(self.t.parallel.forward_only(self.t.model), self.held_out,
                          self.eval_steps, self.t.plan.local_batch_size, self.t.parallel, step,
                          self.t.plan.num_accumulation_steps)
        reset_running_stats(self.t.model)
        self.evals.append(result)
        self.t.log(f"eval at step {step}: held-out loss {result.loss:.4f}, perplexity "
                   f"{result.perplexity:.3f} ({result.tokens} tokens)")
        return result

    def due(self, step: int, end: int) -> bool:
        if self.held_out is None:
            return False
        if step == end:
            return True
        return self.eval_interval is not None and step % self.eval_interval == 0

    def after_step(self, m, end: int) -> None:
        self._steps_this_session += 1
        ex = m.extras
        if self.due(m.step, end):
            result = self._evaluate(m.step)
            ex["eval_loss"] = (result.loss, f"eval_loss: {result.loss:.4f}")
            ppl = result.perplexity
            ex["eval_ppl"] = (ppl if math.isfinite(ppl) else None, f"eval_ppl: {ppl:.3f}")
            ex["eval_tokens"] = (result.tokens, None)
        elif self.evals:
            ex["eval_loss"] = (self.evals[-1].loss, f"eval_loss: {self.evals[-1].loss:.4f}")
        # tokens/s counts every rank's tokens, so the peak is that of every device
        util = mfu(m.tokens_per_s, self.flops_per_token, self.peak_flops,
                   self.t.parallel.world_size)
        ex["mfu"] = (util, f"mfu: {100 * util:.2f}%")
        rss = rss_bytes()
        if rss is not None:
            ex["rss_mb"] = (rss / 2 ** 20, f"rss: {rss / 2 ** 20:,.0f}MB")
        dev = device_memory_bytes()
        if dev is not None:
            ex["device_mem_mb"] = (dev / 2 ** 20, f"device_mem: {dev / 2 ** 20:,.0f}MB")
        eta = eta_seconds(self._steps_this_session, end - m.step,
                          time.perf_counter() - self._t0)
        ex["eta_s"] = (eta, f"eta: {format_duration(eta)}")

    def write_row(self, row: dict) -> None:
        if self.tb is not None:
            self.tb.write_row(row)

    def finish(self) -> None:
        if self.evals:
            first, last = self.evals[0], self.evals[-1]
            self.t.log(f"held-out loss: first {first.loss:.4f} (step {first.step}) -> last "
                       f"{last.loss:.4f} (step {last.step}), perplexity {last.perplexity:.3f}")
        self._sample()
        if self.tb is not None:
            self.tb.close()
        self._log_files("end")

    def _sample(self) -> None:
        """The greedy sample, decoded on every rank and logged by rank 0: under tensor, expert
        and pipeline parallelism and fully sharded parameters the forward is a collective of
        every rank of a group (models/generation.py, distributed/pipeline_eval.py,
        distributed/fsdp.py); under context parallel every rank decodes the whole prompt
        alone (models/cp_model.py); elsewhere each rank's copy of the weights is the same."""
        prompt = self.t.cfg.logging.sample_prompt
        if prompt is None or self.tokenizer is None:
            return
        from ..models.generation import generate
        ids = self.tokenizer.encode(prompt)
        with self.t.model.whole_sequences():   # context parallel: models/cp_model.py
            new = generate(self.t.parallel.forward_only(self.t.model), ids,
                           self.t.cfg.logging.sample_max_new_tokens, temperature=0.0)
        reset_running_stats(self.t.model)
        self.t.log(f"sample (greedy, {len(new)} tokens):\n{prompt}{self.tokenizer.decode(new)}")
