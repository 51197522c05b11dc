/* test_kernels.c — every CUDA kernel (cuda/ops_cuda.h) against the CPU backend
 * (src/ops_cpu.c) on random inputs.
 *
 *  - Inputs are fresh random numbers each run (the seed is printed; TSR_TEST_SEED=N
 *    repeats a run), never zeros.
 *  - Outputs that a kernel overwrites are poisoned with NaN first, so an element the
 *    kernel forgets fails the check; gradients (accumulated, +=) start from random
 *    values, so a kernel that overwrites instead of accumulating fails too.
 *  - Error measure: max |gpu - cpu| / max |cpu| over the tensor (normwise, so elements
 *    near zero do not dominate); any non-finite value where the CPU has a finite one fails.
 *  - Tolerances: fp32 kernels 1e-5 (same arithmetic, different summation order: the
 *    observed error is ~1e-7 .. 1e-6); bf16 outputs 1e-2 (one bf16 rounding is 2^-9
 *    relative, plus accumulated rounding of bf16 intermediates); fp32 outputs of bf16
 *    GEMMs 1e-4 (identical bf16 inputs, but tensor cores sum in their own order and
 *    grouping); double sums 1e-10.  Casts are bitwise.
 *  - Shapes include 1 and sizes that are not multiples of the tiles (32 rows/keys,
 *    256 threads, 8 head dims per thread).
 *  - Determinism: the reductions that could race (attention backward, embedding
 *    backward, sum of squares) are run twice and must agree bitwise.
 * Exits 77 (skip) when no CUDA device is usable.  TSR_TEST_ONLY=group,... runs only
 * the groups named (casts embedding rmsnorm layernorm rope activations elementwise xent
 * adamw reductions matmul attention).  In a build with cuDNN attention (TSR_HAVE_CUDNN)
 * the attention group checks it too, unless TSR_TEST_NO_CUDNN is set. */
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"
#include "ops_cuda.h"
#include "testutil.h"
#include "util.h"

#define TOL_F32 1e-5
#define TOL_BF16 1e-2
#define TOL_BF16_GEMM_F32 1e-4
#define TOL_DOUBLE 1e-10

static cudaStream_t g_stream;
static uint64_t g_seed, g_next;

/* ------------------------------------------------------------------ helpers */

