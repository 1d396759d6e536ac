"""Ring attention (``context_parallel_method: colossal``): exact causal attention over a ring of
context-parallel ranks, forward and backward each in one ring pass.

Each of the ``n`` ring positions holds its two load-balanced chunks of the sequence
(``distributed/cp_layout.py``): q, k [B, N, L, D], v [B, N, L, Dv], ``L = S / n``. K/V blocks
travel one position forward per step (:func:`cp_layout.ring_source`); every rank computes the
blocks :func:`cp_layout.ring_blocks` lists (masked-out ones are skipped) and combines them per
query row with an online softmax (running max m, normaliser l, unnormalised context acc;
Milakov & Gimelshein 2018):

    s = q_a k_b^T * scale (float32; -inf above the diagonal of a ``causal`` block)
    m' = max(m, rowmax s);  l' = l e^(m - m') + rowsum e^(s - m')
    acc' = acc e^(m - m') + e^(s - m') v_b
    context = acc / l,  lse = m + log l

which is ``models/layers.causal_attention`` on the full sequence, restricted to this rank's
rows. The max logit per head is the max over batch and this rank's query rows of the final m:
the max over unmasked keys of the scaled scores of this rank's queries (the caller MAX-reduces
it over the cp group to get the full sequence's).

Backward (FlashAttention-2's, one more ring pass, no rerun of the forward): with
``D = rowsum(dcontext * context)`` and for every visible block p = e^(s - lse),

    dv_b += p^T dcontext_a;  ds = p * (dcontext_a v_b^T - D);  dq_a += ds k_b * scale;
    dk_b += ds^T q_a * scale

The dK/dV accumulators of a block travel with it, so after the ``n - 1`` shifts of
(K, V, dK, dV) one last shift of (dK, dV) brings every block's gradient home.

Transport: :class:`RingShift`, ``GroupCommunicator.send`` / ``recv`` between ring neighbours in
the phase order of :func:`cp_layout.ring_phases`; tensors of one dtype travel as one flat buffer.
The blocks' masks come from the layout (causal over global positions), unless ``mask_bias`` is
a document mask: the whole ``[B, 1, S, S]`` bias in global positions (``models/documents.py``,
``cp_model.SequenceChunks.tables``), told apart by its last dim ``S = L * n``. Each visited block
then adds its ``[c, c]`` cut (``c = L / 2``, the rows of its query chunk, the columns of its key
chunk), causal part included; the layout still skips the blocks above the diagonal.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from . import cp_layout
from .collectives import GroupCommunicator

__all__ = ["RingShift", "RingAttention", "RingAttentionCore", "DocumentRingCore",
           "ring_forward", "ring_backward", "diagonal_bias"]

_BMM = ops.BatchMatMul()
_BMM_TB = ops.BatchMatMul(transpose_b=True)
_BMM_TA = ops.BatchMatMul(transpose_a=True)
_DIAGONAL: Dict[int, Tensor] = {}


def diagonal_bias(n: int) -> Tensor:
    """[n, n] float32: -inf above the diagonal, 0 elsewhere (cached per size)."""
    if n not in _DIAGONAL:
        _DIAGONAL[n] = Tensor(np.where(np.triu(np.ones((n, n), bool), 1), -np.inf,
                                       0.0).astype(np.float32))
    return _DIAGONAL[n]


class RingShift:
    """One step of the ring: send tensors to the next position, receive the previous one's."""

    def __init__(self, comm: GroupCommunicator, group: str):
        self.comm, self.group = comm, group
        self.members = comm.ranks(group)
        self.size = len(self.members)
        self.pos = self.members.index(comm.rank)
        self.phases = [(op, self.members[p]) for op, p in cp_layout.ring_phases(self.pos,
                                                                              self.size)]

    def __call__(self, tensors: Sequence[Tensor]) -> List[Tensor]:
        """The previous position's ``tensors`` (same shapes and dtypes as this rank's)."""
        if self.size == 1:
            return list(tensors)
        dtypes = []
        for t in tensors:
            if t.dtype not in dtypes:
                dtypes.append(t.dtype)
        packs = [ops.concat([t.reshape(-1) for t in tensors if t.dtype == d]) for d in dtypes]
        got = packs
        for op, peer in self.phases:
            if op == "send":
                for buf in packs:
                    self.comm.send(buf, peer)
            else:
                got = [self.comm.recv(buf, peer) for buf in packs]
        out, offsets = [], [0] * len(dtypes)
        for t in tensors:
            j = dtypes.index(t.dtype)
            n = int(np.prod(t.shape))
            out.append(got[j][offsets[j]:offsets[j] + n].reshape(t.shape))
            offsets[j] += n
        return out


