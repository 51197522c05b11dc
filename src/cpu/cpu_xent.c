/* cpu_xent.c — cross-entropy over the logits: xent (one rank holds the vocabulary), the
 * vocab-parallel passes xent_local_stats, xent_local_sumexp, xent_rows, xent_grad, and
 * xent_head, the LM head's GEMMs fused with xent over chunks of rows.
 *
 * A row is one task; the loss of xent is summed over N_PARTIAL fixed row ranges, then
 * the ranges in order, so it is the same for every thread count.  For 16-bit logits a
 * row is widened into the thread's buffer (V floats: this rank's vocabulary slice), the
 * fp32 row code runs on it and the gradient is rounded once as it is stored over the
 * logits, so a 16-bit call gives bitwise the fp32 kernel's results on the widened
 * logits. */
#include "cpu_internal.h"

size_t cpu_xent_buf_floats(int V) { return (size_t)(V > 0 ? V : 1); }

static inline float row_max(const float *z, int V) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
  return m;
}

/* sum_j exp(z_j - m) in double, without storing the exponentials (the loss alone). */
TSR_CLONES static double sum_exp(const float *z, float m, int V) {
  float e[256];
  double sum = 0.0;
  for (int j0 = 0; j0 < V; j0 += 256) {
    const int len = V - j0 < 256 ? V - j0 : 256;
#pragma omp simd
    for (int j = 0; j < len; j++) e[j] = expf_vec(z[j0 + j] - m);
    sum += sum_d(e, len);
  }
  return sum;
}

/* Loss of one row; when grad is set, also overwrites the row with dloss*(softmax-onehot)
 * (grad_row may be z itself).  A target outside [0, V) (e.g. -1 or -100 as an ignore
 * index) contributes zero loss and zero gradient. */
TSR_CLONES static double xent_row(float *grad_row, const float *z, int32_t target, int V,
                                  float dloss) {
  if (target < 0 || target >= V) {
    if (grad_row) memset(grad_row, 0, (size_t)V * sizeof(float));
    return 0.0;
  }
  const float m = row_max(z, V), zt = z[target];
  double sum;
  if (grad_row) { /* store exp(z - m) in place, then scale */
#pragma omp simd
    for (int j = 0; j < V; j++) grad_row[j] = expf_vec(z[j] - m);
    sum = sum_d(grad_row, V);
    const float f = (float)(dloss / sum);
#pragma omp simd
    for (int j = 0; j < V; j++) grad_row[j] *= f;
    grad_row[target] -= dloss;
  } else {
    sum = sum_exp(z, m, V);
  }
  return log(sum) + (double)m - (double)zt;
}

/* Row r of the logits as fp32: in place for fp32 storage, else widened into the
 * thread's buffer. */
static inline float *logit_row(tsr_dtype dt, void *logits, int r, int V) {
  if (dt == TSR_F32) return (float *)logits + (size_t)r * V;
  float *z = cpu_buf_thread();
  widen_row(dt, z, tsr_dtype_at_c(logits, dt, (int64_t)r * V), V);
  return z;
}

void tsr_cpu_xent(tsr_dtype dt, double *acc, double div, void *logits, const int32_t *targets,
                  int n, int V, float dloss, int grad) {
  if (n <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_xent_buf_floats(V));
  double partial[N_PARTIAL];
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < N_PARTIAL; c++) {
    const int r0 = (int)((long)n * c / N_PARTIAL), r1 = (int)((long)n * (c + 1) / N_PARTIAL);
    double s = 0.0;
    for (int r = r0; r < r1; r++) {
      float *z = logit_row(dt, logits, r, V);
      s += xent_row(grad ? z : NULL, z, targets[r], V, dloss);
      if (grad && dt != TSR_F32) narrow_row(dt, tsr_dtype_at(logits, dt, (int64_t)r * V), z, V);
    }
    partial[c] = s;
  }
  double total = 0.0;
  for (int c = 0; c < N_PARTIAL; c++) total += partial[c];
  *acc += total / div;
}

void tsr_cpu_xent_local_stats(tsr_dtype dt, double *row_max_out, double *target_logit,
                              const void *logits, const int32_t *targets, int n, int V,
                              int vocab_start) {
  if (n <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_xent_buf_floats(V));
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    const float *z = logit_row(dt, (void *)logits, r, V);
    row_max_out[r] = row_max(z, V);
    const int t = targets[r] - vocab_start;
    target_logit[r] = (t >= 0 && t < V) ? (double)z[t] : 0.0;
  }
}

