/* ops_cpu.c — the CPU backend of ops.h: OpenBLAS GEMMs, OpenMP loops, fp32 compute.
 *
 * This backend is also the reference the CUDA kernels are tested against, so every
 * function is deterministic: each output element (or each reduction) is owned by one
 * task and summed in a fixed order.  Where gradients are reduced over rows (dw, dbias,
 * dwpe, dwte) the work is split over columns, never over rows, so no two threads ever
 * add into the same element.  Everything but the GEMMs gives the same bits for every
 * thread count; a GEMM's pieces follow the thread count (below), and OpenBLAS's kernels
 * round an element's k-sum differently at piece edges, so its last bits may change with
 * OMP_NUM_THREADS (as they did when OpenBLAS threaded itself).
 *
 * Threads.  There is one thread pool, OpenMP's.  OpenBLAS is told to use one thread and
 * each GEMM is split into pieces along the rows or columns of its output (never along
 * the summed dimension), one single-threaded sgemm per OpenMP thread.  Letting OpenBLAS's
 * own pthreads and the OpenMP team share the cores makes both spin against each other
 * between every GEMM and the element-wise op after it (measured 1.6x slower per step
 * than either pool alone on 2 cores).
 *
 * Speed.  The element-wise loops are written so the compiler vectorises them at -O2 with
 * the baseline x86-64 instruction set (SSE2): `omp simd` loops without branches, fixed-
 * width lanes for sums, and an exp of our own (expf_vec) because libm's expf and tanhf
 * are scalar calls — they were 15% of a tiny-model step.
 *
 * Attention works on blocks of ATT_QB query rows against chunks of ATT_KC keys, each
 * block product a single-threaded sgemm, and never stores a T x T matrix.  The forward
 * keeps an online softmax per query row and saves only lse.  The backward rebuilds
 * P = exp(s - lse) block by block; one task per (batch, KV head) owns dk/dv of that head
 * and dq of its query heads, so nothing is shared between tasks and every sum runs in a
 * fixed order (key chunks ascending, then heads, then query blocks). */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "ops.h"
#include "ops_backend.h"
#include "util.h"

#ifdef _OPENMP
#include <omp.h>
#else /* serial build: the pragmas are ignored, the results are the same */
static int omp_get_max_threads(void) { return 1; }
static int omp_in_parallel(void) { return 0; }
#endif

/* Columns per task for column-split reductions (dw, dbias, dwte, ...). */
#define COL_BLOCK 64
/* Attention tiles: query rows per block, keys per chunk.  A thread's scratch is two
 * ATT_QB x ATT_KC tiles and two ATT_KC x head_dim accumulators, on its stack. */
#define ATT_QB 64
#define ATT_KC 256
/* Fixed number of partial sums for scalar reductions (sumsq, xent loss): the split
 * depends on n only, so the result is identical for every thread count. */
#define N_PARTIAL 64
/* Elementwise loops shorter than this are not worth waking the thread team. */
#define PAR_MIN 16384
/* GEMMs below this many flops run as one call. */
#define GEMM_PAR_MIN_FLOPS 2e6
/* AdamW works in blocks of this many elements (the square roots of one block). */
#define ADAM_BLOCK 512
/* Element-wise work per task in the flat (not row-wise) kernels. */
#define ELEM_BLOCK 4096

/* The kernels heavy in exp are TSR_CLONES (util.h): the default build targets baseline
 * x86-64 (SSE2), where exp runs 4 lanes wide; AVX2+FMA gives 8, AVX-512 16.  Results are
 * deterministic on a given CPU; CPUs of different levels round differently (FMA). */

/* ---- a device backend (ops_backend.h): when one is installed every op goes to it ---- */
static const tsr_ops_backend *dev;
tsr_ops_device_opener tsr_ops_cuda_open;
#define DEV_VOID(op, ...)   \
  do {                      \
    if (dev) {              \
      dev->op(__VA_ARGS__); \
      return;               \
    }                       \
  } while (0)
#define DEV_RET(op, ...) \
  do {                   \
    if (dev) return dev->op(__VA_ARGS__); \
  } while (0)

void tsr_ops_set_backend(const tsr_ops_backend *b) { dev = b; }
int tsr_ops_on_device(void) { return dev != NULL; }
size_t tsr_ops_mem_bytes(void) { return dev ? dev->mem_bytes(0) : tsr_mem_bytes(); }
size_t tsr_ops_mem_peak_bytes(void) { return dev ? dev->mem_bytes(1) : tsr_mem_peak_bytes(); }
void tsr_ops_mem_reset_peak(void) {
  if (dev) dev->mem_bytes(2);
}

