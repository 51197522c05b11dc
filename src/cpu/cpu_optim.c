/* cpu_optim.c — the optimizer's ops: adamw (with the compute copy's refresh fused in),
 * its per-step scalars tsr_ops_adamw_scalars (every backend takes them from here), and
 * sumsq_ranges (the gradient norm).  Master weights, moments and gradients are fp32
 * whatever the storage type; only AdamW's out is stored as out_dt. */
#include "cpu_internal.h"
#include "ops/sumsq_order.h"
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

/* ---- sumsq_ranges in the canonical order of ops/sumsq_order.h ---- */
enum { CHUNK = TSR_SUMSQ_CHUNK, LANES = TSR_SUMSQ_LANES };

/* The lanes' fixed tree: lane t < h adds lane t + h, h = LANES/2 .. 1. */
static double lane_tree(double *acc) {
  for (int h = LANES / 2; h >= 1; h /= 2)
#pragma omp simd
    for (int t = 0; t < h; t++) acc[t] += acc[t + h];
  return acc[0];
}

/* A chunk of k <= CHUNK fp32 values, squared; of doubles, as they are. */
static double chunk_sq(const float *restrict x, long k) {
  double acc[LANES] = {0};
  long j = 0;
  for (; j + LANES <= k; j += LANES)
#pragma omp simd
    for (int t = 0; t < LANES; t++) acc[t] += (double)x[j + t] * (double)x[j + t];
  for (long t = 0; j + t < k; t++) acc[t] += (double)x[j + t] * (double)x[j + t];
  return lane_tree(acc);
}
static double chunk_d(const double *restrict x, long k) {
  double acc[LANES] = {0};
  long j = 0;
  for (; j + LANES <= k; j += LANES)
#pragma omp simd
    for (int t = 0; t < LANES; t++) acc[t] += x[j + t];
  for (long t = 0; j + t < k; t++) acc[t] += x[j + t];
  return lane_tree(acc);
}

/* The node of level L (L = 0: one chunk of the squares) over the n <= CHUNK^(L+1) values
 * at x: its children's sums (level L - 1, each over CHUNK^L values), then their chunk. */
static double node_sum(const float *x, long n, int level, long span) {
  if (level == 0) return chunk_sq(x, n);
  double part[CHUNK]; /* span: the values under one child, CHUNK^level */
  const long k = (n + span - 1) / span;
  if (level == 1) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (long c = 0; c < k; c++) part[c] = chunk_sq(x + c * span, n - c * span < span ? n - c * span : span);
  } else {
    for (long c = 0; c < k; c++)
      part[c] = node_sum(x + c * span, n - c * span < span ? n - c * span : span, level - 1,
                         span / CHUNK);
  }
  return chunk_d(part, k);
}

static double range_sum(const float *x, long n) {
  if (n <= 0) return 0.0;
  int level = 0;
  long span = 1; /* CHUNK^level: the values under one child of the top node */
  for (long cover = CHUNK; cover < n; cover *= CHUNK) level++, span *= CHUNK;
  return node_sum(x, n, level, span);
}

double tsr_cpu_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  double s = 0.0;
  for (int k = 0; k < n_ranges; k++) s += range_sum(x + r[2 * k], (long)(r[2 * k + 1] - r[2 * k]));
  return s;
}
