/* cpu_gemm.c — the linear layers: matmul_fwd, matmul_bwd (OpenBLAS sgemm), which other
 * families' kernels also run as cpu_linear_fwd / _bwd (the fused LM head of cpu_xent.c).
 *
 * fp32 storage.  Each GEMM is one sgemm per OpenMP thread, the output split along its
 * larger dimension (gemm below).  Each element is one single-threaded sgemm's sum over
 * the whole of K, but OpenBLAS's kernels round an element's sum differently at piece
 * edges, and the pieces follow the thread count, so the last bits may change with
 * OMP_NUM_THREADS (as they did when OpenBLAS threaded itself).
 *
 * 16-bit storage.  sgemm needs fp32 operands, and widening whole activations would cost
 * the memory 16-bit storage saves, so the product is tiled (gemm16): a task owns a
 * TILE_M x TILE_N tile of the output and walks K in chunks of TILE_K, widening the chunk's
 * slices of A and B into its buffers and calling sgemm on them; a 16-bit output is summed
 * in an fp32 tile and rounded once at the end (after the bias and GELU's derivative), an
 * fp32 output (dw) is accumulated in place.  The tiles depend on the shapes only, so the
 * result is the same for every thread count.  When K fits one chunk, consecutive tasks of
 * a thread share their B slice (tasks go down the columns of tiles) and widen it once.
 * The sums differ from the fp32 path's only in where sgemm's blocks and chunks fall. */
#include "cpu_internal.h"

/* Output tile and K chunk of the 16-bit GEMMs: per thread (TILE_M + TILE_N) TILE_K +
 * TILE_M TILE_N + TILE_N floats, 513 KiB.  Smaller tiles cost sgemm's efficiency
 * (128 x 128 x 512 tiles made the tiny model's GEMMs 1.2-1.6x the fp32 time, these
 * 1.1-1.25x, one thread); the chunk's size matters less. */
#define TILE_M 256
#define TILE_N 256
#define TILE_K 128
/* Fewer output tiles than this leave threads idle: the tiles are made smaller (to 32). */
#define TILE_TASKS_MIN 8

size_t cpu_gemm_buf_floats(void) {
  return (size_t)(TILE_M + TILE_N) * TILE_K + (size_t)TILE_M * TILE_N + TILE_N;
}

/* ------------------------------------------------------------ fp32 GEMM */

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

/* dx = dx * gelu'(x) in place, over n elements. */
TSR_CLONES static void gelu_bwd_block(float *restrict dx, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) dx[i] = gelu_grad(dx[i], x[i]);
}

/* ---------------------------------------------------------- 16-bit GEMM */

/* C[M,N] = op(A)[M,K] op(B)[K,N], A and B stored as dt (row-major, leading dimensions
 * lda, ldb).  Exactly one output: Cf (fp32, accumulated: C += ...) or Cd (dt, written:
 * C = ... + bias, then times gelu'(gelu_pre) element-wise; bias [N] and gelu_pre [M,N]
 * (leading dimension ldc) are dt, either may be NULL). */
typedef struct {
  tsr_dtype dt;
  CBLAS_TRANSPOSE ta, tb;
  int M, N, K;
  const void *A, *B;
  int lda, ldb;
  float *Cf;
  void *Cd;
  int ldc;
  const void *bias, *gelu_pre;
} gemm16_args;

/* One output tile [m0, m0 + mb) x [n0, n0 + nb); buf is the thread's buffer.  keep_b:
 * buf's B part already holds this tile's B slice (K fits one chunk). */
