/* cpu_norm.c — RMSNorm and LayerNorm, with the residual add before them fused in:
 * rmsnorm_fwd/bwd, layernorm_fwd/bwd.
 *
 * One task per row (16-bit storage: per block of rows) for the forward and the input
 * gradient (statistics in double, eight lanes), one task per block of COL_BLOCK columns
 * for dw and db (rows summed in order, in double).  Every row runs the same row function
 * for every storage type: 16-bit rows are widened into the thread's buffer first (x or
 * the stored h, dout, and dx when it accumulates) and the outputs rounded once; the
 * weight and bias are widened once per call into the shared buffer.  So a 16-bit call
 * gives bitwise the fp32 kernel's results on the widened inputs, rounded.  These row
 * functions are compiled for baseline x86-64 only (no TSR_CLONES), as they always were:
 * with FMA contraction their roundings would depend on the CPU. */
#include "cpu_internal.h"

/* 16-bit storage is converted NORM_BLOCK floats at a time (whole rows, at least one):
 * per row the conversions' calls would cost as much as their work at C = 128. */
#define NORM_BLOCK 2048
static int block_rows(tsr_dtype dt, int C) {
  return dt == TSR_F32 || C >= NORM_BLOCK ? 1 : NORM_BLOCK / C;
}
/* Per thread, for a block of rows: x (or h), dout, and out or dx; enough for every
 * width up to C. */
size_t cpu_norm_buf_floats(int C) { return 3 * (size_t)(C > NORM_BLOCK ? C : NORM_BLOCK); }

/* Rows [r0, r0 + rows) of a norm's input as fp32, for the forward: x, or h = x + y (y !=
 * NULL; stored into h, which may be x, rounded to dt: the residual stream).  fp32
 * storage is read (and h written) in place; 16-bit rows are widened into buf (C floats
 * per row) after the rounded sum is stored. */
static const float *fwd_input_rows(tsr_dtype dt, float *buf, void *h, const void *x,
                                   const void *y, int r0, int rows, int C) {
  const int64_t at = (int64_t)r0 * C;
  const long len = (long)rows * C;
  if (dt == TSR_F32) {
    if (!y) return (const float *)x + at;
    float *hr = (float *)h + at; /* the fp32 residual add, in place when h is x */
    const float *xr = (const float *)x + at, *yr = (const float *)y + at;
    for (long i = 0; i < len; i++) hr[i] = xr[i] + yr[i];
    return hr;
  }
  if (y) { /* h = x + y rounded, then the norm reads h as stored */
    add_row(dt, tsr_dtype_at(h, dt, at), tsr_dtype_at_c(x, dt, at), tsr_dtype_at_c(y, dt, at),
            len);
    x = h;
  }
  widen_row(dt, buf, tsr_dtype_at_c(x, dt, at), len);
  return buf;
}

/* A norm parameter as fp32: in place, or widened into dst (the shared buffer). */
static const float *param_f32(tsr_dtype dt, float *dst, const void *p, int C) {
  if (dt == TSR_F32 || !p) return p;
  widen_row(dt, dst, p, C);
  return dst;
}

/* -------------------------------------------------------------- RMSNorm */

static void rmsnorm_row(float *restrict o, float *rstd, const float *restrict xr,
                        const float *restrict w, int C, float eps) {
  const float rs = (float)(1.0 / sqrt(sumsq_d(xr, C) / C + (double)eps));
  *rstd = rs;
#pragma omp simd
  for (int c = 0; c < C; c++) o[c] = xr[c] * rs * w[c];
}

void tsr_cpu_rmsnorm_fwd(tsr_dtype dt, void *out, float *rstd, void *h, const void *x,
                         const void *y, const void *w, int n, int C, float eps) {
  if (n <= 0 || C <= 0) return;
  const float *wf = w;
  const int R = block_rows(dt, C), nblk = (n + R - 1) / R;
  if (dt != TSR_F32) {
    cpu_buf_need((size_t)C, cpu_norm_buf_floats(C));
    wf = param_f32(dt, cpu_buf_shared(), w, C);
  }
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int blk = 0; blk < nblk; blk++) {
    const int r0 = blk * R, rows = n - r0 < R ? n - r0 : R;
    float *buf = dt == TSR_F32 ? NULL : cpu_buf_thread();
    const float *xr = fwd_input_rows(dt, buf, h, x, y, r0, rows, C);
    float *o = dt == TSR_F32 ? (float *)out + (size_t)r0 * C : buf + 2 * (size_t)R * C;
    for (int i = 0; i < rows; i++)
      rmsnorm_row(o + (size_t)i * C, rstd + r0 + i, xr + (size_t)i * C, wf, C, eps);
    if (dt != TSR_F32) narrow_row(dt, tsr_dtype_at(out, dt, (int64_t)r0 * C), o, (long)rows * C);
  }
}