#define CUDA_CK(expr)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      printf("FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
#define OK(expr)                                                          \
  do {                                                                    \
    if ((expr) != 0) {                                                    \
      printf("FAIL: %s:%d: %s returned an error\n", __FILE__, __LINE__, #expr); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static float urand(float lo, float hi) {
  return lo + (hi - lo) * (float)tsr_rand_uniform(g_seed, g_next++);
}
static float *hrand(long n, float lo, float hi) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (long i = 0; i < n; i++) x[i] = urand(lo, hi);
  return x;
}
static float *hcopy(const float *x, long n) {
  float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}
static void *dalloc(size_t bytes) {
  void *p = NULL;
  CUDA_CK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}
static void *dup_bytes(const void *h, size_t bytes) {
  void *d = dalloc(bytes);
  CUDA_CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}
static float *dup_f32(const float *h, long n) { return dup_bytes(h, (size_t)n * sizeof(float)); }
static void down(void *h, const void *d, size_t bytes) {
  CUDA_CK(cudaStreamSynchronize(g_stream));
  CUDA_CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}
static void *poisoned(size_t bytes) { /* all-ones bytes: NaN in fp32 and bf16 */
  void *d = dalloc(bytes);
  CUDA_CK(cudaMemset(d, 0xff, bytes ? bytes : 1));
  return d;
}
static void dfree(void *d) { CUDA_CK(cudaFree(d)); }

/* Scratch sized by tsr_cuda_scratch_bytes for exactly the shapes of the call (so a size
 * the query gets wrong fails the call), poisoned; reallocated per call. */
static tsr_cuda_scratch g_ws;
static const tsr_cuda_scratch *scratch_for(tsr_cuda_scratch_dims d) {
  size_t bytes = 0;
  OK(tsr_cuda_scratch_bytes(&d, &bytes));
  if (g_ws.base) dfree(g_ws.base);
  g_ws.base = bytes ? poisoned(bytes) : NULL;
  g_ws.bytes = bytes;
  return &g_ws;
}
#define WS(...) scratch_for((tsr_cuda_scratch_dims){__VA_ARGS__})

/* bf16 on the host: the rounded fp32 value and its upper 16 bits */
static uint16_t bf16_bits(float x) {
  uint32_t u;
  float r = tsr_round_bf16(x);
  memcpy(&u, &r, 4);
  return (uint16_t)(u >> 16);
}
static float bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static void round_inplace(float *x, long n) { tsr_ops_round_bf16(x, x, n); }
static tsr_bf16 *dup_bf16(const float *h, long n) { /* h must already be bf16-exact */
  uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
  for (long i = 0; i < n; i++) b[i] = bf16_bits(h[i]);
  tsr_bf16 *d = dup_bytes(b, (size_t)n * 2);
  free(b);
  return d;
}

static double rel_err(const float *got, const float *ref, long n) {
  double max_ref = 0.0, max_diff = 0.0;
  for (long i = 0; i < n; i++) {
    if (isfinite(ref[i]) && !isfinite(got[i])) return INFINITY;
    const double d = fabs((double)got[i] - (double)ref[i]);
    if (d > max_diff) max_diff = d;
    if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

static void check_f32(const char *what, const float *d_got, const float *ref, long n, double tol) {
  float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  down(got, d_got, (size_t)n * sizeof(float));
  const double e = rel_err(got, ref, n);
  TU_CHECK(e <= tol, "%-48s rel err %.2e (tol %.0e)", what, e, tol);
  free(got);
}
/* Softmax statistics (lse): a logarithm, so its absolute error is the relative error of
 * the normaliser.  Each element within tol x max(1, |ref|): a normwise relative error
 * would fail a lone lse near zero (T = 1: lse is one score, q.k, which can be ~1e-3). */
static void check_lse(const char *what, const float *d_got, const float *ref, long n, double tol) {
  float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  down(got, d_got, (size_t)n * sizeof(float));
  double e = 0.0;
  for (long i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - (double)ref[i]) / fmax(1.0, fabs((double)ref[i]));
    if (isnan(d)) { /* a NaN anywhere fails (a later max would forget it) */
      e = INFINITY;
      break;
    }
    if (d > e) e = d;
  }
  TU_CHECK(e <= tol, "%-48s err %.2e (tol %.0e of max(1, |lse|))", what, e, tol);
  free(got);
}
static void check_bf16(const char *what, const tsr_bf16 *d_got, const float *ref, long n,
                       double tol) {
  uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
  float *got = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  down(b, d_got, (size_t)n * 2);
  for (long i = 0; i < n; i++) got[i] = bf16_value(b[i]);
  const double e = rel_err(got, ref, n);
  TU_CHECK(e <= tol, "%-48s rel err %.2e (tol %.0e)", what, e, tol);
  free(b);
  free(got);
}
static void check_double(const char *what, const double *d_got, double ref, double tol) {
  double got;
  down(&got, d_got, sizeof got);
  const double e = fabs(got - ref) / (fabs(ref) > 0 ? fabs(ref) : 1.0);
  TU_CHECK(isfinite(got) && e <= tol, "%-48s %.10g vs %.10g, rel err %.2e (tol %.0e)", what, got,
           ref, e, tol);
}
static int same_bytes(const void *d_a, const void *d_b, size_t bytes) {
  char *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
  down(a, d_a, bytes);
  down(b, d_b, bytes);
  const int same = memcmp(a, b, bytes) == 0;
  free(a);
  free(b);
  return same;
}

/* -------------------------------------------------------------------- casts */

static void test_casts(long n) {
  float *x = hrand(n, -100.0f, 100.0f);
  for (long i = 0; i < n; i += 7) { /* exact ties: round to even, both ways */
    uint32_t u;
    memcpy(&u, &x[i], 4);
    u = (u & 0xffff0000u) | 0x8000u;
    memcpy(&x[i], &u, 4);
  }
  float *ref = malloc((size_t)n * sizeof(float));
  tsr_ops_round_bf16(ref, x, n);
  float *d_x = dup_f32(x, n), *d_r = poisoned((size_t)n * 4), *d_back = poisoned((size_t)n * 4);
  tsr_bf16 *d_b = poisoned((size_t)n * 2);
  OK(tsr_cuda_round_bf16(d_r, d_x, n, g_stream));
  OK(tsr_cuda_cast_f32_bf16(d_b, d_x, n, g_stream));
  OK(tsr_cuda_cast_bf16_f32(d_back, d_b, n, g_stream));
  float *got = malloc((size_t)n * sizeof(float));
  uint16_t *gb = malloc((size_t)n * 2);
  down(got, d_r, (size_t)n * 4);
  TU_CHECK(memcmp(got, ref, (size_t)n * 4) == 0, "round_bf16 n=%ld bitwise as tsr_round_bf16", n);
  down(gb, d_b, (size_t)n * 2);
  int ok = 1;
  for (long i = 0; i < n; i++) ok &= gb[i] == bf16_bits(x[i]);
  TU_CHECK(ok, "cast fp32->bf16 n=%ld bitwise", n);
  down(got, d_back, (size_t)n * 4);
  TU_CHECK(memcmp(got, ref, (size_t)n * 4) == 0, "cast bf16->fp32 n=%ld bitwise", n);
  /* fp16: the whole range, subnormals and overflow (x spread over 2^-30 .. 2^18) */
  for (long i = 0; i < n; i++) x[i] = ldexpf(x[i] / 100.0f, (int)(i % 49) - 30);
  tsr_ops_round_fp16(ref, x, n);
  float *d_y = dup_f32(x, n);
  OK(tsr_cuda_round_fp16(d_r, d_y, n, g_stream));
  down(got, d_r, (size_t)n * 4);
  TU_CHECK(memcmp(got, ref, (size_t)n * 4) == 0, "round_fp16 n=%ld bitwise as tsr_round_fp16", n);
  dfree(d_y);
  free(x), free(ref), free(got), free(gb);
  dfree(d_x), dfree(d_r), dfree(d_back), dfree(d_b);
}

/* rows x cols out of a strided fp32 matrix into compact bf16 and back (written, or added
 * into a strided fp32 matrix), bitwise against the CPU's rounding */
static void test_cast_rows(long rows, int cols, long stride) {
  const long n = rows * stride, m = rows * cols;
  float *x = hrand(n, -100.0f, 100.0f), *y = hrand(n, -1.0f, 1.0f);
  float *d_x = dup_f32(x, n), *d_y = dup_f32(y, n), *d_w = dup_f32(y, n);
  tsr_bf16 *d_b = poisoned((size_t)m * 2);
  OK(tsr_cuda_cast_rows_f32_bf16(d_b, d_x, rows, cols, stride, g_stream));
  uint16_t *gb = malloc((size_t)m * 2);
  down(gb, d_b, (size_t)m * 2);
  int ok = 1;
  for (long r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) ok &= gb[r * cols + c] == bf16_bits(x[r * stride + c]);
  TU_CHECK(ok, "cast rows fp32->bf16 %ld x %d of stride %ld bitwise", rows, cols, stride);
  OK(tsr_cuda_cast_rows_bf16_f32(d_y, stride, d_b, rows, cols, 1, g_stream));
  OK(tsr_cuda_cast_rows_bf16_f32(d_w, stride, d_b, rows, cols, 0, g_stream));
  float *got = malloc((size_t)n * 4), *wrote = malloc((size_t)n * 4);
  down(got, d_y, (size_t)n * 4);
  down(wrote, d_w, (size_t)n * 4);
  int add_ok = 1, set_ok = 1;
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < stride; c++) {
      const long i = r * stride + c;
      const float b = bf16_value(bf16_bits(x[i]));
      add_ok &= got[i] == (c < cols ? y[i] + b : y[i]);
      set_ok &= wrote[i] == (c < cols ? b : y[i]);
    }
  TU_CHECK(add_ok, "cast rows bf16->fp32 added into %ld x %d of stride %ld (the rest untouched)",
           rows, cols, stride);
  TU_CHECK(set_ok, "cast rows bf16->fp32 written into %ld x %d of stride %ld (the rest untouched)",
           rows, cols, stride);
  free(x), free(y), free(gb), free(got), free(wrote);
  dfree(d_x), dfree(d_y), dfree(d_w), dfree(d_b);
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(int n, int T, int C, int vocab, int vocab_start, int vocab_local,
                           int with_wpe) {
  char name[128];
  int32_t *tok = malloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n; r++) tok[r] = (int32_t)(urand(0.0f, 1.0f) * vocab) % vocab;
  float *wte = hrand((long)vocab_local * C, -1, 1), *wpe = with_wpe ? hrand((long)T * C, -1, 1) : NULL;
  float *out = malloc((size_t)n * C * sizeof(float));
  tsr_ops_embedding_fwd(out, tok, wte, wpe, n, T, C, vocab_start, vocab_local);
  int32_t *d_tok = dup_bytes(tok, (size_t)n * sizeof(int32_t));
  float *d_wte = dup_f32(wte, (long)vocab_local * C), *d_wpe = wpe ? dup_f32(wpe, (long)T * C) : NULL;
  float *d_out = poisoned((size_t)n * C * 4);
  OK(tsr_cuda_embedding_fwd(d_out, d_tok, d_wte, d_wpe, n, T, C, vocab_start, vocab_local, g_stream));
  snprintf(name, sizeof name, "embedding fwd n=%d T=%d C=%d V=%d+%d%s", n, T, C, vocab_start,
           vocab_local, with_wpe ? " +wpe" : "");
  check_f32(name, d_out, out, (long)n * C, TOL_F32);

  float *dout = hrand((long)n * C, -1, 1);
  float *dwte = hrand((long)vocab_local * C, -1, 1), *dwpe = with_wpe ? hrand((long)T * C, -1, 1) : NULL;
  float *d_dout = dup_f32(dout, (long)n * C), *d_dwte = dup_f32(dwte, (long)vocab_local * C);
  float *d_dwte2 = dup_f32(dwte, (long)vocab_local * C);
  float *d_dwpe = dwpe ? dup_f32(dwpe, (long)T * C) : NULL;
  tsr_ops_embedding_bwd(dwte, dwpe, dout, tok, n, T, C, vocab_start, vocab_local);
  OK(tsr_cuda_embedding_bwd(d_dwte, d_dwpe, d_dout, d_tok, n, T, C, vocab_start, vocab_local, WS(.rows = n, .vocab_local = vocab_local), g_stream));
  OK(tsr_cuda_embedding_bwd(d_dwte2, NULL, d_dout, d_tok, n, T, C, vocab_start, vocab_local, WS(.rows = n, .vocab_local = vocab_local), g_stream));
  snprintf(name, sizeof name, "embedding bwd dwte n=%d C=%d V=%d", n, C, vocab_local);
  check_f32(name, d_dwte, dwte, (long)vocab_local * C, TOL_F32);
  TU_CHECK(same_bytes(d_dwte, d_dwte2, (size_t)vocab_local * C * 4), "embedding bwd deterministic (two runs bitwise)");
  if (with_wpe) check_f32("embedding bwd dwpe", d_dwpe, dwpe, (long)T * C, TOL_F32);
  free(tok), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
  dfree(d_tok), dfree(d_wte), dfree(d_out), dfree(d_dout), dfree(d_dwte), dfree(d_dwte2);
  if (d_wpe) dfree(d_wpe), dfree(d_dwpe);
}

/* -------------------------------------------------------------------- norms */

static void test_rmsnorm(int n, int C) {
  char name[128];
  const long nc = (long)n * C;
  float *x = hrand(nc, -2, 2), *w = hrand(C, 0.5f, 1.5f), *out = malloc(nc * 4), *rstd = malloc(n * 4);
  tsr_ops_rmsnorm_fwd(out, rstd, x, w, n, C, 1e-5f);
  float *d_x = dup_f32(x, nc), *d_w = dup_f32(w, C), *d_out = poisoned(nc * 4), *d_rstd = poisoned(n * 4);
  OK(tsr_cuda_rmsnorm_fwd(d_out, d_rstd, d_x, d_w, n, C, 1e-5f, g_stream));
  snprintf(name, sizeof name, "rmsnorm fwd n=%d C=%d", n, C);
  check_f32(name, d_out, out, nc, TOL_F32);
  check_f32("rmsnorm fwd rstd", d_rstd, rstd, n, TOL_F32);
  float *dout = hrand(nc, -1, 1), *dx = hrand(nc, -1, 1), *dw = hrand(C, -1, 1);
  float *d_dout = dup_f32(dout, nc), *d_dx = dup_f32(dx, nc), *d_dw = dup_f32(dw, C), *d_rs = dup_f32(rstd, n);
  tsr_ops_rmsnorm_bwd(dx, dw, dout, x, w, rstd, n, C);
  OK(tsr_cuda_rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rs, n, C, WS(.rows = n, .cols = C), g_stream));
  snprintf(name, sizeof name, "rmsnorm bwd dx n=%d C=%d", n, C);
  check_f32(name, d_dx, dx, nc, TOL_F32);
  check_f32("rmsnorm bwd dw", d_dw, dw, C, TOL_F32);

  /* bf16: the CPU computes on the same bf16-exact values */
  round_inplace(x, nc), round_inplace(w, C), round_inplace(dout, nc);
  float *dxb = hrand(nc, -1e-3, 1e-3), *dwb = hrand(C, -1, 1); /* small: the bf16 check  */
  round_inplace(dxb, nc);                                          /* must see the gradient */
  tsr_bf16 *b_x = dup_bf16(x, nc), *b_w = dup_bf16(w, C), *b_dout = dup_bf16(dout, nc);
  tsr_bf16 *b_out = poisoned(nc * 2), *b_dx = dup_bf16(dxb, nc);
  float *d_dwb = dup_f32(dwb, C);
  tsr_ops_rmsnorm_fwd(out, rstd, x, w, n, C, 1e-5f);
  OK(tsr_cuda_rmsnorm_fwd_bf16(b_out, d_rstd, b_x, b_w, n, C, 1e-5f, g_stream));
  snprintf(name, sizeof name, "rmsnorm fwd bf16 n=%d C=%d", n, C);
  check_bf16(name, b_out, out, nc, TOL_BF16);
  check_f32("rmsnorm fwd bf16 rstd (fp32)", d_rstd, rstd, n, TOL_F32);
  CUDA_CK(cudaMemcpy(d_rs, rstd, n * 4, cudaMemcpyHostToDevice));
  tsr_ops_rmsnorm_bwd(dxb, dwb, dout, x, w, rstd, n, C);
  OK(tsr_cuda_rmsnorm_bwd_bf16(b_dx, d_dwb, b_dout, b_x, b_w, d_rs, n, C, WS(.rows = n, .cols = C), g_stream));
  check_bf16("rmsnorm bwd bf16 dx", b_dx, dxb, nc, TOL_BF16);
  check_f32("rmsnorm bwd bf16 dw (fp32)", d_dwb, dwb, C, TOL_F32);
  free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw), free(dxb), free(dwb);
  dfree(d_x), dfree(d_w), dfree(d_out), dfree(d_rstd), dfree(d_dout), dfree(d_dx), dfree(d_dw);
  dfree(d_rs), dfree(b_x), dfree(b_w), dfree(b_dout), dfree(b_out), dfree(b_dx), dfree(d_dwb);
}

