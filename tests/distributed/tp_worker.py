"""msrun worker of the tensor-parallel tests.

    python tests/distributed/tp_worker.py OUT_DIR grad MODEL...    one forward/backward
    python tests/distributed/tp_worker.py OUT_DIR train MODEL...   the Trainer, 10 steps
    python tests/distributed/tp_worker.py OUT_DIR all MODEL...     both, in that order

``grad``: every rank builds the full model (the seeded init of one process) as the reference
and a second copy that it shards (``apply_tensor_parallel``), runs one micro-batch through both
and writes ``OUT_DIR/grad.MODEL.rank{r}.json``: the losses, the largest relative error of each
local gradient against this rank's slice of the reference gradient, the local max logits
against the reference's local heads, and the parameter bytes held.
``train``: the real Trainer (``parallelism.tensor_parallel: 2``, sequence parallel) writes
``OUT_DIR/MODEL/metrics.jsonl`` (rank 0) and ``OUT_DIR/train.MODEL.rank{r}.json`` (parameter
and optimizer-state bytes per rank; for Muon the NS FLOPs this rank ran, its owned weights
and the optimizer's class). ``grad`` runs for the ``tp_case.MODELS`` among MODEL...
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-12))


def param_bytes(model) -> dict:
    return {p.name: int(np.prod(p.shape)) * 4 for p in model.get_parameters()}


def grad_case(out, name, reducer):
    import mindspore as ms
    from mindformers_core.distributed.shard_spec import shard
    from mindformers_core.models import build_model
    from tp_case import CONFIGS, TP
    cfg = CONFIGS[name](out, TP)
    full = build_model(cfg.model, seed=7, jit="none")
    from mindformers_core.models.tp_model import apply_tensor_parallel
    model = apply_tensor_parallel(build_model(cfg.model, seed=7, jit="none"),
                                  reducer.group_comm)
    rng = np.random.default_rng(3)
    b, s = 2, cfg.model.seq_length
    ids = ms.Tensor(rng.integers(0, cfg.model.vocab_size, (b, s)).astype(np.int32))
    labels = ms.Tensor(rng.integers(0, cfg.model.vocab_size, (b, s)).astype(np.int32))
    mask = ms.Tensor((rng.random((b, s)) > 0.2).astype(np.float32))
    out_json = {}
    for key, m in (("full", full), ("tp", model)):
        params = [p for p in m.get_parameters() if p.requires_grad]

        def objective(i, l, k):
            loss_sum, n, aux = m(i, l, k)
            return loss_sum / n + aux, loss_sum, aux

        grad_fn = ms.value_and_grad(objective, None, params, has_aux=True)
        (obj, loss_sum, aux), grads = grad_fn(ids, labels, mask)
        out_json[key] = {"loss_sum": float(loss_sum.asnumpy()), "aux": float(aux.asnumpy()),
                         "grads": {p.name: g.asnumpy() for p, g in zip(params, grads)},
                         "max_logits": m.get_max_attention_logits()}
    specs = model.shard_specs()
    index = reducer.group_comm.mesh.local_rank("tp", reducer.rank)
    errors = {}
    for pname, want in out_json["full"]["grads"].items():
        if pname in specs:
            want = shard(specs[pname], want, index)
        errors[pname] = rel(out_json["tp"]["grads"][pname], want)
    heads = out_json["tp"]["max_logits"].shape[1]
    ml_want = out_json["full"]["max_logits"][:, index * heads:(index + 1) * heads]
    res = {"loss_sum": [out_json["full"]["loss_sum"], out_json["tp"]["loss_sum"]],
           "aux": [out_json["full"]["aux"], out_json["tp"]["aux"]],
           "grad_rel_err": errors, "max_logits_rel_err": rel(out_json["tp"]["max_logits"], ml_want),
           "max_logits_shape": list(out_json["tp"]["max_logits"].shape),
           "bytes_full": param_bytes(full), "bytes_tp": param_bytes(model),
           "sharded": sorted(specs)}
    with open(os.path.join(out, f"grad.{name}.rank{reducer.rank}.json"), "w") as fh:
        json.dump(res, fh)


def train_case(out, name):
    from mindformers_core.trainer import Trainer
    from tp_case import CONFIGS, TP
    run_dir = os.path.join(out, name)
    cfg = CONFIGS[name](run_dir, TP)
    trainer = Trainer(cfg, run_dir, overwrite=True)
    trainer.train()
    from mindformers_core.distributed.zero import ZeroOptimizer, optimizer_state_bytes
    from mindformers_core.optim.muon import Muon
    opt = trainer.optimizer
    # under tp: the shard_exchange.ShardedMuonExchange (of the held Muon under ZeRO-1)
    muon = isinstance(opt.inner if isinstance(opt, ZeroOptimizer) else opt, Muon)
    with open(os.path.join(out, f"train.{name}.rank{trainer.rank}.json"), "w") as fh:
        json.dump({"bytes": param_bytes(trainer.model), "data_rank": trainer.data_rank,
                   "world": trainer.parallel.world_size,
                   "state_bytes": optimizer_state_bytes(opt),
                   "optimizer": opt.optimizer_name,      # "ShardedMuon" under ZeRO-1
                   "full_shapes": {p.name: list(opt.full_shape(i))
                                   for i, p in enumerate(opt.parameters)} if muon else {},
                   "ns_flops": opt.exchange.ns_flops_total if muon else 0.0,
                   "owners": opt.exchange.owner_by_name if muon else {}}, fh)


def run(out, what, names):
    """``what`` (grad, train or all) for ``names`` into ``out`` (module docstring)."""
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    os.makedirs(out, exist_ok=True)
    if what in ("grad", "all"):
        from mindformers_core.distributed.setup import setup_parallel
        from tp_case import CONFIGS, MODELS, TP
        reducer = setup_parallel(CONFIGS[names[0]](out, TP))
        for name in names:
            if name in MODELS:
                grad_case(out, name, reducer)
    if what in ("train", "all"):
        for name in names:
            train_case(out, name)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3:])
