/* Multi-tensor fp32 add in one call (trainer/host_accumulate.py drives it).
 *
 *   out[t][i] = a[t][i] + b[t][i]        for every tensor t and element i
 *
 * `out[t]` may be `a[t]` (in-place accumulation), so `out` and `a` are not `restrict`. One
 * fp32 add per element, the rounding of MindSpore's CPU Add kernel (bit-identical).
 * The tensors are cut into blocks of `block` elements, numbered across the tensors in order;
 * a call adds blocks [b_lo, b_hi), so the caller can split the work over threads. Returns the
 * number of elements written.
 */
#include <stdint.h>

static void add_range(float *out, const float *a, const float *restrict b, int64_t lo,
                      int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
}

int64_t mfc_add_blocks(int64_t n, float **out, const float **a, const float **b,
                       const int64_t *numel, int64_t block, int64_t b_lo, int64_t b_hi) {
  int64_t first = 0; /* number of the tensor's first block */
  int64_t done = 0;
  for (int64_t t = 0; t < n && first < b_hi; ++t) {
    const int64_t blocks = (numel[t] + block - 1) / block;
    const int64_t lo_b = b_lo > first ? b_lo - first : 0;
    const int64_t hi_b = b_hi - first < blocks ? b_hi - first : blocks;
    if (lo_b < hi_b) {
      const int64_t lo = lo_b * block;
      const int64_t hi = hi_b * block < numel[t] ? hi_b * block : numel[t];
      add_range(out[t], a[t], b[t], lo, hi);
      done += hi - lo;
    }
    first += blocks;
  }
  return done;
}
