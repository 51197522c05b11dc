/* ops_cpu.c — the CPU backend of ops.h: OpenBLAS GEMMs, OpenMP loops, fp32 compute.
 *
 * This backend is also the reference the CUDA kernels are tested against, so every
 * function is deterministic: each output element (or each reduction) is owned by one
 * task and summed in a fixed order that does not depend on the thread count.  Where
 * gradients are reduced over rows (dw, dbias, dwpe, dwte) the work is split over
 * columns, never over rows, so no two threads ever add into the same element.
 *
 * Attention is flash-style: the forward keeps an online softmax per query row and
 * saves only lse; the backward rebuilds P = exp(s - lse) and never stores a T x T
 * matrix.  dq is computed per query row; dk/dv per (batch, kv head, key block), so one
 * task owns each dk/dv slice and sums over query heads and rows in a fixed order. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops.h"
#include "util.h"

#ifdef _OPENMP
#include <omp.h>
#else /* serial build: the pragmas are ignored, the results are the same */
static void omp_set_num_threads(int n) { (void)n; }
#endif

/* Columns per task for column-split reductions (dw, dbias, dwte, ...). */
#define COL_BLOCK 64
/* Keys per task in the attention backward (dk/dv); local accumulators 2*KEY_BLOCK*hd. */
#define KEY_BLOCK 32
/* Fixed number of partial sums for scalar reductions (sumsq, xent loss): the split
 * depends on n only, so the result is identical for every thread count. */
#define N_PARTIAL 64
/* Elementwise loops shorter than this are not worth waking the thread team. */
#define PAR_MIN 16384

void tsr_ops_init(int n_threads) {
  if (n_threads > 0) {
    openblas_set_num_threads(n_threads);
    omp_set_num_threads(n_threads);
  }
}

/* Dot product with eight independent partial sums: the compiler vectorises it without
 * reassociation, and the summation order is fixed by n alone. */
static inline float dotf(const float *restrict a, const float *restrict b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
  for (int u = 0; i < n; i++, u++) acc[u] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y += a * x */
static inline void axpyf(float *restrict y, float a, const float *restrict x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) /* fixed-size blocks: vectorised at -O2 as well */
    for (int u = 0; u < 8; u++) y[i + u] += a * x[i + u];
  for (; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------------ GEMM */

void tsr_ops_matmul_fwd(float *y, const float *x, const float *w, const float *bias, int n,
                        int in, int out) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int r = 0; r < n; r++) memcpy(y + (size_t)r * out, bias, (size_t)out * sizeof(float));
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta, y,
              out);
}

void tsr_ops_matmul_bwd(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                        const float *w, int n, int in, int out) {
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in, 1.0f,
                dx, in);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 1.0f,
                dw, in);
  if (dbias) {
    int nblk = (out + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * COL_BLOCK, nc = out - c0 < COL_BLOCK ? out - c0 : COL_BLOCK;
      double acc[COL_BLOCK] = {0};
      for (int r = 0; r < n; r++) {
        const float *row = dy + (size_t)r * out + c0;
        for (int c = 0; c < nc; c++) acc[c] += row[c];
      }
      for (int c = 0; c < nc; c++) dbias[c0 + c] += (float)acc[c];
    }
  }
}

/* ------------------------------------------------------------ embedding */

void tsr_ops_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int n, int T, int C, int vocab_start, int vocab_local) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    float *o = out + (size_t)r * C;
    int tok = tokens[r] - vocab_start;
    if (tok >= 0 && tok < vocab_local)
      memcpy(o, wte + (size_t)tok * C, (size_t)C * sizeof(float));
    else
      memset(o, 0, (size_t)C * sizeof(float));
    if (wpe) {
      const float *p = wpe + (size_t)(r % T) * C;
      for (int c = 0; c < C; c++) o[c] += p[c];
    }
  }
}

void tsr_ops_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int n, int T, int C, int vocab_start, int vocab_local) {
  if (dwte) {
    /* Rows may share a token, so split over columns and walk rows in order. */
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      for (int r = 0; r < n; r++) {
        int tok = tokens[r] - vocab_start;
        if (tok < 0 || tok >= vocab_local) continue;
        float *d = dwte + (size_t)tok * C + c0;
        const float *g = dout + (size_t)r * C + c0;
        for (int c = 0; c < nc; c++) d[c] += g[c];
      }
    }
  }
  if (dwpe) {
    int npos = n < T ? n : T;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int t = 0; t < npos; t++) {
      float *d = dwpe + (size_t)t * C;
      for (int r = t; r < n; r += T) {
        const float *g = dout + (size_t)r * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
      }
    }
  }
}