void *tsr_ops_alloc(size_t count, size_t size) {
  if (!dev) return tsr_calloc(count, size);
  if (count != 0 && size > SIZE_MAX / count) {
    tsr_error("%s: allocation of %zu x %zu bytes overflows", dev->name, count, size);
    return NULL;
  }
  return dev->alloc(count * size);
}
void tsr_ops_free_(void **p) {
  if (!p || !*p) return;
  if (dev)
    dev->free(*p);
  else
    tsr_free_(p);
  *p = NULL;
}
void tsr_ops_copy(void *dst, const void *src, size_t bytes) {
  if (dev)
    dev->copy(dst, src, bytes);
  else if (dst != src && bytes)
    memmove(dst, src, bytes);
}
void tsr_ops_zero(void *dst, size_t bytes) {
  if (dev)
    dev->zero(dst, bytes);
  else if (bytes)
    memset(dst, 0, bytes);
}
void tsr_ops_sync(void) {
  if (dev) dev->sync();
}
int tsr_ops_status(void) { return dev ? dev->status() : 0; }
void tsr_ops_set_matmul_inputs(int mode) { /* the CPU computes in fp32 whatever the mode */
  if (dev) dev->set_matmul_inputs(mode);
}
int tsr_ops_reserve(const tsr_ops_shapes *s) { return dev ? dev->reserve(s) : 0; }

void tsr_ops_init(int n_threads) {
#ifdef _OPENMP
  openblas_set_num_threads(1); /* GEMMs are split over the OpenMP threads (gemm below) */
  /* OPENBLAS_NUM_THREADS alone (as some scripts set it) still sets the threads per rank */
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  if (n_threads <= 0 && !getenv("OMP_NUM_THREADS") && blas && atoi(blas) > 0)
    n_threads = atoi(blas);
  if (n_threads > 0) omp_set_num_threads(n_threads);
#else
  if (n_threads > 0) openblas_set_num_threads(n_threads);
#endif
}

/* ------------------------------------------------------------- helpers */

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

/* Sums in double over eight lanes, in an order fixed by n: sum x_i, sum x_i^2,
 * sum x_i y_i. */
#define LANES_SUM(expr)                                                                    \
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
  long i = 0;                                                                              \
  for (; i + 8 <= n; i += 8)                                                               \
    for (int u = 0; u < 8; u++) {                                                          \
      const long k = i + u;                                                                \
      acc[u] += (expr);                                                                    \
    }                                                                                      \
  for (int u = 0; i < n; i++, u++) {                                                       \
    const long k = i;                                                                      \
    acc[u] += (expr);                                                                      \
  }                                                                                        \
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
static inline double sum_d(const float *restrict x, long n) { LANES_SUM((double)x[k]); }
static inline double sumsq_d(const float *restrict x, long n) {
  LANES_SUM((double)x[k] * x[k]);
}
static inline double dot_d(const float *restrict x, const float *restrict y, long n) {
  LANES_SUM((double)x[k] * y[k]);
}

/* y += a * x */
static inline void axpyf(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp(x) for |x| <= 87.33 to 1.5 ulp (measured 1.4 over the range); larger |x| is clamped
 * to 87.33 (results 1.2e-38 .. 8.5e37: the float range without subnormals), NaN stays NaN.
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-5 polynomial for e^r,
 * 2^n built in the exponent bits.  Plain arithmetic without branches, so `omp simd` loops
 * that call it vectorise; libm's expf is a scalar call.  The clamp is done on the bits
 * (an integer select): a float compare-and-select here makes the compiler duplicate the
 * whole body for the clamped value and give up vectorising. */
static inline float expf_vec(float x) {
  int32_t bits;
  memcpy(&bits, &x, sizeof bits);
  int32_t mag = bits & 0x7fffffff;
  mag = mag > 0x42aeac50 && mag <= 0x7f800000 ? 0x42aeac50 : mag; /* 87.3365 */
  bits = (bits & (int32_t)0x80000000) | mag;
  memcpy(&x, &bits, sizeof x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float y = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                      4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * r) * r +
                  r + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof scale);
  return y * scale;
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

/* ------------------------------------------------------------------ GEMM */

/* C[M,N] = op(A) op(B) + beta C (row-major), split into one piece per thread along the
 * larger of M and N.  Each element of C is one single-threaded sgemm's sum over the whole
 * of K: no partial sums meet, and a given thread count always gives the same pieces. */
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* an empty sum: C = beta C (BLAS would refuse the leading dimensions) */
    for (int r = 0; r < M; r++)
      for (int c = 0; c < N; c++) {
        float *y = C + (size_t)r * ldc + c;
        *y = beta == 0.0f ? 0.0f : beta * *y;
      }
    return;
  }
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * M * N * K < GEMM_PAR_MIN_FLOPS) nt = 1;
  const int split_n = N >= M, dim = split_n ? N : M;
  int chunk = (dim + nt - 1) / nt;
  chunk = (chunk + 15) / 16 * 16; /* whole register tiles of the kernels */
  const int pieces = (dim + chunk - 1) / chunk;
  if (pieces <= 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(pieces)
  for (int p = 0; p < pieces; p++) {
    const int o = p * chunk, len = dim - o < chunk ? dim - o : chunk;
    if (split_n)
      cblas_sgemm(CblasRowMajor, ta, tb, M, len, K, 1.0f, A, lda,
                  tb == CblasNoTrans ? B + o : B + (size_t)o * ldb, ldb, beta, C + o, ldc);
    else
      cblas_sgemm(CblasRowMajor, ta, tb, len, N, K, 1.0f,
                  ta == CblasNoTrans ? A + (size_t)o * lda : A + o, lda, B, ldb, beta,
                  C + (size_t)o * ldc, ldc);
  }
}

