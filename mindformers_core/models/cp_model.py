"""The model's side of context parallelism: this rank's tokens, its RoPE rows, its attention.

Under ``parallelism.context_parallel: cp`` every rank of a cp group reads the same micro-batch
(the whole sequences of its data-parallel replica) and the model keeps its own tokens of the
load-balanced causal split (``distributed/cp_layout.py``: cp rank i holds chunks i and
2cp-1-i of 2cp), so

* the embedding, the MLPs / MoE, the head and the loss run on ``S / cp`` tokens per sequence;
* the rotary (RoPE / YaRN) tables are the rows of the chunks' GLOBAL positions
  (:meth:`SequenceChunks.tables`);
* attention is ``distributed/context_parallel.py``'s ``context_parallel_attention`` (ring,
  ulysses or hybrid) on the local chunks, exactly the full sequence's rows;
* the returned ``loss_sum`` / ``n_tokens`` are this rank's parts: summed over the cp (and dp)
  ranks they are the global batch's (the run's gradient reduction sums over dp x cp);
* full-sequence statistics are made whole before use: the MoE's sequence-wise aux loss reads
  the per-sequence expert counts summed over the cp group (``MoE.sequence_counts``), and the
  MTP depths shift the WHOLE sequences (a chunk's next token lives in another chunk) and divide
  by the whole sequences' loss-token count, so their losses are parts that sum over cp too.

The MoE's aux-loss part: with counts c summed over cp, the sequence length S = cp * L and
``router.aux_loss`` computed on the local L positions, f is cp times the full sequence's and P
the mean over L local positions, whose mean over the cp ranks is the full P; so the full loss
is the sum over the cp ranks of ``aux_loss(local) / cp**2``.

Composed (config/layout.py). cp x tp: the tensor-parallel cut runs first
(``distributed/setup.py``), so its runner (``models/tp_model.py``) embeds this rank's chunks,
splits their tokens over tp (sequence parallel) and gathers them before each attention block,
whose core is the cp one here on the local heads; the routed experts see this rank's chunks
whole, so the counts hook above is the same. The tp runner's loss on the chunks' labels is a
cp part as without tp; the reductions over dp x cp are the run's (``dp_cp``). cp x ep: the
EP cut runs after this one; each rank dispatches its own chunks' tokens over the ep group
(folded over cp x dp: at dp2 x cp2 x ep2 it is the cp group), and routing, counts and the aux
loss are computed before the dispatch, per token, so they are the same as without ep.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict

import numpy as np
from mindspore import Tensor, ops

from ..distributed import cp_layout
from ..distributed.context_parallel import context_parallel_attention
from .transformer_layer import RecomputedCore

__all__ = ["SequenceChunks", "apply_context_parallel", "whole_sequences"]


class SequenceChunks:
    """This cp rank's tokens of the load-balanced split (``cp`` ranks, rank ``rank``)."""

    def __init__(self, cp: int, rank: int, own_cores=()):
        self.cp, self.rank = int(cp), int(rank)
        #: (attention block, its core before the cut): what :func:`whole_sequences` restores
        self.own_cores = tuple(own_cores)
        self._index: Dict[int, Tensor] = {}

    def index(self, seq: int) -> Tensor:
        """int32 [seq / cp]: the global positions this rank holds, in its order."""
        if seq not in self._index:
            pos = cp_layout.local_positions(seq, self.cp, self.rank)
            self._index[seq] = Tensor(pos.astype(np.int32))
        return self._index[seq]

    def take(self, x, axis: int = 1):
        """This rank's part of ``x`` (the whole sequences along ``axis``)."""
        return ops.gather(x, self.index(x.shape[axis]), axis)

    def tables(self, full: tuple, whole_mask: bool = False) -> tuple:
        """``layers.attention_tables`` of the whole sequences -> this rank's: the cos/sin rows
        of its global positions; the mask bias cut to the local [S/cp, S/cp] shape (the cp
        attention ignores it: its causal masks come from the layout), or with ``whole_mask``
        kept whole in global positions: a document mask (``models/documents.py``), of which
        the cp attention cuts the blocks of the positions it holds."""
        cos_q, sin_q, cos_k, sin_k, rot, mask = full
        idx = self.index(cos_q.shape[2])
        n = idx.shape[0]
        return (ops.gather(cos_q, idx, 2), ops.gather(sin_q, idx, 2), ops.gather(cos_k, idx, 2),
                ops.gather(sin_k, idx, 2), rot, mask if whole_mask else mask[:, :, :n, :n])


def apply_context_parallel(model, comm, method: str, ulysses_degree: int = 1):
    """Cut ``model`` (a ``GPTModel``) for the ``cp`` group of ``comm`` (module docstring):
    every attention block (decoder and MTP layers) runs ``method``'s core, the model keeps its
    chunks, the MoE blocks sum their per-sequence counts over the group. Returns the model."""
    members = comm.ranks("cp")
    cp = len(members)
    cores = {}   # one cp core per distinct inner core (hybrid registers its sub-groups once)
    own = []
    for attn in model.attention_blocks():
        inner = attn.core_attention
        own.append((attn, inner))
        # recompute's core_attention (RecomputedCore): the whole cp core is recomputed, its
        # ring passes or all-to-alls rerun in the backward, around the plain inner core
        recomputed = isinstance(inner, RecomputedCore)
        plain = inner.fn if recomputed else inner
        if id(plain) not in cores:
            cores[id(plain)] = context_parallel_attention(comm, method, plain, ulysses_degree)
        attn.core_attention = RecomputedCore(cores[id(plain)]) if recomputed \
            else cores[id(plain)]

    def sequence_counts(counts):
        return ops.stop_gradient(comm.all_reduce(ops.stop_gradient(counts), "cp"))

    for moe in model.moe_layers().values():
        moe.set_sequence_counts(sequence_counts, cp)
    model.set_sequence_chunks(SequenceChunks(cp, members.index(comm.rank), own))
    return model


@contextmanager
def whole_sequences(model, chunks):
    """While inside, ``model`` (cut with ``chunks``) runs whole sequences on this rank: no
    chunks, each attention block's own core. Context parallel splits no weight, so every cp
    rank decodes the prompt alone, with the key/value cache (the end-of-run sample,
    trainer/progress.py); the MoE blocks still sum their per-sequence counts over the cp group,
    which only the aux loss reads, and every rank decodes the same tokens together. Nothing
    changes for ``chunks`` None (no context parallel)."""
    if chunks is None:
        yield model
        return
    cut = [(attn, attn.core_attention) for attn, _ in chunks.own_cores]
    for attn, own in chunks.own_cores:
        attn.core_attention = own
    model.set_sequence_chunks(None)
    try:
        yield model
    finally:
        for attn, core in cut:
            attn.core_attention = core
        model.set_sequence_chunks(chunks)
