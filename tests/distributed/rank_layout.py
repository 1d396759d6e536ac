"""What a model-parallel worker leaves for its test, and the single-process run it is compared
with (the expert-parallel and tensor x expert-parallel msrun tests).

``save_layout`` writes ``OUT/CASE.rank{r}.json`` (``model.shard_specs()`` as
``[full shape, split dim, group, shards]``, the local shapes, the optimizer-state shapes of the
split weights, the routers' expert bias, and any ``more`` fields) and ``OUT/CASE.rank{r}.npz``
(this rank's final split weights); ``load_layouts`` reads them back.
"""
import json
import os


def save_layout(out_dir, name: str, rank: int, trainer, **more) -> None:
    import numpy as np
    specs = trainer.model.shard_specs()
    params = {p.name: p for p in trainer.model.get_parameters()}
    state = {k: list(v.shape) for k, v in trainer.optimizer.state_dict().items()
             if hasattr(v, "shape") and any(k.endswith(n) for n in specs)}
    np.savez(os.path.join(out_dir, f"{name}.rank{rank}.npz"),
             **{k: params[k].asnumpy() for k in specs})
    with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as fh:
        json.dump({"specs": {k: [list(s.full_shape), s.split_dim, s.group, s.num_shards]
                             for k, s in specs.items()},
                   "local_shapes": {k: list(params[k].shape) for k in specs},
                   "state_shapes": state,
                   "expert_bias": {k: params[k].asnumpy().tolist() for k in params
                                   if k.endswith("expert_bias")}, **more}, fh)


def load_layouts(out_dir, name: str, workers: int) -> dict:
    """``{rank: (meta, {name: array})}`` of case ``name``."""
    import numpy as np
    res = {}
    for rank in range(workers):
        with open(os.path.join(out_dir, f"{name}.rank{rank}.json")) as fh:
            meta = json.load(fh)
        z = np.load(os.path.join(out_dir, f"{name}.rank{rank}.npz"))
        res[rank] = (meta, {k: z[k] for k in z.files})
    return res


def single_process(cfg, run_dir) -> dict:
    """The one-process Trainer run of ``cfg``: its metrics rows, final parameters and model."""
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from msrun_util import read_metrics
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(cfg, str(run_dir), overwrite=True)
    trainer.train()
    return {"metrics": read_metrics(run_dir), "model": trainer.model,
            "params": {p.name: p.asnumpy().copy() for p in trainer.model.get_parameters()}}