static void test_layernorm(int n, int C) {
  char name[128];
  const long nc = (long)n * C;
  float *x = hrand(nc, -2, 3), *w = hrand(C, 0.5f, 1.5f), *b = hrand(C, -0.5f, 0.5f);
  float *out = malloc(nc * 4), *mean = malloc(n * 4), *rstd = malloc(n * 4);
  tsr_ops_layernorm_fwd(out, mean, rstd, x, w, b, n, C, 1e-5f);
  float *d_x = dup_f32(x, nc), *d_w = dup_f32(w, C), *d_b = dup_f32(b, C);
  float *d_out = poisoned(nc * 4), *d_mean = poisoned(n * 4), *d_rstd = poisoned(n * 4);
  OK(tsr_cuda_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, n, C, 1e-5f, g_stream));
  snprintf(name, sizeof name, "layernorm fwd n=%d C=%d", n, C);
  check_f32(name, d_out, out, nc, TOL_F32);
  check_f32("layernorm fwd mean", d_mean, mean, n, TOL_F32);
  check_f32("layernorm fwd rstd", d_rstd, rstd, n, TOL_F32);
  float *dout = hrand(nc, -1, 1), *dx = hrand(nc, -1, 1), *dw = hrand(C, -1, 1), *db = hrand(C, -1, 1);
  float *d_dout = dup_f32(dout, nc), *d_dx = dup_f32(dx, nc), *d_dw = dup_f32(dw, C), *d_db = dup_f32(db, C);
  CUDA_CK(cudaMemcpy(d_mean, mean, n * 4, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_rstd, rstd, n * 4, cudaMemcpyHostToDevice));
  tsr_ops_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, n, C);
  OK(tsr_cuda_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, n, C, WS(.rows = n, .cols = C), g_stream));
  snprintf(name, sizeof name, "layernorm bwd dx n=%d C=%d", n, C);
  /* dx is rstd times a difference of fp32 terms: its rounding (the GPU contracts to FMAs)
   * grows with rstd, 1/sqrt(eps) = 316 for C = 1, where x - mean is 0 */
  double rstd_max = 1.0;
  for (int i = 0; i < n; i++) rstd_max = fmax(rstd_max, rstd[i]);
  check_f32(name, d_dx, dx, nc, fmax(TOL_F32, 4 * FLT_EPSILON * rstd_max));
  check_f32("layernorm bwd dw", d_dw, dw, C, TOL_F32);
  check_f32("layernorm bwd db", d_db, db, C, TOL_F32);
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dx), free(dw), free(db);
  dfree(d_x), dfree(d_w), dfree(d_b), dfree(d_out), dfree(d_mean), dfree(d_rstd), dfree(d_dout);
  dfree(d_dx), dfree(d_dw), dfree(d_db);
}

/* --------------------------------------------------------------------- RoPE */

/* Rotates heads [col0/hd, col0/hd + n_heads) of rows of width `stride`: the other
 * columns must come back untouched, so the whole buffer is compared. */
static void test_rope(int n, int T, int n_heads, int hd, int stride, int col0, float theta) {
  char name[160];
  const long total = (long)n * stride;
  float *x = hrand(total, -1, 1), *ref = hcopy(x, total);
  float *d_x = dup_f32(x, total);
  tsr_ops_rope_fwd(ref + col0, n, T, n_heads, hd, stride, theta);
  OK(tsr_cuda_rope_fwd(d_x + col0, n, T, n_heads, hd, stride, theta, g_stream));
  snprintf(name, sizeof name, "rope fwd n=%d T=%d heads=%d hd=%d stride=%d", n, T, n_heads, hd, stride);
  check_f32(name, d_x, ref, total, TOL_F32);
  tsr_ops_rope_bwd(ref + col0, n, T, n_heads, hd, stride, theta);
  OK(tsr_cuda_rope_bwd(d_x + col0, n, T, n_heads, hd, stride, theta, g_stream));
  check_f32("rope bwd (inverse rotation)", d_x, ref, total, TOL_F32);
  check_f32("rope fwd+bwd gives the input back", d_x, x, total, TOL_F32);

  round_inplace(x, total);
  memcpy(ref, x, total * 4);
  tsr_bf16 *b_x = dup_bf16(x, total);
  tsr_ops_rope_fwd(ref + col0, n, T, n_heads, hd, stride, theta);
  OK(tsr_cuda_rope_fwd_bf16(b_x + col0, n, T, n_heads, hd, stride, theta, g_stream));
  check_bf16("rope fwd bf16", b_x, ref, total, TOL_BF16);
  free(x), free(ref);
  dfree(d_x), dfree(b_x);
}

/* ------------------------------------------------------------- activations */

static void test_activations(int n, int F) {
  char name[128];
  const long nf = (long)n * F, n2 = 2 * nf;
  float *gu = hrand(n2, -4, 4), *out = malloc(nf * 4), *dout = hrand(nf, -1, 1), *dgu = hrand(n2, -1, 1);
  /* the backward writes its gradient: the device's starts poisoned */
  float *d_gu = dup_f32(gu, n2), *d_out = poisoned(nf * 4), *d_dout = dup_f32(dout, nf), *d_dgu = poisoned(n2 * 4);
  tsr_ops_swiglu_fwd(out, gu, n, F);
  tsr_ops_swiglu_bwd(dgu, dout, gu, n, F);
  OK(tsr_cuda_swiglu_fwd(d_out, d_gu, n, F, g_stream));
  OK(tsr_cuda_swiglu_bwd(d_dgu, d_dout, d_gu, n, F, g_stream));
  snprintf(name, sizeof name, "swiglu fwd n=%d F=%d", n, F);
  check_f32(name, d_out, out, nf, TOL_F32);
  check_f32("swiglu bwd", d_dgu, dgu, n2, TOL_F32);

  float *gx = malloc(n2 * 4), *gdx = hrand(n2, -1, 1), *gdout = hrand(n2, -1, 1);
  float *d_gx = poisoned(n2 * 4), *d_gdx = poisoned(n2 * 4), *d_gdout = dup_f32(gdout, n2);
  tsr_ops_gelu_fwd(gx, gu, (int)n2);
  tsr_ops_gelu_bwd(gdx, gdout, gu, (int)n2);
  OK(tsr_cuda_gelu_fwd(d_gx, d_gu, (int)n2, g_stream));
  OK(tsr_cuda_gelu_bwd(d_gdx, d_gdout, d_gu, (int)n2, g_stream));
  snprintf(name, sizeof name, "gelu fwd n=%ld", n2);
  check_f32(name, d_gx, gx, n2, TOL_F32);
  check_f32("gelu bwd", d_gdx, gdx, n2, TOL_F32);

  /* bf16 */
  round_inplace(gu, n2), round_inplace(dout, nf), round_inplace(gdout, n2);
  tsr_bf16 *b_gu = dup_bf16(gu, n2), *b_dout = dup_bf16(dout, nf), *b_dgu = poisoned(n2 * 2);
  tsr_bf16 *b_out = poisoned(nf * 2), *b_gx = poisoned(n2 * 2), *b_gdout = dup_bf16(gdout, n2);
  tsr_bf16 *b_gdx = poisoned(n2 * 2);
  tsr_ops_swiglu_fwd(out, gu, n, F);
  tsr_ops_swiglu_bwd(dgu, dout, gu, n, F);
  tsr_ops_gelu_fwd(gx, gu, (int)n2);
  tsr_ops_gelu_bwd(gdx, gdout, gu, (int)n2);
  OK(tsr_cuda_swiglu_fwd_bf16(b_out, b_gu, n, F, g_stream));
  OK(tsr_cuda_swiglu_bwd_bf16(b_dgu, b_dout, b_gu, n, F, g_stream));
  OK(tsr_cuda_gelu_fwd_bf16(b_gx, b_gu, (int)n2, g_stream));
  OK(tsr_cuda_gelu_bwd_bf16(b_gdx, b_gdout, b_gu, (int)n2, g_stream));
  check_bf16("swiglu fwd bf16", b_out, out, nf, TOL_BF16);
  check_bf16("swiglu bwd bf16", b_dgu, dgu, n2, TOL_BF16);
  check_bf16("gelu fwd bf16", b_gx, gx, n2, TOL_BF16);
  check_bf16("gelu bwd bf16", b_gdx, gdx, n2, TOL_BF16);
  free(gu), free(out), free(dout), free(dgu), free(gx), free(gdx), free(gdout);
  dfree(d_gu), dfree(d_out), dfree(d_dout), dfree(d_dgu), dfree(d_gx), dfree(d_gdx), dfree(d_gdout);
  dfree(b_gu), dfree(b_dout), dfree(b_dgu), dfree(b_out), dfree(b_gx), dfree(b_gdout), dfree(b_gdx);
}