/* -------------------------------------------------------------- RMSNorm */

void tsr_ops_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int n, int C,
                         float eps) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * C;
    float *o = out + (size_t)r * C;
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
    float rs = (float)(1.0 / sqrt(ss / C + (double)eps));
    rstd[r] = rs;
    for (int c = 0; c < C; c++) o[c] = xr[c] * rs * w[c];
  }
}

void tsr_ops_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int n, int C) {
  /* out = x r w, r = (mean x^2 + eps)^-1/2, dr/dx_i = -r^3 x_i / C:
   * dx_i = r (w_i g_i - x_i r^2 <g w, x> / C) */
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int r = 0; r < n; r++) {
      const float *xr = x + (size_t)r * C, *g = dout + (size_t)r * C;
      float *d = dx + (size_t)r * C;
      double dot = 0.0;
      for (int c = 0; c < C; c++) dot += (double)g[c] * w[c] * xr[c];
      float rs = rstd[r];
      float k = (float)(dot / C) * rs * rs;
      for (int c = 0; c < C; c++) d[c] += rs * (w[c] * g[c] - xr[c] * k);
    }
  }
  if (dw) {
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      double acc[COL_BLOCK] = {0};
      for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * C + c0, *g = dout + (size_t)r * C + c0;
        float rs = rstd[r];
        for (int c = 0; c < nc; c++) acc[c] += (double)(g[c] * xr[c] * rs);
      }
      for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc[c];
    }
  }
}

/* ------------------------------------------------------------ LayerNorm */

void tsr_ops_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C, float eps) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * C;
    float *o = out + (size_t)r * C;
    double s = 0.0;
    for (int c = 0; c < C; c++) s += xr[c];
    double mu = s / C, var = 0.0;
    for (int c = 0; c < C; c++) {
      double d = xr[c] - mu;
      var += d * d;
    }
    float m = (float)mu, rs = (float)(1.0 / sqrt(var / C + (double)eps));
    mean[r] = m;
    rstd[r] = rs;
    for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * rs * w[c] + b[c];
  }
}

void tsr_ops_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int n, int C) {
  /* xhat = (x - mean) r;  dx = r (g w - mean(g w) - xhat mean(g w xhat)) */
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int r = 0; r < n; r++) {
      const float *xr = x + (size_t)r * C, *g = dout + (size_t)r * C;
      float *d = dx + (size_t)r * C;
      float m = mean[r], rs = rstd[r];
      double sum_gw = 0.0, sum_gwx = 0.0;
      for (int c = 0; c < C; c++) {
        float gw = g[c] * w[c];
        sum_gw += gw;
        sum_gwx += (double)gw * ((xr[c] - m) * rs);
      }
      float a = (float)(sum_gw / C), bb = (float)(sum_gwx / C);
      for (int c = 0; c < C; c++) d[c] += rs * (g[c] * w[c] - a - (xr[c] - m) * rs * bb);
    }
  }
  if (dw || db) {
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      double aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
      for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * C + c0, *g = dout + (size_t)r * C + c0;
        float m = mean[r], rs = rstd[r];
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

/* ----------------------------------------------------------------- RoPE */

/* dir = +1 rotates by +angle (forward), -1 by -angle (backward, the inverse).  Angles
 * are formed in double: pos * theta^(-2i/hd) reaches ~1e4 rad at long context, where
 * fp32 would lose the phase.  Work is split over positions so each cos/sin pair is
 * computed once per call and applied to every row and head at that position. */
static void rope_apply(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta,
                       int dir) {
  int half = head_dim / 2;
  double inv_freq[half > 0 ? half : 1];
  for (int i = 0; i < half; i++) inv_freq[i] = pow((double)theta, -2.0 * i / head_dim);
  int npos = n < T ? n : T;
#pragma omp parallel for schedule(static) if ((long)n * n_heads * head_dim > PAR_MIN)
  for (int t = 0; t < npos; t++) {
    float cs[half > 0 ? half : 1], sn[half > 0 ? half : 1];
    for (int i = 0; i < half; i++) {
      double ang = (double)t * inv_freq[i];
      cs[i] = (float)cos(ang);
      sn[i] = (float)(dir * sin(ang));
    }
    for (int r = t; r < n; r += T)
      for (int h = 0; h < n_heads; h++) {
        float *a = x + (size_t)r * stride + (size_t)h * head_dim, *b = a + half;
        for (int i = 0; i < half; i++) {
          float xa = a[i], xb = b[i];
          a[i] = xa * cs[i] - xb * sn[i];
          b[i] = xa * sn[i] + xb * cs[i];
        }
      }
  }
}

void tsr_ops_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta) {
  rope_apply(x, n, T, n_heads, head_dim, stride, theta, +1);
}

