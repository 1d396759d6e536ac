/* Adam / AdamW over many fp32 tensors in one call (optim/host_adam.py drives it).
 *
 * The tensors are cut into blocks of `block` elements, numbered across the tensors in order;
 * a call updates blocks [b_lo, b_hi), so the caller can split one step over threads. Per
 * element, in the order and fp32 rounding of MindSpore's CPU Adam kernel followed by the
 * decay multiply the optimizer applied after it:
 *
 *   g' = g + l2 * p                      (coupled L2; l2 = 0 otherwise)
 *   m  = m + (g' - m) * (1 - b1)
 *   v  = v + (g' * g' - v) * (1 - b2)
 *   p  = (p - lr * m / (sqrt(v) + eps)) * decay        decay_first = 0
 *   p  = p * decay - lr * m / (sqrt(v) + eps)          decay_first = 1
 *
 * lr and eps carry the bias correction (optim/update_rules.py, AdamRule.scalars).
 */
#include <math.h>
#include <stdint.h>

static void adam_range(float *restrict p, float *restrict m, float *restrict v,
                       const float *restrict g, int64_t lo, int64_t hi, float one_b1,
                       float one_b2, float lr, float eps, float decay, int decay_first,
                       float l2) {
  /* one loop; -O3 unswitches the loop-invariant branch, so both forms vectorise */
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = g[i] + l2 * p[i];
    const float mi = m[i] + (gi - m[i]) * one_b1;
    const float vi = v[i] + (gi * gi - v[i]) * one_b2;
    const float u = lr * mi / (sqrtf(vi) + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = decay_first ? p[i] * decay - u : (p[i] - u) * decay;
  }
}

int64_t mfc_adam_blocks(int64_t n, float **p, float **m, float **v, const float **g,
                        const int64_t *numel, int64_t block, int64_t b_lo, int64_t b_hi,
                        float b1, float b2, float lr, float eps, float decay,
                        int32_t decay_first, float l2) {
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  int64_t first = 0; /* number of the tensor's first block */
  int64_t done = 0;
  for (int64_t t = 0; t < n && first < b_hi; ++t) {
    const int64_t blocks = (numel[t] + block - 1) / block;
    const int64_t lo_b = b_lo > first ? b_lo - first : 0;
    const int64_t hi_b = b_hi - first < blocks ? b_hi - first : blocks;
    if (lo_b < hi_b) {
      const int64_t lo = lo_b * block;
      const int64_t hi = hi_b * block < numel[t] ? hi_b * block : numel[t];
      adam_range(p[t], m[t], v[t], g[t], lo, hi, one_b1, one_b2, lr, eps, decay,
                 decay_first, l2);
      done += hi - lo;
    }
    first += blocks;
  }
  return done;
}
