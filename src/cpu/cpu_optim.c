/* cpu_optim.c — the optimizer's ops: adamw (with the compute copy's refresh fused in),
 * its per-step scalars tsr_ops_adamw_scalars (every backend takes them from here), and
 * sumsq_ranges (the gradient norm).  Master weights, moments and gradients are fp32
 * whatever the storage type; only AdamW's out is stored as out_dt. */
#include "cpu_internal.h"
#ifdef __SSE2__
#include <emmintrin.h>
#endif

tsr_adamw_scalars tsr_ops_adamw_scalars(float lr, float beta1, float beta2, float weight_decay,
                                        long t) {
  const double bc1 = 1.0 - pow((double)beta1, (double)t);
  const double bc2 = 1.0 - pow((double)beta2, (double)t);
  return (tsr_adamw_scalars){.decay = (float)(1.0 - (double)lr * (double)weight_decay),
                             .step_size = (float)((double)lr / bc1),
                             .bc2_sqrt = (float)sqrt(bc2),
                             .one_m_b1 = (float)(1.0 - (double)beta1),
                             .one_m_b2 = (float)(1.0 - (double)beta2)};
}

/* Square roots of a block in place (IEEE-exact like sqrtf).  sqrtf in a loop is a call
 * with an errno check, which the compiler cannot vectorise without -fno-math-errno. */
static void sqrt_block(float *x, int n) {
  int i = 0;
#ifdef __SSE2__
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}

void tsr_cpu_adamw(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, long t, float grad_scale, void *out,
                   tsr_dtype out_dt) {
  const tsr_adamw_scalars s = tsr_ops_adamw_scalars(lr, beta1, beta2, weight_decay, t);
  const float decay = s.decay, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  const float one_m_b1 = s.one_m_b1, one_m_b2 = s.one_m_b2;
  const long nblk = (n + ADAM_BLOCK - 1) / ADAM_BLOCK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (long blk = 0; blk < nblk; blk++) {
    const long i0 = blk * ADAM_BLOCK;
    const int len = n - i0 < ADAM_BLOCK ? (int)(n - i0) : ADAM_BLOCK;
    float *restrict pb = p + i0, *restrict mb = m + i0, *restrict vb = v + i0;
    const float *restrict gb = g + i0;
    float root[ADAM_BLOCK];
#pragma omp simd
    for (int i = 0; i < len; i++) {
      const float gi = gb[i] * grad_scale;
      pb[i] *= decay;
      mb[i] = mb[i] * beta1 + one_m_b1 * gi;
      vb[i] = vb[i] * beta2 + one_m_b2 * gi * gi;
      root[i] = vb[i];
    }
    sqrt_block(root, len);
#pragma omp simd
    for (int i = 0; i < len; i++) {
      const float denom = root[i] / bc2_sqrt + eps;
      pb[i] -= step_size * (mb[i] / denom);
    }
    /* the refresh, while the block is in cache: the same rounding as a cast of p */
    if (out) narrow_row(out_dt, tsr_dtype_at(out, out_dt, i0), pb, len);
  }
}

/* Sum of squares of n fp32 values in double, over N_PARTIAL fixed pieces summed in
 * order: the same bits for every thread count. */
static double sumsq(const float *x, long n_elem) {
  double partial[N_PARTIAL];
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (int c = 0; c < N_PARTIAL; c++) {
    const long i0 = n_elem / N_PARTIAL * c + (c < n_elem % N_PARTIAL ? c : n_elem % N_PARTIAL);
    const long len = n_elem / N_PARTIAL + (c < n_elem % N_PARTIAL ? 1 : 0);
    const float *xc = x + i0;
    double acc[4] = {0, 0, 0, 0};
    long i = 0;
    for (; i + 4 <= len; i += 4)
      for (int u = 0; u < 4; u++) acc[u] += (double)xc[i + u] * xc[i + u];
    for (; i < len; i++) acc[0] += (double)xc[i] * xc[i];
    partial[c] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  double total = 0.0;
  for (int c = 0; c < N_PARTIAL; c++) total += partial[c];
  return total;
}

double tsr_cpu_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  double s = 0.0;
  for (int k = 0; k < n_ranges; k++) s += sumsq(x + r[2 * k], (long)(r[2 * k + 1] - r[2 * k]));
  return s;
}