void tsr_ops_matmul_fwd(float *y, const float *x, const float *w, const float *bias, int n,
                        int in, int out) {
  DEV_VOID(matmul_fwd, y, x, w, bias, n, in, out);
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int r = 0; r < n; r++) memcpy(y + (size_t)r * out, bias, (size_t)out * sizeof(float));
    beta = 1.0f;
  }
  gemm(CblasNoTrans, CblasTrans, n, out, in, x, in, w, in, beta, y, out);
}

void tsr_ops_matmul_bwd(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                        const float *w, int n, int in, int out) {
  DEV_VOID(matmul_bwd, dx, dw, dbias, dy, x, w, n, in, out);
  if (dx) gemm(CblasNoTrans, CblasNoTrans, n, in, out, dy, out, w, in, 0.0f, dx, in);
  if (dw) gemm(CblasTrans, CblasNoTrans, out, in, n, dy, out, x, in, 1.0f, dw, in);
  if (dbias) {
    int nblk = (out + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * COL_BLOCK, nc = out - c0 < COL_BLOCK ? out - c0 : COL_BLOCK;
      double acc[COL_BLOCK] = {0};
      for (int r = 0; r < n; r++) {
        const float *row = dy + (size_t)r * out + c0;
#pragma omp simd
        for (int c = 0; c < nc; c++) acc[c] += row[c];
      }
      for (int c = 0; c < nc; c++) dbias[c0 + c] += (float)acc[c];
    }
  }
}

/* ------------------------------------------------------------ embedding */

void tsr_ops_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int n, int T, int C, int vocab_start, int vocab_local) {
  DEV_VOID(embedding_fwd, out, tokens, wte, wpe, n, T, C, vocab_start, vocab_local);
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
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += p[c];
    }
  }
}

void tsr_ops_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int n, int T, int C, int vocab_start, int vocab_local) {
  DEV_VOID(embedding_bwd, dwte, dwpe, dout, tokens, n, T, C, vocab_start, vocab_local);
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
#pragma omp simd
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
#pragma omp simd
        for (int c = 0; c < C; c++) d[c] += g[c];
      }
    }
  }
}

/* -------------------------------------------------------------- RMSNorm */

void tsr_ops_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int n, int C,
                         float eps) {
  DEV_VOID(rmsnorm_fwd, out, rstd, x, w, n, C, eps);
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * C;
    float *o = out + (size_t)r * C;
    const float rs = (float)(1.0 / sqrt(sumsq_d(xr, C) / C + (double)eps));
    rstd[r] = rs;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = xr[c] * rs * w[c];
  }
}

void tsr_ops_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int n, int C) {
  DEV_VOID(rmsnorm_bwd, dx, dw, dout, x, w, rstd, n, C);
  /* out = x r w, r = (mean x^2 + eps)^-1/2, dr/dx_i = -r^3 x_i / C:
   * dx_i = r (w_i g_i - x_i r^2 <g w, x> / C) */
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int r = 0; r < n; r++) {
      const float *xr = x + (size_t)r * C, *g = dout + (size_t)r * C;
      float *d = dx + (size_t)r * C;
      float gw[C];
#pragma omp simd
      for (int c = 0; c < C; c++) gw[c] = g[c] * w[c];
      const double dot = dot_d(gw, xr, C);
      const float rs = rstd[r];
      const float k = (float)(dot / C) * rs * rs;
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] += rs * (gw[c] - xr[c] * k);
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
        const float rs = rstd[r];