static void test_elementwise(long n) {
  char name[128];
  float *a = hrand(n, -1, 1), *b = hrand(n, -1, 1), *o = malloc(n * 4), *acc = hrand(n, -1, 1);
  float *d_a = dup_f32(a, n), *d_b = dup_f32(b, n), *d_o = poisoned(n * 4), *d_acc = dup_f32(acc, n);
  tsr_ops_add(o, a, b, n);
  tsr_ops_acc(acc, a, n);
  tsr_ops_scale(acc, 0.37f, n);
  OK(tsr_cuda_add(d_o, d_a, d_b, n, g_stream));
  OK(tsr_cuda_acc(d_acc, d_a, n, g_stream));
  OK(tsr_cuda_scale(d_acc, 0.37f, n, g_stream));
  snprintf(name, sizeof name, "add n=%ld", n);
  check_f32(name, d_o, o, n, TOL_F32);
  check_f32("acc + scale", d_acc, acc, n, TOL_F32);
  /* the residual add with rounding to the storage precision: bitwise the CPU's */
  static const char *const prec_name[] = {"fp32", "bf16", "fp16"};
  float *d_x = poisoned(n * 4), *got = malloc(n * 4);
  for (int prec = TSR_PREC_FP32; prec <= TSR_PREC_FP16; prec++) {
    tsr_ops_residual(o, a, b, n, (tsr_prec)prec);
    CUDA_CK(cudaMemset(d_o, 0xff, n * 4));
    OK(tsr_cuda_residual(d_o, d_a, d_b, n, (tsr_prec)prec, g_stream));
    down(got, d_o, n * 4);
    TU_CHECK(!memcmp(got, o, n * 4), "residual %s n=%ld bitwise the CPU's", prec_name[prec], n);
    CUDA_CK(cudaMemcpy(d_x, a, n * 4, cudaMemcpyHostToDevice));
    OK(tsr_cuda_residual(d_x, d_x, d_b, n, (tsr_prec)prec, g_stream)); /* in place */
    down(got, d_x, n * 4);
    TU_CHECK(!memcmp(got, o, n * 4), "residual %s n=%ld in place bitwise the CPU's",
             prec_name[prec], n);
  }
  free(got);
  dfree(d_x);
  round_inplace(a, n), round_inplace(b, n);
  float *c = hrand(n, -1, 1);
  round_inplace(c, n);
  tsr_bf16 *b_a = dup_bf16(a, n), *b_b = dup_bf16(b, n), *b_o = poisoned(n * 2), *b_c = dup_bf16(c, n);
  tsr_ops_add(o, a, b, n);
  tsr_ops_acc(c, a, n);
  OK(tsr_cuda_add_bf16(b_o, b_a, b_b, n, g_stream));
  OK(tsr_cuda_acc_bf16(b_c, b_a, n, g_stream));
  check_bf16("add bf16", b_o, o, n, TOL_BF16);
  check_bf16("acc bf16", b_c, c, n, TOL_BF16);
  free(a), free(b), free(o), free(acc), free(c);
  dfree(d_a), dfree(d_b), dfree(d_o), dfree(d_acc), dfree(b_a), dfree(b_b), dfree(b_o), dfree(b_c);
}

/* ------------------------------------------------------------ cross entropy */

static void test_xent(int n, int V) {
  char name[128];
  const long nv = (long)n * V;
  float *z = hrand(nv, -6, 6);
  int32_t *tgt = malloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n; r++) tgt[r] = (r % 5 == 3) ? -100 : (int32_t)(urand(0, 1) * V) % V;
  int32_t *d_tgt = dup_bytes(tgt, (size_t)n * sizeof(int32_t));
  double *d_loss = dalloc(sizeof(double));

  float *g = hcopy(z, nv);
  const double loss = tsr_ops_xent_fwd_bwd(g, tgt, n, V, 0.25f);
  float *d_z = dup_f32(z, nv);
  OK(tsr_cuda_xent_fwd_bwd(d_loss, d_z, d_tgt, n, V, 0.25f, WS(.rows = n), g_stream));
  snprintf(name, sizeof name, "xent fwd_bwd n=%d V=%d loss", n, V);
  check_double(name, d_loss, loss, TOL_F32);
  check_f32("xent fwd_bwd gradient", d_z, g, nv, TOL_F32);

  float *d_z2 = dup_f32(z, nv);
  OK(tsr_cuda_xent_fwd(d_loss, d_z2, d_tgt, n, V, WS(.rows = n), g_stream));
  check_double("xent fwd loss", d_loss, tsr_ops_xent_fwd(z, tgt, n, V), TOL_F32);
  check_f32("xent fwd leaves logits unchanged", d_z2, z, nv, 0.0);

  /* vocab-parallel over two "ranks": columns [0, V0) and [V0, V); the host plays the
   * all-reduces between the passes, for the CPU and the GPU alike */
  const int V0 = V / 3 + 1 < V ? V / 3 + 1 : V, Vp[2] = {V0, V - V0}, start[2] = {0, V0};
  double *rmax[2], *tl[2], *se[2];
  double *gmax = malloc(n * 8), *gtl = malloc(n * 8), *gse = malloc(n * 8);
  double *cmax = malloc(n * 8), *ctl = malloc(n * 8), *cse = malloc(n * 8);
  float *part[2], *d_part[2];
  double *d_rmax = dalloc(n * 8), *d_tl = dalloc(n * 8), *d_se = dalloc(n * 8);
  for (int k = 0; k < 2; k++) {
    rmax[k] = malloc(n * 8), tl[k] = malloc(n * 8), se[k] = malloc(n * 8);
    part[k] = malloc((size_t)n * (Vp[k] > 0 ? Vp[k] : 1) * 4);
    for (int r = 0; r < n; r++) memcpy(part[k] + (size_t)r * Vp[k], z + (size_t)r * V + start[k], Vp[k] * 4);
    d_part[k] = dup_f32(part[k], (long)n * Vp[k]);
  }
  for (int pass = 0; pass < 2; pass++) { /* pass 0: GPU (stats downloaded), 1: CPU */
    double *mx = pass ? cmax : gmax, *t = pass ? ctl : gtl, *s = pass ? cse : gse;
    for (int r = 0; r < n; r++) mx[r] = -INFINITY, t[r] = 0, s[r] = 0;
    for (int k = 0; k < 2; k++) {
      if (Vp[k] == 0) continue;
      if (pass) {
        tsr_ops_xent_local_stats(rmax[k], tl[k], part[k], tgt, n, Vp[k], start[k]);
      } else {
        OK(tsr_cuda_xent_local_stats(d_rmax, d_tl, d_part[k], d_tgt, n, Vp[k], start[k], g_stream));
        down(rmax[k], d_rmax, n * 8);
        down(tl[k], d_tl, n * 8);
      }
      for (int r = 0; r < n; r++) mx[r] = rmax[k][r] > mx[r] ? rmax[k][r] : mx[r], t[r] += tl[k][r];
    }
    for (int k = 0; k < 2; k++) {
      if (Vp[k] == 0) continue;
      if (pass) {
        tsr_ops_xent_local_sumexp(se[k], part[k], mx, n, Vp[k]);
      } else {
        CUDA_CK(cudaMemcpy(d_rmax, mx, n * 8, cudaMemcpyHostToDevice));
        OK(tsr_cuda_xent_local_sumexp(d_se, d_part[k], d_rmax, n, Vp[k], g_stream));
        down(se[k], d_se, n * 8);
      }
      for (int r = 0; r < n; r++) s[r] += se[k][r];
    }
  }
  double e_max = 0, e_tl = 0, e_se = 0;
  for (int r = 0; r < n; r++) {
    e_max = fmax(e_max, fabs(gmax[r] - cmax[r]) / fmax(fabs(cmax[r]), 1e-30));
    e_tl = fmax(e_tl, fabs(gtl[r] - ctl[r]) / fmax(fabs(ctl[r]), 1.0));
    e_se = fmax(e_se, fabs(gse[r] - cse[r]) / cse[r]);
  }
  snprintf(name, sizeof name, "xent vocab-parallel stats n=%d V=%d+%d", n, Vp[0], Vp[1]);
  TU_CHECK(e_max == 0 && e_tl == 0 && e_se <= TOL_F32, "%-48s max %.1e target %.1e sumexp %.1e", name,
           e_max, e_tl, e_se);
  CUDA_CK(cudaMemcpy(d_rmax, cmax, n * 8, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_tl, ctl, n * 8, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_se, cse, n * 8, cudaMemcpyHostToDevice));
  OK(tsr_cuda_xent_rows(d_loss, d_rmax, d_se, d_tl, n, g_stream));
  check_double("xent vocab-parallel rows (loss sum)", d_loss, tsr_ops_xent_rows(cmax, cse, ctl, n), TOL_DOUBLE);
  for (int k = 0; k < 2; k++) {
    if (Vp[k] == 0) continue;
    tsr_ops_xent_grad(part[k], tgt, cmax, cse, n, Vp[k], start[k], 0.25f);
    OK(tsr_cuda_xent_grad(d_part[k], d_tgt, d_rmax, d_se, n, Vp[k], start[k], 0.25f, g_stream));
    snprintf(name, sizeof name, "xent vocab-parallel grad, rank %d of 2", k);
    check_f32(name, d_part[k], part[k], (long)n * Vp[k], TOL_F32);
  }

  /* bf16 logits: the CPU computes on the same bf16-exact values */
  round_inplace(z, nv);
  memcpy(g, z, nv * 4);
  const double loss_b = tsr_ops_xent_fwd_bwd(g, tgt, n, V, 0.25f);
  tsr_bf16 *b_z = dup_bf16(z, nv);
  OK(tsr_cuda_xent_fwd_bwd_bf16(d_loss, b_z, d_tgt, n, V, 0.25f, WS(.rows = n), g_stream));
  check_double("xent fwd_bwd bf16 loss", d_loss, loss_b, TOL_F32);
  check_bf16("xent fwd_bwd bf16 gradient", b_z, g, nv, TOL_BF16);
  /* the vocab-parallel bf16 passes on one "rank" holding everything */
  double *m1 = malloc(n * 8), *t1 = malloc(n * 8), *s1 = malloc(n * 8);
  memcpy(g, z, nv * 4);
  tsr_ops_xent_local_stats(m1, t1, g, tgt, n, V, 0);
  tsr_ops_xent_local_sumexp(s1, g, m1, n, V);
  tsr_ops_xent_grad(g, tgt, m1, s1, n, V, 0, 0.25f);
  dfree(b_z);
  b_z = dup_bf16(z, nv);
  OK(tsr_cuda_xent_local_stats_bf16(d_rmax, d_tl, b_z, d_tgt, n, V, 0, g_stream));
  OK(tsr_cuda_xent_local_sumexp_bf16(d_se, b_z, d_rmax, n, V, g_stream));
  OK(tsr_cuda_xent_grad_bf16(b_z, d_tgt, d_rmax, d_se, n, V, 0, 0.25f, g_stream));
  check_bf16("xent vocab-parallel bf16 passes, gradient", b_z, g, nv, TOL_BF16);

  free(z), free(tgt), free(g), free(gmax), free(gtl), free(gse), free(cmax), free(ctl), free(cse);
  free(m1), free(t1), free(s1);
  for (int k = 0; k < 2; k++) free(rmax[k]), free(tl[k]), free(se[k]), free(part[k]), dfree(d_part[k]);
  dfree(d_tgt), dfree(d_loss), dfree(d_z), dfree(d_z2), dfree(d_rmax), dfree(d_tl), dfree(d_se), dfree(b_z);
}

