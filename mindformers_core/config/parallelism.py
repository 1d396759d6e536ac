"""`parallelism:` section (upstream field names). Owned by the distributed package."""
from __future__ import annotations

from dataclasses import dataclass

from .schema import Section


@dataclass
class ParallelismConfig(Section):
    tensor_parallel: int = 1
    context_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel_shard: int = -1   # -1: shard optimizer state over all DP ranks; 1: replicate