#pragma omp simd
        for (int c = 0; c < nc; c++) acc[c] += (double)(g[c] * xr[c] * rs);
      }
      for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc[c];
    }
  }
}

/* ------------------------------------------------------------ LayerNorm */

void tsr_ops_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C, float eps) {
  DEV_VOID(layernorm_fwd, out, mean, rstd, x, w, b, n, C, eps);
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * C;
    float *o = out + (size_t)r * C;
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
    mean[r] = m;
    rstd[r] = rs;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * rs * w[c] + b[c];
  }
}

void tsr_ops_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int n, int C) {
  DEV_VOID(layernorm_bwd, dx, dw, db, dout, x, w, mean, rstd, n, C);
  /* xhat = (x - mean) r;  dx = r (g w - mean(g w) - xhat mean(g w xhat)) */
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int r = 0; r < n; r++) {
      const float *xr = x + (size_t)r * C, *g = dout + (size_t)r * C;
      float *d = dx + (size_t)r * C;
      const float m = mean[r], rs = rstd[r];
      float gw[C], xhat[C];
#pragma omp simd
      for (int c = 0; c < C; c++) {
        gw[c] = g[c] * w[c];
        xhat[c] = (xr[c] - m) * rs;
      }
      const float a = (float)(sum_d(gw, C) / C), bb = (float)(dot_d(gw, xhat, C) / C);
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] += rs * (gw[c] - a - xhat[c] * bb);
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
#pragma omp simd
        for (int i = 0; i < half; i++) {
          float xa = a[i], xb = b[i];
          a[i] = xa * cs[i] - xb * sn[i];
          b[i] = xa * sn[i] + xb * cs[i];
        }
      }
  }
}

void tsr_ops_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta) {
  DEV_VOID(rope_fwd, x, n, T, n_heads, head_dim, stride, theta);
  rope_apply(x, n, T, n_heads, head_dim, stride, theta, +1);
}

void tsr_ops_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                      float theta) {
  DEV_VOID(rope_bwd, dx, n, T, n_heads, head_dim, stride, theta);
  rope_apply(dx, n, T, n_heads, head_dim, stride, theta, -1);
}

/* ------------------------------------------------------------ attention */