/* -------------------------------------------------------- AdamW, reductions */

static void test_adamw(long n) {
  float *p = hrand(n, -1, 1), *m = hrand(n, -0.1f, 0.1f), *v = hrand(n, 1e-6f, 1e-2f);
  float *d_p = dup_f32(p, n), *d_m = dup_f32(m, n), *d_v = dup_f32(v, n);
  /* steps 2-4 also refresh a compute copy (fp32, bf16, fp16) in the same pass: on the
   * device it must be bitwise the rounding of the device's new p */
  static const char *const prec_name[] = {"fp32", "bf16", "fp16"};
  float *out = malloc((size_t)n * sizeof(float)), *pd = malloc((size_t)n * sizeof(float));
  char name[64];
  for (long t = 1; t <= 4; t++) {
    float *g = hrand(n, -2, 2), *d_g = dup_f32(g, n);
    const tsr_prec prec = (tsr_prec)(t - 2);
    float *d_out = t > 1 ? poisoned((size_t)n * sizeof(float)) : NULL;
    tsr_ops_adamw(p, m, v, g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, t > 1 ? out : NULL,
                  prec);
    OK(tsr_cuda_adamw(d_p, d_m, d_v, d_g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, d_out,
                      prec, g_stream));
    if (d_out) {
      snprintf(name, sizeof name, "adamw n=%ld %s refresh against the CPU's", n, prec_name[t - 2]);
      check_f32(name, d_out, out, n, prec == TSR_PREC_FP32 ? TOL_F32 : TOL_BF16);
      down(pd, d_p, (size_t)n * sizeof(float));
      if (prec == TSR_PREC_BF16) tsr_ops_round_bf16(pd, pd, n);
      if (prec == TSR_PREC_FP16) tsr_ops_round_fp16(pd, pd, n);
      down(out, d_out, (size_t)n * sizeof(float));
      TU_CHECK(memcmp(out, pd, (size_t)n * sizeof(float)) == 0,
               "adamw n=%ld %s refresh bitwise the rounding of the device's p", n,
               prec_name[t - 2]);
      dfree(d_out);
    }
    free(g);
    dfree(d_g);
  }
  free(out), free(pd);
  snprintf(name, sizeof name, "adamw n=%ld, 4 steps: p", n);
  check_f32(name, d_p, p, n, TOL_F32);
  check_f32("adamw m", d_m, m, n, TOL_F32);
  check_f32("adamw v", d_v, v, n, TOL_F32);
  free(p), free(m), free(v);
  dfree(d_p), dfree(d_m), dfree(d_v);
}

static void test_reductions(long n) {
  char name[64];
  float *x = hrand(n, -3, 3), *d_x = dup_f32(x, n);
  double *d_s = dalloc(8), *d_s2 = dalloc(8);
  int *d_ok = dalloc(sizeof(int)), ok = -1;
  OK(tsr_cuda_sumsq(d_s, d_x, n, WS(.sumsq_elems = n), g_stream));
  OK(tsr_cuda_sumsq(d_s2, d_x, n, WS(.sumsq_elems = n), g_stream));
  snprintf(name, sizeof name, "sumsq n=%ld", n);
  check_double(name, d_s, tsr_ops_sumsq(x, n), TOL_DOUBLE);
  TU_CHECK(same_bytes(d_s, d_s2, 8), "sumsq deterministic (two runs bitwise)");
  /* a scratch one byte short of what the query says is refused, nothing launched */
  tsr_cuda_scratch short_ws = *WS(.sumsq_elems = n);
  short_ws.bytes -= 1;
  printf("      (an error about scratch is expected next)\n");
  fflush(stdout);
  TU_CHECK(tsr_cuda_sumsq(d_s, d_x, n, &short_ws, g_stream) != 0,
           "sumsq n=%ld refuses a scratch one byte short of tsr_cuda_scratch_bytes", n);
  TU_CHECK(same_bytes(d_s, d_s2, 8), "  ... and left its output alone");
  OK(tsr_cuda_all_finite(d_ok, d_x, n, g_stream));
  down(&ok, d_ok, sizeof ok);
  TU_CHECK(ok == 1, "all_finite on finite data n=%ld: %d", n, ok);
  const float bad[2] = {NAN, INFINITY};
  for (int k = 0; k < 2; k++) {
    const long at = (long)(urand(0, 1) * n) % n;
    CUDA_CK(cudaMemcpy(d_x + at, &bad[k], 4, cudaMemcpyHostToDevice));
    OK(tsr_cuda_all_finite(d_ok, d_x, n, g_stream));
    down(&ok, d_ok, sizeof ok);
    TU_CHECK(ok == 0, "all_finite finds a planted %s at %ld of %ld", k ? "inf" : "nan", at, n);
    CUDA_CK(cudaMemcpy(d_x + at, &x[at], 4, cudaMemcpyHostToDevice));
  }
  /* a loss added up on the device: *acc += *x / div, twice, as the host does it */
  const double acc0 = urand(-5, 5), x0 = urand(1, 9), div = (double)(3 + n % 7);
  double host = acc0, got = 0;
  CUDA_CK(cudaMemcpy(d_s, &acc0, 8, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_s2, &x0, 8, cudaMemcpyHostToDevice));
  for (int k = 0; k < 2; k++) {
    OK(tsr_cuda_add_quotient(d_s, d_s2, div, g_stream));
    host += x0 / div;
  }
  down(&got, d_s, 8);
  TU_CHECK(got == host, "add_quotient twice: %.17g, the host's sum %.17g", got, host);
  free(x);
  dfree(d_x), dfree(d_s), dfree(d_s2), dfree(d_ok);
}

/* ------------------------------------------------------------------- GEMMs */