def _halves(x) -> list:
    c = x.shape[2] // 2
    return [x[:, :, :c], x[:, :, c:]]


def _scores(qh, kh, scale: float, kind: str, bias=None):
    s = _BMM_TB(qh, kh).astype(ms.float32) * scale
    if bias is not None:
        return s + bias
    return s + diagonal_bias(qh.shape[2]) if kind == cp_layout.CAUSAL else s


def _block_bias(bias, shift: RingShift, step: int, a: int, b: int, c: int):
    """The [B, 1, c, c] cut of a whole document bias (or None) for query half ``a`` of this
    position and key half ``b`` of the block it holds at ``step``."""
    if bias is None:
        return None
    qc = int(cp_layout.rank_chunks(shift.size, shift.pos)[a]) * c
    kc = int(cp_layout.rank_chunks(shift.size,
                                   cp_layout.ring_source(shift.pos, step, shift.size))[b]) * c
    return bias[:, :, qc:qc + c, kc:kc + c]


def ring_forward(q, k, v, scale: float, shift: RingShift, bias=None):
    """(context [B, N, L, Dv], max_logits [N] (detached), lse [B, N, L, 1] float32);
    ``bias``: a whole document mask bias (module docstring) or None."""
    qs = _halves(q)
    half = int(q.shape[2]) // 2
    state = [None, None]   # per query half: (m, l, acc)
    kb, vb = k, v
    for step in range(shift.size):
        if step:
            kb, vb = shift([kb, vb])
        ks, vs = _halves(kb), _halves(vb)
        for a, b, kind in cp_layout.ring_blocks(shift.pos, step, shift.size):
            s = _scores(qs[a], ks[b], scale, kind, _block_bias(bias, shift, step, a, b, half))
            blk = s.max(axis=-1, keepdims=True)
            m = blk if state[a] is None else ops.maximum(state[a][0], blk)
            p = ops.exp(s - m)
            pv = _BMM(p.astype(vb.dtype), vs[b]).astype(ms.float32)
            if state[a] is None:
                state[a] = (m, p.sum(-1, keepdims=True), pv)
            else:
                c = ops.exp(state[a][0] - m)
                state[a] = (m, state[a][1] * c + p.sum(-1, keepdims=True), state[a][2] * c + pv)
    ctx = ops.concat([acc / l for _, l, acc in state], 2).astype(v.dtype)
    lse = ops.concat([m + ops.log(l) for m, l, _ in state], 2)
    row_max = ops.concat([m for m, _, _ in state], 2)
    return ctx, ops.stop_gradient(ops.amax(row_max, axis=(0, 2, 3))), lse