void tsr_ops_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                      float theta) {
  rope_apply(dx, n, T, n_heads, head_dim, stride, theta, -1);
}

/* ------------------------------------------------------------ attention */

static float attn_scale(int hd) { return (float)(1.0 / sqrt((double)hd)); }

void tsr_ops_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride) {
  const int group = H / KV;
  const float scale = attn_scale(hd);
  const long nrows = (long)B * H * T;
  /* One task per query row (b, h, t); row t costs O(t), hence dynamic scheduling.
   * The result of a row does not depend on which thread computes it. */
#pragma omp parallel for schedule(dynamic, 16)
  for (long idx = 0; idx < nrows; idx++) {
    const int t = (int)(idx % T), h = (int)((idx / T) % H), b = (int)(idx / ((long)T * H));
    const int g = h / group;
    const float *qt = q + ((size_t)b * T + t) * qkv_stride + (size_t)h * hd;
    const float *kb = k + (size_t)b * T * qkv_stride + (size_t)g * hd;
    const float *vb = v + (size_t)b * T * qkv_stride + (size_t)g * hd;
    float acc[hd];
    memset(acc, 0, sizeof acc);
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= t; j++) {
      const float s = scale * dotf(qt, kb + (size_t)j * qkv_stride, hd);
      if (s > m) { /* online softmax: rescale what was summed under the old max */
        const float c = expf(m - s);
        l *= c;
        for (int i = 0; i < hd; i++) acc[i] *= c;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      axpyf(acc, p, vb + (size_t)j * qkv_stride, hd);
    }
    float *o = out + ((size_t)b * T + t) * H * hd + (size_t)h * hd;
    const float inv = 1.0f / l;
    for (int i = 0; i < hd; i++) o[i] = acc[i] * inv;
    lse[((size_t)b * H + h) * T + t] = m + logf(l);
  }
}