TSR_CLONES static void gemm16_tile(const gemm16_args *g, int m0, int mb, int n0, int nb,
                                   float *buf, int keep_b) {
  const tsr_dtype dt = g->dt;
  float *a = buf, *b = a + (size_t)TILE_M * TILE_K, *c = b + (size_t)TILE_N * TILE_K;
  float *row = c + (size_t)TILE_M * TILE_N;
  if (g->Cd && g->bias) {
    widen_row(dt, row, tsr_dtype_at_c(g->bias, dt, n0), nb);
    for (int r = 0; r < mb; r++) memcpy(c + (size_t)r * nb, row, (size_t)nb * sizeof(float));
  } else if (g->Cd) {
    memset(c, 0, (size_t)mb * nb * sizeof(float)); /* an empty sum (K = 0) stays 0 */
  }
  for (int k0 = 0; k0 < g->K; k0 += TILE_K) {
    const int kb = g->K - k0 < TILE_K ? g->K - k0 : TILE_K;
    int lda_t, ldb_t;
    if (g->ta == CblasNoTrans) {
      lda_t = kb;
      widen_block(dt, a, kb, tsr_dtype_at_c(g->A, dt, (int64_t)m0 * g->lda + k0), g->lda, mb, kb);
    } else {
      lda_t = mb;
      widen_block(dt, a, mb, tsr_dtype_at_c(g->A, dt, (int64_t)k0 * g->lda + m0), g->lda, kb, mb);
    }
    if (g->tb == CblasNoTrans) {
      ldb_t = nb;
      if (!keep_b)
        widen_block(dt, b, nb, tsr_dtype_at_c(g->B, dt, (int64_t)k0 * g->ldb + n0), g->ldb, kb,
                    nb);
    } else {
      ldb_t = kb;
      if (!keep_b)
        widen_block(dt, b, kb, tsr_dtype_at_c(g->B, dt, (int64_t)n0 * g->ldb + k0), g->ldb, nb,
                    kb);
    }
    if (g->Cf)
      cblas_sgemm(CblasRowMajor, g->ta, g->tb, mb, nb, kb, 1.0f, a, lda_t, b, ldb_t, 1.0f,
                  g->Cf + (size_t)m0 * g->ldc + n0, g->ldc);
    else
      cblas_sgemm(CblasRowMajor, g->ta, g->tb, mb, nb, kb, 1.0f, a, lda_t, b, ldb_t,
                  k0 == 0 && !g->bias ? 0.0f : 1.0f, c, nb);
  }
  if (!g->Cd) return;
  for (int r = 0; r < mb; r++) {
    float *cr = c + (size_t)r * nb;
    const size_t at = (size_t)(m0 + r) * g->ldc + n0;
    if (g->gelu_pre) {
      widen_row(dt, row, tsr_dtype_at_c(g->gelu_pre, dt, (int64_t)at), nb);
#pragma omp simd
      for (int i = 0; i < nb; i++) cr[i] = gelu_grad(cr[i], row[i]);
    }
    narrow_row(dt, tsr_dtype_at(g->Cd, dt, (int64_t)at), cr, nb);
  }
}

/* A tile of len split in parts: equal tiles (whole register tiles of 16), so that no
 * thread's share is a ragged remainder. */
static int tile_len(int len, int parts) { return ((len + parts - 1) / parts + 15) / 16 * 16; }

static void gemm16(const gemm16_args *g) {
  if (g->M <= 0 || g->N <= 0 || (g->Cf && g->K <= 0)) return;
  int p_m = (g->M + TILE_M - 1) / TILE_M, p_n = (g->N + TILE_N - 1) / TILE_N;
  int tm = tile_len(g->M, p_m), tn = tile_len(g->N, p_n);
  /* enough tiles for the threads; a function of the shapes, not of the thread count */
  while ((long)p_m * p_n < TILE_TASKS_MIN && (tm > 32 || tn > 32)) {
    if (tn >= tm)
      tn = tile_len(g->N, ++p_n);
    else
      tm = tile_len(g->M, ++p_m);
  }
  const int n_m = (g->M + tm - 1) / tm, n_n = (g->N + tn - 1) / tn;
  const long ntasks = (long)n_m * n_n;
  const int one_chunk = g->K <= TILE_K;
  cpu_buf_need(0, cpu_gemm_buf_floats());
#pragma omp parallel if (2.0 * g->M * g->N * (g->K > 0 ? g->K : 1) >= GEMM_PAR_MIN_FLOPS)
  {
    float *buf = cpu_buf_thread();
    int last_n = -1; /* the column of tiles whose B slice is in buf */
#pragma omp for schedule(static)
    for (long t = 0; t < ntasks; t++) {
      const int ni = (int)(t / n_m), mi = (int)(t % n_m);
      const int m0 = mi * tm, n0 = ni * tn;
      const int mb = g->M - m0 < tm ? g->M - m0 : tm, nb = g->N - n0 < tn ? g->N - n0 : tn;
      gemm16_tile(g, m0, mb, n0, nb, buf, one_chunk && ni == last_n);
      last_n = ni;
    }
  }
}