void tsr_cpu_xent_local_sumexp(tsr_dtype dt, double *sumexp, const void *logits,
                               const double *row_max_in, int n, int V) {
  if (n <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_xent_buf_floats(V));
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++)
    sumexp[r] = sum_exp(logit_row(dt, (void *)logits, r, V), (float)row_max_in[r], V);
}

void tsr_cpu_xent_rows(double *acc, double div, const double *row_max_in, const double *sumexp,
                       const double *target_logit, int n) {
  double total = 0.0; /* fixed order: the same sum on every rank */
  for (int r = 0; r < n; r++) total += log(sumexp[r]) + row_max_in[r] - target_logit[r];
  *acc += total / div;
}

TSR_CLONES static void exp_scale_row(float *z, float m, float f, int V) {
#pragma omp simd
  for (int j = 0; j < V; j++) z[j] = expf_vec(z[j] - m) * f;
}

void tsr_cpu_xent_grad(tsr_dtype dt, void *logits, const int32_t *targets,
                       const double *row_max_in, const double *sumexp, int n, int V,
                       int vocab_start, float dloss) {
  if (n <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_xent_buf_floats(V));
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    float *z = logit_row(dt, logits, r, V);
    exp_scale_row(z, (float)row_max_in[r], (float)(dloss / sumexp[r]), V);
    const int t = targets[r] - vocab_start;
    if (t >= 0 && t < V) z[t] -= dloss;
    if (dt != TSR_F32) narrow_row(dt, tsr_dtype_at(logits, dt, (int64_t)r * V), z, V);
  }
}

/* ---- xent_head ----
 * Chunk by chunk: the chunk's logits into scratch (cpu_linear_fwd, matmul_fwd's code),
 * its rows by xent_row as xent does them, then the gradient's two GEMMs (cpu_linear_bwd).
 * The rows of a chunk run in parallel in blocks of HEAD_ROWS, whose row losses are then
 * added in row order into xent's N_PARTIAL partial sums: each partial sum sees the same
 * additions in the same order as in xent, over however many chunks its rows fall, so
 * the loss has xent's bits whatever the chunk. */
#define HEAD_ROWS 1024

void tsr_cpu_xent_head(tsr_dtype dt, double *acc, double div, void *dx, float *dw, const void *x,
                       const void *w, const int32_t *targets, void *scratch, int n, int C, int V,
                       int chunk, float dloss) {
  if (n <= 0) return;
  if (chunk <= 0 || chunk > n) chunk = n;
  const int grad = dx || dw;
  double partial[N_PARTIAL] = {0}, loss[HEAD_ROWS];
  int c = 0; /* the partial sum of the next row */
  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int rows = n - r0 < chunk ? n - r0 : chunk;
    const void *xc = tsr_dtype_at_c(x, dt, (int64_t)r0 * C);
    cpu_linear_fwd(dt, scratch, xc, w, NULL, rows, C, V);
    if (dt != TSR_F32) cpu_buf_need(0, cpu_xent_buf_floats(V));
    for (int b0 = 0; b0 < rows; b0 += HEAD_ROWS) {
      const int nb = rows - b0 < HEAD_ROWS ? rows - b0 : HEAD_ROWS;
#pragma omp parallel for schedule(static)
      for (int i = 0; i < nb; i++) {
        const int r = b0 + i; /* the chunk's row */
        float *z = logit_row(dt, scratch, r, V);
        loss[i] = xent_row(grad ? z : NULL, z, targets[r0 + r], V, dloss);
        if (grad && dt != TSR_F32) narrow_row(dt, tsr_dtype_at(scratch, dt, (int64_t)r * V), z, V);
      }
      for (int i = 0; i < nb; i++) {
        const long r = (long)r0 + b0 + i;
        while (r >= (long)n * (c + 1) / N_PARTIAL) c++; /* xent's ranges, in order */
        partial[c] += loss[i];
      }
    }
    if (grad)
      cpu_linear_bwd(dt, dx ? tsr_dtype_at(dx, dt, (int64_t)r0 * C) : NULL, dw, NULL, scratch, xc,
                     w, NULL, rows, C, V);
  }
  if (!acc) return;
  double total = 0.0;
  for (int k = 0; k < N_PARTIAL; k++) total += partial[k];
  *acc += total / div;
}
