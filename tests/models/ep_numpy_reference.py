"""Float64 numpy pieces of the expert-parallel tests: the SwiGLU expert, the all-to-all of
equal chunks, and the one-process output of kept pairs (written from the formulas)."""
import numpy as np

H, F = 6, 5


def swiglu_expert(x, w1, w2):
    h = x @ w1
    g, u = h[..., :F], h[..., F:]
    return (g / (1 + np.exp(-g)) * u) @ w2


def all_to_all(buffers, ep):
    """Chunk d of rank s goes to rank d, where it is chunk s (equal chunks along dim 0)."""
    chunks = [np.split(b, ep) for b in buffers]
    return [np.concatenate([chunks[s][d] for s in range(ep)]) for d in range(ep)]


def reference(x, topk, gates, w1, w2, kept):
    """sum_j g_tj * expert_{e_tj}(x_t) over the kept pairs."""
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk.shape[1]):
            if kept[t, j]:
                out[t] += gates[t, j] * swiglu_expert(x[t], w1[topk[t, j]], w2[topk[t, j]])
    return out