static void test_matmul(tsr_cuda_blas *blas, int n, int in, int out) {
  char name[128];
  const long nx = (long)n * in, nw = (long)out * in, ny = (long)n * out;
  float *x = hrand(nx, -1, 1), *w = hrand(nw, -1, 1), *bias = hrand(out, -1, 1), *y = malloc(ny * 4);
  float *d_x = dup_f32(x, nx), *d_w = dup_f32(w, nw), *d_b = dup_f32(bias, out), *d_y = poisoned(ny * 4);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    tsr_ops_matmul_fwd(y, x, w, with_bias ? bias : NULL, n, in, out);
    CUDA_CK(cudaMemset(d_y, 0xff, ny * 4));
    OK(tsr_cuda_matmul_fwd(blas, d_y, d_x, d_w, with_bias ? d_b : NULL, n, in, out, g_stream));
    snprintf(name, sizeof name, "matmul fwd fp32 n=%d in=%d out=%d%s", n, in, out, with_bias ? " +bias" : "");
    check_f32(name, d_y, y, ny, TOL_F32);
  }
  /* dx is written (the device's starts poisoned); dw and dbias accumulate onto random values */
  float *dy = hrand(ny, -1, 1), *dx = malloc(nx * 4), *dw = hrand(nw, -1, 1), *db = hrand(out, -1, 1);
  float *d_dy = dup_f32(dy, ny), *d_dx = poisoned(nx * 4), *d_dw = dup_f32(dw, nw), *d_db = dup_f32(db, out);
  tsr_ops_matmul_bwd(dx, dw, db, dy, x, w, n, in, out);
  OK(tsr_cuda_matmul_bwd(blas, d_dx, d_dw, d_db, d_dy, d_x, d_w, n, in, out, WS(.rows = n, .cols = out), g_stream));
  snprintf(name, sizeof name, "matmul bwd fp32 dx n=%d in=%d out=%d", n, in, out);
  check_f32(name, d_dx, dx, nx, TOL_F32);
  check_f32("matmul bwd fp32 dw", d_dw, dw, nw, TOL_F32);
  check_f32("matmul bwd fp32 dbias", d_db, db, out, TOL_F32);
  float *dx_before = malloc(nx * 4);
  down(dx_before, d_dx, nx * 4);
  tsr_ops_matmul_bwd(NULL, dw, NULL, dy, x, w, n, in, out); /* NULL gradients are skipped */
  OK(tsr_cuda_matmul_bwd(blas, NULL, d_dw, NULL, d_dy, d_x, d_w, n, in, out, WS(.rows = n, .cols = out), g_stream));
  check_f32("matmul bwd fp32 dw only", d_dw, dw, nw, TOL_F32);
  check_f32("matmul bwd fp32 dx untouched when NULL", d_dx, dx_before, nx, 0.0);
  free(dx_before);

  /* bf16 inputs, fp32 and bf16 outputs; bias in the output's type */
  round_inplace(x, nx), round_inplace(w, nw), round_inplace(bias, out), round_inplace(dy, ny);
  tsr_bf16 *b_x = dup_bf16(x, nx), *b_w = dup_bf16(w, nw), *b_bias = dup_bf16(bias, out), *b_dy = dup_bf16(dy, ny);
  tsr_bf16 *b_y = poisoned(ny * 2), *b_pre = poisoned(ny * 2);
  CUDA_CK(cudaMemcpy(d_b, bias, out * 4, cudaMemcpyHostToDevice));
  float *gl = malloc(ny * 4);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    tsr_ops_matmul_fwd(y, x, w, with_bias ? bias : NULL, n, in, out);
    CUDA_CK(cudaMemset(d_y, 0xff, ny * 4));
    OK(tsr_cuda_matmul_fwd_bf16(blas, d_y, TSR_CUDA_F32, b_x, b_w, with_bias ? d_b : NULL,
                                TSR_CUDA_ACT_NONE, NULL, n, in, out, g_stream));
    snprintf(name, sizeof name, "matmul fwd bf16->fp32 n=%d in=%d out=%d%s", n, in, out, with_bias ? " +bias" : "");
    check_f32(name, d_y, y, ny, TOL_BF16_GEMM_F32);
    OK(tsr_cuda_matmul_fwd_bf16(blas, b_y, TSR_CUDA_BF16, b_x, b_w, with_bias ? b_bias : NULL,
                                TSR_CUDA_ACT_NONE, NULL, n, in, out, g_stream));
    check_bf16("matmul fwd bf16->bf16", b_y, y, ny, TOL_BF16);
    /* GELU epilogue (fused when out % 8 == 0, else the separate pass) */
    tsr_ops_gelu_fwd(gl, y, (int)ny);
    CUDA_CK(cudaMemset(d_y, 0xff, ny * 4));
    float *d_pre = poisoned(ny * 4);
    OK(tsr_cuda_matmul_fwd_bf16(blas, d_y, TSR_CUDA_F32, b_x, b_w, with_bias ? d_b : NULL,
                                TSR_CUDA_ACT_GELU, d_pre, n, in, out, g_stream));
    check_f32("matmul fwd bf16->fp32 +gelu: pre-activation", d_pre, y, ny, TOL_BF16_GEMM_F32);
    check_f32("matmul fwd bf16->fp32 +gelu: output", d_y, gl, ny, TOL_BF16_GEMM_F32);
    OK(tsr_cuda_matmul_fwd_bf16(blas, b_y, TSR_CUDA_BF16, b_x, b_w, with_bias ? b_bias : NULL,
                                TSR_CUDA_ACT_GELU, b_pre, n, in, out, g_stream));
    check_bf16("matmul fwd bf16->bf16 +gelu: pre-activation", b_pre, y, ny, TOL_BF16);
    check_bf16("matmul fwd bf16->bf16 +gelu: output", b_y, gl, ny, TOL_BF16);
    dfree(d_pre);
  }
  /* backward: dx in fp32 and in bf16 (written over poison), dw and dbias fp32 (accumulating) */
  float *dxb = malloc(nx * 4);
  tsr_bf16 *b_dx = poisoned(nx * 2);
  CUDA_CK(cudaMemset(d_dx, 0xff, nx * 4));
  CUDA_CK(cudaMemcpy(d_dw, dw, nw * 4, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_db, db, out * 4, cudaMemcpyHostToDevice));
  tsr_ops_matmul_bwd(dx, dw, db, dy, x, w, n, in, out);
  tsr_ops_matmul_bwd(dxb, NULL, NULL, dy, x, w, n, in, out);
  OK(tsr_cuda_matmul_bwd_bf16(blas, d_dx, TSR_CUDA_F32, d_dw, d_db, b_dy, b_x, b_w, n, in, out, WS(.rows = n, .cols = out), g_stream));
  OK(tsr_cuda_matmul_bwd_bf16(blas, b_dx, TSR_CUDA_BF16, NULL, NULL, b_dy, b_x, b_w, n, in, out, WS(.rows = n, .cols = out), g_stream));
  snprintf(name, sizeof name, "matmul bwd bf16 dx->fp32 n=%d in=%d out=%d", n, in, out);
  check_f32(name, d_dx, dx, nx, TOL_BF16_GEMM_F32);
  check_bf16("matmul bwd bf16 dx->bf16", b_dx, dxb, nx, TOL_BF16);
  check_f32("matmul bwd bf16 dw (fp32)", d_dw, dw, nw, TOL_BF16_GEMM_F32);
  check_f32("matmul bwd bf16 dbias (fp32)", d_db, db, out, TOL_F32);

  free(x), free(w), free(bias), free(y), free(dy), free(dx), free(dw), free(db), free(gl), free(dxb);
  dfree(d_x), dfree(d_w), dfree(d_b), dfree(d_y), dfree(d_dy), dfree(d_dx), dfree(d_dw), dfree(d_db);
  dfree(b_x), dfree(b_w), dfree(b_bias), dfree(b_dy), dfree(b_y), dfree(b_pre), dfree(b_dx);
}

/* out = 0: dx = dy w is an empty sum, written as zeros (fp32 and bf16), as on the CPU */
static void test_matmul_empty_sum(tsr_cuda_blas *blas, int n, int in) {
  const long nx = (long)n * in;
  float *w = hrand(nx, -1, 1), *dx = hrand(nx, -1, 1), *got = malloc(nx * 4);
  float *d_dx = poisoned(nx * 4), *d_w = dup_f32(w, nx);
  tsr_bf16 *b_dx = poisoned(nx * 2);
  uint16_t *bits = malloc(nx * 2);
  tsr_ops_matmul_bwd(dx, NULL, NULL, NULL, NULL, w, n, in, 0);
  OK(tsr_cuda_matmul_bwd(blas, d_dx, NULL, NULL, NULL, NULL, d_w, n, in, 0,
                         WS(.rows = n, .cols = 1), g_stream));
  OK(tsr_cuda_matmul_bwd_bf16(blas, b_dx, TSR_CUDA_BF16, NULL, NULL, NULL, NULL, NULL, n, in, 0,
                              WS(.rows = n, .cols = 1), g_stream));
  down(got, d_dx, nx * 4);
  down(bits, b_dx, nx * 2);
  long bad = 0;
  for (long i = 0; i < nx; i++) bad += dx[i] != 0.0f || got[i] != 0.0f || bits[i] != 0;
  TU_CHECK(bad == 0, "matmul bwd out=0: dx written as zeros (CPU, fp32, bf16): %ld wrong", bad);
  free(w), free(dx), free(got), free(bits);
  dfree(d_dx), dfree(d_w), dfree(b_dx);
}

/* --------------------------------------------------------------- attention */

/* q, k, v in one fused [B*T, (H+2KV)*hd] buffer (the model's layout), or, with
 * separate = 1, three buffers of row stride H*hd. */