static float attn_scale(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* C[M,N] (ldc) = alpha op(A) op(B) + beta C in the calling thread: the attention tiles,
 * inside a parallel loop (OpenBLAS runs single-threaded there, see tsr_ops_init). */
static void tile_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Query rows [i0, i1) of one (batch, head), against keys in chunks of ATT_KC with an
 * online softmax: q, k, v point at the head's row 0.  Each chunk is two GEMMs, S = Q K^T
 * and acc += P V; the chunk holding the diagonal computes its masked corner too (at most
 * ATT_QB^2/2 wasted products per row block) and sets P = 0 there. */
TSR_CLONES static void attn_fwd_rows(float *out, size_t out_stride, float *lse,
                                     const float *q, const float *k, const float *v, int stride,
                                     int hd, int i0, int i1, float scale) {
  const int nq = i1 - i0;
  float s[ATT_QB * ATT_KC], acc[ATT_QB * hd], m[ATT_QB], l[ATT_QB];
  for (int ii = 0; ii < nq; ii++) m[ii] = -INFINITY, l[ii] = 0.0f;
  for (int j0 = 0; j0 < i1; j0 += ATT_KC) {
    const int nk = i1 - j0 < ATT_KC ? i1 - j0 : ATT_KC;
    tile_gemm(CblasNoTrans, CblasTrans, nq, nk, hd, scale, q + (size_t)i0 * stride, stride,
              k + (size_t)j0 * stride, stride, 0.0f, s, ATT_KC);
    for (int ii = 0; ii < nq; ii++) {
      const int jn = i0 + ii - j0 + 1 < nk ? i0 + ii - j0 + 1 : nk; /* keys j <= i */
      float *sr = s + ii * ATT_KC, *a = acc + ii * hd;
      float mx = m[ii];
#pragma omp simd reduction(max : mx)
      for (int jj = 0; jj < jn; jj++) mx = sr[jj] > mx ? sr[jj] : mx;
#pragma omp simd
      for (int jj = 0; jj < jn; jj++) sr[jj] = expf_vec(sr[jj] - mx);
      for (int jj = jn; jj < nk; jj++) sr[jj] = 0.0f;
      /* online softmax: rescale what was summed under the old max */
      const float c = j0 == 0 ? 0.0f : mx > m[ii] ? expf(m[ii] - mx) : 1.0f;
      if (j0 > 0) {
#pragma omp simd
        for (int d = 0; d < hd; d++) a[d] *= c;
      }
      l[ii] = l[ii] * c + (float)sum_d(sr, jn);
      m[ii] = mx;
    }
    tile_gemm(CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, s, ATT_KC, v + (size_t)j0 * stride,
              stride, j0 == 0 ? 0.0f : 1.0f, acc, hd);
  }
  for (int ii = 0; ii < nq; ii++) {
    float *o = out + (size_t)(i0 + ii) * out_stride;
    const float inv = 1.0f / l[ii];
#pragma omp simd
    for (int d = 0; d < hd; d++) o[d] = acc[ii * hd + d] * inv;
    lse[i0 + ii] = m[ii] + logf(l[ii]);
  }
}

void tsr_ops_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride) {
  DEV_VOID(attention_fwd, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride);
  const int group = H / KV, nqb = (T + ATT_QB - 1) / ATT_QB;
  const float scale = attn_scale(hd);
  const long ntasks = (long)B * H * nqb;
  /* One task per (b, h, block of query rows); later blocks cost more (causal), hence
   * dynamic scheduling.  A task's result does not depend on which thread computes it. */
#pragma omp parallel for schedule(dynamic, 1)
  for (long task = 0; task < ntasks; task++) {
    const int qb = (int)(task % nqb), h = (int)((task / nqb) % H);
    const int b = (int)(task / ((long)nqb * H)), g = h / group;
    const int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < T ? i0 + ATT_QB : T;
    const size_t base = (size_t)b * T * qkv_stride;
    attn_fwd_rows(out + (size_t)b * T * H * hd + (size_t)h * hd, (size_t)H * hd,
                  lse + ((size_t)b * H + h) * T, q + base + (size_t)h * hd,
                  k + base + (size_t)g * hd, v + base + (size_t)g * hd, qkv_stride, hd, i0, i1,
                  scale);
  }
}

/* The backward of one (batch, KV head) over its query heads h0 .. h0+group-1.  Pointers
 * are at the batch's row 0 (q, dq, dout, out: head 0; k, v, dk, dv: this KV head); a
 * NULL gradient is not computed.  For each chunk of ATT_KC keys, and each query block
 * at or below it: S = Q K^T, P = exp(scale S - lse), dP = dO V^T, dS = P (dP - D) with
 * D = rowsum(dO O); then dV += P^T dO, dK += scale dS^T Q (both kept for the chunk),
 * dQ += scale dS K (into dq directly: this task owns those rows). */
