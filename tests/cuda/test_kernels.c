/* test_kernels.c — every op of the CUDA backend (tsr_cuda_X, cuda/backend.h) against the
 * CPU kernel of the same op (tsr_cpu_X, src/cpu/ops_cpu.h), on random inputs, in fp32, bf16
 * and fp16 storage.
 *
 *  - The backend is opened without MPI on device 0 and reserved, for each test, for
 *    exactly the test's shapes (so an op whose scratch the query undercounts fails).
 *  - Inputs are fresh random numbers each run (the seed is printed; TSR_TEST_SEED=N
 *    repeats a run), never zeros, the same values on both sides in the storage type.
 *  - Outputs an op writes start poisoned (NaN), so an element it forgets fails; outputs
 *    it accumulates start from random values on both sides, so one that overwrites
 *    fails too.
 *  - Error measure and tolerances: kernels_util.h.  Any non-finite value where the CPU
 *    has a finite one fails.
 *  - Shapes include 1 and sizes that are not multiples of the tiles (32 and 64 rows, 256
 *    threads, 8 head dims per thread, 8 GEMM columns).
 *  - Determinism: the reductions that could race (embedding and attention backward, sums
 *    of squares) run twice and must agree bitwise.
 * Exits 77 (skip) when no CUDA device is usable.  TSR_TEST_ONLY=group,... runs only the
 * groups named (casts embedding rmsnorm layernorm rope activations elementwise xent adamw
 * reductions matmul attention failures); TSR_TEST_HEAD_DIM=N only the attention shapes of
 * head_dim N.  In a build with cuDNN attention (TSR_HAVE_CUDNN) the attention group checks
 * it too, unless TSR_TEST_NO_CUDNN is set. */
#include "kernels_util.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

static const tsr_dtype all_dt[3] = {TSR_F32, TSR_BF16, TSR_F16};

/* -------------------------------------------------------------------- casts */

/* Source values of type src: fp32 over 2^-30 .. 2^18 (fp16's subnormals and overflow),
 * with exact ties of bf16 and fp16 rounding and some infinities; 16-bit sources are random
 * finite (or infinite) bit patterns. */
static tbuf cast_source(tsr_dtype src, long n) {
  tbuf t = tb_alloc(src, n);
  for (long i = 0; i < n; i++) {
    const uint32_t r = (uint32_t)(urand(0, 1) * 4294967040.0f);
    if (src == TSR_F32) {
      float x = ldexpf(urand(-1, 1), (int)(i % 49) - 30);
      uint32_t u;
      memcpy(&u, &x, 4);
      if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u;      /* a bf16 tie */
      if (i % 7 == 3) u = (u & 0xffffe000u) | 0x1000u;      /* an fp16 tie (normal range) */
      if (i % 1009 == 5) u = (u & 0x80000000u) | 0x7f800000u; /* inf */
      memcpy(&x, &u, 4);
      ((float *)t.h)[i] = x;
    } else {
      uint16_t u = (uint16_t)(r >> 8);
      const uint16_t e = src == TSR_BF16 ? 0x7f80 : 0x7c00, m = src == TSR_BF16 ? 0x7f : 0x3ff;
      if ((u & e) == e) u &= (uint16_t)~m; /* no NaN: inf instead */
      ((uint16_t *)t.h)[i] = u;
    }
  }
  tb_upload(&t);
  return t;
}

static void test_casts(long n) {
  char name[96];
  for (int a = 0; a < 3; a++) {
    const tsr_dtype src = all_dt[a];
    tbuf x = cast_source(src, n);
    for (int b = 0; b < 3; b++) {
      const tsr_dtype dst = all_dt[b];
      tbuf y = tb_out(dst, n);
      tsr_cpu_cast(dst, y.h, src, x.h, n);
      tsr_cuda_cast(dst, y.d, src, x.d, n);
      ksync("cast");
      snprintf(name, sizeof name, "cast %s -> %s n=%ld", tsr_dtype_name(src), tsr_dtype_name(dst),
               n);
      check_bits(name, &y);
      tb_free(&y);
    }
    tsr_cuda_cast(src, x.d, src, x.d, n); /* in place: nothing to do */
    ksync("cast in place");
    snprintf(name, sizeof name, "cast %s -> %s in place n=%ld", tsr_dtype_name(src),
             tsr_dtype_name(src), n);
    check_bits(name, &x);
    tb_free(&x);
  }
}

/* ---------------------------------------------------------------- embedding */