void tsr_ops_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride) {
  const int group = H / KV;
  const float scale = attn_scale(hd);
  const size_t out_stride = (size_t)H * hd;

  /* dq: one task per query row, dq_t += scale * sum_j dS_tj k_j. */
  if (dq) {
    const long nrows = (long)B * H * T;
#pragma omp parallel for schedule(dynamic, 16)
    for (long idx = 0; idx < nrows; idx++) {
      const int t = (int)(idx % T), h = (int)((idx / T) % H), b = (int)(idx / ((long)T * H));
      const int g = h / group;
      const size_t row = (size_t)b * T + t;
      const float *qt = q + row * qkv_stride + (size_t)h * hd;
      const float *kb = k + (size_t)b * T * qkv_stride + (size_t)g * hd;
      const float *vb = v + (size_t)b * T * qkv_stride + (size_t)g * hd;
      const float *go = dout + row * out_stride + (size_t)h * hd;
      const float D = dotf(go, out + row * out_stride + (size_t)h * hd, hd);
      const float L = lse[((size_t)b * H + h) * T + t];
      float acc[hd];
      memset(acc, 0, sizeof acc);
      for (int j = 0; j <= t; j++) {
        const float *kj = kb + (size_t)j * qkv_stride;
        const float p = expf(scale * dotf(qt, kj, hd) - L);
        const float dp = dotf(go, vb + (size_t)j * qkv_stride, hd);
        axpyf(acc, p * (dp - D), kj, hd);
      }
      float *d = dq + row * qkv_stride + (size_t)h * hd;
      for (int i = 0; i < hd; i++) d[i] += scale * acc[i];
    }
  }

  /* dk, dv: one task per (b, kv head g, block of keys).  The task sums over the query
   * heads of group g (outer) and the query rows t >= key (inner) in that fixed order,
   * into local accumulators, then adds once into dk/dv. */
  if (dk || dv) {
    const int nkb = (T + KEY_BLOCK - 1) / KEY_BLOCK;
    const long ntasks = (long)B * KV * nkb;
#pragma omp parallel for schedule(dynamic, 1)
    for (long task = 0; task < ntasks; task++) {
      const int kblk = (int)(task % nkb), g = (int)((task / nkb) % KV);
      const int b = (int)(task / ((long)nkb * KV));
      const int j0 = kblk * KEY_BLOCK, j1 = j0 + KEY_BLOCK < T ? j0 + KEY_BLOCK : T;
      const float *kb = k + (size_t)b * T * qkv_stride + (size_t)g * hd;
      const float *vb = v + (size_t)b * T * qkv_stride + (size_t)g * hd;
      float dkl[KEY_BLOCK * hd], dvl[KEY_BLOCK * hd];
      memset(dkl, 0, sizeof dkl);
      memset(dvl, 0, sizeof dvl);
      for (int h = g * group; h < (g + 1) * group; h++)
        for (int t = j0; t < T; t++) {
          const size_t row = (size_t)b * T + t;
          const float *qt = q + row * qkv_stride + (size_t)h * hd;
          const float *go = dout + row * out_stride + (size_t)h * hd;
          const float D = dotf(go, out + row * out_stride + (size_t)h * hd, hd);
          const float L = lse[((size_t)b * H + h) * T + t];
          const int jend = t + 1 < j1 ? t + 1 : j1;
          for (int j = j0; j < jend; j++) {
            const float p = expf(scale * dotf(qt, kb + (size_t)j * qkv_stride, hd) - L);
            const float dp = dotf(go, vb + (size_t)j * qkv_stride, hd);
            axpyf(dvl + (size_t)(j - j0) * hd, p, go, hd);
            axpyf(dkl + (size_t)(j - j0) * hd, p * (dp - D), qt, hd);
          }
        }
      for (int j = j0; j < j1; j++) {
        const size_t off = ((size_t)b * T + j) * qkv_stride + (size_t)g * hd;
        if (dk) {
          float *d = dk + off;
          const float *s = dkl + (size_t)(j - j0) * hd;
          for (int i = 0; i < hd; i++) d[i] += scale * s[i];
        }
        if (dv) {
          float *d = dv + off;
          const float *s = dvl + (size_t)(j - j0) * hd;
          for (int i = 0; i < hd; i++) d[i] += s[i];
        }
      }
    }
  }
}

/* -------------------------------------------------------- SwiGLU, GELU */

void tsr_ops_swiglu_fwd(float *out, const float *gate_up, int n, int F) {
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *g = gate_up + (size_t)r * 2 * F, *u = g + F;
    float *o = out + (size_t)r * F;
    for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

void tsr_ops_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n, int F) {
  /* silu(g) = g s, s = sigmoid(g);  silu'(g) = s (1 + g (1 - s)) */
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *g = gate_up + (size_t)r * 2 * F, *u = g + F;
    const float *d = dout + (size_t)r * F;
    float *dg = dgate_up + (size_t)r * 2 * F, *du = dg + F;
    for (int j = 0; j < F; j++) {
      const float s = 1.0f / (1.0f + expf(-g[j]));
      dg[j] += d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      du[j] += d[j] * g[j] * s;
    }
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

void tsr_ops_gelu_fwd(float *out, const float *x, int n_elem) {
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (int i = 0; i < n_elem; i++) {
    const float xi = x[i];
    out[i] = 0.5f * xi * (1.0f + tanhf(GELU_C * (xi + GELU_A * xi * xi * xi)));
  }
}

void tsr_ops_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem) {
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (int i = 0; i < n_elem; i++) {
    const float xi = x[i];
    const float th = tanhf(GELU_C * (xi + GELU_A * xi * xi * xi));
    const float du = GELU_C * (1.0f + 3.0f * GELU_A * xi * xi);
    dx[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
  }
}

/* ----------------------------------------------------------- elementwise */

void tsr_ops_add(float *out, const float *a, const float *b, long n_elem) {
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] = a[i] + b[i];
}

void tsr_ops_acc(float *out, const float *a, long n_elem) {
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] += a[i];
}

void tsr_ops_scale(float *x, float s, long n_elem) {
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) x[i] *= s;
}

/* -------------------------------------------------------- cross entropy */

/* Loss of one row; when grad is set, also overwrites the row with dloss*(softmax-onehot).
 * A target outside [0, V) (e.g. -1 or -100 as an ignore index) contributes zero loss
 * and zero gradient. */