/* ---------------------------------------------------------------- ops */

void cpu_linear_fwd(tsr_dtype dt, void *y, const void *x, const void *w, const void *bias, int n,
                    int in, int out) {
  if (n <= 0 || out <= 0) return;
  if (dt != TSR_F32) {
    gemm16(&(gemm16_args){.dt = dt, .ta = CblasNoTrans, .tb = CblasTrans, .M = n, .N = out,
                          .K = in, .A = x, .B = w, .lda = in, .ldb = in, .Cd = y, .ldc = out,
                          .bias = bias});
    return;
  }
  float *yf = y;
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int r = 0; r < n; r++) memcpy(yf + (size_t)r * out, bias, (size_t)out * sizeof(float));
    beta = 1.0f;
  }
  gemm(CblasNoTrans, CblasTrans, n, out, in, x, in, w, in, beta, yf, out);
}

/* dbias[c] += the sum over rows of dy[., c], in double, one task per column block. */
TSR_CLONES static void bias_grad_block(tsr_dtype dt, float *dbias, const void *dy, int n, int out,
                                       int c0, int nc) {
  double acc[COL_BLOCK] = {0};
  float tmp[COL_BLOCK];
  for (int r = 0; r < n; r++) {
    const float *row;
    if (dt == TSR_F32) {
      row = (const float *)dy + (size_t)r * out + c0;
    } else {
      widen_row(dt, tmp, tsr_dtype_at_c(dy, dt, (int64_t)r * out + c0), nc);
      row = tmp;
    }
#pragma omp simd
    for (int c = 0; c < nc; c++) acc[c] += row[c];
  }
  for (int c = 0; c < nc; c++) dbias[c0 + c] += (float)acc[c];
}

void cpu_linear_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                    const void *x, const void *w, const void *gelu_pre, int n, int in, int out) {
  if (n <= 0) return;
  if (dt != TSR_F32) {
    if (dx)
      gemm16(&(gemm16_args){.dt = dt, .ta = CblasNoTrans, .tb = CblasNoTrans, .M = n, .N = in,
                            .K = out, .A = dy, .B = w, .lda = out, .ldb = in, .Cd = dx,
                            .ldc = in, .gelu_pre = gelu_pre});
    if (dw)
      gemm16(&(gemm16_args){.dt = dt, .ta = CblasTrans, .tb = CblasNoTrans, .M = out, .N = in,
                            .K = n, .A = dy, .B = x, .lda = out, .ldb = in, .Cf = dw,
                            .ldc = in});
  } else {
    if (dx) {
      gemm(CblasNoTrans, CblasNoTrans, n, in, out, dy, out, w, in, 0.0f, dx, in);
      if (gelu_pre) { /* GELU's backward on the product, as its own pass did */
        const long n_elem = (long)n * in, nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
        for (long blk = 0; blk < nblk; blk++) {
          const long i0 = blk * ELEM_BLOCK;
          gelu_bwd_block((float *)dx + i0, (const float *)gelu_pre + i0,
                         n_elem - i0 < ELEM_BLOCK ? (int)(n_elem - i0) : ELEM_BLOCK);
        }
      }
    }
    if (dw) gemm(CblasTrans, CblasNoTrans, out, in, n, dy, out, x, in, 1.0f, dw, in);
  }
  if (dbias && n > 0) {
    const int nblk = (out + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * out > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      const int c0 = blk * COL_BLOCK, nc = out - c0 < COL_BLOCK ? out - c0 : COL_BLOCK;
      bias_grad_block(dt, dbias, dy, n, out, c0, nc);
    }
  }
}

void tsr_cpu_matmul_fwd(tsr_dtype dt, void *y, const void *x, const void *w, const void *bias,
                        int n, int in, int out) {
  cpu_linear_fwd(dt, y, x, w, bias, n, in, out);
}

void tsr_cpu_matmul_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                        const void *x, const void *w, const void *gelu_pre, int n, int in,
                        int out) {
  cpu_linear_bwd(dt, dx, dw, dbias, dy, x, w, gelu_pre, n, in, out);
}
