"""Training data: synthetic Markov corpus, token files, MindRecord, and the global-batch sampler.

    ds = build_dataset(cfg.train_dataset, cfg.model, seed=cfg.training.seed, rank=r, world=dp)
    batch = ds.micro_batch(step, micro_index, num_micro, local_batch_size)
    ds.entropy_floor      # nats/token or None
    ds.state_dict() / ds.load_state_dict(state)   # data position (consumed samples)
"""
from .builder import TrainDataset, build_dataset, random_prefix_mask
from .markov import SyntheticMarkov, entropy_nats
from .mindrecord import MINDRECORD_COLUMNS, MindDataset
from .sampler import GlobalBatchSampler
from .token_file import TokenFile

__all__ = ["build_dataset", "TrainDataset", "SyntheticMarkov", "TokenFile", "MindDataset",
           "GlobalBatchSampler", "MINDRECORD_COLUMNS", "random_prefix_mask", "entropy_nats"]