TSR_CLONES static void attn_bwd_head(float *dq, float *dk, float *dv, const float *dout,
                                     const float *out, size_t out_stride, const float *lse,
                                     const float *q, const float *k, const float *v, int stride,
                                     int T, int hd, int h0, int group, float scale) {
  const int ost = (int)out_stride;
  float p[ATT_QB * ATT_KC], dp[ATT_QB * ATT_KC], dkl[ATT_KC * hd], dvl[ATT_KC * hd], D[ATT_QB];
  for (int j0 = 0; j0 < T; j0 += ATT_KC) {
    const int nk = T - j0 < ATT_KC ? T - j0 : ATT_KC;
    const float *kc = k + (size_t)j0 * stride, *vc = v + (size_t)j0 * stride;
    memset(dkl, 0, sizeof dkl);
    memset(dvl, 0, sizeof dvl);
    for (int h = h0; h < h0 + group; h++)
      for (int i0 = j0 / ATT_QB * ATT_QB; i0 < T; i0 += ATT_QB) {
        const int nq = T - i0 < ATT_QB ? T - i0 : ATT_QB;
        const int nkb = i0 + nq - j0 < nk ? i0 + nq - j0 : nk; /* keys j < i0 + nq */
        const float *qb = q + (size_t)i0 * stride + (size_t)h * hd;
        const float *gb = dout + (size_t)i0 * out_stride + (size_t)h * hd;
        const float *ob = out + (size_t)i0 * out_stride + (size_t)h * hd;
        const float *L = lse + (size_t)h * T + i0;
        for (int ii = 0; ii < nq; ii++)
          D[ii] = dotf(gb + (size_t)ii * out_stride, ob + (size_t)ii * out_stride, hd);
        tile_gemm(CblasNoTrans, CblasTrans, nq, nkb, hd, scale, qb, stride, kc, stride, 0.0f, p,
                  ATT_KC);
        tile_gemm(CblasNoTrans, CblasTrans, nq, nkb, hd, 1.0f, gb, ost, vc, stride, 0.0f, dp,
                  ATT_KC);
        for (int ii = 0; ii < nq; ii++) {
          const int i = i0 + ii, jn = i - j0 + 1 < 0 ? 0 : i - j0 + 1 < nkb ? i - j0 + 1 : nkb;
          float *pr = p + ii * ATT_KC, *dr = dp + ii * ATT_KC;
          const float Li = L[ii], Di = D[ii];
#pragma omp simd
          for (int jj = 0; jj < jn; jj++) {
            const float pij = expf_vec(pr[jj] - Li);
            pr[jj] = pij;
            dr[jj] = pij * (dr[jj] - Di); /* dS / scale */
          }
          for (int jj = jn; jj < nkb; jj++) pr[jj] = dr[jj] = 0.0f;
        }
        if (dv)
          tile_gemm(CblasTrans, CblasNoTrans, nkb, hd, nq, 1.0f, p, ATT_KC, gb, ost, 1.0f, dvl, hd);
        if (dk)
          tile_gemm(CblasTrans, CblasNoTrans, nkb, hd, nq, scale, dp, ATT_KC, qb, stride, 1.0f, dkl,
                    hd);
        if (dq)
          tile_gemm(CblasNoTrans, CblasNoTrans, nq, hd, nkb, scale, dp, ATT_KC, kc, stride, 1.0f,
                    dq + (size_t)i0 * stride + (size_t)h * hd, stride);
      }
    for (int jj = 0; jj < nk; jj++) {
      const size_t o = (size_t)(j0 + jj) * stride;
      if (dk) axpyf(dk + o, 1.0f, dkl + jj * hd, hd);
      if (dv) axpyf(dv + o, 1.0f, dvl + jj * hd, hd);
    }
  }
}

void tsr_ops_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride) {
  DEV_VOID(attention_bwd, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride);
  const int group = H / KV;
  const float scale = attn_scale(hd);
  const size_t out_stride = (size_t)H * hd;
  const long ntasks = (long)B * KV;
#pragma omp parallel for schedule(dynamic, 1)
  for (long task = 0; task < ntasks; task++) {
    const int g = (int)(task % KV), b = (int)(task / KV);
    const size_t base = (size_t)b * T * qkv_stride, kv = base + (size_t)g * hd;
    const size_t ob = (size_t)b * T * out_stride;
    attn_bwd_head(dq ? dq + base : NULL, dk ? dk + kv : NULL, dv ? dv + kv : NULL, dout + ob,
                  out + ob, out_stride, lse + (size_t)b * H * T, q + base, k + kv, v + kv,
                  qkv_stride, T, hd, g * group, group, scale);
  }
}

/* -------------------------------------------------------- SwiGLU, GELU */

TSR_CLONES static void swiglu_fwd_row(float *restrict o, const float *restrict g,
                                      const float *restrict u, int F) {
#pragma omp simd
  for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + expf_vec(-g[j])) * u[j];
}

void tsr_ops_swiglu_fwd(float *out, const float *gate_up, int n, int F) {
  DEV_VOID(swiglu_fwd, out, gate_up, n, F);
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *g = gate_up + (size_t)r * 2 * F;
    swiglu_fwd_row(out + (size_t)r * F, g, g + F, F);
  }
}

/* silu(g) = g s, s = sigmoid(g);  silu'(g) = s (1 + g (1 - s)) */
TSR_CLONES static void swiglu_bwd_row(float *restrict dg, float *restrict du,
                                      const float *restrict d, const float *restrict g,
                                      const float *restrict u, int F) {
#pragma omp simd
  for (int j = 0; j < F; j++) {
    const float s = 1.0f / (1.0f + expf_vec(-g[j]));
    dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    du[j] = d[j] * g[j] * s;
  }
}

