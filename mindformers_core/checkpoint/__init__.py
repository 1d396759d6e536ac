"""Checkpoints: files, sharded layouts, resume checks, and what a run saves and loads.

    store          the single-process file, naming, listing, pruning, resolve_checkpoint
                   (a file or a directory's newest complete checkpoint)
    file_io        safetensors + JSON header, digests, atomic writes
    sharded        per-rank files and the index of a sharded checkpoint; resharding to any
                   layout
    sharded_save   the trainer's use of sharded checkpoints (every rank its part)
    plan           which rank writes which piece (remove_redundancy), balanced by bytes
    balanced_load  each rank file read by one rank and shared (load_balanced)
    async_writer   async_save's background writer
    resume_checks  what a resume checks beyond the digest
    weights        model weights from a checkpoint into a built model
    train_state    the counters a checkpoint carries

Nothing here imports the trainer: the trainer imports this package.
"""