/* out = x r w, r = (mean x^2 + eps)^-1/2, dr/dx_i = -r^3 x_i / C:
 * dx_i = r (w_i g_i - x_i r^2 <g w, x> / C), added to d (acc) or written. */
static void rmsnorm_dx_row(float *restrict d, const float *restrict xr, const float *restrict g,
                           const float *restrict w, float rs, int C, int acc) {
  float gw[C];
#pragma omp simd
  for (int c = 0; c < C; c++) gw[c] = g[c] * w[c];
  const double dot = dot_d(gw, xr, C);
  const float k = (float)(dot / C) * rs * rs;
  if (acc) {
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] += rs * (gw[c] - xr[c] * k);
  } else {
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] = rs * (gw[c] - xr[c] * k);
  }
}

/* Rows [r0, r0 + rows) of x, dout and (acc) dx as fp32 for a norm's input gradient: in
 * place for fp32 storage, else widened into buf (3 rows x C floats per row); *d is where
 * the rows' dx are formed. */
static void bwd_rows(tsr_dtype dt, float *buf, const float **xr, const float **g, float **d,
                     void *dx, const void *x, const void *dout, int r0, int rows, int C,
                     int acc) {
  const int64_t at = (int64_t)r0 * C;
  const long len = (long)rows * C;
  if (dt == TSR_F32) {
    *xr = (const float *)x + at, *g = (const float *)dout + at, *d = (float *)dx + at;
    return;
  }
  widen_row(dt, buf, tsr_dtype_at_c(x, dt, at), len);
  widen_row(dt, buf + len, tsr_dtype_at_c(dout, dt, at), len);
  if (acc) widen_row(dt, buf + 2 * len, tsr_dtype_at_c(dx, dt, at), len);
  *xr = buf, *g = buf + len, *d = buf + 2 * len;
}

/* Columns [c0, c0 + nc) of row r of a dt tensor as fp32: in place, or widened into tmp. */
static inline const float *cols_f32(tsr_dtype dt, float *tmp, const void *p, int r, int C,
                                    int c0, int nc) {
  const int64_t at = (int64_t)r * C + c0;
  if (dt == TSR_F32) return (const float *)p + at;
  widen_row(dt, tmp, tsr_dtype_at_c(p, dt, at), nc);
  return tmp;
}

static void layernorm_dx_row(float *restrict d, const float *restrict xr,
                             const float *restrict g, const float *restrict w, float m, float rs,
                             int C, int acc);

/* dx of either norm (mean NULL: RMSNorm), row blocks over the threads; 16-bit rows are
 * widened into the thread's buffer, computed in fp32 and narrowed once. */
static void norm_dx(tsr_dtype dt, void *dx, const void *dout, const void *x, const void *w,
                    const float *mean, const float *rstd, int n, int C, int acc) {
  const float *wf = w;
  const int R = block_rows(dt, C), nblk = (n + R - 1) / R;
  if (dt != TSR_F32) {
    cpu_buf_need((size_t)C, cpu_norm_buf_floats(C));
    wf = param_f32(dt, cpu_buf_shared(), w, C);
  }
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int blk = 0; blk < nblk; blk++) {
    const int r0 = blk * R, rows = n - r0 < R ? n - r0 : R;
    const float *xr, *g;
    float *d;
    bwd_rows(dt, dt == TSR_F32 ? NULL : cpu_buf_thread(), &xr, &g, &d, dx, x, dout, r0, rows,
             C, acc);
    for (int i = 0; i < rows; i++) {
      const size_t o = (size_t)i * C;
      if (mean)
        layernorm_dx_row(d + o, xr + o, g + o, wf, mean[r0 + i], rstd[r0 + i], C, acc);
      else
        rmsnorm_dx_row(d + o, xr + o, g + o, wf, rstd[r0 + i], C, acc);
    }
    if (dt != TSR_F32) narrow_row(dt, tsr_dtype_at(dx, dt, (int64_t)r0 * C), d, (long)rows * C);
  }
}

void tsr_cpu_rmsnorm_bwd(tsr_dtype dt, void *dx, float *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int n, int C, int acc) {
  if (n <= 0 || C <= 0) return;
  if (dx) norm_dx(dt, dx, dout, x, w, NULL, rstd, n, C, acc);
  if (dw) {
    const int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      const int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      double acc_w[COL_BLOCK] = {0};
      float xt[COL_BLOCK], gt[COL_BLOCK];
      for (int r = 0; r < n; r++) {
        const float *xr = cols_f32(dt, xt, x, r, C, c0, nc);
        const float *g = cols_f32(dt, gt, dout, r, C, c0, nc);
        const float rs = rstd[r];
#pragma omp simd
        for (int c = 0; c < nc; c++) acc_w[c] += (double)(g[c] * xr[c] * rs);
      }
      for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc_w[c];
    }
  }
}