#ifdef TSR_HAVE_CUDNN
/* cuDNN's fused attention (cuda/sdpa_cudnn.cpp) against the CPU on the inputs and CPU
 * results of test_attention (d_out, d_lse hold the CPU's out and lse).  Where it must run
 * (below) it must also fit its workspace in the staging tsr_ops_cudnn_attention_staging_elems
 * sizes; elsewhere it may decline, saying why. */
static void test_attention_cudnn(int B, int T, int H, int KV, int hd, int separate,
                                 const float *buf, const float *q, const float *k,
                                 const float *v, long nbuf, const float *out, const float *lse,
                                 const float *dout, float *d_buf, const float *d_out,
                                 const float *d_lse, const float *d_dout) {
  char name[200], why[600];
  const int stride = separate ? H * hd : (H + 2 * KV) * hd;
  const long nout = (long)B * T * H * hd, nl = (long)B * H * T;
  tsr_ops_shapes sh = {.attn_bht = nl, .attn_io = (long)B * T * (H + KV) * hd, .attn_t = T};
  const long n_stage = tsr_ops_cudnn_attention_staging_elems(&sh);
  int dev = 0, major = 0;
  CUDA_CK(cudaGetDevice(&dev));
  CUDA_CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const int rc = tsr_cuda_cudnn_attention_prepare(B, T, H, KV, hd, n_stage, why, sizeof why);
  snprintf(name, sizeof name, "attention cudnn B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd,
           separate ? " (separate q,k,v)" : "");
  /* on sm_90 cuDNN accepts all but one-token sequences and head dimensions that are not
   * multiples of 8 (tests/cuda/cudnn_offline.c); elsewhere hd 64 and 128 at least */
  const int must = T > 1 && (major == 9 ? hd % 8 == 0 && hd <= 256
                                         : major >= 8 && (hd == 64 || hd == 128));
  if (must)
    TU_CHECK(rc == 0, "%s: runs (%s)", name, why);
  else if (rc != 0)
    printf("      %s: declined (%s)\n", name, why);
  if (rc != 0) return;
  printf("      %s: %s\n", name, why);
  tsr_bf16 *staging = poisoned((size_t)n_stage * 2);
  float *c_out = poisoned(nout * 4), *c_lse = poisoned(nl * 4);
  float *d_q = d_buf + (q - buf), *d_k = d_buf + (k - buf), *d_v = d_buf + (v - buf);
  OK(tsr_cuda_cudnn_attention_fwd(c_out, c_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride, staging,
                                  n_stage, g_stream));
  check_f32(name, c_out, out, nout, TOL_BF16);
  check_lse("attention cudnn fwd lse", c_lse, lse, nl, TOL_BF16);
  float *dc = hrand(nbuf, -1e-3, 1e-3); /* small start: the check sees the gradient */
  float *c_db = dup_f32(dc, nbuf), *c_db2 = dup_f32(dc, nbuf);
  tsr_ops_attention_bwd(dc + (q - buf), dc + (k - buf), dc + (v - buf), dout, out, lse, q, k, v, B,
                        T, H, KV, hd, stride);
  for (int run = 0; run < 2; run++) {
    float *db = run ? c_db2 : c_db;
    OK(tsr_cuda_cudnn_attention_bwd(db + (q - buf), db + (k - buf), db + (v - buf), d_dout, d_out,
                                    d_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride, staging,
                                    n_stage, g_stream));
  }
  check_f32("attention cudnn bwd dq, dk, dv (accumulated)", c_db, dc, nbuf, TOL_BF16);
  if (strstr(why, "NON-deterministic"))
    printf("      (cuDNN gave no deterministic backward here: two runs not compared)\n");
  else
    TU_CHECK(same_bytes(c_db, c_db2, nbuf * 4), "attention cudnn bwd deterministic (two runs "
                                                 "bitwise)");
  printf("      (an error about the staging is expected next)\n");
  fflush(stdout);
  TU_CHECK(tsr_cuda_cudnn_attention_fwd(c_out, c_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride,
                                        staging, 4 * (sh.attn_io / 4) / 2, g_stream) != 0,
           "attention cudnn refuses a staging too small for its copies");
  free(dc);
  dfree(staging), dfree(c_out), dfree(c_lse), dfree(c_db), dfree(c_db2);
}
#endif

