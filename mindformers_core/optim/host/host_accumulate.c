/* Multi-tensor fp32 add in one call (optim/host_accumulate.py drives it).
 *
 *   out[t][i] = a[t][i] + b[t][i]        for every tensor t < n and element i < numel[t]
 *
 * `out[t]` may be `a[t]` (in-place accumulation), so `out` and `a` are not `restrict`. One
 * fp32 add per element: the rounding of MindSpore's CPU Add kernel (bit-identical). Returns
 * the number of elements written. One thread: the add is memory-bound (on the 2-core test
 * machine two threads were no faster).
 */
#include <stdint.h>

int64_t mfc_add_many(int64_t n, float **out, const float **a, const float **b,
                     const int64_t *numel) {
  int64_t done = 0;
  for (int64_t t = 0; t < n; ++t) {
    float *o = out[t];
    const float *x = a[t];
    const float *restrict y = b[t];
    for (int64_t i = 0; i < numel[t]; ++i) o[i] = x[i] + y[i];
    done += numel[t];
  }
  return done;
}

/* out[t][i] = a[t][i] * factor: clipping's scale of every gradient in one call (one fp32
 * multiply per element: the rounding of MindSpore's CPU Mul). Returns the elements written. */
int64_t mfc_scale_many(int64_t n, float **out, const float **a, float factor,
                       const int64_t *numel) {
  int64_t done = 0;
  for (int64_t t = 0; t < n; ++t) {
    float *restrict o = out[t];
    const float *restrict x = a[t];
    for (int64_t i = 0; i < numel[t]; ++i) o[i] = x[i] * factor;
    done += numel[t];
  }
  return done;
}