/* ------------------------------------------------------------ LayerNorm */

static void layernorm_row(float *restrict o, float *mean, float *rstd, const float *restrict xr,
                          const float *restrict w, const float *restrict b, int C, float eps) {
  const double mu = sum_d(xr, C) / C;
  double var = 0.0;
  { /* sum (x - mu)^2 in double, eight lanes */
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
      for (int u = 0; u < 8; u++) {
        const double d = xr[c + u] - mu;
        acc[u] += d * d;
      }
    for (int u = 0; c < C; c++, u++) {
      const double d = xr[c] - mu;
      acc[u] += d * d;
    }
    var = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
  const float m = (float)mu, rs = (float)(1.0 / sqrt(var / C + (double)eps));
  *mean = m;
  *rstd = rs;
#pragma omp simd
  for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * rs * w[c] + b[c];
}

void tsr_cpu_layernorm_fwd(tsr_dtype dt, void *out, float *mean, float *rstd, void *h,
                           const void *x, const void *y, const void *w, const void *b, int n,
                           int C, float eps) {
  if (n <= 0 || C <= 0) return;
  const float *wf = w, *bf = b;
  const int R = block_rows(dt, C), nblk = (n + R - 1) / R;
  if (dt != TSR_F32) {
    cpu_buf_need(2 * (size_t)C, cpu_norm_buf_floats(C));
    wf = param_f32(dt, cpu_buf_shared(), w, C);
    bf = param_f32(dt, cpu_buf_shared() + C, b, C);
  }
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int blk = 0; blk < nblk; blk++) {
    const int r0 = blk * R, rows = n - r0 < R ? n - r0 : R;
    float *buf = dt == TSR_F32 ? NULL : cpu_buf_thread();
    const float *xr = fwd_input_rows(dt, buf, h, x, y, r0, rows, C);
    float *o = dt == TSR_F32 ? (float *)out + (size_t)r0 * C : buf + 2 * (size_t)R * C;
    for (int i = 0; i < rows; i++)
      layernorm_row(o + (size_t)i * C, mean + r0 + i, rstd + r0 + i, xr + (size_t)i * C, wf, bf,
                    C, eps);
    if (dt != TSR_F32) narrow_row(dt, tsr_dtype_at(out, dt, (int64_t)r0 * C), o, (long)rows * C);
  }
}

/* xhat = (x - mean) r;  dx = r (g w - mean(g w) - xhat mean(g w xhat)), added or written */
static void layernorm_dx_row(float *restrict d, const float *restrict xr,
                             const float *restrict g, const float *restrict w, float m, float rs,
                             int C, int acc) {
  float gw[C], xhat[C];
#pragma omp simd
  for (int c = 0; c < C; c++) {
    gw[c] = g[c] * w[c];
    xhat[c] = (xr[c] - m) * rs;
  }
  const float a = (float)(sum_d(gw, C) / C), bb = (float)(dot_d(gw, xhat, C) / C);
  if (acc) {
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] += rs * (gw[c] - a - xhat[c] * bb);
  } else {
#pragma omp simd
    for (int c = 0; c < C; c++) d[c] = rs * (gw[c] - a - xhat[c] * bb);
  }
}

void tsr_cpu_layernorm_bwd(tsr_dtype dt, void *dx, float *dw, float *db, const void *dout,
                           const void *x, const void *w, const float *mean, const float *rstd,
                           int n, int C, int acc) {
  if (n <= 0 || C <= 0) return;
  if (dx) norm_dx(dt, dx, dout, x, w, mean, rstd, n, C, acc);
  if (dw || db) {
    const int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      const int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      double aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
      float xt[COL_BLOCK], gt[COL_BLOCK];
      for (int r = 0; r < n; r++) {
        const float *xr = cols_f32(dt, xt, x, r, C, c0, nc);
        const float *g = cols_f32(dt, gt, dout, r, C, c0, nc);
        const float m = mean[r], rs = rstd[r];
#pragma omp simd
        for (int c = 0; c < nc; c++) {
          aw[c] += (double)(g[c] * ((xr[c] - m) * rs));
          ab[c] += g[c];
        }
      }
      for (int c = 0; c < nc; c++) {
        if (dw) dw[c0 + c] += (float)aw[c];
        if (db) db[c0 + c] += (float)ab[c];
      }
    }
  }
}