static void test_attention(int B, int T, int H, int KV, int hd, int separate) {
  char name[160];
  const int stride = separate ? H * hd : (H + 2 * KV) * hd;
  const long rows = (long)B * T, nqkv = rows * stride, nout = rows * H * hd, nl = (long)B * H * T;
  const long nbuf = separate ? 3 * nqkv : nqkv;
  float *buf = hrand(nbuf, -2, 2);
  float *q = buf, *k = separate ? buf + nqkv : buf + H * hd, *v = separate ? buf + 2 * nqkv : buf + (H + KV) * hd;
  float *out = malloc(nout * 4), *lse = malloc(nl * 4);
  tsr_ops_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, stride);
  float *d_buf = dup_f32(buf, nbuf);
  float *d_q = d_buf + (q - buf), *d_k = d_buf + (k - buf), *d_v = d_buf + (v - buf);
  float *d_out = poisoned(nout * 4), *d_lse = poisoned(nl * 4);
  OK(tsr_cuda_attention_fwd(d_out, d_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride, g_stream));
  snprintf(name, sizeof name, "attention fwd B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd,
           separate ? " (separate q,k,v)" : "");
  check_f32(name, d_out, out, nout, TOL_F32);
  check_lse("attention fwd lse", d_lse, lse, nl, TOL_F32);

  /* backward on the CPU's out and lse, so only the backward is under test */
  float *dout = hrand(nout, -1, 1), *dbuf = hrand(nbuf, -1, 1);
  float *d_dout = dup_f32(dout, nout), *d_dbuf = dup_f32(dbuf, nbuf), *d_dbuf2 = dup_f32(dbuf, nbuf);
  CUDA_CK(cudaMemcpy(d_out, out, nout * 4, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  tsr_ops_attention_bwd(dbuf + (q - buf), dbuf + (k - buf), dbuf + (v - buf), dout, out, lse, q, k, v,
                        B, T, H, KV, hd, stride);
  for (int run = 0; run < 2; run++) {
    float *db = run ? d_dbuf2 : d_dbuf;
    OK(tsr_cuda_attention_bwd(db + (q - buf), db + (k - buf), db + (v - buf), d_dout, d_out, d_lse,
                              d_q, d_k, d_v, B, T, H, KV, hd, stride, WS(.attn_bht = (long)B * H * T), g_stream));
  }
  check_f32("attention bwd dq, dk, dv (accumulated)", d_dbuf, dbuf, nbuf, TOL_F32);
  TU_CHECK(same_bytes(d_dbuf, d_dbuf2, nbuf * 4), "attention bwd deterministic (two runs bitwise)");

  /* tensor cores: bf16 products, fp32 storage; both kernel sets (WMMA, mma.sync) */
  for (int kern = TSR_CUDA_TC_WMMA; kern <= TSR_CUDA_TC_MMA; kern++) {
    tsr_cuda_attention_tc_use(kern);
    if (!tsr_cuda_attention_tc_supported(hd)) continue;
    const char *kname = kern == TSR_CUDA_TC_MMA ? "mma" : "wmma";
    float *t_out = poisoned(nout * 4), *t_lse = poisoned(nl * 4);
    OK(tsr_cuda_attention_tc_fwd(t_out, t_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride, g_stream));
    snprintf(name, sizeof name, "attention tc (%s) fwd B=%d T=%d H=%d KV=%d hd=%d%s", kname, B, T,
             H, KV, hd, separate ? " (separate q,k,v)" : "");
    check_f32(name, t_out, out, nout, TOL_BF16);
    check_lse(kern ? "attention tc (mma) fwd lse" : "attention tc (wmma) fwd lse", t_lse, lse, nl,
              TOL_BF16);
    float *dtc = hrand(nbuf, -1e-3, 1e-3); /* small start: the check sees the gradient */
    float *t_db = dup_f32(dtc, nbuf), *t_db2 = dup_f32(dtc, nbuf);
    tsr_ops_attention_bwd(dtc + (q - buf), dtc + (k - buf), dtc + (v - buf), dout, out, lse, q, k,
                          v, B, T, H, KV, hd, stride);
    for (int run = 0; run < 2; run++) {
      float *db = run ? t_db2 : t_db;
      OK(tsr_cuda_attention_tc_bwd(db + (q - buf), db + (k - buf), db + (v - buf), d_dout, d_out,
                                   d_lse, d_q, d_k, d_v, B, T, H, KV, hd, stride,
                                   WS(.attn_bht = (long)B * H * T,
                                      .attn_part = KV < H ? 2L * B * H * T * hd : 0),
                                   g_stream));
    }
    check_f32(kern ? "attention tc (mma) bwd dq, dk, dv (accumulated)"
                   : "attention tc (wmma) bwd dq, dk, dv (accumulated)",
              t_db, dtc, nbuf, TOL_BF16);
    TU_CHECK(same_bytes(t_db, t_db2, nbuf * 4),
             "attention tc (%s) bwd deterministic (two runs bitwise)", kname);
    if (KV < H) { /* grouped: without the partials' scratch it refuses, launching nothing */
      printf("      (an error about scratch is expected next)\n");
      fflush(stdout);
      TU_CHECK(tsr_cuda_attention_tc_bwd(t_db2 + (q - buf), t_db2 + (k - buf), t_db2 + (v - buf),
                                         d_dout, d_out, d_lse, d_q, d_k, d_v, B, T, H, KV, hd,
                                         stride, WS(.attn_bht = (long)B * H * T), g_stream) != 0,
               "attention tc (%s) bwd (KV < H) refuses a scratch without attn_part", kname);
      TU_CHECK(same_bytes(t_db, t_db2, nbuf * 4), "  ... and left its outputs alone");
    }
    free(dtc);
    dfree(t_out), dfree(t_lse), dfree(t_db), dfree(t_db2);
  }
  tsr_cuda_attention_tc_use(TSR_CUDA_TC_WMMA);
#ifdef TSR_HAVE_CUDNN
  if (!getenv("TSR_TEST_NO_CUDNN")) /* device-test.sh sanitize: our kernels, not cuDNN's */
    test_attention_cudnn(B, T, H, KV, hd, separate, buf, q, k, v, nbuf, out, lse, dout, d_buf,
                         d_out, d_lse, d_dout);
#endif

  /* bf16 storage: the CPU reference computes in fp32 on the same bf16-exact values */
  round_inplace(buf, nbuf), round_inplace(dout, nout);
  tsr_ops_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, stride);
  tsr_bf16 *b_buf = dup_bf16(buf, nbuf), *b_out = poisoned(nout * 2);
  tsr_bf16 *b_q = b_buf + (q - buf), *b_k = b_buf + (k - buf), *b_v = b_buf + (v - buf);
  CUDA_CK(cudaMemset(d_lse, 0xff, nl * 4));
  OK(tsr_cuda_attention_fwd_bf16(b_out, d_lse, b_q, b_k, b_v, B, T, H, KV, hd, stride, g_stream));
  check_bf16("attention fwd bf16 out", b_out, out, nout, TOL_BF16);
  check_lse("attention fwd bf16 lse (fp32)", d_lse, lse, nl, TOL_F32);
  round_inplace(out, nout); /* the backward sees the bf16 output, on both sides */
  float *dbb = hrand(nbuf, -1e-3, 1e-3); /* small start: the bf16 check sees the gradient */
  round_inplace(dbb, nbuf);
  tsr_bf16 *b_dout = dup_bf16(dout, nout), *b_outr = dup_bf16(out, nout), *b_dbuf = dup_bf16(dbb, nbuf);
  CUDA_CK(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  tsr_ops_attention_bwd(dbb + (q - buf), dbb + (k - buf), dbb + (v - buf), dout, out, lse, q, k, v, B,
                        T, H, KV, hd, stride);
  OK(tsr_cuda_attention_bwd_bf16(b_dbuf + (q - buf), b_dbuf + (k - buf), b_dbuf + (v - buf), b_dout,
                                 b_outr, d_lse, b_q, b_k, b_v, B, T, H, KV, hd, stride, WS(.attn_bht = (long)B * H * T), g_stream));
  check_bf16("attention bwd bf16 dq, dk, dv", b_dbuf, dbb, nbuf, TOL_BF16);

  free(buf), free(out), free(lse), free(dout), free(dbuf), free(dbb);
  dfree(d_buf), dfree(d_out), dfree(d_lse), dfree(d_dout), dfree(d_dbuf), dfree(d_dbuf2);
  dfree(b_buf), dfree(b_out), dfree(b_dout), dfree(b_outr), dfree(b_dbuf);
}

/* --------------------------------------------------------------------- main */

/* TSR_TEST_ONLY=attention,xent runs only the groups named (debugging on a GPU). */
static int want(const char *group) {
  const char *only = getenv("TSR_TEST_ONLY");
  return !only || !*only || strstr(only, group) != NULL;
}

int main(void) {
  int n_dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0) {
    printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  struct cudaDeviceProp prop;
  CUDA_CK(cudaGetDeviceProperties(&prop, 0));
  CUDA_CK(cudaSetDevice(0));
  CUDA_CK(cudaStreamCreate(&g_stream));
  const char *s = getenv("TSR_TEST_SEED");
  g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  printf("device %s (sm_%d%d), seed %llu (TSR_TEST_SEED=%llu repeats this run)\n", prop.name,
         prop.major, prop.minor, (unsigned long long)g_seed, (unsigned long long)g_seed);
  tsr_ops_init(0);

  if (want("casts")) {
    test_casts(1);
    test_casts(100003);
    test_cast_rows(1, 1, 1);
    test_cast_rows(37, 100, 160);
    test_cast_rows(1000, 64, 64);
  }
  if (want("embedding")) {
    test_embedding(39, 13, 70, 50, 10, 30, 1); /* tokens outside this rank's slice */
    test_embedding(300, 100, 256, 7, 0, 7, 0); /* few tokens: long runs of the same row */
    test_embedding(1, 1, 1, 3, 0, 3, 1);
    test_embedding(1000, 500, 300, 32000, 0, 32000, 1);
  }
  const int norm_shapes[][2] = {{1, 1}, {1, 64}, {37, 100}, {300, 1000}, {64, 4096}, {5, 5000}};
  for (int i = 0; i < 6 && want("rmsnorm"); i++) test_rmsnorm(norm_shapes[i][0], norm_shapes[i][1]);
  for (int i = 0; i < 6 && want("layernorm"); i++) test_layernorm(norm_shapes[i][0], norm_shapes[i][1]);
  if (want("rope")) {
    test_rope(2 * 33, 33, 3, 16, (3 + 2 * 1) * 16, 0, 10000.0f);      /* q heads of a fused qkv */
    test_rope(2 * 33, 33, 1, 16, (3 + 2 * 1) * 16, 3 * 16, 10000.0f); /* its k head */
    test_rope(3 * 7, 7, 2, 2, 4, 0, 500000.0f);
    test_rope(4096, 4096, 1, 128, 128, 0, 10000.0f); /* long context: the phase */
  }
  if (want("activations")) {
    test_activations(1, 1);
    test_activations(37, 100);
    test_activations(64, 1376);
  }
  if (want("elementwise")) {
    test_elementwise(1);
    test_elementwise(1000003);
  }
  if (want("xent")) {
    test_xent(1, 1);
    test_xent(7, 1000);
    test_xent(64, 50257);
    test_xent(3, 70000);
  }
  if (want("adamw")) {
    test_adamw(1);
    test_adamw(100003);
  }
  if (want("reductions")) {
    test_reductions(1);
    test_reductions(1000);
    test_reductions((1L << 22) + 3);
  }
  if (want("matmul")) {
    tsr_cuda_blas *blas = NULL;
    OK(tsr_cuda_blas_create(&blas, 0));
    test_matmul(blas, 1, 3, 5);
    test_matmul(blas, 77, 130, 65);
    test_matmul(blas, 256, 512, 384);
    test_matmul(blas, 33, 64, 24);
    test_matmul_empty_sum(blas, 7, 9);
    tsr_cuda_blas_destroy(&blas);
    TU_CHECK(blas == NULL, "tsr_cuda_blas_destroy NULLs the handle");
  }
  const int att[][5] = {{1, 1, 1, 1, 8},    {2, 33, 4, 2, 16},  {1, 100, 6, 3, 20},
                        {1, 70, 2, 1, 128}, {2, 130, 4, 4, 64}, {1, 257, 8, 2, 72},
                        {1, 64, 3, 1, 96},  {1, 31, 2, 2, 32}};
  if (want("attention")) {
    int dev = 0, optin = 0;
    CUDA_CK(cudaGetDevice(&dev));
    CUDA_CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (int kern = TSR_CUDA_TC_WMMA; kern <= TSR_CUDA_TC_MMA; kern++) {
      tsr_cuda_attention_tc_use(kern);
      TU_CHECK(tsr_cuda_attention_tc_kernel() == kern, "attention tc: kernel set %d chosen", kern);
      for (int hd = 16; hd <= 144; hd += 16) {
        const size_t need = tsr_cuda_attention_tc_smem(hd);
        TU_CHECK(tsr_cuda_attention_tc_supported(hd) == (need > 0 && need <= (size_t)optin) &&
                     (need > 0) == (hd == 32 || hd == 64 || hd == 96 || hd == 128),
                 "attention tc (%s): head_dim %d %s (needs %zu bytes of shared memory, the GPU "
                 "gives %d)",
                 kern ? "mma" : "wmma", hd,
                 tsr_cuda_attention_tc_supported(hd) ? "offered" : "not offered", need, optin);
      }
    }
    tsr_cuda_attention_tc_use(TSR_CUDA_TC_WMMA);
    for (int i = 0; i < 8; i++) test_attention(att[i][0], att[i][1], att[i][2], att[i][3], att[i][4], 0);
    test_attention(2, 45, 4, 2, 64, 1);
  }

  CUDA_CK(cudaStreamSynchronize(g_stream));
  CUDA_CK(cudaGetLastError());
  CUDA_CK(cudaStreamDestroy(g_stream));
  return tu_summary("test_kernels");
}
