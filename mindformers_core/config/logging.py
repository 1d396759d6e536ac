"""`logging:` section: what a run reports besides the step line and ``metrics.jsonl``.

* ``tensorboard``: also write TensorBoard event files (the same scalars as ``metrics.jsonl``)
  to ``<output_dir>/tensorboard`` (needs ``tensorboardX``: ``pip install -e .[tensorboard]``).
* ``peak_flops``: the per-device peak FLOP/s the step line's MFU divides by; null = the
  documented default of the device (``trainer/throughput.py``).
* ``sample_prompt``: after training, print a greedy continuation of this prompt of
  ``sample_max_new_tokens`` tokens (null: no sample). Needs a text tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .schema import Section, check_range

__all__ = ["LoggingConfig"]


@dataclass
class LoggingConfig(Section):
    tensorboard: bool = False
    peak_flops: Optional[float] = None
    sample_prompt: Optional[str] = None
    sample_max_new_tokens: int = 64

    def validate(self, path: str) -> None:
        check_range(self.peak_flops, f"{path}.peak_flops", lo=0, lo_open=True)
        check_range(self.sample_max_new_tokens, f"{path}.sample_max_new_tokens", lo=1)
