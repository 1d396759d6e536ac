"""Per-step metrics: the log line, the progress bar, ``metrics.jsonl`` and the final summary.

``metrics.jsonl`` (docs/architecture.md, "Trainer"): one JSON row per optimizer step with int ``step`` (1-based
count of completed steps), ``loss`` (token-weighted mean cross-entropy of the step, nats),
``lr`` (the lr APPLIED at this step, of the first parameter group; ``lrs`` lists every group),
``grad_norm`` (global L2 norm before clipping), ``tokens_per_s``, ``step_time_s`` and, when the
corpus' entropy rate is known, ``excess_loss = loss - entropy_floor``. Extra keys: ``clipped``,
``skipped``, ``consumed_samples``, ``global_batch_size``, ``loss_scale``, ``aux_loss``,
``num_zeros_in_grad`` when enabled, ``moe`` (MoE loads every log_interval, ``moe_metrics.py``),
and ``run_id`` (the run lineage, ``trainer/run_dir.py``).
A resume appends: rows up to the resumed step are kept; rows after it (steps run after the
checkpoint by the interrupted process, now run again) move to ``metrics.rewound.jsonl``, so the
file describes one consistent run and no row is lost.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, TextIO

if TYPE_CHECKING:
    from .moe_metrics import MoEStepStats

__all__ = ["StepMetrics", "MetricsWriter", "format_step_line", "truncate_jsonl"]


@dataclass
class StepMetrics:
    step: int
    total_steps: int
    loss: float
    lr: float
    lrs: List[float]
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    consumed_samples: int
    global_batch_size: int
    tokens: int = 0                 # loss tokens of the step (all ranks)
    clipped: bool = False
    skipped: bool = False
    excess_loss: Optional[float] = None
    loss_scale: Optional[float] = None
    aux_loss: Optional[float] = None
    mtp_loss: Optional[float] = None          # multi-token prediction (scaled), models/mtp.py
    num_zeros_in_grad: Optional[int] = None
    qk_clipped_heads: Optional[int] = None    # Muon QK-Clip: heads rescaled this step
    max_attention_logit: Optional[float] = None  # largest tracked q.k logit of the step
    moe: Optional["MoEStepStats"] = None       # MoE loads, every log_interval (moe_metrics.py)
    #: more keys for the row and the step line, in order (held-out loss, MFU, memory, ETA:
    #: ``trainer/progress.py``); key -> ``(row value, step-line text or None)``
    #: monitor records (``trainer/monitor.py``) are row-only: ``(value, None)``
    extras: Dict[str, tuple] = field(default_factory=dict)

    def row(self) -> dict:
        """The ``metrics.jsonl`` row (non-finite numbers become null: JSON has no NaN)."""
        row = {
            "step": int(self.step), "loss": _finite(self.loss), "lr": float(self.lr),
            "grad_norm": _finite(self.grad_norm), "tokens_per_s": float(self.tokens_per_s),
            "step_time_s": float(self.step_time_s),
        }
        if self.excess_loss is not None:
            row["excess_loss"] = _finite(self.excess_loss)
        row.update({"lrs": [float(x) for x in self.lrs], "tokens": int(self.tokens),
                    "clipped": bool(self.clipped),
                    "skipped": bool(self.skipped), "consumed_samples": int(self.consumed_samples),
                    "global_batch_size": int(self.global_batch_size)})
        if self.loss_scale is not None:
            row["loss_scale"] = float(self.loss_scale)
        if self.aux_loss is not None:
            row["aux_loss"] = _finite(self.aux_loss)
        if self.mtp_loss is not None:
            row["mtp_loss"] = _finite(self.mtp_loss)
        if self.num_zeros_in_grad is not None:
            row["num_zeros_in_grad"] = int(self.num_zeros_in_grad)
        if self.qk_clipped_heads is not None:
            row["qk_clipped_heads"] = int(self.qk_clipped_heads)
            row["max_attention_logit"] = _finite(self.max_attention_logit)
        if self.moe is not None:
            row["moe"] = self.moe.row()
        row.update({k: v for k, (v, _) in self.extras.items()})
        return row


def _finite(x: float):
    x = float(x)
    return x if math.isfinite(x) else None


def format_step_line(m: StepMetrics) -> str:
    """One human line per step, upstream-like field order."""
    width = len(str(m.total_steps))
    state = "skipped" if m.skipped else ("clipped" if m.clipped else "")
    parts = [f"step: [{m.step:>{width}d}/{m.total_steps}]", f"loss: {m.loss:.6f}"]
    if m.excess_loss is not None:
        parts.append(f"excess: {m.excess_loss:.4f}")
    parts += [f"lr: {m.lr:.6e}", f"grad_norm: {m.grad_norm:.6f}" + (f" ({state})" if state else ""),
              f"tokens/s: {m.tokens_per_s:,.0f}", f"step_time: {m.step_time_s * 1000:.0f}ms",
              f"consumed_samples: {m.consumed_samples}", f"global_batch_size: {m.global_batch_size}"]
    if m.loss_scale is not None:
        parts.append(f"loss_scale: {m.loss_scale:g}")
    if m.aux_loss is not None and m.aux_loss != 0:
        parts.append(f"aux_loss: {m.aux_loss:.6f}")
    if m.mtp_loss is not None:
        parts.append(f"mtp_loss: {m.mtp_loss:.6f}")
    if m.num_zeros_in_grad is not None:
        parts.append(f"num_zeros_in_grad: {m.num_zeros_in_grad}")
    if m.qk_clipped_heads is not None:
        parts.append(f"qk_clip: {m.qk_clipped_heads} heads (max logit {m.max_attention_logit:.2f})")
    if m.moe is not None:
        parts.append(m.moe.short())
    parts += [text for _, text in m.extras.values() if text is not None]
    return "{ " + ", ".join(parts) + " }"


REWOUND_NAME = "metrics.rewound.jsonl"


def truncate_jsonl(path: str, last_step: int) -> List[str]:
    """Cut ``path`` back to rows with ``step <= last_step`` (a resumed run rewrites the later
    ones); returns the rows taken out, which the caller keeps elsewhere."""
    if not os.path.exists(path):
        return []
    with open(path, "r", encoding="utf-8") as fh:
        lines = fh.readlines()
    kept, dropped, cut = [], [], False
    for line in lines:
        try:
            row = json.loads(line)
            step = int(row.get("step", 0))
        except (ValueError, TypeError, AttributeError):
            cut = True   # a line cut by a kill mid-write
            continue
        (kept if step <= last_step else dropped).append(json.dumps(row) + "\n")
    if dropped or cut:
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(kept)
    return dropped


@dataclass
class MetricsWriter:
    """Writes the step line (or a progress bar on a TTY) and ``metrics.jsonl``.

    On an interactive terminal the bar is redrawn in place and a full line is printed every
    ``log_interval`` steps; on a pipe or file (CI, nohup) every ``log_interval``-th step (and
    the last, and every skipped one) is a plain line.
    """
    output_dir: Optional[str]
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    enabled: bool = True            # False on ranks other than 0
    log_interval: int = 1            # training.log_interval
    _fh: Optional[TextIO] = None
    _losses: List[float] = field(default_factory=list)
    _start: float = field(default_factory=time.time)
    _tokens: int = 0
    run_id: Optional[str] = None          # written into every row
    last_lr: Optional[float] = None       # lr of the last logged step (saved in checkpoints)
    #: lines the final summary repeats (e.g. the damaged checkpoints a resume skipped)
    notes: List[str] = field(default_factory=list)

    def open(self, resume_step: int = 0) -> None:
        if not self.enabled or self.output_dir is None:
            return
        os.makedirs(self.output_dir, exist_ok=True)
        path = os.path.join(self.output_dir, "metrics.jsonl")
        if resume_step > 0:
            dropped = truncate_jsonl(path, resume_step)
            if dropped:
                with open(os.path.join(self.output_dir, REWOUND_NAME), "a",
                          encoding="utf-8") as fh:
                    fh.writelines(dropped)
                self.message(f"metrics.jsonl: {len(dropped)} row(s) after step {resume_step} "
                             f"(run again now) moved to {REWOUND_NAME}")
            mode = "a"
        else:
            mode = "w"
        self._fh = open(path, mode, encoding="utf-8")

    @property
    def is_tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def log(self, m: StepMetrics, tokens: int) -> None:
        self._losses.append(m.loss)
        self._tokens += tokens
        self.last_lr = float(m.lr)
        if not self.enabled:
            return
        self.write_row(m.row())
        if self.is_tty:
            self.stream.write("\r" + _bar(m) + " " * 4)
            if m.step % self.log_interval == 0 or m.step == m.total_steps or m.skipped:
                self.stream.write("\r" + format_step_line(m) + "\n")
        elif m.step % self.log_interval == 0 or m.step == m.total_steps or m.skipped:
            self.stream.write(format_step_line(m) + "\n")
        self.stream.flush()

    def write_row(self, row: dict) -> None:
        """Append one row to ``metrics.jsonl`` (rank 0, when there is an output dir), tagged
        with the run id."""
        if self._fh is not None:
            if self.run_id is not None:
                row = {**row, "run_id": self.run_id}
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            if self.is_tty:
                self.stream.write("\r")
            self.stream.write(text + "\n")
            self.stream.flush()

    def summary(self, state, entropy_floor: Optional[float], reason: str) -> str:
        """Final summary text (also returned for tests)."""
        wall = time.time() - self._start
        finite = [x for x in self._losses if math.isfinite(x)]
        lines = [f"training {reason}: {state.step} steps ({state.applied_steps} applied, "
                 f"{state.total_skipped} skipped, {state.total_clipped} clipped), "
                 f"{state.consumed_samples} samples, {wall:.1f}s this session"]
        if finite:
            first, last = finite[0], finite[-1]
            tail = finite[-min(10, len(finite)):]
            lines.append(f"loss: first {first:.4f} -> last {last:.4f} "
                         f"(mean of last {len(tail)}: {sum(tail) / len(tail):.4f})")
            if entropy_floor is not None:
                lines.append(f"entropy floor {entropy_floor:.4f}: excess loss "
                             f"{first - entropy_floor:.4f} -> {last - entropy_floor:.4f}")
        if self._tokens and wall > 0:
            lines.append(f"throughput: {self._tokens / wall:,.0f} tokens/s")
        lines.extend(self.notes)
        text = "\n".join(lines)
        self.message(text)
        return text

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _bar(m: StepMetrics, width: int = 30) -> str:
    frac = m.step / max(1, m.total_steps)
    filled = int(round(frac * width))
    return (f"[{'#' * filled}{'.' * (width - filled)}] {m.step}/{m.total_steps} "
            f"loss {m.loss:.4f} lr {m.lr:.2e} gnorm {m.grad_norm:.3f} "
            f"{m.step_time_s * 1000:.0f}ms/step")
