"""Rank and world size as the launcher declares them: :mod:`mindformers_core.launch_env`
(a leaf module, so that the config layer reads them without importing ``distributed``)."""
from ..launch_env import env_rank, env_world_size, is_msrun_scheduler, launched_by_msrun

__all__ = ["launched_by_msrun", "is_msrun_scheduler", "env_world_size", "env_rank"]
