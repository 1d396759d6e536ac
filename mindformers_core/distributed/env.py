"""Rank and world size as the launcher (msrun) declares them, read without initialising
communication (so config resolution and single-process runs never touch collectives)."""
from __future__ import annotations

import os

__all__ = ["launched_by_msrun", "env_world_size", "env_rank"]


def launched_by_msrun() -> bool:
    """True inside a worker started by MindSpore's msrun (it sets MS_WORKER_NUM / MS_ROLE)."""
    return os.environ.get("MS_ROLE") == "MS_WORKER" and "MS_WORKER_NUM" in os.environ


def env_world_size() -> int:
    """Total workers of the job as msrun declares them; 1 outside msrun."""
    if launched_by_msrun():
        return int(os.environ["MS_WORKER_NUM"])
    return 1


def env_rank() -> int:
    """Global rank as msrun declares it (RANK_ID); 0 outside msrun."""
    if launched_by_msrun():
        return int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
    return 0