static double xent_row(float *grad_row, const float *z, int32_t target, int V, float dloss) {
  if (target < 0 || target >= V) {
    if (grad_row) memset(grad_row, 0, (size_t)V * sizeof(float));
    return 0.0;
  }
  float m = -INFINITY;
  for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
  const float zt = z[target];
  double sum = 0.0;
  if (grad_row) { /* store exp(z - m) in place, then scale */
    for (int j = 0; j < V; j++) {
      const float e = expf(z[j] - m);
      grad_row[j] = e;
      sum += e;
    }
    const float f = (float)(dloss / sum);
    for (int j = 0; j < V; j++) grad_row[j] *= f;
    grad_row[target] -= dloss;
  } else {
    for (int j = 0; j < V; j++) sum += expf(z[j] - m);
  }
  return log(sum) + (double)m - (double)zt;
}

static double xent(float *grad, const float *logits, const int32_t *targets, int n, int V,
                   float dloss) {
  double partial[N_PARTIAL];
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < N_PARTIAL; c++) {
    const int r0 = (int)((long)n * c / N_PARTIAL), r1 = (int)((long)n * (c + 1) / N_PARTIAL);
    double s = 0.0;
    for (int r = r0; r < r1; r++)
      s += xent_row(grad ? grad + (size_t)r * V : NULL, logits + (size_t)r * V, targets[r], V,
                    dloss);
    partial[c] = s;
  }
  double total = 0.0;
  for (int c = 0; c < N_PARTIAL; c++) total += partial[c];
  return total;
}

double tsr_ops_xent_fwd_bwd(float *logits, const int32_t *targets, int n, int V, float dloss) {
  return xent(logits, logits, targets, n, V, dloss);
}

double tsr_ops_xent_fwd(const float *logits, const int32_t *targets, int n, int V) {
  return xent(NULL, logits, targets, n, V, 0.0f);
}

void tsr_ops_xent_local_stats(double *row_max, double *target_logit, const float *logits,
                              const int32_t *targets, int n, int V, int vocab_start) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * V;
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
    row_max[r] = m;
    const int t = targets[r] - vocab_start;
    target_logit[r] = (t >= 0 && t < V) ? (double)z[t] : 0.0;
  }
}

void tsr_ops_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max, int n,
                               int V) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * V;
    const float m = (float)row_max[r];
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += expf(z[j] - m);
    sumexp[r] = sum;
  }
}

double tsr_ops_xent_rows(const double *row_max, const double *sumexp, const double *target_logit,
                         int n) {
  double total = 0.0; /* fixed order: the same sum on every rank */
  for (int r = 0; r < n; r++) total += log(sumexp[r]) + row_max[r] - target_logit[r];
  return total;
}

void tsr_ops_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                       const double *sumexp, int n, int V, int vocab_start, float dloss) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    float *z = logits + (size_t)r * V;
    const float m = (float)row_max[r];
    const float f = (float)(dloss / sumexp[r]);
    for (int j = 0; j < V; j++) z[j] = expf(z[j] - m) * f;
    const int t = targets[r] - vocab_start;
    if (t >= 0 && t < V) z[t] -= dloss;
  }
}

/* ---------------------------------------------------------------- AdamW */

void tsr_ops_adamw(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, long t, float grad_scale) {
  /* Scalars as torch forms them: Python doubles, cast to fp32 where they meet a tensor. */
  const double bc1 = 1.0 - pow((double)beta1, (double)t);
  const double bc2 = 1.0 - pow((double)beta2, (double)t);
  const float decay = (float)(1.0 - (double)lr * (double)weight_decay);
  const float step_size = (float)((double)lr / bc1);
  const float bc2_sqrt = (float)sqrt(bc2);
  const float one_m_b1 = (float)(1.0 - (double)beta1), one_m_b2 = (float)(1.0 - (double)beta2);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (long i = 0; i < n; i++) {
    const float gi = g[i] * grad_scale;
    p[i] *= decay;
    m[i] = m[i] * beta1 + one_m_b1 * gi;
    v[i] = v[i] * beta2 + one_m_b2 * gi * gi;
    const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

/* ---------------------------------------------------- casts, reductions */

void tsr_ops_round_bf16(float *dst, const float *src, long n_elem) {
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) dst[i] = tsr_round_bf16(src[i]);
}

double tsr_ops_sumsq(const float *x, long n_elem) {
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

int tsr_ops_all_finite(const float *x, long n_elem) {
  unsigned bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return !bad;
}
