/* Sums of squares of many fp32 tensors in one call (optim/host_norm.py drives it).
 *
 * The tensors are cut into blocks of `block` elements, numbered across the tensors in order
 * (as optim/host_adam.c); a call writes the float64 sum of squares of each block in
 * [b_lo, b_hi) to partial[b - b_lo]. Inside a block, LANES independent float64 accumulators
 * take every LANES-th element and are added in a fixed order at the end, so the result does
 * not depend on how the caller splits the blocks over threads (and the compiler may
 * vectorise the lanes without reassociating anything).
 */
#include <stdint.h>

#define LANES 16

static double sq_sum(const float *restrict x, int64_t lo, int64_t hi) {
  double acc[LANES] = {0};
  int64_t i = lo;
  for (; i + LANES <= hi; i += LANES) {
    for (int j = 0; j < LANES; ++j) {
      const double v = (double)x[i + j];
      acc[j] += v * v;
    }
  }
  for (int j = 0; i < hi; ++i, ++j) {
    const double v = (double)x[i];
    acc[j] += v * v;
  }
  double total = 0.0;
  for (int j = 0; j < LANES; ++j) total += acc[j];
  return total;
}

int64_t mfc_sq_sum_blocks(int64_t n, const float **x, const int64_t *numel, int64_t block,
                          int64_t b_lo, int64_t b_hi, double *partial) {
  int64_t first = 0; /* number of the tensor's first block */
  int64_t done = 0;
  for (int64_t t = 0; t < n && first < b_hi; ++t) {
    const int64_t blocks = (numel[t] + block - 1) / block;
    for (int64_t b = b_lo > first ? b_lo : first; b < first + blocks && b < b_hi; ++b) {
      const int64_t lo = (b - first) * block;
      const int64_t hi = lo + block < numel[t] ? lo + block : numel[t];
      partial[b - b_lo] = sq_sum(x[t], lo, hi);
      done += hi - lo;
    }
    first += blocks;
  }
  return done;
}
