"""Rank and world size as the launcher (msrun) declares them, read without initialising
communication (so config resolution and single-process runs never touch collectives).

msrun starts ``MS_WORKER_NUM`` worker processes (``MS_ROLE=MS_WORKER``, ``RANK_ID``) plus,
on the master node, one *scheduler* process (``MS_ROLE=MS_SCHED``) running the same command.
The scheduler must call ``mindspore.communication.init()`` too: that call serves the cluster
until the job ends (``comm.init_distributed`` then exits the process). Both roles see the
job's world size here, so the config resolves the same way in every process.
"""
from __future__ import annotations

import os

__all__ = ["launched_by_msrun", "is_msrun_scheduler", "env_world_size", "env_rank"]

_ROLES = ("MS_WORKER", "MS_SCHED")


def launched_by_msrun() -> bool:
    """True inside a process started by MindSpore's msrun (worker or scheduler)."""
    return os.environ.get("MS_ROLE") in _ROLES and "MS_WORKER_NUM" in os.environ


def is_msrun_scheduler() -> bool:
    """True in msrun's scheduler process (it runs the command but trains nothing)."""
    return launched_by_msrun() and os.environ.get("MS_ROLE") == "MS_SCHED"


def env_world_size() -> int:
    """Total workers of the job as msrun declares them. Outside msrun, ``MS_WORKER_NUM`` when
    it is set (``MS_WORKER_NUM=8 python run_mindformer.py ... --check`` checks the config for an
    8-worker launch), else 1. A process that really runs alone still trains with world 1: the
    trainer's plan takes the communicator's world size."""
    if launched_by_msrun() or os.environ.get("MS_WORKER_NUM", "").strip().isdigit():
        return int(os.environ["MS_WORKER_NUM"])
    return 1


def env_rank() -> int:
    """Global rank as msrun declares it (RANK_ID); 0 outside msrun and in the scheduler."""
    if launched_by_msrun() and not is_msrun_scheduler():
        return int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
    return 0