void tsr_ops_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n, int F) {
  DEV_VOID(swiglu_bwd, dgate_up, dout, gate_up, n, F);
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *g = gate_up + (size_t)r * 2 * F;
    float *dg = dgate_up + (size_t)r * 2 * F;
    swiglu_bwd_row(dg, dg + F, dout + (size_t)r * F, g, g + F, F);
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = (1 - e) / (1 + e), e = exp(-2u): -1 and 1 at the ends of the clamp; near 0 the
 * absolute error is ~1e-7, which is all that 1 + tanh (GELU) can see. */
static inline float tanhf_vec(float u) {
  const float e = expf_vec(-2.0f * u);
  return (1.0f - e) / (1.0f + e);
}

TSR_CLONES static void gelu_fwd_block(float *restrict out, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) {
    const float xi = x[i];
    out[i] = 0.5f * xi * (1.0f + tanhf_vec(GELU_C * (xi + GELU_A * xi * xi * xi)));
  }
}

TSR_CLONES static void gelu_bwd_block(float *restrict dx, const float *restrict dout,
                                      const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) {
    const float xi = x[i];
    const float th = tanhf_vec(GELU_C * (xi + GELU_A * xi * xi * xi));
    const float du = GELU_C * (1.0f + 3.0f * GELU_A * xi * xi);
    dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
  }
}

void tsr_ops_gelu_fwd(float *out, const float *x, int n_elem) {
  DEV_VOID(gelu_fwd, out, x, n_elem);
  const int nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (int blk = 0; blk < nblk; blk++) {
    const int i0 = blk * ELEM_BLOCK;
    gelu_fwd_block(out + i0, x + i0, n_elem - i0 < ELEM_BLOCK ? n_elem - i0 : ELEM_BLOCK);
  }
}

void tsr_ops_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem) {
  DEV_VOID(gelu_bwd, dx, dout, x, n_elem);
  const int nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (int blk = 0; blk < nblk; blk++) {
    const int i0 = blk * ELEM_BLOCK;
    gelu_bwd_block(dx + i0, dout + i0, x + i0,
                   n_elem - i0 < ELEM_BLOCK ? n_elem - i0 : ELEM_BLOCK);
  }
}

/* ----------------------------------------------------------- elementwise */

/* The compiler's conversion where it has _Float16 (F16C's vcvtps2ph in the x86-64-v3 and
 * v4 copies: 8-16 lanes); test_ops holds it bitwise equal to tsr_round_fp16 on finite
 * values, and both keep NaN a NaN. */
TSR_CLONES static void round_fp16_block(float *dst, const float *src, long n) {
#ifdef __FLT16_MAX__
  for (long i = 0; i < n; i++) dst[i] = (float)(_Float16)src[i];
#else
  for (long i = 0; i < n; i++) dst[i] = tsr_round_fp16(src[i]);
#endif
}

/* n values (one block) rounded to prec, as tsr_ops_round_* (fp32: copied; dst may be src) */
static void round_block(float *dst, const float *src, long n, tsr_prec prec) {
  if (prec == TSR_PREC_BF16)
    for (long i = 0; i < n; i++) dst[i] = tsr_round_bf16(src[i]);
  else if (prec == TSR_PREC_FP16)
    round_fp16_block(dst, src, n);
  else if (dst != src)
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void tsr_ops_add(float *out, const float *a, const float *b, long n_elem) {
  DEV_VOID(add, out, a, b, n_elem);
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] = a[i] + b[i];
}

void tsr_ops_acc(float *out, const float *a, long n_elem) {
  DEV_VOID(acc, out, a, n_elem);
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] += a[i];
}

void tsr_ops_residual(float *out, const float *x, const float *y, long n_elem, tsr_prec prec) {
  DEV_VOID(residual, out, x, y, n_elem, prec);
  if (prec == TSR_PREC_FP32) {
    tsr_ops_add(out, x, y, n_elem);
    return;
  }
  const long nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long blk = 0; blk < nblk; blk++) {
    const long i0 = blk * ELEM_BLOCK;
    const int len = n_elem - i0 < ELEM_BLOCK ? (int)(n_elem - i0) : ELEM_BLOCK;
    float t[ELEM_BLOCK];
    round_block(t, y + i0, len, prec);
    for (int i = 0; i < len; i++) t[i] += x[i0 + i];
    round_block(out + i0, t, len, prec);
  }
}

void tsr_ops_scale(float *x, float s, long n_elem) {
  DEV_VOID(scale, x, s, n_elem);
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) x[i] *= s;
}

/* -------------------------------------------------------- cross entropy */

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
  DEV_RET(xent_fwd_bwd, logits, targets, n, V, dloss);
  return xent(logits, logits, targets, n, V, dloss);
}

double tsr_ops_xent_fwd(const float *logits, const int32_t *targets, int n, int V) {
  DEV_RET(xent_fwd, logits, targets, n, V);
  return xent(NULL, logits, targets, n, V, 0.0f);
}