/* docs > 0: document starts (about one per docs rows) restart the positions */
static void test_embedding(tsr_dtype dt, int n, int T, int C, int vocab, int vocab_start,
                           int vocab_local, int with_wpe, int docs) {
  char name[128];
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = C, s.vocab_local = vocab_local, s.attn_t = T;
  kreserve(s);
  int32_t *d_doc = NULL, *doc = docs > 0 ? docs_make(n, T, docs, &d_doc) : NULL;
  int32_t *tok = hmalloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n; r++) tok[r] = (int32_t)(urand(0.0f, 1.0f) * vocab) % vocab;
  int32_t *d_tok = dmalloc((size_t)n * sizeof(int32_t));
  CUDA_CK(cudaMemcpy(d_tok, tok, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
  tbuf wte = tb_rand(dt, (long)vocab_local * C, -1, 1), wpe = {dt, 0, NULL, NULL};
  if (with_wpe) wpe = tb_rand(dt, (long)T * C, -1, 1);
  tbuf out = tb_out(dt, (long)n * C);
  tsr_cpu_embedding_fwd(dt, out.h, tok, wte.h, wpe.h, n, T, C, vocab_start, vocab_local, doc);
  tsr_cuda_embedding_fwd(dt, out.d, d_tok, wte.d, wpe.d, n, T, C, vocab_start, vocab_local, d_doc);
  ksync("embedding_fwd");
  snprintf(name, sizeof name, "embedding fwd n=%d T=%d C=%d V=%d+%d%s%s", n, T, C, vocab_start,
           vocab_local, with_wpe ? " +wpe" : "", doc ? " documents" : "");
  check_close(name, &out, tol_of(dt));

  tbuf dout = tb_rand(dt, (long)n * C, -1, 1);
  tbuf dwte = tb_rand(TSR_F32, (long)vocab_local * C, -1, 1);
  tbuf dwte2 = tb_dup(&dwte), dwpe = {TSR_F32, 0, NULL, NULL};
  if (with_wpe) dwpe = tb_rand(TSR_F32, (long)T * C, -1, 1);
  tbuf dwpe2 = with_wpe ? tb_dup(&dwpe) : dwpe;
  tsr_cpu_embedding_bwd(dt, dwte.h, dwpe.h, dout.h, tok, n, T, C, vocab_start, vocab_local, doc);
  tsr_cuda_embedding_bwd(dt, dwte.d, dwpe.d, dout.d, d_tok, n, T, C, vocab_start, vocab_local,
                        d_doc);
  tsr_cuda_embedding_bwd(dt, dwte2.d, dwpe2.d, dout.d, d_tok, n, T, C, vocab_start, vocab_local,
                        d_doc);
  ksync("embedding_bwd");
  snprintf(name, sizeof name, "embedding bwd dwte (fp32, accumulated) n=%d C=%d V=%d %s", n, C,
           vocab_local, tsr_dtype_name(dt));
  check_close(name, &dwte, TOL_F32);
  check_same_runs("embedding bwd dwte", &dwte, &dwte2);
  if (with_wpe) {
    check_close(doc ? "embedding bwd dwpe (fp32, accumulated), documents"
                    : "embedding bwd dwpe (fp32, accumulated)",
                &dwpe, TOL_F32);
    check_same_runs("embedding bwd dwpe", &dwpe, &dwpe2);
    tb_free(&dwpe2);
  }
  free(tok), free(doc);
  CUDA_CK(cudaFree(d_tok));
  if (d_doc) CUDA_CK(cudaFree(d_doc));
  tb_free(&wte), tb_free(&wpe), tb_free(&out), tb_free(&dout), tb_free(&dwte), tb_free(&dwte2);
  tb_free(&dwpe);
}

/* -------------------------------------------------------------------- norms */

/* max |h| over a tensor (the scale of a gradient, for a start to add it to) */
static float tb_absmax(const tbuf *t) {
  float m = 0;
  for (long i = 0; i < t->n; i++) m = fmaxf(m, fabsf(tb_get(t, i)));
  return m;
}

/* The forward without y, with y into a separate h, and with y in place (h = x); then the
 * backward writing dx, and summing into dx from a start of the gradient's own scale
 * (LayerNorm: with its bias gradient, or with db NULL where with_b is 0). */
static void test_norm(int layer, tsr_dtype dt, int n, int C, int with_b) {
  char name[128];
  const char *what = layer ? "layernorm" : "rmsnorm";
  const long nc = (long)n * C;
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = C;
  kreserve(s);
  tbuf x = tb_rand(dt, nc, -2, 3), y = tb_rand(dt, nc, -1, 1), w = tb_rand(dt, C, 0.5f, 1.5f);
  tbuf b = {dt, 0, NULL, NULL};
  if (layer) b = tb_rand(dt, C, -0.5f, 0.5f);
  tbuf mean = tb_out(TSR_F32, n), rstd = tb_out(TSR_F32, n);
  for (int v = 0; v < 3; v++) {
    tbuf out = tb_out(dt, nc), xin = tb_dup(&x), h = v == 1 ? tb_out(dt, nc) : tb_dup(&x);
    tbuf *hp = v == 2 ? &xin : &h;
    const void *yh = v ? y.h : NULL, *yd = v ? y.d : NULL;
    if (layer) {
      tsr_cpu_layernorm_fwd(dt, out.h, mean.h, rstd.h, hp->h, xin.h, yh, w.h, b.h, n, C, 1e-5f);
      tsr_cuda_layernorm_fwd(dt, out.d, mean.d, rstd.d, hp->d, xin.d, yd, w.d, b.d, n, C, 1e-5f);
    } else {
      tsr_cpu_rmsnorm_fwd(dt, out.h, rstd.h, hp->h, xin.h, yh, w.h, n, C, 1e-5f);
      tsr_cuda_rmsnorm_fwd(dt, out.d, rstd.d, hp->d, xin.d, yd, w.d, n, C, 1e-5f);
    }
    ksync(what);
    snprintf(name, sizeof name, "%s fwd%s n=%d C=%d", what,
             v == 0 ? "" : v == 1 ? " x+y into h" : " x+y in place", n, C);
    check_close(name, &out, tol_of(dt));
    check_close("  ... rstd (fp32)", &rstd, TOL_F32);
    if (layer) check_close("  ... mean (fp32)", &mean, TOL_F32);
    if (v) check_bits("  ... the stored sum h", hp);
    tb_free(&out), tb_free(&xin), tb_free(&h);
  }
  /* backward on the CPU's statistics of x (the last forward had y: recompute without) */
  tbuf out = tb_out(dt, nc);
  if (layer)
    tsr_cpu_layernorm_fwd(dt, out.h, mean.h, rstd.h, NULL, x.h, NULL, w.h, b.h, n, C, 1e-5f);
  else
    tsr_cpu_rmsnorm_fwd(dt, out.h, rstd.h, NULL, x.h, NULL, w.h, n, C, 1e-5f);
  tb_upload(&mean), tb_upload(&rstd);
  tbuf dout = tb_rand(dt, nc, -1, 1), dw = tb_rand(TSR_F32, C, -1, 1);
  tbuf db = {TSR_F32, 0, NULL, NULL};
  if (layer && with_b) db = tb_rand(TSR_F32, C, -1, 1);
  /* dx is rstd times a difference of fp32 terms of the size of rstd w dout: where they
   * cancel its rounding is relative to the terms, not to dx (C = 1: RMSNorm's dx is
   * rstd w dout eps / (x^2 + eps); LayerNorm's is 0 up to rounding, x - mean being 0) */
  double terms = 0.0;
  for (long i = 0; i < nc; i++)
    terms = fmax(terms, fabs(((float *)rstd.h)[i / C] * tb_get(&w, i % C) * tb_get(&dout, i)));
  for (int accumulate = 0; accumulate < 2; accumulate++) {
    tbuf dx = tb_out(dt, nc);
    if (accumulate) { /* a start of the gradient's scale: a kernel that overwrites fails */
      tbuf g = tb_out(dt, nc);
      if (layer)
        tsr_cpu_layernorm_bwd(dt, g.h, NULL, NULL, dout.h, x.h, w.h, mean.h, rstd.h, n, C, 0);
      else
        tsr_cpu_rmsnorm_bwd(dt, g.h, NULL, dout.h, x.h, w.h, rstd.h, n, C, 0);
      const float sc = 0.5f * tb_absmax(&g);
      tb_free(&g), tb_free(&dx);
      dx = tb_rand(dt, nc, -sc, sc);
    }
    if (layer) {
      tsr_cpu_layernorm_bwd(dt, dx.h, dw.h, db.h, dout.h, x.h, w.h, mean.h, rstd.h, n, C,
                            accumulate);
      tsr_cuda_layernorm_bwd(dt, dx.d, dw.d, db.d, dout.d, x.d, w.d, mean.d, rstd.d, n, C,
                            accumulate);
    } else {
      tsr_cpu_rmsnorm_bwd(dt, dx.h, dw.h, dout.h, x.h, w.h, rstd.h, n, C, accumulate);
      tsr_cuda_rmsnorm_bwd(dt, dx.d, dw.d, dout.d, x.d, w.d, rstd.d, n, C, accumulate);
    }
    ksync(what);
    snprintf(name, sizeof name, "%s bwd dx %s n=%d C=%d%s", what,
             accumulate ? "summed into" : "written", n, C, layer && !with_b ? " (db NULL)" : "");
    const double dx_max = tb_absmax(&dx); /* (tb_err is absolute where dx is all zeros) */
    check_close(name, &dx, fmax(tol_of(dt), 8 * FLT_EPSILON * terms / (dx_max > 0 ? dx_max : 1)));
    check_close("  ... dw (fp32, accumulated)", &dw, TOL_F32);
    if (db.n) check_close("  ... db (fp32, accumulated)", &db, TOL_F32);
    tb_free(&dx);
  }
  tb_free(&x), tb_free(&y), tb_free(&w), tb_free(&b), tb_free(&mean), tb_free(&rstd);
  tb_free(&out), tb_free(&dout), tb_free(&dw), tb_free(&db);
}

/* --------------------------------------------------------------------- RoPE */

/* Rotates heads [col0/hd, col0/hd + n_heads) of rows of width `stride`: the other
 * columns must come back untouched, so the whole buffer is compared. */
static void test_rope(tsr_dtype dt, int n, int T, int n_heads, int hd, int stride, int col0,
                      tsr_rope theta, int docs) {
  char name[160];
  const long total = (long)n * stride;
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = stride, s.attn_t = T, s.attn_hd = hd;
  kreserve(s);
  int32_t *d_doc = NULL, *doc = docs > 0 ? docs_make(n, T, docs, &d_doc) : NULL;
  tbuf x = tb_rand(dt, total, -1, 1), x0 = tb_dup(&x);
  tsr_cpu_rope_fwd(dt, tb_hat(&x, col0), n, T, n_heads, hd, stride, theta, doc);
  tsr_cuda_rope_fwd(dt, tb_dat(&x, col0), n, T, n_heads, hd, stride, theta, d_doc);
  ksync("rope_fwd");
  snprintf(name, sizeof name, "rope fwd n=%d T=%d heads=%d hd=%d stride=%d%s", n, T, n_heads, hd,
           stride, doc ? " documents" : "");
  check_close(name, &x, tol_of(dt));
  tsr_cpu_rope_bwd(dt, tb_hat(&x, col0), n, T, n_heads, hd, stride, theta, doc);
  tsr_cuda_rope_bwd(dt, tb_dat(&x, col0), n, T, n_heads, hd, stride, theta, d_doc);
  ksync("rope_bwd");
  check_close("rope bwd (the inverse rotation)", &x, tol_of(dt));
  const tbuf back = {dt, total, x0.h, x.d}; /* the device's result against the input */
  check_close("rope fwd then bwd gives the input back", &back, 2 * tol_of(dt));
  tb_free(&x), tb_free(&x0);
  free(doc);
  if (d_doc) CUDA_CK(cudaFree(d_doc));
}

/* ------------------------------------------------------------- activations */

static void test_activations(tsr_dtype dt, int n, int F) {
  char name[128];
  const long nf = (long)n * F, n2 = 2 * nf;
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = 2L * F;
  kreserve(s);
  tbuf gu = tb_rand(dt, n2, -4, 4), out = tb_out(dt, nf), dout = tb_rand(dt, nf, -1, 1);
  tbuf dgu = tb_out(dt, n2), gx = tb_out(dt, n2);
  tsr_cpu_swiglu_fwd(dt, out.h, gu.h, n, F);
  tsr_cpu_swiglu_bwd(dt, dgu.h, dout.h, gu.h, n, F);
  tsr_cpu_gelu_fwd(dt, gx.h, gu.h, n2);
  tsr_cuda_swiglu_fwd(dt, out.d, gu.d, n, F);
  tsr_cuda_swiglu_bwd(dt, dgu.d, dout.d, gu.d, n, F);
  tsr_cuda_gelu_fwd(dt, gx.d, gu.d, n2);
  ksync("activations");
  snprintf(name, sizeof name, "swiglu fwd n=%d F=%d", n, F);
  check_close(name, &out, tol_of(dt));
  check_close("swiglu bwd (written)", &dgu, tol_of(dt));
  snprintf(name, sizeof name, "gelu fwd n=%ld", n2);
  check_close(name, &gx, tol_of(dt));
  tb_free(&gu), tb_free(&out), tb_free(&dout), tb_free(&dgu), tb_free(&gx);
}

/* The sums: residual in the storage type (out = x + y rounded once, also in place), add
 * and acc in fp32; each a single rounding, so bitwise the CPU's. */
static void test_elementwise(long n) {
  char name[128];
  for (int k = 0; k < 3; k++) {
    const tsr_dtype dt = all_dt[k];
    kreserve(shapes_of(dt));
    tbuf x = tb_rand(dt, n, -1, 1), y = tb_rand(dt, n, -1, 1), o = tb_out(dt, n);
    tbuf xi = tb_dup(&x);
    tsr_cpu_residual(dt, o.h, x.h, y.h, n);
    tsr_cuda_residual(dt, o.d, x.d, y.d, n);
    tsr_cpu_residual(dt, xi.h, xi.h, y.h, n);
    tsr_cuda_residual(dt, xi.d, xi.d, y.d, n);
    ksync("residual");
    snprintf(name, sizeof name, "residual n=%ld", n);
    check_bits(name, &o);
    check_bits("residual in place (out = x)", &xi);
    tb_free(&x), tb_free(&y), tb_free(&o), tb_free(&xi);
  }
  tbuf a = tb_rand(TSR_F32, n, -1, 1), b = tb_rand(TSR_F32, n, -1, 1), o = tb_out(TSR_F32, n);
  tbuf c = tb_rand(TSR_F32, n, -1, 1);
  tsr_cpu_add(o.h, a.h, b.h, n);
  tsr_cuda_add(o.d, a.d, b.d, n);
  tsr_cpu_acc(c.h, a.h, n);
  tsr_cuda_acc(c.d, a.d, n);
  ksync("add, acc");
  snprintf(name, sizeof name, "add n=%ld", n);
  check_bits(name, &o);
  snprintf(name, sizeof name, "acc n=%ld (summed into a random start)", n);
  check_bits(name, &c);
  tb_free(&a), tb_free(&b), tb_free(&o), tb_free(&c);
}

/* ------------------------------------------------------------ cross entropy */

/* *acc on the device (op memory) and on the host, from the same random start */
typedef struct {
  double h, start, *d;
} dacc;
static dacc dacc_new(void) {
  dacc a = {0, 0, NULL};
  a.h = a.start = urand(-5, 5);
  a.d = dmalloc(sizeof(double));
  CUDA_CK(cudaMemcpy(a.d, &a.h, sizeof(double), cudaMemcpyHostToDevice));
  return a;
}
/* the sum the op added, device against host */
static void check_added(const char *name, dacc *a, double tol) {
  double got = NAN;
  CUDA_CK(cudaStreamSynchronize((cudaStream_t)tsr_cuda_ops_stream()));
  CUDA_CK(cudaMemcpy(&got, a->d, sizeof got, cudaMemcpyDeviceToHost));
  const double g = got - a->start, r = a->h - a->start;
  const double e = fabs(g - r) / (fabs(r) > 0 ? fabs(r) : 1.0);
  kcheck(isfinite(got) && e <= tol, "%-58s added %.10g vs %.10g, rel err %.2e (tol %.0e)", name,
         g, r, e, tol);
  a->start = a->h = got;
}

/* n targets below V, every fifth row (r % 5 == 3) ignored (-100), on the host (returned)
 * and a copy on the device (*dev); the caller frees both. */
static int32_t *rand_targets(int n, int V, int32_t **dev) {
  int32_t *tgt = hmalloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n; r++) tgt[r] = (r % 5 == 3) ? -100 : (int32_t)(urand(0, 1) * V) % V;
  *dev = dmalloc((size_t)n * sizeof(int32_t));
  CUDA_CK(cudaMemcpy(*dev, tgt, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
  return tgt;
}

static void test_xent(tsr_dtype dt, int n, int V) {
  char name[128];
  const long nv = (long)n * V;
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = V;
  kreserve(s);
  tbuf z = tb_rand(dt, nv, -6, 6);
  int32_t *d_tgt, *tgt = rand_targets(n, V, &d_tgt);
  const double div = 3.0 + n % 7;
  dacc loss = dacc_new();

  tbuf g = tb_dup(&z), z2 = tb_dup(&z);
  tsr_cpu_xent(dt, &loss.h, div, g.h, tgt, n, V, 0.25f, 1);
  tsr_cuda_xent(dt, loss.d, div, g.d, d_tgt, n, V, 0.25f, 1);
  ksync("xent");
  snprintf(name, sizeof name, "xent n=%d V=%d with grad: loss", n, V);
  check_added(name, &loss, TOL_F32);
  check_close("  ... gradient (logits overwritten)", &g, tol_of(dt));
  tsr_cpu_xent(dt, &loss.h, div, z2.h, tgt, n, V, 0.25f, 0);
  tsr_cuda_xent(dt, loss.d, div, z2.d, d_tgt, n, V, 0.25f, 0);
  ksync("xent");
  check_added("xent without grad: loss", &loss, TOL_F32);
  check_bits("  ... logits unchanged", &z2);

  /* vocab-parallel over two "ranks": columns [0, V0) and [V0, V); the host plays the
   * all-reduces between the passes, for the CPU and the device alike */
  const int V0 = V / 3 + 1 < V ? V / 3 + 1 : V, Vp[2] = {V0, V - V0}, start[2] = {0, V0};
  const size_t es = tsr_dtype_size(dt);
  tbuf part[2];
  tbuf rmax = tb_out(TSR_F32, 2L * n), tl = tb_out(TSR_F32, 2L * n), se = tb_out(TSR_F32, 2L * n);
  double *gmax = hmalloc(n * 8), *gtl = hmalloc(n * 8), *gse = hmalloc(n * 8);
  double *cmax = hmalloc(n * 8), *ctl = hmalloc(n * 8), *cse = hmalloc(n * 8);
  double *hrm = hmalloc(n * 8), *htl = hmalloc(n * 8), *hse = hmalloc(n * 8);
  double *d_rm = dmalloc(n * 8), *d_tl = dmalloc(n * 8), *d_se = dmalloc(n * 8);
  for (int k = 0; k < 2; k++) {
    part[k] = tb_out(dt, (long)n * Vp[k]);
    for (int r = 0; r < n; r++)
      memcpy((char *)part[k].h + (size_t)r * Vp[k] * es,
             (char *)z.h + ((size_t)r * V + start[k]) * es, (size_t)Vp[k] * es);
    tb_upload(&part[k]);
  }
  for (int r = 0; r < n; r++)
    gmax[r] = cmax[r] = -INFINITY, gtl[r] = ctl[r] = 0, gse[r] = cse[r] = 0;
  for (int k = 0; k < 2; k++) {
    if (!Vp[k]) continue;
    tsr_cpu_xent_local_stats(dt, hrm, htl, part[k].h, tgt, n, Vp[k], start[k]);
    for (int r = 0; r < n; r++) cmax[r] = fmax(cmax[r], hrm[r]), ctl[r] += htl[r];
    tsr_cuda_xent_local_stats(dt, d_rm, d_tl, part[k].d, d_tgt, n, Vp[k], start[k]);
    ksync("xent_local_stats");
    CUDA_CK(cudaMemcpy(hrm, d_rm, n * 8, cudaMemcpyDeviceToHost));
    CUDA_CK(cudaMemcpy(htl, d_tl, n * 8, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; r++) gmax[r] = fmax(gmax[r], hrm[r]), gtl[r] += htl[r];
  }
  for (int k = 0; k < 2; k++) {
    if (!Vp[k]) continue;
    tsr_cpu_xent_local_sumexp(dt, hse, part[k].h, cmax, n, Vp[k]);
    for (int r = 0; r < n; r++) cse[r] += hse[r];
    CUDA_CK(cudaMemcpy(d_rm, gmax, n * 8, cudaMemcpyHostToDevice));
    tsr_cuda_xent_local_sumexp(dt, d_se, part[k].d, d_rm, n, Vp[k]);
    ksync("xent_local_sumexp");
    CUDA_CK(cudaMemcpy(hse, d_se, n * 8, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; r++) gse[r] += hse[r];
  }
  double e_max = 0, e_tl = 0, e_se = 0;
  for (int r = 0; r < n; r++) {
    e_max = fmax(e_max, fabs(gmax[r] - cmax[r]));
    e_tl = fmax(e_tl, fabs(gtl[r] - ctl[r]));
    e_se = fmax(e_se, fabs(gse[r] - cse[r]) / cse[r]);
  }
  snprintf(name, sizeof name, "xent vocab-parallel stats n=%d V=%d+%d", n, Vp[0], Vp[1]);
  kcheck(e_max == 0 && e_tl == 0 && e_se <= TOL_F32,
         "%-58s %s max %.1e target %.1e sumexp %.1e", name, tsr_dtype_name(dt), e_max, e_tl, e_se);
  CUDA_CK(cudaMemcpy(d_rm, cmax, n * 8, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_tl, ctl, n * 8, cudaMemcpyHostToDevice));
  CUDA_CK(cudaMemcpy(d_se, cse, n * 8, cudaMemcpyHostToDevice));
  tsr_cpu_xent_rows(&loss.h, div, cmax, cse, ctl, n);
  tsr_cuda_xent_rows(loss.d, div, d_rm, d_se, d_tl, n);
  ksync("xent_rows");
  check_added("xent vocab-parallel rows: loss", &loss, TOL_DOUBLE);
  for (int k = 0; k < 2; k++) {
    if (!Vp[k]) continue;
    tsr_cpu_xent_grad(dt, part[k].h, tgt, cmax, cse, n, Vp[k], start[k], 0.25f);
    tsr_cuda_xent_grad(dt, part[k].d, d_tgt, d_rm, d_se, n, Vp[k], start[k], 0.25f);
    ksync("xent_grad");
    snprintf(name, sizeof name, "xent vocab-parallel grad, rank %d of 2", k);
    check_close(name, &part[k], tol_of(dt));
  }
  free(tgt), free(gmax), free(gtl), free(gse), free(cmax), free(ctl), free(cse);
  free(hrm), free(htl), free(hse);
  CUDA_CK(cudaFree(d_tgt));
  CUDA_CK(cudaFree(loss.d));
  CUDA_CK(cudaFree(d_rm));
  CUDA_CK(cudaFree(d_tl));
  CUDA_CK(cudaFree(d_se));
  for (int k = 0; k < 2; k++) tb_free(&part[k]);
  tb_free(&z), tb_free(&g), tb_free(&z2), tb_free(&rmax), tb_free(&tl), tb_free(&se);
}

/* xent_head: the device's chunks (cuBLASLt's GEMMs around xent's kernel) against the
 * CPU's, the last chunk ragged unless chunk divides n; then the loss alone and dw alone.
 * In 16-bit storage the two backends' GEMMs round a logit or its gradient differently
 * now and then, so everything is held to the storage type's tolerance. */
static void test_xent_head(tsr_dtype dt, int n, int C, int V, int chunk) {
  char name[128];
  const int rows = chunk <= 0 || chunk > n ? n : chunk;
  const long nx = (long)n * C, nw = (long)V * C;
  const double tol = tol_of(dt);
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = V > C ? V : C;
  kreserve(s);
  tbuf x = tb_rand(dt, nx, -1, 1), w = tb_rand(dt, nw, -0.5f, 0.5f);
  tbuf sc = tb_out(dt, (long)rows * V), dx = tb_out(dt, nx), dw = tb_rand(TSR_F32, nw, -1, 1);
  int32_t *d_tgt, *tgt = rand_targets(n, V, &d_tgt);
  const double div = 3.0 + n % 7;
  dacc loss = dacc_new();
  tsr_cpu_xent_head(dt, &loss.h, div, dx.h, dw.h, x.h, w.h, tgt, sc.h, n, C, V, chunk, 0.25f);
  tsr_cuda_xent_head(dt, loss.d, div, dx.d, dw.d, x.d, w.d, d_tgt, sc.d, n, C, V, chunk, 0.25f);
  ksync("xent_head");
  snprintf(name, sizeof name, "xent_head n=%d C=%d V=%d chunk %d: loss", n, C, V, chunk);
  check_added(name, &loss, dt == TSR_F32 ? TOL_F32 : tol);
  check_close("  ... dx (written)", &dx, tol);
  check_close("  ... dw (fp32, accumulated)", &dw, dt == TSR_F32 ? TOL_F32 : tol);
  tsr_cpu_xent_head(dt, &loss.h, div, NULL, NULL, x.h, w.h, tgt, sc.h, n, C, V, chunk, 0.25f);
  tsr_cuda_xent_head(dt, loss.d, div, NULL, NULL, x.d, w.d, d_tgt, sc.d, n, C, V, chunk, 0.25f);
  ksync("xent_head");
  check_added("xent_head, the loss alone", &loss, dt == TSR_F32 ? TOL_F32 : tol);
  tsr_cpu_xent_head(dt, NULL, div, NULL, dw.h, x.h, w.h, tgt, sc.h, n, C, V, chunk, 0.25f);
  tsr_cuda_xent_head(dt, NULL, div, NULL, dw.d, x.d, w.d, d_tgt, sc.d, n, C, V, chunk, 0.25f);
  ksync("xent_head");
  check_close("xent_head, dw alone (accumulated)", &dw, dt == TSR_F32 ? TOL_F32 : tol);
  free(tgt);
  CUDA_CK(cudaFree(d_tgt));
  CUDA_CK(cudaFree(loss.d));
  tb_free(&x), tb_free(&w), tb_free(&sc), tb_free(&dx), tb_free(&dw);
}

/* -------------------------------------------------------- AdamW, reductions */

/* Four steps; steps 2-4 refresh a compute copy in fp32, bf16, fp16 in the same pass: on
 * the device it must be bitwise the conversion of the device's new p. */
static void test_adamw(long n) {
  char name[96];
  kreserve(shapes_of(TSR_F32));
  tbuf p = tb_rand(TSR_F32, n, -1, 1), m = tb_rand(TSR_F32, n, -0.1f, 0.1f);
  tbuf v = tb_rand(TSR_F32, n, 1e-6f, 1e-2f);
  for (long t = 1; t <= 4; t++) {
    tbuf g = tb_rand(TSR_F32, n, -2, 2);
    const tsr_dtype odt = t > 1 ? all_dt[t - 2] : TSR_F32;
    tbuf out = t > 1 ? tb_out(odt, n) : (tbuf){odt, 0, NULL, NULL};
    tsr_cpu_adamw(p.h, m.h, v.h, g.h, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, out.h, odt);
    tsr_cuda_adamw(p.d, m.d, v.d, g.d, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, out.d, odt);
    ksync("adamw");
    if (out.n) {
      snprintf(name, sizeof name, "adamw n=%ld step %ld: the refreshed copy", n, t);
      check_close(name, &out, tol_of(odt));
      tbuf mine = tb_alloc(TSR_F32, n), conv = tb_alloc(odt, n);
      tb_download(&p, mine.h);
      tsr_cpu_cast(odt, conv.h, TSR_F32, mine.h, n);
      CUDA_CK(cudaMemcpy(conv.d, out.d, (size_t)n * tsr_dtype_size(odt), cudaMemcpyDeviceToDevice));
      check_bits("  ... bitwise the conversion of the device's p", &conv);
      tb_free(&mine), tb_free(&conv);
    }
    tb_free(&g), tb_free(&out);
  }
  snprintf(name, sizeof name, "adamw n=%ld, 4 steps: p", n);
  check_close(name, &p, TOL_F32);
  check_close("adamw m", &m, TOL_F32);
  check_close("adamw v", &v, TOL_F32);
  tb_free(&p), tb_free(&m), tb_free(&v);
}

/* Sums of squares of n_ranges ranges of x (the first all of it, then up to max_len long
 * anywhere, empty ones too, and more ranges than the backend fetches at once), bitwise the
 * CPU's, and twice bitwise alike. */
static void test_sumsq(long n, int n_ranges, long max_len) {
  tbuf x = tb_rand(TSR_F32, n, -3, 3);
  int64_t *r = hmalloc((size_t)n_ranges * 2 * sizeof(int64_t));
  long longest = 0;
  for (int k = 0; k < n_ranges; k++) {
    const long len = k == 0        ? n
                     : k % 11 == 4 ? 0
                                   : (long)(urand(0, 1) * (max_len + 1)) % (max_len + 1);
    const long a = k == 0 ? 0 : (long)(urand(0, 1) * (n - len + 1)) % (n - len + 1);
    r[2 * k] = a, r[2 * k + 1] = a + len;
    if (len > longest) longest = len;
  }
  tsr_ops_shapes s = shapes_of(TSR_F32);
  s.sumsq_elems = longest;
  kreserve(s);
  const double ref = tsr_cpu_sumsq_ranges(x.h, r, n_ranges);
  const double a = tsr_cuda_sumsq_ranges(x.d, r, n_ranges);
  const double b = tsr_cuda_sumsq_ranges(x.d, r, n_ranges);
  ksync("sumsq_ranges");
  /* one order on every backend (ops/sumsq_order.h): the CPU's bits exactly */
  kcheck(!memcmp(&a, &ref, sizeof a), "sumsq_ranges n=%ld over %d ranges bitwise the CPU's: "
         "%.17g vs %.17g", n, n_ranges, a, ref);
  kcheck(!memcmp(&a, &b, sizeof a), "sumsq_ranges n=%ld over %d ranges deterministic (two runs "
         "bitwise)", n, n_ranges);
  free(r);
  tb_free(&x);
}

/* ------------------------------------------------------------------- GEMMs */

static void test_matmul(tsr_dtype dt, int n, int in, int out) {
  char name[128];
  const long nx = (long)n * in, nw = (long)out * in, ny = (long)n * out;
  const double tol = tol_of(dt), tol_w = dt == TSR_F32 ? TOL_F32 : TOL_GEMM16_F32;
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = in > out ? in : out;
  kreserve(s);
  tbuf x = tb_rand(dt, nx, -1, 1), w = tb_rand(dt, nw, -1, 1), bias = tb_rand(dt, out, -1, 1);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    tbuf y = tb_out(dt, ny);
    const tbuf *b = with_bias ? &bias : NULL;
    tsr_cpu_matmul_fwd(dt, y.h, x.h, w.h, b ? b->h : NULL, n, in, out);
    tsr_cuda_matmul_fwd(dt, y.d, x.d, w.d, b ? b->d : NULL, n, in, out);
    ksync("matmul_fwd");
    snprintf(name, sizeof name, "matmul fwd n=%d in=%d out=%d%s", n, in, out,
             with_bias ? " +bias" : "");
    check_close(name, &y, tol);
    tb_free(&y);
  }
  /* dx written (poisoned), dw and dbias accumulated onto random values; then with the
   * GELU's backward fused in (gelu_pre: in % 8 == 0 takes cuBLASLt's DGELU epilogue
   * where it has one, the others the separate pass), and dw alone */
  tbuf dy = tb_rand(dt, ny, -1, 1), pre = tb_rand(dt, nx, -3, 3);
  tbuf dw = tb_rand(TSR_F32, nw, -1, 1), db = tb_rand(TSR_F32, out, -1, 1);
  for (int gelu = 0; gelu < 2; gelu++) {
    tbuf dx = tb_out(dt, nx);
    const void *ph = gelu ? pre.h : NULL, *pd = gelu ? pre.d : NULL;
    tsr_cpu_matmul_bwd(dt, dx.h, dw.h, db.h, dy.h, x.h, w.h, ph, n, in, out);
    tsr_cuda_matmul_bwd(dt, dx.d, dw.d, db.d, dy.d, x.d, w.d, pd, n, in, out);
    ksync("matmul_bwd");
    snprintf(name, sizeof name, "matmul bwd dx n=%d in=%d out=%d%s", n, in, out,
             gelu ? " * gelu'(pre)" : "");
    check_close(name, &dx, tol);
    check_close("  ... dw (fp32, accumulated)", &dw, tol_w);
    check_close("  ... dbias (fp32, accumulated)", &db, TOL_F32);
    tb_free(&dx);
  }
  tbuf dx = tb_out(dt, nx);
  tsr_cpu_matmul_bwd(dt, NULL, dw.h, NULL, dy.h, x.h, w.h, NULL, n, in, out);
  tsr_cuda_matmul_bwd(dt, NULL, dw.d, NULL, dy.d, x.d, w.d, NULL, n, in, out);
  ksync("matmul_bwd");
  check_close("matmul bwd dw only", &dw, tol_w);
  check_bits("  ... dx untouched (NULL)", &dx);
  tb_free(&x), tb_free(&w), tb_free(&bias), tb_free(&dy), tb_free(&pre), tb_free(&dw);
  tb_free(&db), tb_free(&dx);
}

/* out = 0: dx = dy w is an empty sum, written as zeros, with or without gelu_pre */
static void test_matmul_empty_sum(tsr_dtype dt, int n, int in) {
  tsr_ops_shapes s = shapes_of(dt);
  s.rows = n, s.cols = in;
  kreserve(s);
  tbuf w = tb_rand(dt, in, -1, 1), pre = tb_rand(dt, (long)n * in, -1, 1);
  for (int gelu = 0; gelu < 2; gelu++) {
    tbuf dx = tb_out(dt, (long)n * in);
    tsr_cpu_matmul_bwd(dt, dx.h, NULL, NULL, NULL, NULL, w.h, gelu ? pre.h : NULL, n, in, 0);
    tsr_cuda_matmul_bwd(dt, dx.d, NULL, NULL, NULL, NULL, w.d, gelu ? pre.d : NULL, n, in, 0);
    ksync("matmul_bwd");
    void *got = hmalloc((size_t)dx.n * tsr_dtype_size(dt));
    tb_download(&dx, got);
    long nz = 0, nz_dev = 0; /* zeros of either sign: gelu' may be negative */
    for (long i = 0; i < dx.n; i++)
      nz += tb_get(&dx, i) != 0.0f, nz_dev += tsr_load(dt, got, (size_t)i) != 0.0f;
    kcheck(nz == 0 && nz_dev == 0, "matmul bwd out=0%s %s: zeros written (%ld not on the CPU, "
           "%ld on the device)", gelu ? " +gelu_pre" : "", tsr_dtype_name(dt), nz, nz_dev);
    free(got);
    tb_free(&dx);
  }
  tb_free(&w), tb_free(&pre);
}

/* --------------------------------------------------------------- failures */

/* An op whose shapes exceed what was reserved reports itself and fails the backend:
 * status() turns TSR_ERR and stays so, and the ops after it queue nothing. */
static void test_failures(void) {
  tsr_ops_shapes s = shapes_of(TSR_BF16);
  s.rows = 1, s.cols = 1;
  kreserve(s);
  tbuf dy = tb_rand(TSR_BF16, 1000L * 64, -1, 1), db = tb_rand(TSR_F32, 64, -1, 1);
  tbuf x = tb_rand(TSR_BF16, 16, -1, 1), o = tb_out(TSR_BF16, 16);
  printf("      (an error about scratch is expected next)\n");
  fflush(stdout);
  tsr_cuda_matmul_bwd(TSR_BF16, NULL, NULL, db.d, dy.d, NULL, NULL, NULL, 1000, 1, 64);
  kb->sync();
  kcheck(kb->status() != 0, "an op beyond the reserved scratch fails the backend");
  tsr_cuda_residual(TSR_BF16, o.d, x.d, x.d, 16);
  kb->sync();
  kcheck(kb->status() != 0, "  ... and it stays failed");
  check_bits("  ... the ops after it queue nothing (output still poisoned)", &o);
  kreserve(s);
  kcheck(kb->status() == 0, "  ... until the backend is opened again");
  setenv("TSR_CUDA_ATTENTION", "flash", 1);
  const tsr_ops_backend *b2 = NULL;
  printf("      (an error about TSR_CUDA_ATTENTION is expected next)\n");
  fflush(stdout);
  kb->close();
  kb = NULL;
  const int rc = tsr_cuda_ops_open_device(0, &b2);
  kcheck(rc != 0 && !b2, "TSR_CUDA_ATTENTION=flash is refused when the backend opens");
  unsetenv("TSR_CUDA_ATTENTION");
  tb_free(&dy), tb_free(&db), tb_free(&x), tb_free(&o);
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
  const char *s = getenv("TSR_TEST_SEED");
  const uint64_t seed =
      s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  kseed(seed);
  printf("device %s (sm_%d%d), seed %llu (TSR_TEST_SEED=%llu repeats this run)\n", prop.name,
         prop.major, prop.minor, (unsigned long long)seed, (unsigned long long)seed);
  unsetenv("TSR_CUDA_ATTENTION");
  unsetenv("TSR_CUDA_PROFILE");
  tsr_cpu_init(0);

  if (want("casts")) {
    kreserve(shapes_of(TSR_F32));
    test_casts(1);
    test_casts(100003);
  }
  for (int k = 0; k < 3; k++) {
    const tsr_dtype dt = all_dt[k];
    if (want("embedding")) {
      test_embedding(dt, 39, 13, 70, 50, 10, 30, 1, 0); /* tokens outside this rank's slice */
      test_embedding(dt, 300, 100, 256, 7, 0, 7, 0, 0); /* few tokens: long runs of one row */
      test_embedding(dt, 1, 1, 1, 3, 0, 3, 1, 0);
      test_embedding(dt, 1000, 500, 300, 32000, 0, 32000, 1, 0);
      /* document masking: positions restart at each document (T above the vocabulary) */
      test_embedding(dt, 39, 13, 70, 50, 10, 30, 1, 4);
      test_embedding(dt, 600, 200, 96, 7, 0, 7, 1, 30);
    }
    const int norm_shapes[][2] = {{1, 1}, {1, 64}, {37, 100}, {300, 1000}, {64, 4096}, {5, 5000}};
    for (int i = 0; i < 6 && want("rmsnorm"); i++)
      test_norm(0, dt, norm_shapes[i][0], norm_shapes[i][1], 0);
    for (int i = 0; i < 6 && want("layernorm"); i++)
      test_norm(1, dt, norm_shapes[i][0], norm_shapes[i][1], i != 2);
    if (want("rope")) {
      const tsr_rope plain = tsr_rope_plain(10000.0f);
      /* Llama 3.1's scaling: every band (kept, interpolated, scaled) at hd 16 */
      const tsr_rope l3 = {500000.0f, TSR_ROPE_SCALING_LLAMA3, 8.0, 1.0, 4.0, 64.0};
      test_rope(dt, 2 * 33, 33, 3, 16, (3 + 2 * 1) * 16, 0, plain, 0);      /* q of a fused qkv */
      test_rope(dt, 2 * 33, 33, 1, 16, (3 + 2 * 1) * 16, 3 * 16, plain, 0); /* its k head */
      test_rope(dt, 3 * 7, 7, 2, 2, 4, 0, tsr_rope_plain(500000.0f), 0);
      test_rope(dt, 2 * 33, 33, 3, 16, 3 * 16, 0, l3, 0);
      test_rope(dt, 4096, 4096, 1, 128, 128, 0, plain, 0); /* long context: the phase */
      test_rope(dt, 2 * 33, 33, 3, 16, (3 + 2 * 1) * 16, 0, plain, 5);   /* documents */
      test_rope(dt, 2 * 33, 33, 3, 16, 3 * 16, 0, l3, 5);                /* documents, llama3 */
      test_rope(dt, 4096, 4096, 1, 128, 128, 0, plain, 700);
    }
    if (want("activations")) {
      test_activations(dt, 1, 1);
      test_activations(dt, 37, 100);
      test_activations(dt, 64, 1376);
    }
    if (want("xent")) {
      test_xent(dt, 1, 1);
      test_xent(dt, 7, 1000);
      test_xent(dt, 64, 50257);
      test_xent(dt, 3, 70000);
      test_xent_head(dt, 37, 24, 300, 16); /* chunks of 16, 16, 5 */
      test_xent_head(dt, 1, 8, 5, 0);
      test_xent_head(dt, 70, 64, 3001, 70);
    }
    if (want("matmul")) {
      test_matmul(dt, 1, 3, 5);
      test_matmul(dt, 77, 130, 65);
      test_matmul(dt, 256, 512, 384);
      test_matmul(dt, 33, 64, 24);
      test_matmul_empty_sum(dt, 7, 9);
    }
  }
  if (want("elementwise")) {
    test_elementwise(1);
    test_elementwise(1000003);
  }
  if (want("adamw")) {
    test_adamw(1);
    test_adamw(100003);
  }
  if (want("reductions")) {
    test_sumsq(1, 1, 1);
    test_sumsq(1000, 7, 1000);
    test_sumsq((1L << 22) + 3, 2, 1L << 22);
    test_sumsq(100003, 600, 1000); /* more ranges than one fetch of the backend's */
    test_sumsq(8193, 3, 8193);      /* a chunk and one element: two levels */
    test_sumsq(3 * 8192 + 255, 5, 8192 + 257);
  }
  if (want("attention")) test_attention_group();
  if (want("failures")) test_failures();

  if (kb) kb->close();
  return ksummary("test_kernels");
}