def ring_backward(q, k, v, ctx, lse, dctx, scale: float, shift: RingShift, bias=None):
    """(dq, dk, dv) of ``ring_forward`` for the context's gradient ``dctx`` (module docstring);
    float32 inside, returned in the inputs' dtypes."""
    f32 = ms.float32
    half = int(q.shape[2]) // 2
    dctx = dctx.astype(f32)
    d_row = (dctx * ctx.astype(f32)).sum(-1, keepdims=True)
    qs, dos, ds_, lses = _halves(q.astype(f32)), _halves(dctx), _halves(d_row), _halves(lse)
    dq = [ops.zeros_like(h) for h in qs]
    kb, vb = k, v
    dk, dv = ops.zeros(k.shape, f32), ops.zeros(v.shape, f32)
    for step in range(shift.size):
        if step:
            kb, vb, dk, dv = shift([kb, vb, dk, dv])
        ks, vs = _halves(kb.astype(f32)), _halves(vb.astype(f32))
        dks, dvs = _halves(dk), _halves(dv)
        for a, b, kind in cp_layout.ring_blocks(shift.pos, step, shift.size):
            p = ops.exp(_scores(qs[a], ks[b], scale, kind,
                                _block_bias(bias, shift, step, a, b, half)) - lses[a])
            dvs[b] = dvs[b] + _BMM_TA(p, dos[a])
            ds = p * (_BMM_TB(dos[a], vs[b]) - ds_[a])
            dq[a] = dq[a] + _BMM(ds, ks[b]) * scale
            dks[b] = dks[b] + _BMM_TA(ds, qs[a]) * scale
        dk, dv = ops.concat(dks, 2), ops.concat(dvs, 2)
    dk, dv = shift([dk, dv])
    return ops.concat(dq, 2).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


class RingAttentionCore(nn.Cell):
    """``(q, k, v) -> (context, max_logits, lse)`` with the ring backward as its ``bprop``
    (MindSpore would otherwise differentiate the send/recv emulation itself)."""

    def __init__(self, shift: RingShift, scale: float):
        super().__init__()
        self.shift, self.scale = shift, float(scale)

    def construct(self, q, k, v):
        return ring_forward(q, k, v, self.scale, self.shift)

    def bprop(self, q, k, v, out, dout):
        ctx, _, lse = out
        return ring_backward(q, k, v, ctx, lse, dout[0], self.scale, self.shift)


class DocumentRingCore(nn.Cell):
    """``(q, k, v, bias) -> (context, max_logits, lse)``: :class:`RingAttentionCore` under a
    whole document mask ``bias`` (module docstring; the bias gets no gradient)."""

    def __init__(self, shift: RingShift, scale: float):
        super().__init__()
        self.shift, self.scale = shift, float(scale)

    def construct(self, q, k, v, bias):
        return ring_forward(q, k, v, self.scale, self.shift, bias)

    def bprop(self, q, k, v, bias, out, dout):
        ctx, _, lse = out
        return ring_backward(q, k, v, ctx, lse, dout[0], self.scale, self.shift,
                             bias) + (ops.zeros_like(bias),)


class RingAttention:
    """The model's core attention ``core(q, k, v, scale, mask_bias) -> (context, max_logits)``
    as ring attention over ``group`` of ``comm`` (module docstring: ``mask_bias`` is read only
    when it is a whole document mask).

    q, k [B, N, L, D], v [B, N, L, Dv]: this rank's two chunks (``cp_layout.split_sequence``
    with the group's size and this rank's position in it). max_logits [N]: over this rank's
    queries only; MAX over the group gives the full sequence's.
    """

    def __init__(self, comm: GroupCommunicator, group: str = "cp"):
        self.shift = RingShift(comm, group)
        self.size, self.pos = self.shift.size, self.shift.pos
        self._cores: Dict[float, RingAttentionCore] = {}

    def __call__(self, q, k, v, scale: float, mask_bias=None):
        if q.shape[2] % 2:
            raise ValueError(f"ring attention: the local sequence length {q.shape[2]} is not "
                             f"even (this rank's two chunks of the load-balanced split)")
        scale = float(scale)
        documents = mask_bias is not None and mask_bias.shape[-1] == q.shape[2] * self.size
        key = (scale, documents)
        if key not in self._cores:
            self._cores[key] = (DocumentRingCore if documents else RingAttentionCore)(
                self.shift, scale)
        if documents:
            ctx, max_logits, _ = self._cores[key](q, k, v, ops.stop_gradient(mask_bias))
        else:
            ctx, max_logits, _ = self._cores[key](q, k, v)
        return ctx, max_logits