void tsr_ops_xent_fwd_bwd_acc(double *acc, double div, float *logits, const int32_t *targets,
                              int n, int V, float dloss) {
  DEV_VOID(xent_fwd_bwd_acc, acc, div, logits, targets, n, V, dloss);
  *acc += xent(logits, logits, targets, n, V, dloss) / div;
}

void tsr_ops_xent_fwd_acc(double *acc, double div, const float *logits, const int32_t *targets,
                          int n, int V) {
  DEV_VOID(xent_fwd_acc, acc, div, logits, targets, n, V);
  *acc += xent(NULL, logits, targets, n, V, 0.0f) / div;
}

void tsr_ops_xent_local_stats(double *row_max_out, double *target_logit, const float *logits,
                              const int32_t *targets, int n, int V, int vocab_start) {
  DEV_VOID(xent_local_stats, row_max_out, target_logit, logits, targets, n, V, vocab_start);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * V;
    row_max_out[r] = row_max(z, V);
    const int t = targets[r] - vocab_start;
    target_logit[r] = (t >= 0 && t < V) ? (double)z[t] : 0.0;
  }
}

void tsr_ops_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max_in,
                               int n, int V) {
  DEV_VOID(xent_local_sumexp, sumexp, logits, row_max_in, n, V);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) sumexp[r] = sum_exp(logits + (size_t)r * V, (float)row_max_in[r], V);
}

double tsr_ops_xent_rows(const double *row_max_in, const double *sumexp,
                         const double *target_logit, int n) {
  DEV_RET(xent_rows, row_max_in, sumexp, target_logit, n);
  double total = 0.0; /* fixed order: the same sum on every rank */
  for (int r = 0; r < n; r++) total += log(sumexp[r]) + row_max_in[r] - target_logit[r];
  return total;
}

void tsr_ops_xent_rows_acc(double *acc, double div, const double *row_max_in,
                           const double *sumexp, const double *target_logit, int n) {
  DEV_VOID(xent_rows_acc, acc, div, row_max_in, sumexp, target_logit, n);
  *acc += tsr_ops_xent_rows(row_max_in, sumexp, target_logit, n) / div;
}

TSR_CLONES static void exp_scale_row(float *z, float m, float f, int V) {
#pragma omp simd
  for (int j = 0; j < V; j++) z[j] = expf_vec(z[j] - m) * f;
}

void tsr_ops_xent_grad(float *logits, const int32_t *targets, const double *row_max_in,
                       const double *sumexp, int n, int V, int vocab_start, float dloss) {
  DEV_VOID(xent_grad, logits, targets, row_max_in, sumexp, n, V, vocab_start, dloss);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; r++) {
    float *z = logits + (size_t)r * V;
    exp_scale_row(z, (float)row_max_in[r], (float)(dloss / sumexp[r]), V);
    const int t = targets[r] - vocab_start;
    if (t >= 0 && t < V) z[t] -= dloss;
  }
}

/* ---------------------------------------------------------------- AdamW */

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

void tsr_ops_adamw(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, long t, float grad_scale,
                   float *out, tsr_prec out_prec) {
  DEV_VOID(adamw, p, m, v, g, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale, out,
           out_prec);
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
    if (out) round_block(out + i0, pb, len, out_prec); /* the refresh, while in cache */
  }
}

/* ---------------------------------------------------- casts, reductions */

void tsr_ops_round_bf16(float *dst, const float *src, long n_elem) {
  DEV_VOID(round_bf16, dst, src, n_elem);
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) dst[i] = tsr_round_bf16(src[i]);
}

void tsr_ops_round_fp16(float *dst, const float *src, long n_elem) {
  DEV_VOID(round_fp16, dst, src, n_elem);
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long b = 0; b < n_elem; b += ELEM_BLOCK)
    round_fp16_block(dst + b, src + b, n_elem - b < ELEM_BLOCK ? n_elem - b : ELEM_BLOCK);
}

double tsr_ops_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  DEV_RET(sumsq_ranges, x, r, n_ranges);
  double s = 0.0;
  for (int k = 0; k < n_ranges; k++) s += tsr_ops_sumsq(x + r[2 * k], (long)(r[2 * k + 1] - r[2 * k]));
  return s;
}

double tsr_ops_sumsq(const float *x, long n_elem) {
  DEV_RET(sumsq, x, n_elem);
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
  DEV_RET(all_finite, x, n_elem);
  unsigned bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return !bad;
}
