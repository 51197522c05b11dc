/* test_ops.c — every CPU op against an independent double-precision reference, and its
 * 16-bit storage (bf16, fp16) against its fp32 storage.
 *
 * fp32 storage.  For each op the test writes a small, naive forward in double (explicit
 * causal mask, textbook formulas) and checks:
 *   forward:  fp32 op vs the double reference,
 *   backward: the analytic fp32 gradient of L = sum(out * r) (r random) for every input
 *             and parameter vs central finite differences of the DOUBLE reference,
 *             and what the op says of its outputs: parameter gradients and the norms'
 *             dx with acc = 1 accumulate (two calls = twice the gradient); written
 *             outputs start as NaN and a second call gives bitwise the first's result.
 * Errors are max|a - ref| / max|ref| over a tensor.  Tolerances:
 *   forward 1e-5 — fp32 sums of at most a few hundred O(1) terms err by ~1e-7 relative;
 *   gradient 1e-4 — the FD of the double reference is accurate to ~1e-9 (eps = 1e-5,
 *   truncation O(eps^2), rounding 1e-16/eps), so the error is the fp32 analytic gradient
 *   itself (~1e-6); 1e-4 still catches any wrong term, sign, index or missing factor.
 *
 * 16-bit storage (test16_*).  The reference is the fp32 op run on the widened 16-bit
 * inputs, its 16-bit outputs rounded once (dtype.h's scalar conversions).  Written
 * outputs start as 0xFFFF (a NaN), accumulating ones from random values.
 *   - Bitwise where the 16-bit path does the same fp32 arithmetic in the same order:
 *     the element-wise ops, casts, residual, RoPE, embedding, the norms (forward and
 *     backward: the same row code on widened rows), cross-entropy, AdamW's out, and the
 *     fp32 outputs of those (statistics, dw, db, dwte).
 *   - Close (check16_close) for the GEMMs and attention, whose 16-bit path tiles the
 *     products differently (K in chunks, other sgemm shapes), so the fp32 sums round in
 *     another order: each element within 1 unit in the last place of dt of the reference,
 *     or within 2^-8 (bf16) / 2^-11 (fp16) of the tensor's largest magnitude.  Only the
 *     second allows more than 1 ulp, for elements much smaller than the tensor whose sum
 *     cancelled: there the fp32 order error (~1e-7 of the terms) can exceed their ulp,
 *     most of all for fp16's subnormals.  A wrong term errs by O(the tensor) and fails.
 *     Their fp32 outputs (dw, lse) are held to 1e-5 normwise.
 * The 16-bit checks also run a second time in a child process with
 * TSR_CPU_CONVERT=portable, the conversions of CPUs without F16C / AVX512-BF16.
 *
 * Data are random with a fresh seed each run (printed); rerun with `test_ops SEED`.
 * Exit 0 = all checks pass, 1 = some failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "ops/sumsq_order.h"
#include "core/util.h"

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static void omp_set_num_threads(int n) { (void)n; }
#endif

#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4
#define TOL_ACC 1e-6 /* two accumulated calls vs 2x one call: differs by fp32 rounding only */
#define FD_EPS 1e-5

static int n_checks = 0, n_failed = 0;

static void check(const char *name, double err, double tol) {
  int ok = err <= tol; /* NaN fails */
  n_checks++;
  if (!ok) n_failed++;
  printf("%s  %-62s err %.3e  (tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, tol);
}

/* ---------------------------------------------------------------- random */

static uint64_t rng_state;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double urand(void) { return ((rng_next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static void fill(float *x, long n, float amp) {
  for (long i = 0; i < n; i++) x[i] = (float)(amp * (2.0 * urand() - 1.0));
}
static int irand(int lo, int hi) { return lo + (int)(urand() * (hi - lo)); } /* [lo, hi) */

static float *fnew(long n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  if (!p) abort();
  return p;
}
static double *dnew(long n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!p) abort();
  return p;
}
static double *to_d(const float *x, long n) {
  double *d = dnew(n);
  for (long i = 0; i < n; i++) d[i] = x[i];
  return d;
}
static float *fdup(const float *x, long n) {
  float *p = fnew(n);
  memcpy(p, x, (size_t)n * sizeof(float));
  return p;
}
static float *fnan(long n) { /* a written output, poisoned */
  float *p = fnew(n);
  for (long i = 0; i < n; i++) p[i] = NAN;
  return p;
}

/* max|a - ref| / max|ref| (absolute when ref is all zero) */
static double rel_err(const float *a, const double *ref, long n) {
  double num = 0, den = 0;
  for (long i = 0; i < n; i++) {
    double d = fabs((double)a[i] - ref[i]);
    if (isnan(d)) return NAN; /* a NaN anywhere fails (a later max would forget it) */
    if (d > num) num = d;
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  return den > 0 ? num / den : num;
}
/* two fp32 tensors; ref = factor * b */
static double rel_err_ff(const float *a, const float *b, long n, double factor) {
  double *r = dnew(n);
  for (long i = 0; i < n; i++) r[i] = factor * b[i];
  double e = rel_err(a, r, n);
  free(r);
  return e;
}
/* columns [c0, c0+w) of every row of a [rows, stride] tensor */
static double rel_err_cols(const float *a, const double *ref, long rows, int stride, int c0,
                           int w) {
  double num = 0, den = 0;
  for (long r = 0; r < rows; r++)
    for (int c = c0; c < c0 + w; c++) {
      double d = fabs((double)a[r * stride + c] - ref[r * stride + c]);
      if (isnan(d)) return NAN;
      if (d > num) num = d;
      if (fabs(ref[r * stride + c]) > den) den = fabs(ref[r * stride + c]);
    }
  return den > 0 ? num / den : num;
}
static double same_bits(const void *a, const void *b, size_t bytes) {
  return memcmp(a, b, bytes) ? 1.0 : 0.0;
}

/* ------------------------------------------------------ finite differences */

/* L(params) = sum(ref_forward(ctx) * r), evaluated in double. */
typedef void (*ref_fn)(const void *ctx, double *out);
typedef struct {
  ref_fn fwd;
  const void *ctx;
  long n_out;
  const double *r;
  double *buf;
} objective;

static double loss(const objective *o) {
  o->fwd(o->ctx, o->buf);
  double s = 0;
  for (long i = 0; i < o->n_out; i++) s += o->buf[i] * o->r[i];
  return s;
}

/* Central differences of L over param[0..n) (param is read by o->fwd through ctx). */
static double *fd_grad(const objective *o, double *param, long n) {
  double *g = dnew(n);
  for (long i = 0; i < n; i++) {
    double save = param[i];
    param[i] = save + FD_EPS;
    double lp = loss(o);
    param[i] = save - FD_EPS;
    double lm = loss(o);
    param[i] = save;
    g[i] = (lp - lm) / (2 * FD_EPS);
  }
  return g;
}
static double fd_err(const objective *o, double *param, long n, const float *analytic) {
  double *g = fd_grad(o, param, n);
  double e = rel_err(analytic, g, n);
  free(g);
  return e;
}

/* ------------------------------------------------------------------ matmul */

typedef struct {
  int n, in, out;
  double *x, *w, *b;
  int gelu; /* x goes through GELU first (the fused backward's forward) */
} mm_ctx;
static double gelu_d(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static void mm_ref(const void *vc, double *y) {
  const mm_ctx *c = vc;
  for (int r = 0; r < c->n; r++)
    for (int o = 0; o < c->out; o++) {
      double s = c->b ? c->b[o] : 0;
      for (int i = 0; i < c->in; i++) {
        const double xv = c->x[r * c->in + i];
        s += (c->gelu ? gelu_d(xv) : xv) * c->w[o * c->in + i];
      }
      y[r * c->out + o] = s;
    }
}

static void test_matmul(int n, int in, int out) {
  char name[128];
  float *x = fnew((long)n * in), *w = fnew((long)out * in), *b = fnew(out);
  float *y = fnan((long)n * out);
  fill(x, (long)n * in, 1), fill(w, (long)out * in, 1), fill(b, out, 1);
  mm_ctx c = {n, in, out, to_d(x, (long)n * in), to_d(w, (long)out * in), to_d(b, out), 0};
  double *yref = dnew((long)n * out);

  tsr_ops_matmul_fwd(TSR_F32, y, x, w, b, n, in, out);
  mm_ref(&c, yref);
  snprintf(name, sizeof name, "matmul %dx%d->%d fwd (bias)", n, in, out);
  check(name, rel_err(y, yref, (long)n * out), TOL_FWD);
  double *bsave = c.b;
  c.b = NULL;
  tsr_ops_matmul_fwd(TSR_F32, y, x, w, NULL, n, in, out);
  mm_ref(&c, yref);
  c.b = bsave;
  snprintf(name, sizeof name, "matmul %dx%d->%d fwd (no bias)", n, in, out);
  check(name, rel_err(y, yref, (long)n * out), TOL_FWD);

  float *r = fnew((long)n * out);
  fill(r, (long)n * out, 1);
  double *rd = to_d(r, (long)n * out);
  float *dx = fnan((long)n * in), *dw = fnew((long)out * in), *db = fnew(out);
  tsr_ops_matmul_bwd(TSR_F32, dx, dw, db, r, x, w, NULL, n, in, out);
  objective o = {mm_ref, &c, (long)n * out, rd, yref};
  snprintf(name, sizeof name, "matmul %dx%d->%d dx vs FD", n, in, out);
  check(name, fd_err(&o, c.x, (long)n * in, dx), TOL_GRAD);
  snprintf(name, sizeof name, "matmul %dx%d->%d dw vs FD", n, in, out);
  check(name, fd_err(&o, c.w, (long)out * in, dw), TOL_GRAD);
  snprintf(name, sizeof name, "matmul %dx%d->%d dbias vs FD", n, in, out);
  check(name, fd_err(&o, c.b, out, db), TOL_GRAD);

  /* dx is written (it starts NaN here), dw and dbias accumulate */
  float *dx2 = fnan((long)n * in), *dw2 = fnew((long)out * in), *db2 = fnew(out);
  tsr_ops_matmul_bwd(TSR_F32, dx2, dw2, db2, r, x, w, NULL, n, in, out);
  tsr_ops_matmul_bwd(TSR_F32, dx2, NULL, NULL, r, x, w, NULL, n, in, out); /* NULLs: skipped */
  tsr_ops_matmul_bwd(TSR_F32, NULL, dw2, db2, r, x, w, NULL, n, in, out);
  double e = rel_err_ff(dx2, dx, (long)n * in, 1);
  double e2 = rel_err_ff(dw2, dw, (long)out * in, 2), e3 = rel_err_ff(db2, db, out, 2);
  snprintf(name, sizeof name, "matmul %dx%d->%d bwd writes dx, accumulates dw, db (NULLs)", n, in,
           out);
  check(name, fmax(e, fmax(e2, e3)), TOL_ACC);

  free(x), free(w), free(b), free(y), free(c.x), free(c.w), free(c.b), free(yref), free(r);
  free(rd), free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

/* GELU's backward fused into the GEMM's: with y = gelu(u) @ w^T, matmul_bwd's dx given
 * gelu_pre = u is dL/du. */
static void test_matmul_gelu(int n, int in, int out) {
  char name[128];
  float *u = fnew((long)n * in), *w = fnew((long)out * in), *r = fnew((long)n * out);
  fill(u, (long)n * in, 5), fill(w, (long)out * in, 1), fill(r, (long)n * out, 1);
  mm_ctx c = {n, in, out, to_d(u, (long)n * in), to_d(w, (long)out * in), NULL, 1};
  double *rd = to_d(r, (long)n * out), *yref = dnew((long)n * out);
  float *dx = fnan((long)n * in), *dx2 = fnan((long)n * in);
  tsr_ops_matmul_bwd(TSR_F32, dx, NULL, NULL, r, u, w, u, n, in, out);
  objective o = {mm_ref, &c, (long)n * out, rd, yref};
  snprintf(name, sizeof name, "matmul %dx%d->%d dx with GELU fused vs FD", n, in, out);
  check(name, fd_err(&o, c.x, (long)n * in, dx), TOL_GRAD);
  tsr_ops_matmul_bwd(TSR_F32, dx2, NULL, NULL, r, u, w, u, n, in, out);
  tsr_ops_matmul_bwd(TSR_F32, dx2, NULL, NULL, r, u, w, u, n, in, out);
  snprintf(name, sizeof name, "matmul %dx%d->%d GELU dx written (twice on NaN: bitwise once)",
           n, in, out);
  check(name, same_bits(dx, dx2, sizeof(float) * n * in), 0);
  free(u), free(w), free(r), free(c.x), free(c.w), free(rd), free(yref), free(dx), free(dx2);
}

/* --------------------------------------------------------------- embedding */

/* Document starts (ops_list.h "Documents") of B sequences of T rows: a new document after
 * about one row in `every`, at random; in sequence 0 also at row 1 (a one-row document
 * first), at multiples of 64 (attention tiles) and at the last row (a one-row document
 * last); the last sequence (B > 1) is one document.  free() it. */
static int32_t *make_docs(int B, int T, int every) {
  int32_t *d = malloc(sizeof(int32_t) * (size_t)B * T);
  for (int b = 0; b < B; b++) {
    int start = 0;
    for (int t = 1; t < T; t++) {
      const int cut = irand(0, every) == 0 || (b == 0 && (t == 1 || t % 64 == 0 || t == T - 1));
      if (cut && !(B > 1 && b == B - 1)) start = t;
      d[(long)b * T + t] = start;
    }
    d[(long)b * T] = 0;
  }
  return d;
}
/* The position of row r of sequences of T rows (ops_list.h). */
static int pos_of(const int32_t *doc, int r, int T) { return doc ? r % T - doc[r] : r % T; }

typedef struct {
  int n, T, C, vs, vl;
  const int32_t *tok;
  double *wte, *wpe;
  const int32_t *doc;
} emb_ctx;
static void emb_ref(const void *vc, double *out) {
  const emb_ctx *c = vc;
  for (int r = 0; r < c->n; r++)
    for (int k = 0; k < c->C; k++) {
      int t = c->tok[r];
      double v = (t >= c->vs && t < c->vs + c->vl) ? c->wte[(t - c->vs) * c->C + k] : 0.0;
      out[r * c->C + k] = v + (c->wpe ? c->wpe[pos_of(c->doc, r, c->T) * c->C + k] : 0.0);
    }
}

/* tokens for n rows of a vocabulary slice [vs, vs + vl) of vocab: two out of range, one
 * repeated */
static int32_t *emb_tokens(int n, int vocab, int vs, int vl) {
  int32_t *tok = malloc(sizeof(int32_t) * (n > 4 ? n : 4));
  for (int r = 0; r < n; r++) tok[r] = irand(0, vocab);
  if (n < 4) return tok;
  tok[0] = vs - 1 >= 0 ? vs - 1 : vocab - 1; /* out of range below (or above) */
  tok[1] = vs + vl < vocab ? vs + vl : 0;     /* out of range above (or below) */
  tok[2] = tok[3] = vs;                       /* a repeated in-range token */
  return tok;
}

/* doc: the rows' document starts (NULL: none) */
static void test_embedding_docs(int B, int T, int C, int vocab, int vs, int vl,
                                const int32_t *doc) {
  char name[128];
  int n = B * T;
  int32_t *tok = emb_tokens(n, vocab, vs, vl);
  float *wte = fnew((long)vl * C), *wpe = fnew((long)T * C), *out = fnan((long)n * C);
  fill(wte, (long)vl * C, 1), fill(wpe, (long)T * C, 1);
  emb_ctx c = {n, T, C, vs, vl, tok, to_d(wte, (long)vl * C), to_d(wpe, (long)T * C), doc};
  double *ref = dnew((long)n * C);

  tsr_ops_embedding_fwd(TSR_F32, out, tok, wte, wpe, n, T, C, vs, vl, doc);
  emb_ref(&c, ref);
  snprintf(name, sizeof name, "embedding n=%d C=%d vocab[%d,%d)%s fwd", n, C, vs, vs + vl,
           doc ? " documents" : "");
  check(name, rel_err(out, ref, (long)n * C), TOL_FWD);
  double *wpe_save = c.wpe;
  c.wpe = NULL;
  tsr_ops_embedding_fwd(TSR_F32, out, tok, wte, NULL, n, T, C, vs, vl, doc);
  emb_ref(&c, ref);
  c.wpe = wpe_save;
  snprintf(name, sizeof name, "embedding n=%d C=%d fwd without positions", n, C);
  check(name, rel_err(out, ref, (long)n * C), TOL_FWD);

  float *r = fnew((long)n * C);
  fill(r, (long)n * C, 1);
  double *rd = to_d(r, (long)n * C);
  float *dwte = fnew((long)vl * C), *dwpe = fnew((long)T * C);
  tsr_ops_embedding_bwd(TSR_F32, dwte, dwpe, r, tok, n, T, C, vs, vl, doc);
  objective o = {emb_ref, &c, (long)n * C, rd, ref};
  snprintf(name, sizeof name, "embedding n=%d C=%d dwte vs FD", n, C);
  check(name, fd_err(&o, c.wte, (long)vl * C, dwte), TOL_GRAD);
  snprintf(name, sizeof name, "embedding n=%d C=%d%s dwpe vs FD", n, C, doc ? " documents" : "");
  check(name, fd_err(&o, c.wpe, (long)T * C, dwpe), TOL_GRAD);

  float *dwte2 = fnew((long)vl * C), *dwpe2 = fnew((long)T * C);
  tsr_ops_embedding_bwd(TSR_F32, dwte2, dwpe2, r, tok, n, T, C, vs, vl, doc);
  tsr_ops_embedding_bwd(TSR_F32, dwte2, dwpe2, r, tok, n, T, C, vs, vl, doc);
  double e = fmax(rel_err_ff(dwte2, dwte, (long)vl * C, 2),
                  rel_err_ff(dwpe2, dwpe, (long)T * C, 2));
  snprintf(name, sizeof name, "embedding n=%d C=%d bwd accumulates", n, C);
  check(name, e, TOL_ACC);

  free(tok), free(wte), free(wpe), free(out), free(c.wte), free(c.wpe), free(ref), free(r);
  free(rd), free(dwte), free(dwpe), free(dwte2), free(dwpe2);
}
static void test_embedding(int B, int T, int C, int vocab, int vs, int vl) {
  test_embedding_docs(B, T, C, vocab, vs, vl, NULL);
}

/* ------------------------------------------------------ RMSNorm, LayerNorm */

typedef struct {
  int n, C, layer; /* layer: LayerNorm, else RMSNorm */
  double eps;
  double *x, *w, *b;
} norm_ctx;
static void norm_ref(const void *vc, double *out) {
  const norm_ctx *c = vc;
  for (int r = 0; r < c->n; r++) {
    const double *x = c->x + (long)r * c->C;
    double mu = 0, ss = 0;
    if (c->layer) {
      for (int k = 0; k < c->C; k++) mu += x[k];
      mu /= c->C;
    }
    for (int k = 0; k < c->C; k++) ss += (x[k] - mu) * (x[k] - mu);
    double rs = 1 / sqrt(ss / c->C + c->eps);
    for (int k = 0; k < c->C; k++)
      out[(long)r * c->C + k] = (x[k] - mu) * rs * c->w[k] + (c->layer ? c->b[k] : 0);
  }
}

static void norm_fwd(tsr_dtype dt, int layer, void *out, float *mean, float *rstd, void *h,
                     const void *x, const void *y, const void *w, const void *b, int n, int C) {
  if (layer)
    tsr_ops_layernorm_fwd(dt, out, mean, rstd, h, x, y, w, b, n, C, 1e-5f);
  else
    tsr_ops_rmsnorm_fwd(dt, out, rstd, h, x, y, w, n, C, 1e-5f);
}
static void norm_bwd(tsr_dtype dt, int layer, void *dx, float *dw, float *db, const void *dout,
                     const void *x, const void *w, const float *mean, const float *rstd, int n,
                     int C, int acc) {
  if (layer)
    tsr_ops_layernorm_bwd(dt, dx, dw, db, dout, x, w, mean, rstd, n, C, acc);
  else
    tsr_ops_rmsnorm_bwd(dt, dx, dw, dout, x, w, rstd, n, C, acc);
}

static void test_norm(int layer, int n, int C) {
  char name[128];
  const char *nm = layer ? "layernorm" : "rmsnorm";
  const long len = (long)n * C;
  float *x = fnew(len), *y = fnew(len), *w = fnew(C), *b = fnew(C), *out = fnan(len);
  float *mean = fnew(n), *rstd = fnew(n);
  fill(x, len, 2), fill(y, len, 1), fill(w, C, 1.5), fill(b, C, 1);
  for (long i = 0; i < C; i++) x[i] += 3.0f; /* one row with a large mean */
  norm_ctx c = {n, C, layer, 1e-5, to_d(x, len), to_d(w, C), to_d(b, C)};
  double *ref = dnew(len);
  norm_fwd(TSR_F32, layer, out, mean, rstd, NULL, x, NULL, w, b, n, C);
  norm_ref(&c, ref);
  snprintf(name, sizeof name, "%s n=%d C=%d fwd", nm, n, C);
  check(name, rel_err(out, ref, len), TOL_FWD);

  /* the residual add fused in: h = x + y (stored), out = norm(h); h may be x */
  float *h = fnan(len), *out2 = fnan(len), *xi = fdup(x, len), *hsum = fnew(len);
  for (long i = 0; i < len; i++) hsum[i] = x[i] + y[i];
  norm_fwd(TSR_F32, layer, out2, mean, rstd, h, x, y, w, b, n, C);
  norm_ctx ch = c;
  ch.x = to_d(hsum, len);
  norm_ref(&ch, ref);
  snprintf(name, sizeof name, "%s n=%d C=%d fwd of x + y (fused residual)", nm, n, C);
  check(name, rel_err(out2, ref, len), TOL_FWD);
  float *out3 = fnan(len);
  norm_fwd(TSR_F32, layer, out3, mean, rstd, xi, xi, y, w, b, n, C);
  snprintf(name, sizeof name, "%s n=%d C=%d fused residual: h = x + y bitwise, in place too", nm,
           n, C);
  check(name,
        same_bits(h, hsum, sizeof(float) * len) + same_bits(xi, hsum, sizeof(float) * len) +
            same_bits(out3, out2, sizeof(float) * len),
        0);
  norm_fwd(TSR_F32, layer, out, mean, rstd, NULL, x, NULL, w, b, n, C); /* stats of x again */

  float *r = fnew(len);
  fill(r, len, 1);
  double *rd = to_d(r, len);
  float *dx = fnan(len), *dw = fnew(C), *db = fnew(C); /* acc = 0: dx written */
  norm_bwd(TSR_F32, layer, dx, dw, db, r, x, w, mean, rstd, n, C, 0);
  objective o = {norm_ref, &c, len, rd, ref};
  snprintf(name, sizeof name, "%s n=%d C=%d dx vs FD", nm, n, C);
  check(name, fd_err(&o, c.x, len, dx), TOL_GRAD);
  snprintf(name, sizeof name, "%s n=%d C=%d dw vs FD", nm, n, C);
  check(name, fd_err(&o, c.w, C, dw), TOL_GRAD);
  if (layer) {
    snprintf(name, sizeof name, "%s n=%d C=%d db vs FD", nm, n, C);
    check(name, fd_err(&o, c.b, C, db), TOL_GRAD);
  }
  /* acc = 1 adds dx to what is there (twice from 0: twice the gradient); dw, db always
   * accumulate; acc = 0 writes (twice on NaN: bitwise once) */
  float *dx2 = fnew(len), *dw2 = fnew(C), *db2 = fnew(C), *dx3 = fnan(len);
  for (int rep = 0; rep < 2; rep++) {
    norm_bwd(TSR_F32, layer, dx2, dw2, db2, r, x, w, mean, rstd, n, C, 1);
    norm_bwd(TSR_F32, layer, dx3, NULL, NULL, r, x, w, mean, rstd, n, C, 0);
  }
  double e = fmax(rel_err_ff(dx2, dx, len, 2), rel_err_ff(dw2, dw, C, 2));
  if (layer) e = fmax(e, rel_err_ff(db2, db, C, 2));
  snprintf(name, sizeof name, "%s n=%d C=%d bwd acc=1 accumulates dx, dw, db always", nm, n, C);
  check(name, e, TOL_ACC);
  snprintf(name, sizeof name, "%s n=%d C=%d bwd acc=0 writes dx (NULL dw, db skipped)", nm, n, C);
  check(name, same_bits(dx3, dx, sizeof(float) * len), 0);

  free(x), free(y), free(w), free(b), free(out), free(mean), free(rstd), free(c.x), free(c.w);
  free(c.b), free(ref), free(h), free(out2), free(xi), free(hsum), free(ch.x), free(out3);
  free(r), free(rd), free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2), free(dx3);
}

/* -------------------------------------------------------------------- RoPE */

typedef struct {
  int n, T, H, hd, stride;
  tsr_rope rope;
  double *x;
  const int32_t *doc;
} rope_ctx;
/* Pair i's frequency, written from Llama 3.1's published rescaling (the reference code's
 * apply_scaling, one frequency at a time). */
static double rope_ref_freq(const tsr_rope *rp, int i, int hd) {
  const double f = 1.0 / pow(rp->theta, 2.0 * i / hd);
  if (rp->scaling != TSR_ROPE_SCALING_LLAMA3) return f;
  const double old_ctx = rp->original_context, wavelen = 2 * M_PI / f;
  const double low_wavelen = old_ctx / rp->low_freq_factor;
  const double high_wavelen = old_ctx / rp->high_freq_factor;
  if (wavelen < high_wavelen) return f;
  if (wavelen > low_wavelen) return f / rp->factor;
  const double smooth = (old_ctx / wavelen - rp->low_freq_factor) /
                        (rp->high_freq_factor - rp->low_freq_factor);
  return (1 - smooth) * f / rp->factor + smooth * f;
}
static void rope_ref(const void *vc, double *out) {
  const rope_ctx *c = vc;
  memcpy(out, c->x, sizeof(double) * c->n * c->stride);
  for (int r = 0; r < c->n; r++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < c->hd / 2; i++) {
        double ang = pos_of(c->doc, r, c->T) * rope_ref_freq(&c->rope, i, c->hd);
        long ia = (long)r * c->stride + h * c->hd + i, ib = ia + c->hd / 2;
        out[ia] = c->x[ia] * cos(ang) - c->x[ib] * sin(ang);
        out[ib] = c->x[ia] * sin(ang) + c->x[ib] * cos(ang);
      }
}

/* hd = 8: wavelengths 2 pi x (1, 10, 100, 1000): below 256/8 (kept), between (interpolated),
 * above 256/2 (scaled) */
static const tsr_rope llama3_rope = {10000.0f, TSR_ROPE_SCALING_LLAMA3, 8.0, 2.0, 8.0, 256.0};

static void test_rope_hand(void) {
  /* hd = 4, theta = 1e4, pos 2: pair (x0, x2) turns by 2 rad, (x1, x3) by 2*1e4^-0.5 =
   * 0.02 rad.  x = (1, 2, 3, 4); values from cos/sin by hand (10 digits). */
  float x[3 * 4];
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 4; i++) x[r * 4 + i] = (float)(i + 1);
  tsr_ops_rope_fwd(TSR_F32, x, 3, 3, 1, 4, 4, tsr_rope_plain(10000.0f), NULL);
  const double want[4] = {-3.1440391170, 1.9196053466, -0.3391430828, 4.0391973601};
  const double pos0[4] = {1, 2, 3, 4};
  double e = fmax(rel_err(x + 8, want, 4), rel_err(x, pos0, 4));
  check("rope hand case (hd=4, pos 0 and 2, theta=1e4)", e, 1e-6);
  /* llama3 scaling, hd = 4, theta = 1e4, original context 8, low 1, high 4, factor 8: pair
   * 0 (wavelength 2 pi < 8/4? no; > 8? no) is interpolated, s = (8/(2 pi) - 1)/3 =
   * 0.09108, f = (1 - s)/8 + s = 0.20470; pair 1 (wavelength 628 > 8) turns at 0.01/8.
   * pos 2: angles 0.40940 and 0.0025 rad. */
  tsr_rope l3 = {10000.0f, TSR_ROPE_SCALING_LLAMA3, 8.0, 1.0, 4.0, 8.0};
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 4; i++) x[r * 4 + i] = (float)(i + 1);
  tsr_ops_rope_fwd(TSR_F32, x, 3, 3, 1, 4, 4, l3, NULL);
  const double s = (8.0 / (2 * M_PI) - 1) / 3, a0 = 2 * ((1 - s) / 8 + s), a1 = 2 * 0.01 / 8;
  const double want3[4] = {cos(a0) - 3 * sin(a0), 2 * cos(a1) - 4 * sin(a1),
                           sin(a0) + 3 * cos(a0), 2 * sin(a1) + 4 * cos(a1)};
  check("rope llama3 hand case (hd=4, interpolated and scaled pairs)", rel_err(x + 8, want3, 4),
        1e-6);
}

static void test_rope_docs(int B, int T, int H, int hd, int pad, tsr_rope theta, const int32_t *doc) {
  char name[128];
  int n = B * T, stride = H * hd + pad;
  long len = (long)n * stride;
  float *x = fnew(len);
  fill(x, len, 1);
  rope_ctx c = {n, T, H, hd, stride, theta, to_d(x, len), doc};
  double *ref = dnew(len);
  float *y = fdup(x, len);
  tsr_ops_rope_fwd(TSR_F32, y, n, T, H, hd, stride, theta, doc);
  rope_ref(&c, ref);
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d stride=%d theta=%g%s%s fwd", n, H, hd, stride,
           (double)theta.theta, theta.scaling ? " llama3" : "", doc ? " documents" : "");
  check(name, rel_err(y, ref, len), TOL_FWD);
  /* bwd is the inverse rotation applied in place: the analytic gradient of
   * sum(rope(x) * r) is rope_bwd(r); the pad columns of r must pass through. */
  float *r = fnew(len);
  fill(r, len, 1);
  double *rd = to_d(r, len);
  float *g = fdup(r, len);
  tsr_ops_rope_bwd(TSR_F32, g, n, T, H, hd, stride, theta, doc);
  objective o = {rope_ref, &c, len, rd, ref};
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d dx vs FD", n, H, hd);
  check(name, fd_err(&o, c.x, len, g), TOL_GRAD);
  tsr_ops_rope_bwd(TSR_F32, y, n, T, H, hd, stride, theta, doc);
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d bwd(fwd(x)) == x", n, H, hd);
  check(name, rel_err(y, c.x, len), 1e-6);
  free(x), free(c.x), free(ref), free(y), free(r), free(rd), free(g);
}
static void test_rope(int B, int T, int H, int hd, int pad, tsr_rope theta) {
  test_rope_docs(B, T, H, hd, pad, theta, NULL);
}

/* --------------------------------------------------------------- attention */

typedef struct {
  int B, T, H, KV, hd, stride;
  double *qkv;
  double *lse; /* optional output */
  const int32_t *doc; /* document starts, or NULL */
} attn_ctx;
/* Naive O(T^2) attention with an explicit causal mask on the full score matrix (and the
 * keys before the query's document start masked too, with documents). */
static void attn_ref(const void *vc, double *out) {
  const attn_ctx *c = vc;
  const int T = c->T, hd = c->hd;
  double *s = dnew(T);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++) {
      int g = h / (c->H / c->KV);
      for (int t = 0; t < T; t++) {
        const double *q = c->qkv + ((long)b * T + t) * c->stride + h * hd;
        const int j0 = c->doc ? c->doc[(long)b * T + t] : 0;
        double m = -INFINITY, l = 0;
        for (int j = 0; j < T; j++) {
          const double *k = c->qkv + ((long)b * T + j) * c->stride + (c->H + g) * hd;
          double d = 0;
          for (int i = 0; i < hd; i++) d += q[i] * k[i];
          s[j] = j <= t && j >= j0 ? d / sqrt((double)hd) : -INFINITY;
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < T; j++) l += exp(s[j] - m);
        double *o = out + ((long)b * T + t) * c->H * hd + h * hd;
        for (int i = 0; i < hd; i++) {
          double a = 0;
          for (int j = 0; j < T; j++)
            a += exp(s[j] - m) / l *
                 c->qkv[((long)b * T + j) * c->stride + (c->H + c->KV + g) * hd + i];
          o[i] = a;
        }
        if (c->lse) c->lse[((long)b * c->H + h) * T + t] = m + log(l);
      }
    }
  free(s);
}

/* n_fd_samples = 0: FD over every element of the fused qkv buffer; else over that many
 * random elements (large shapes). */
static void test_attention_docs(int B, int T, int H, int KV, int hd, int pad, int n_fd_samples,
                                const int32_t *doc) {
  char name[160], shape[96];
  snprintf(shape, sizeof shape, "B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd,
           doc ? " documents" : "");
  const int stride = (H + 2 * KV) * hd + pad, n = B * T;
  const long len = (long)n * stride, olen = (long)n * H * hd;
  float *qkv = fnew(len), *out = fnan(olen), *lse = fnan((long)B * H * T);
  fill(qkv, len, 1.5f);
  const float *q = qkv, *k = qkv + H * hd, *v = qkv + (H + KV) * hd;
  attn_ctx c = {B, T, H, KV, hd, stride, to_d(qkv, len), dnew((long)B * H * T), doc};
  double *ref = dnew(olen);
  tsr_ops_attention_fwd(TSR_F32, out, lse, q, k, v, B, T, H, KV, hd, stride, doc);
  attn_ref(&c, ref);
  snprintf(name, sizeof name, "attention %s fwd out", shape);
  check(name, rel_err(out, ref, olen), TOL_FWD);
  snprintf(name, sizeof name, "attention %s fwd lse", shape);
  check(name, rel_err(lse, c.lse, (long)B * H * T), TOL_FWD);
  free(c.lse);
  c.lse = NULL;

  float *r = fnew(olen);
  fill(r, olen, 1);
  double *rd = to_d(r, olen);
  float *g1 = fnan(len), *g2 = fnan(len); /* dq, dk, dv written; the padding left alone */
  float *dq = g1, *dk = g1 + H * hd, *dv = g1 + (H + KV) * hd;
  tsr_ops_attention_bwd(TSR_F32, dq, dk, dv, r, out, lse, q, k, v, B, T, H, KV, hd, stride, doc);
  objective o = {attn_ref, &c, olen, rd, ref};
  double *num = NULL;
  if (n_fd_samples == 0) {
    num = fd_grad(&o, c.qkv, len);
  } else { /* NaN marks elements not sampled; compare only sampled ones */
    num = dnew(len);
    for (long i = 0; i < len; i++) num[i] = NAN;
    for (int s = 0; s < n_fd_samples; s++) {
      long i = (long)(urand() * len);
      double save = c.qkv[i];
      c.qkv[i] = save + FD_EPS;
      double lp = loss(&o);
      c.qkv[i] = save - FD_EPS;
      double lm = loss(&o);
      c.qkv[i] = save;
      num[i] = (lp - lm) / (2 * FD_EPS);
    }
  }
  const char *part[3] = {"dq", "dk", "dv"};
  const int c0[3] = {0, H * hd, (H + KV) * hd}, w[3] = {H * hd, KV * hd, KV * hd};
  for (int p = 0; p < 3; p++) {
    double e;
    if (n_fd_samples == 0) {
      e = rel_err_cols(g1, num, n, stride, c0[p], w[p]);
    } else {
      double nm = 0, dn = 0;
      for (long rr = 0; rr < n; rr++)
        for (int cc = c0[p]; cc < c0[p] + w[p]; cc++) {
          long i = rr * stride + cc;
          if (isnan(g1[i])) nm = NAN;
          if (isnan(num[i])) continue;
          nm = fmax(nm, fabs(g1[i] - num[i]));
          dn = fmax(dn, fabs(num[i]));
        }
      e = dn > 0 ? nm / dn : nm;
    }
    snprintf(name, sizeof name, "attention %s %s vs FD%s", shape, part[p],
             n_fd_samples ? " (sampled)" : "");
    check(name, e, TOL_GRAD);
  }
  /* the pad columns belong to no tensor: the backward must not touch them */
  long pad_touched = 0;
  for (long rr = 0; rr < n; rr++)
    for (int cc = (H + 2 * KV) * hd; cc < stride; cc++) pad_touched += !isnan(g1[rr * stride + cc]);
  if (pad) {
    snprintf(name, sizeof name, "attention %s bwd leaves stride padding alone", shape);
    check(name, (double)pad_touched, 0);
  }
  for (int rep = 0; rep < 2; rep++)
    tsr_ops_attention_bwd(TSR_F32, g2, g2 + H * hd, g2 + (H + KV) * hd, r, out, lse, q, k, v, B,
                          T, H, KV, hd, stride, doc);
  snprintf(name, sizeof name, "attention %s bwd writes (twice on NaN: bitwise once)", shape);
  check(name, same_bits(g1, g2, sizeof(float) * len), 0);
  if (!doc) { /* documents all starting at row 0 are no documents: bitwise the same */
    int32_t *zeros = calloc((size_t)n, sizeof(int32_t));
    float *out0 = fnan(olen), *lse0 = fnan((long)B * H * T), *g0 = fnan(len);
    tsr_ops_attention_fwd(TSR_F32, out0, lse0, q, k, v, B, T, H, KV, hd, stride, zeros);
    tsr_ops_attention_bwd(TSR_F32, g0, g0 + H * hd, g0 + (H + KV) * hd, r, out, lse, q, k, v, B,
                          T, H, KV, hd, stride, zeros);
    snprintf(name, sizeof name, "attention %s with one document per sequence: bitwise", shape);
    check(name,
          same_bits(out0, out, sizeof(float) * olen) +
              same_bits(lse0, lse, sizeof(float) * B * H * T) +
              same_bits(g0, g1, sizeof(float) * len),
          0);
    free(zeros), free(out0), free(lse0), free(g0);
  }

  free(qkv), free(out), free(lse), free(c.qkv), free(ref), free(r), free(rd), free(g1), free(g2);
  free(num);
}
static void test_attention(int B, int T, int H, int KV, int hd, int pad, int n_fd_samples) {
  test_attention_docs(B, T, H, KV, hd, pad, n_fd_samples, NULL);
}

/* Forward and backward must be bitwise identical for 1, 2 and 3 threads. */
static void test_attention_threads_docs(int B, int T, int H, int KV, int hd, const int32_t *doc) {
  char name[160];
  const int stride = (H + 2 * KV) * hd, n = B * T;
  const long len = (long)n * stride, olen = (long)n * H * hd;
  float *qkv = fnew(len), *r = fnew(olen);
  fill(qkv, len, 1.5f), fill(r, olen, 1);
  float *out[3], *lse[3], *g[3];
  const int threads[3] = {1, 2, 3};
  int saved = omp_get_max_threads();
  for (int k = 0; k < 3; k++) {
    omp_set_num_threads(threads[k]);
    out[k] = fnew(olen), lse[k] = fnew((long)B * H * T), g[k] = fnew(len);
    tsr_ops_attention_fwd(TSR_F32, out[k], lse[k], qkv, qkv + H * hd, qkv + (H + KV) * hd, B, T,
                          H, KV, hd, stride, doc);
    tsr_ops_attention_bwd(TSR_F32, g[k], g[k] + H * hd, g[k] + (H + KV) * hd, r, out[k], lse[k],
                          qkv, qkv + H * hd, qkv + (H + KV) * hd, B, T, H, KV, hd, stride, doc);
  }
  omp_set_num_threads(saved);
  int same = 1;
  for (int k = 1; k < 3; k++)
    same &= !memcmp(out[0], out[k], sizeof(float) * olen) &&
            !memcmp(lse[0], lse[k], sizeof(float) * B * H * T) &&
            !memcmp(g[0], g[k], sizeof(float) * len);
  snprintf(name, sizeof name, "attention B=%d T=%d H=%d KV=%d hd=%d%s bitwise 1/2/3 threads", B,
           T, H, KV, hd, doc ? " documents" : "");
  check(name, same ? 0.0 : 1.0, 0);
  for (int k = 0; k < 3; k++) free(out[k]), free(lse[k]), free(g[k]);
  free(qkv), free(r);
}
static void test_attention_threads(int B, int T, int H, int KV, int hd) {
  test_attention_threads_docs(B, T, H, KV, hd, NULL);
}

/* --------------------------------------------------------------- SwiGLU, GELU */

typedef struct {
  int n, F;
  double *x;
} act_ctx;
static void swiglu_ref(const void *vc, double *out) {
  const act_ctx *c = vc;
  for (int r = 0; r < c->n; r++)
    for (int j = 0; j < c->F; j++) {
      double g = c->x[(long)r * 2 * c->F + j], u = c->x[(long)r * 2 * c->F + c->F + j];
      out[(long)r * c->F + j] = g / (1 + exp(-g)) * u;
    }
}

static void test_swiglu(int n, int F) {
  char name[128];
  long in_len = (long)n * 2 * F, out_len = (long)n * F;
  float *x = fnew(in_len), *out = fnan(out_len), *r = fnew(out_len);
  fill(x, in_len, 4), fill(r, out_len, 1);
  act_ctx c = {n, F, to_d(x, in_len)};
  double *ref = dnew(out_len), *rd = to_d(r, out_len);
  tsr_ops_swiglu_fwd(TSR_F32, out, x, n, F);
  swiglu_ref(&c, ref);
  snprintf(name, sizeof name, "swiglu n=%d F=%d fwd", n, F);
  check(name, rel_err(out, ref, out_len), TOL_FWD);
  float *g1 = fnan(in_len), *g2 = fnan(in_len); /* written, not accumulated */
  tsr_ops_swiglu_bwd(TSR_F32, g1, r, x, n, F);
  tsr_ops_swiglu_bwd(TSR_F32, g2, r, x, n, F);
  tsr_ops_swiglu_bwd(TSR_F32, g2, r, x, n, F);
  objective o = {swiglu_ref, &c, out_len, rd, ref};
  snprintf(name, sizeof name, "swiglu n=%d F=%d dgate_up vs FD", n, F);
  check(name, fd_err(&o, c.x, in_len, g1), TOL_GRAD);
  snprintf(name, sizeof name, "swiglu n=%d F=%d bwd writes (twice on NaN: bitwise once)", n, F);
  check(name, same_bits(g1, g2, sizeof(float) * in_len), 0);
  free(x), free(out), free(r), free(c.x), free(ref), free(rd), free(g1), free(g2);
}

static void test_gelu(int n) { /* its backward: test_matmul_gelu */
  char name[128];
  float *x = fnew(n), *out = fnan(n);
  fill(x, n, 5);
  double *ref = dnew(n);
  tsr_ops_gelu_fwd(TSR_F32, out, x, n);
  for (int i = 0; i < n; i++) ref[i] = gelu_d(x[i]);
  snprintf(name, sizeof name, "gelu n=%d fwd", n);
  check(name, rel_err(out, ref, n), TOL_FWD);
  free(x), free(out), free(ref);
}

/* ------------------------------------------------------------ cross entropy */

typedef struct {
  int n, V;
  const int32_t *tgt;
  double dloss;
  double *z;
} xent_ctx;
/* out[0] = dloss * sum_r (logsumexp(z_r) - z_r[target]); rows with target outside [0,V)
 * are ignored (the ops' documented ignore rule). */
static void xent_ref(const void *vc, double *out) {
  const xent_ctx *c = vc;
  double s = 0;
  for (int r = 0; r < c->n; r++) {
    int t = c->tgt[r];
    if (t < 0 || t >= c->V) continue;
    const double *z = c->z + (long)r * c->V;
    double m = z[0], l = 0;
    for (int j = 1; j < c->V; j++) m = fmax(m, z[j]);
    for (int j = 0; j < c->V; j++) l += exp(z[j] - m);
    s += m + log(l) - z[t];
  }
  out[0] = c->dloss * s;
}

/* The loss sum of xent (acc starting at 0, div 1). */
static double xent_sum(const float *logits, const int32_t *tgt, int n, int V) {
  double acc = 0;
  tsr_ops_xent(TSR_F32, &acc, 1.0, (void *)logits, tgt, n, V, 0.0f, 0);
  return acc;
}

static void test_xent(int n, int V, int with_fd) {
  char name[128];
  long len = (long)n * V;
  float *z = fnew(len);
  fill(z, len, 3);
  for (int j = 0; j < V; j++) z[j] += 80.0f; /* one row far from 0: needs the max shift */
  int32_t *tgt = malloc(sizeof(int32_t) * n);
  for (int r = 0; r < n; r++) tgt[r] = irand(0, V);
  if (n > 2) tgt[2] = -1; /* ignored row */
  const float dloss = 0.37f;
  xent_ctx c = {n, V, tgt, 1.0, to_d(z, len)};
  double ref;
  xent_ref(&c, &ref);
  double l_eval = xent_sum(z, tgt, n, V), l = 0;
  float *g = fdup(z, len);
  tsr_ops_xent(TSR_F32, &l, 1.0, g, tgt, n, V, dloss, 1);
  int untouched = 1;
  for (long i = 0; i < len; i++) untouched &= z[i] == (float)c.z[i];
  snprintf(name, sizeof name, "xent n=%d V=%d loss vs double log-softmax", n, V);
  check(name, fabs(l - ref) / fabs(ref), 1e-6);
  snprintf(name, sizeof name, "xent n=%d V=%d loss == loss with grad, logits untouched", n, V);
  check(name, untouched ? fabs(l_eval - l) / fabs(ref) : 1.0, 1e-12);
  double rowsum = 0, ign = 0;
  for (int r = 0; r < n; r++) {
    double s = 0;
    for (int j = 0; j < V; j++) s += g[(long)r * V + j];
    rowsum = fmax(rowsum, fabs(s));
    if (tgt[r] < 0)
      for (int j = 0; j < V; j++) ign = fmax(ign, fabs(g[(long)r * V + j]));
  }
  snprintf(name, sizeof name, "xent n=%d V=%d gradient rows sum to 0 (|sum|/dloss)", n, V);
  check(name, rowsum / dloss, 1e-6);
  if (n > 2) {
    snprintf(name, sizeof name, "xent n=%d V=%d ignored target: zero gradient", n, V);
    check(name, ign, 0);
  }
  if (with_fd) {
    c.dloss = dloss;
    double buf, one = 1;
    objective o = {xent_ref, &c, 1, &one, &buf};
    snprintf(name, sizeof name, "xent n=%d V=%d dlogits vs FD", n, V);
    check(name, fd_err(&o, c.z, len, g), TOL_GRAD);
  }
  /* the loss sum is a fixed-order reduction: identical for any thread count */
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  double l1 = xent_sum(z, tgt, n, V);
  omp_set_num_threads(3);
  double l3 = xent_sum(z, tgt, n, V);
  omp_set_num_threads(saved);
  snprintf(name, sizeof name, "xent n=%d V=%d loss bitwise 1/3 threads", n, V);
  check(name, l1 == l3 && l1 == l_eval ? 0.0 : 1.0, 0);
  /* the accumulator gets sum / div, bitwise as the caller would add it */
  double acc = 0.375, want = 0.375 + l_eval / (double)n + l / (double)n;
  tsr_ops_xent(TSR_F32, &acc, (double)n, z, tgt, n, V, dloss, 0);
  float *g2 = fdup(z, len);
  tsr_ops_xent(TSR_F32, &acc, (double)n, g2, tgt, n, V, dloss, 1);
  snprintf(name, sizeof name, "xent n=%d V=%d acc += sum / div, same gradient", n, V);
  check(name, acc == want && !memcmp(g2, g, len * sizeof(float)) ? 0.0 : 1.0, 0);
  free(g2);
  free(z), free(tgt), free(c.z), free(g);
}

/* The vocab-parallel passes over `parts` column slices, combined as the tensor-parallel
 * caller does (max, sums), against the single-rank xent: loss and gradient. */
static void test_xent_parallel(int n, int V, int parts) {
  char name[128];
  const long len = (long)n * V;
  float *z = fnew(len), *g = fnew(len);
  fill(z, len, 3);
  int32_t *tgt = malloc(sizeof(int32_t) * n);
  for (int r = 0; r < n; r++) tgt[r] = irand(0, V);
  const float dloss = 0.61f;
  double want = 0.5;
  memcpy(g, z, sizeof(float) * len);
  tsr_ops_xent(TSR_F32, &want, 3.0, g, tgt, n, V, dloss, 1);
  double *mx = dnew(n), *tl = dnew(n), *se = dnew(n), *pm = dnew(n), *pt = dnew(n), *ps = dnew(n);
  float **piece = malloc(sizeof(float *) * parts);
  for (int r = 0; r < n; r++) mx[r] = -INFINITY;
  for (int p = 0; p < parts; p++) { /* ragged slices: [V p / parts, V (p+1) / parts) */
    const int v0 = V * p / parts, vl = V * (p + 1) / parts - v0;
    piece[p] = fnew((long)n * vl);
    for (int r = 0; r < n; r++) memcpy(piece[p] + (long)r * vl, z + (long)r * V + v0, 4l * vl);
    tsr_ops_xent_local_stats(TSR_F32, pm, pt, piece[p], tgt, n, vl, v0);
    for (int r = 0; r < n; r++) mx[r] = fmax(mx[r], pm[r]), tl[r] += pt[r];
  }
  for (int p = 0; p < parts; p++) {
    const int v0 = V * p / parts, vl = V * (p + 1) / parts - v0;
    tsr_ops_xent_local_sumexp(TSR_F32, ps, piece[p], mx, n, vl);
    for (int r = 0; r < n; r++) se[r] += ps[r];
  }
  double acc = 0.5;
  tsr_ops_xent_rows(&acc, 3.0, mx, se, tl, n);
  snprintf(name, sizeof name, "xent vocab-parallel n=%d V=%d in %d: loss vs xent", n, V, parts);
  check(name, fabs(acc - want) / fabs(want), 1e-12);
  double num = 0, den = 0;
  for (int p = 0; p < parts; p++) {
    const int v0 = V * p / parts, vl = V * (p + 1) / parts - v0;
    tsr_ops_xent_grad(TSR_F32, piece[p], tgt, mx, se, n, vl, v0, dloss);
    for (int r = 0; r < n; r++)
      for (int j = 0; j < vl; j++) {
        const double a = piece[p][(long)r * vl + j], b = g[(long)r * V + v0 + j];
        num = fmax(num, isnan(a) ? INFINITY : fabs(a - b)), den = fmax(den, fabs(b));
      }
    free(piece[p]);
  }
  snprintf(name, sizeof name, "xent vocab-parallel n=%d V=%d in %d: gradient vs xent", n, V,
           parts);
  check(name, num / den, 1e-6);
  free(z), free(g), free(tgt), free(mx), free(tl), free(se), free(pm), free(pt), free(ps);
  free(piece);
}

/* ------------------------------------------------------------------ AdamW */

static void test_adamw(int steps, float wd, float grad_scale) {
  char name[128];
  const long n = 41;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n), *p0 = fnew(n);
  fill(p, n, 0.1f); /* |p| <= 0.1: its fp32 ulp (<= 7.5e-9) stays far below the updates */
  memcpy(p0, p, sizeof(float) * n);
  double *pr = to_d(p, n), *mr = dnew(n), *vr = dnew(n);
  for (long t = 1; t <= steps; t++) {
    fill(g, n, 2);
    tsr_ops_adamw(p, m, v, g, n, lr, b1, b2, eps, wd, t, grad_scale, NULL, TSR_F32);
    /* torch.optim.AdamW, scalar, in double */
    for (long i = 0; i < n; i++) {
      double gi = (double)g[i] * grad_scale;
      pr[i] *= 1 - (double)lr * wd;
      mr[i] = b1 * mr[i] + (1 - (double)b1) * gi;
      vr[i] = b2 * vr[i] + (1 - (double)b2) * gi * gi;
      double bc1 = 1 - pow(b1, (double)t), bc2 = 1 - pow(b2, (double)t);
      pr[i] -= lr / bc1 * mr[i] / (sqrt(vr[i]) / sqrt(bc2) + eps);
    }
  }
  /* compare the parameter change (p itself would hide errors in the update) */
  double *dref = dnew(n);
  float *dp = fnew(n);
  for (long i = 0; i < n; i++) dref[i] = pr[i] - p0[i], dp[i] = p[i] - p0[i];
  double e = fmax(rel_err(dp, dref, n), fmax(rel_err(m, mr, n), rel_err(v, vr, n)));
  /* p - p0 carries a few fp32 roundings of p (<= 7.5e-9 each) against updates of ~lr =
   * 1e-2 (~1e-6 relative); m and v are fp32 recurrences (~1e-7): tolerance 1e-5 */
  snprintf(name, sizeof name, "adamw %d step(s) wd=%g grad_scale=%g (p-p0, m, v)", steps,
           (double)wd, (double)grad_scale);
  check(name, e, 1e-5);
  free(p), free(m), free(v), free(g), free(p0), free(pr), free(mr), free(vr), free(dref), free(dp);
}

/* AdamW with the compute copy refreshed in its pass (out, stored as out_dt): p, m, v
 * bitwise as without out, and out bitwise tsr_ops_cast of the new p, over several of the
 * op's blocks and a ragged tail. */
static void test_adamw_refresh(tsr_dtype out_dt) {
  char name[128];
  const long n = 3 * 512 + 77;
  const size_t es = tsr_dtype_size(out_dt);
  float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n);
  fill(p, n, 1), fill(m, n, 0.1f), fill(g, n, 2);
  for (long i = 0; i < n; i++) v[i] = 1e-3f * (float)urand();
  float *p2 = fdup(p, n), *m2 = fdup(m, n), *v2 = fdup(v, n);
  char *out = malloc(es * n), *want = malloc(es * n);
  memset(out, 0xff, es * n); /* poisoned (a NaN): every element must be written */
  tsr_ops_adamw(p, m, v, g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f, out, out_dt);
  tsr_ops_adamw(p2, m2, v2, g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f, NULL, out_dt);
  tsr_ops_cast(out_dt, want, TSR_F32, p2, n);
  long rounded = 0; /* elements the rounding changed: the check must see some */
  for (long i = 0; i < n; i++) rounded += tsr_load(out_dt, want, i) != p2[i];
  const int same = !memcmp(p, p2, sizeof(float) * n) && !memcmp(m, m2, sizeof(float) * n) &&
                   !memcmp(v, v2, sizeof(float) * n) && !memcmp(out, want, es * n);
  snprintf(name, sizeof name, "adamw with the %s refresh fused: p, m, v, out bitwise",
           tsr_dtype_name(out_dt));
  check(name, same && (out_dt == TSR_F32 || rounded > n / 2) ? 0.0 : 1.0, 0);
  free(p), free(m), free(v), free(g), free(out), free(p2), free(m2), free(v2), free(want);
}

/* ------------------------------------------------------ element-wise, reductions */

static void test_elementwise(void) {
  const long n = 100003;
  float *x = fnew(n), *y = fnew(n), *z = fnan(n), *xi = fnew(n);
  fill(x, n, 3), fill(y, n, 1);
  memcpy(xi, x, sizeof(float) * n);
  int bad = 0;
  tsr_ops_add(z, x, y, n);
  for (long i = 0; i < n; i++) bad += z[i] != x[i] + y[i];
  tsr_ops_acc(z, y, n);
  for (long i = 0; i < n; i++) bad += z[i] != (x[i] + y[i]) + y[i];
  tsr_ops_residual(TSR_F32, z, x, y, n);
  tsr_ops_residual(TSR_F32, xi, xi, y, n); /* in place */
  for (long i = 0; i < n; i++) bad += z[i] != x[i] + y[i] || xi[i] != z[i];
  check("add, acc, fp32 residual (in place too) exact", bad, 0);
  free(x), free(y), free(z), free(xi);
}

static void test_reductions(void) {
  const long n = 100003;
  float *x = fnew(n);
  fill(x, n, 3);
  const int64_t r[6] = {0, 77777, 80000, 80000, 90001, n}; /* an empty range in the middle */
  long double ref = 0;
  for (int k = 0; k < 3; k++)
    for (long i = r[2 * k]; i < r[2 * k + 1]; i++) ref += (long double)x[i] * x[i];
  double s = tsr_ops_sumsq_ranges(x, r, 3);
  check("sumsq_ranges 3 ranges vs long double", fabs(s - (double)ref) / (double)ref, 1e-12);
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  double s1 = tsr_ops_sumsq_ranges(x, r, 3);
  omp_set_num_threads(3);
  double s3 = tsr_ops_sumsq_ranges(x, r, 3);
  omp_set_num_threads(saved);
  check("sumsq_ranges bitwise 1/3 threads", s1 == s3 && s1 == s ? 0.0 : 1.0, 0);
  const int64_t r5[2] = {3, 8};
  long double r5ref = 0;
  for (int i = 3; i < 8; i++) r5ref += (long double)x[i] * x[i];
  check("sumsq_ranges n=5 (tiny) vs long double",
        fabs(tsr_ops_sumsq_ranges(x, r5, 1) - (double)r5ref), 1e-12);
  check("sumsq_ranges of no range is 0", tsr_ops_sumsq_ranges(x, r, 0), 0);
  free(x);
}

/* The order of ops/sumsq_order.h written out plainly, bottom-up: the squares' chunks, then
 * the chunks' sums chunked again until one value is left. */
static double lanes_ref(const double *v, long k) {
  double acc[TSR_SUMSQ_LANES];
  for (int t = 0; t < TSR_SUMSQ_LANES; t++) {
    acc[t] = 0;
    for (long j = t; j < k; j += TSR_SUMSQ_LANES) acc[t] += v[j];
  }
  for (int h = TSR_SUMSQ_LANES / 2; h >= 1; h /= 2)
    for (int t = 0; t < h; t++) acc[t] += acc[t + h];
  return acc[0];
}
static double sumsq_order_ref(const float *x, long n) {
  if (n == 0) return 0;
  double *v = malloc((size_t)n * sizeof(double));
  for (long i = 0; i < n; i++) v[i] = (double)x[i] * (double)x[i];
  long m = n;
  do {
    long next = 0;
    for (long i = 0; i < m; i += TSR_SUMSQ_CHUNK)
      v[next++] = lanes_ref(v + i, m - i < TSR_SUMSQ_CHUNK ? m - i : TSR_SUMSQ_CHUNK);
    m = next;
  } while (m > 1);
  const double s = v[0];
  free(v);
  return s;
}

/* sumsq_ranges in the one order of every backend: the CPU op and the host op bitwise the
 * plain reference, on odd sizes across the chunk and level boundaries and on several ranges
 * (tests/cuda/test_kernels.c holds the CUDA kernels to the same bits). */
static void test_sumsq_order(void) {
  const long C = TSR_SUMSQ_CHUNK;
  const long sizes[] = {1, 3, 255, 257, 8191, C, C + 1, 3 * C + 77, 1000003, C * C + 3 * C + 5};
  const long n = sizes[9];
  float *x = fnew(n);
  fill(x, n, 11);
  long bad = 0, host_bad = 0;
  for (int i = 0; i < 10; i++) {
    const int64_t r[2] = {7, 7 + sizes[i] - (i == 9 ? 7 : 0)};
    const double want = sumsq_order_ref(x + r[0], (long)(r[1] - r[0]));
    const double got = tsr_ops_sumsq_ranges(x, r, 1), host = tsr_ops_host_sumsq_ranges(x, r, 1);
    bad += memcmp(&got, &want, sizeof got) != 0;
    host_bad += memcmp(&host, &want, sizeof host) != 0;
  }
  const int64_t rs[8] = {5, 5 + 3 * C + 1, 400000, 400001, 500000, 500000, 600001, 1600000};
  double want = 0;
  for (int k = 0; k < 4; k++) want += sumsq_order_ref(x + rs[2 * k], (long)(rs[2 * k + 1] - rs[2 * k]));
  const double got = tsr_ops_sumsq_ranges(x, rs, 4), host = tsr_ops_host_sumsq_ranges(x, rs, 4);
  bad += memcmp(&got, &want, sizeof got) != 0;
  host_bad += memcmp(&host, &want, sizeof host) != 0;
  check("sumsq_ranges: the order of sumsq_order.h, bitwise (11 cases, 1 to 8192^2 + 3 x 8192 "
        "+ 5 elements, 4 ranges)", (double)bad, 0);
  check("tsr_ops_host_sumsq_ranges: the same bits", (double)host_bad, 0);
  free(x);
}

/* ================================================================ 16-bit storage */

static uint16_t to16(tsr_dtype dt, float v) {
  return dt == TSR_BF16 ? tsr_f32_to_bf16(v) : tsr_f32_to_f16(v);
}
static float from16(tsr_dtype dt, uint16_t h) {
  return dt == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
}

/* A tensor of dt values (h) and the same values widened (w). */
typedef struct {
  uint16_t *h;
  float *w;
} t16;
static t16 of16(tsr_dtype dt, const float *x, long n) {
  t16 t = {malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1)), fnew(n)};
  if (!t.h) abort();
  for (long i = 0; i < n; i++) t.h[i] = to16(dt, x[i]), t.w[i] = from16(dt, t.h[i]);
  return t;
}
static t16 r16(tsr_dtype dt, long n, float amp) {
  float *x = fnew(n);
  fill(x, n, amp);
  t16 t = of16(dt, x, n);
  free(x);
  return t;
}
static void free16(t16 *t) { free(t->h), free(t->w); }
static uint16_t *hnew(long n) { /* a written 16-bit output, poisoned with 0xFFFF (a NaN) */
  uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
  if (!p) abort();
  memset(p, 0xff, sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
  return p;
}
static uint16_t *hdup(const uint16_t *x, long n) {
  uint16_t *p = hnew(n);
  memcpy(p, x, sizeof(uint16_t) * (size_t)n);
  return p;
}
/* Elements of a (16-bit) that differ from the fp32 reference rounded once to dt. */
static double diff16(tsr_dtype dt, const uint16_t *a, const float *ref, long n) {
  long d = 0;
  for (long i = 0; i < n; i++) d += a[i] != to16(dt, ref[i]);
  return (double)d;
}
/* The spacing of dt's values at |x|. */
static double ulp16(tsr_dtype dt, double x) {
  const int mant = dt == TSR_BF16 ? 7 : 10, emin = dt == TSR_BF16 ? -126 : -14;
  const int e = x != 0 ? ilogb(x) : emin;
  return ldexp(1.0, (e < emin ? emin : e) - mant);
}
/* Columns [c0, c0 + w) of rows x stride: the largest |a - ref16| / max(1 ulp of dt at
 * ref16, tau max|ref16|), ref16 the fp32 reference rounded once; <= 1 passes (the file's
 * head says why tau).  A NaN (an element left unwritten) fails. */
static double close16(tsr_dtype dt, const uint16_t *a, const float *ref, long rows, long stride,
                      long c0, long w) {
  const double tau = dt == TSR_BF16 ? 0x1p-8 : 0x1p-11;
  double big = 0, worst = 0;
  for (long r = 0; r < rows; r++)
    for (long c = c0; c < c0 + w; c++)
      big = fmax(big, fabs(from16(dt, to16(dt, ref[r * stride + c]))));
  for (long r = 0; r < rows; r++)
    for (long c = c0; c < c0 + w; c++) {
      const double x = from16(dt, a[r * stride + c]), b = from16(dt, to16(dt, ref[r * stride + c]));
      if (isnan(x) || isnan(b)) return NAN;
      worst = fmax(worst, fabs(x - b) / fmax(ulp16(dt, b), tau * big));
    }
  return worst;
}
static double close16_flat(tsr_dtype dt, const uint16_t *a, const float *ref, long n) {
  return close16(dt, a, ref, 1, n, 0, n);
}

/* After tsr_ops_reserve for a bf16 run of the tiny model's shapes, its ops at those
 * shapes allocate nothing; the reserved bytes are printed (and kept under 1 MiB a thread,
 * the budget of the tiny model's 16-bit run).  Run first, while no 16-bit op has grown
 * the buffers. */
static void test16_reserve(void) {
  const tsr_dtype dt = TSR_BF16;
  const int B = 16, T = 128, n = B * T, C = 128, F = 384, V = 2048, H = 4, KV = 2, hd = 32;
  const tsr_ops_shapes s = {.dt = dt, .deterministic = 1, .rows = n, .cols = V,
                            .vocab_local = V, .attn_bht = (long)B * H * T,
                            .attn_io = (long)n * (H + KV) * hd, .attn_t = T, .attn_hd = hd};
  const size_t before = tsr_ops_mem_bytes();
  const int rc = tsr_ops_reserve(&s);
  const size_t reserved = tsr_ops_mem_bytes() - before;
  const int qkv_w = (H + 2 * KV) * hd;
  t16 x = r16(dt, (long)n * C, 1), w = r16(dt, (long)V * C, 0.1f), gu = r16(dt, (long)n * 2 * F, 1);
  t16 qkv = r16(dt, (long)n * qkv_w, 1), lg = r16(dt, (long)n * V, 2), wc = r16(dt, C, 1);
  uint16_t *y = hnew((long)n * V), *o = hnew((long)n * C), *a = hnew((long)n * H * hd);
  uint16_t *g = hnew((long)n * qkv_w), *sw = hnew((long)n * 2 * F);
  float *dw = fnew((long)V * C), *st = fnew((long)B * H * T), *rs = fnew(n);
  int32_t *tok = emb_tokens(n, V, 0, V);
  double acc = 0;
  const size_t warm = tsr_ops_mem_bytes();
  tsr_ops_matmul_fwd(dt, y, x.h, w.h, NULL, n, C, V);
  tsr_ops_matmul_bwd(dt, o, dw, NULL, lg.h, x.h, w.h, NULL, n, C, V);
  tsr_ops_matmul_bwd(dt, sw, dw, NULL, x.h, gu.h, w.h, gu.h, n, F, C);
  tsr_ops_rmsnorm_fwd(dt, o, rs, x.h, x.h, o, wc.h, n, C, 1e-5f);
  tsr_ops_rmsnorm_bwd(dt, o, dw, x.h, x.h, wc.h, rs, n, C, 1);
  tsr_ops_attention_fwd(dt, a, st, qkv.h, qkv.h + H * hd, qkv.h + (H + KV) * hd, B, T, H, KV, hd,
                        qkv_w, NULL);
  tsr_ops_attention_bwd(dt, g, g + H * hd, g + (H + KV) * hd, a, a, st, qkv.h, qkv.h + H * hd,
                        qkv.h + (H + KV) * hd, B, T, H, KV, hd, qkv_w, NULL);
  tsr_ops_rope_fwd(dt, qkv.h, n, T, H + KV, hd, qkv_w, tsr_rope_plain(1e4f), NULL);
  tsr_ops_swiglu_fwd(dt, sw, gu.h, n, F);
  tsr_ops_swiglu_bwd(dt, gu.h, sw, gu.h, n, F);
  tsr_ops_embedding_fwd(dt, o, tok, w.h, NULL, n, T, C, 0, V, NULL);
  tsr_ops_embedding_bwd(dt, dw, NULL, o, tok, n, T, C, 0, V, NULL);
  tsr_ops_residual(dt, o, o, x.h, (long)n * C);
  tsr_ops_xent(dt, &acc, 1.0, lg.h, tok, n, V, 0.1f, 1);
  const size_t grown = tsr_ops_mem_bytes() - warm;
  printf("      bf16 conversion buffers reserved for the tiny model, %d threads: %zu bytes\n",
         omp_get_max_threads(), reserved);
  check("tsr_ops_reserve (bf16, tiny model): then its ops allocate nothing (bytes)",
        rc == 0 ? (double)grown : -1.0, 0);
  check("tsr_ops_reserve (bf16, tiny model): under 1 MiB a thread",
        reserved > 0 && reserved <= ((size_t)1 << 20) * (size_t)omp_get_max_threads() ? 0.0 : 1.0,
        0);
  free16(&x), free16(&w), free16(&gu), free16(&qkv), free16(&lg), free16(&wc);
  free(y), free(o), free(a), free(g), free(sw), free(dw), free(st), free(rs), free(tok);
}

static void test16_matmul(tsr_dtype dt, int n, int in, int out, int threads_check) {
  char name[160], sh[64];
  snprintf(sh, sizeof sh, "%s matmul %dx%d->%d", tsr_dtype_name(dt), n, in, out);
  const long nx = (long)n * in, nw = (long)out * in, ny = (long)n * out;
  t16 x = r16(dt, nx, 1), w = r16(dt, nw, 1), b = r16(dt, out, 1), dy = r16(dt, ny, 1);
  t16 u = r16(dt, nx, 3);
  uint16_t *y = hnew(ny), *y0 = hnew(ny);
  float *yr = fnan(ny), *y0r = fnan(ny);
  tsr_ops_matmul_fwd(dt, y, x.h, w.h, b.h, n, in, out);
  tsr_ops_matmul_fwd(TSR_F32, yr, x.w, w.w, b.w, n, in, out);
  tsr_ops_matmul_fwd(dt, y0, x.h, w.h, NULL, n, in, out);
  tsr_ops_matmul_fwd(TSR_F32, y0r, x.w, w.w, NULL, n, in, out);
  snprintf(name, sizeof name, "%s fwd, bias and none, vs fp32 (ulps)", sh);
  check(name, fmax(close16_flat(dt, y, yr, ny), close16_flat(dt, y0, y0r, ny)), 1);

  float *dw0 = fnew(nw), *db0 = fnew(out);
  fill(dw0, nw, 1), fill(db0, out, 1);
  uint16_t *dx = hnew(nx), *dxg = hnew(nx);
  float *dxr = fnan(nx), *dxgr = fnan(nx), *dw = fdup(dw0, nw), *dwr = fdup(dw0, nw);
  float *db = fdup(db0, out), *dbr = fdup(db0, out);
  tsr_ops_matmul_bwd(dt, dx, dw, db, dy.h, x.h, w.h, NULL, n, in, out);
  tsr_ops_matmul_bwd(TSR_F32, dxr, dwr, dbr, dy.w, x.w, w.w, NULL, n, in, out);
  tsr_ops_matmul_bwd(dt, dxg, NULL, NULL, dy.h, x.h, w.h, u.h, n, in, out);
  tsr_ops_matmul_bwd(TSR_F32, dxgr, NULL, NULL, dy.w, x.w, w.w, u.w, n, in, out);
  snprintf(name, sizeof name, "%s dx written, and with GELU fused, vs fp32 (ulps)", sh);
  check(name, fmax(close16_flat(dt, dx, dxr, nx), close16_flat(dt, dxg, dxgr, nx)), 1);
  snprintf(name, sizeof name, "%s dw (fp32, accumulated) vs fp32", sh);
  check(name, rel_err_ff(dw, dwr, nw, 1), TOL_FWD);
  snprintf(name, sizeof name, "%s dbias (fp32, accumulated) bitwise", sh);
  check(name, same_bits(db, dbr, sizeof(float) * out), 0);

  if (threads_check) { /* the tiles depend on the shapes only */
    uint16_t *y3 = hnew(ny), *dx3 = hnew(nx), *y1 = hnew(ny), *dx1 = hnew(nx);
    float *dw3 = fdup(dw0, nw), *dw1 = fdup(dw0, nw);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    tsr_ops_matmul_fwd(dt, y1, x.h, w.h, b.h, n, in, out);
    tsr_ops_matmul_bwd(dt, dx1, dw1, NULL, dy.h, x.h, w.h, u.h, n, in, out);
    omp_set_num_threads(3);
    tsr_ops_matmul_fwd(dt, y3, x.h, w.h, b.h, n, in, out);
    tsr_ops_matmul_bwd(dt, dx3, dw3, NULL, dy.h, x.h, w.h, u.h, n, in, out);
    omp_set_num_threads(saved);
    snprintf(name, sizeof name, "%s y, dx, dw bitwise 1/3 threads", sh);
    check(name,
          same_bits(y1, y3, 2 * ny) + same_bits(y1, y, 2 * ny) + same_bits(dx1, dx3, 2 * nx) +
              same_bits(dx1, dxg, 2 * nx) + same_bits(dw1, dw3, sizeof(float) * nw),
          0);
    free(y3), free(dx3), free(y1), free(dx1), free(dw3), free(dw1);
  }
  free16(&x), free16(&w), free16(&b), free16(&dy), free16(&u), free(y), free(y0), free(yr);
  free(y0r), free(dw0), free(db0), free(dx), free(dxg), free(dxr), free(dxgr), free(dw);
  free(dwr), free(db), free(dbr);
}

static void test16_embedding_docs(tsr_dtype dt, int B, int T, int C, int vocab, int vs, int vl,
                                  const int32_t *doc) {
  char name[160];
  const int n = B * T;
  const long len = (long)n * C;
  int32_t *tok = emb_tokens(n, vocab, vs, vl);
  t16 wte = r16(dt, (long)vl * C, 1), wpe = r16(dt, (long)T * C, 1), dout = r16(dt, len, 1);
  uint16_t *out = hnew(len), *out0 = hnew(len);
  float *outr = fnan(len), *out0r = fnan(len);
  tsr_ops_embedding_fwd(dt, out, tok, wte.h, wpe.h, n, T, C, vs, vl, doc);
  tsr_ops_embedding_fwd(TSR_F32, outr, tok, wte.w, wpe.w, n, T, C, vs, vl, doc);
  tsr_ops_embedding_fwd(dt, out0, tok, wte.h, NULL, n, T, C, vs, vl, doc);
  tsr_ops_embedding_fwd(TSR_F32, out0r, tok, wte.w, NULL, n, T, C, vs, vl, doc);
  snprintf(name, sizeof name, "%s embedding n=%d C=%d%s fwd, with positions and not, bitwise",
           tsr_dtype_name(dt), n, C, doc ? " documents" : "");
  check(name, diff16(dt, out, outr, len) + diff16(dt, out0, out0r, len), 0);
  float *dwte = fnew((long)vl * C), *dwpe = fnew((long)T * C);
  fill(dwte, (long)vl * C, 1), fill(dwpe, (long)T * C, 1);
  float *dwter = fdup(dwte, (long)vl * C), *dwper = fdup(dwpe, (long)T * C);
  tsr_ops_embedding_bwd(dt, dwte, dwpe, dout.h, tok, n, T, C, vs, vl, doc);
  tsr_ops_embedding_bwd(TSR_F32, dwter, dwper, dout.w, tok, n, T, C, vs, vl, doc);
  snprintf(name, sizeof name, "%s embedding n=%d C=%d%s dwte, dwpe (fp32, accumulated) bitwise",
           tsr_dtype_name(dt), n, C, doc ? " documents" : "");
  check(name,
        same_bits(dwte, dwter, sizeof(float) * vl * C) +
            same_bits(dwpe, dwper, sizeof(float) * T * C),
        0);
  free(tok), free16(&wte), free16(&wpe), free16(&dout), free(out), free(out0), free(outr);
  free(out0r), free(dwte), free(dwpe), free(dwter), free(dwper);
}
static void test16_embedding(tsr_dtype dt, int B, int T, int C, int vocab, int vs, int vl) {
  test16_embedding_docs(dt, B, T, C, vocab, vs, vl, NULL);
}

static void test16_norm(tsr_dtype dt, int layer, int n, int C) {
  char name[160], sh[64];
  snprintf(sh, sizeof sh, "%s %s n=%d C=%d", tsr_dtype_name(dt), layer ? "layernorm" : "rmsnorm",
           n, C);
  const long len = (long)n * C;
  float *xf = fnew(len);
  fill(xf, len, 2);
  for (long i = 0; i < C; i++) xf[i] += 3.0f; /* one row with a large mean */
  t16 x = of16(dt, xf, len), y = r16(dt, len, 1), w = r16(dt, C, 1.5f), b = r16(dt, C, 1);
  t16 dout = r16(dt, len, 1), d0 = r16(dt, len, 1);
  /* plain */
  uint16_t *out = hnew(len);
  float *outr = fnan(len), *mean = fnan(n), *rstd = fnan(n), *meanr = fnan(n), *rstdr = fnan(n);
  norm_fwd(dt, layer, out, mean, rstd, NULL, x.h, NULL, w.h, b.h, n, C);
  norm_fwd(TSR_F32, layer, outr, meanr, rstdr, NULL, x.w, NULL, w.w, b.w, n, C);
  snprintf(name, sizeof name, "%s fwd: out, statistics bitwise", sh);
  check(name,
        diff16(dt, out, outr, len) + same_bits(rstd, rstdr, sizeof(float) * n) +
            (layer ? same_bits(mean, meanr, sizeof(float) * n) : 0),
        0);
  /* the residual add fused in: h = round(x + y), then the norm of h as stored */
  float *hsum = fnew(len);
  tsr_ops_add(hsum, x.w, y.w, len);
  t16 hs = of16(dt, hsum, len);
  uint16_t *h = hnew(len), *out2 = hnew(len), *out3 = hnew(len), *xi = hdup(x.h, len);
  norm_fwd(dt, layer, out2, mean, rstd, h, x.h, y.h, w.h, b.h, n, C);
  norm_fwd(TSR_F32, layer, outr, meanr, rstdr, NULL, hs.w, NULL, w.w, b.w, n, C);
  norm_fwd(dt, layer, out3, mean, rstd, xi, xi, y.h, w.h, b.h, n, C); /* h = x, in place */
  snprintf(name, sizeof name, "%s fused residual: h, out, stats bitwise, in place too", sh);
  check(name,
        same_bits(h, hs.h, 2 * len) + same_bits(xi, hs.h, 2 * len) + diff16(dt, out2, outr, len) +
            same_bits(out3, out2, 2 * len) + same_bits(rstd, rstdr, sizeof(float) * n) +
            (layer ? same_bits(mean, meanr, sizeof(float) * n) : 0),
        0);
  /* backward of the norm of h: acc = 0 writes dx, acc = 1 adds to it; dw, db accumulate */
  float *dw = fnew(C), *db = fnew(C);
  fill(dw, C, 1), fill(db, C, 1);
  float *dwr = fdup(dw, C), *dbr = fdup(db, C), *dxr = fnan(len), *dx1r = fdup(d0.w, len);
  uint16_t *dx = hnew(len), *dx1 = hdup(d0.h, len);
  norm_bwd(dt, layer, dx, dw, db, dout.h, hs.h, w.h, mean, rstd, n, C, 0);
  norm_bwd(TSR_F32, layer, dxr, dwr, dbr, dout.w, hs.w, w.w, mean, rstd, n, C, 0);
  norm_bwd(dt, layer, dx1, NULL, NULL, dout.h, hs.h, w.h, mean, rstd, n, C, 1);
  norm_bwd(TSR_F32, layer, dx1r, NULL, NULL, dout.w, hs.w, w.w, mean, rstd, n, C, 1);
  snprintf(name, sizeof name, "%s bwd acc=0 and 1: dx, dw, db bitwise", sh);
  check(name,
        diff16(dt, dx, dxr, len) + diff16(dt, dx1, dx1r, len) + same_bits(dw, dwr, 4l * C) +
            (layer ? same_bits(db, dbr, 4l * C) : 0),
        0);
  free(xf), free16(&x), free16(&y), free16(&w), free16(&b), free16(&dout), free16(&d0);
  free(out), free(outr), free(mean), free(rstd), free(meanr), free(rstdr), free(hsum);
  free16(&hs), free(h), free(out2), free(out3), free(xi), free(dw), free(db), free(dwr);
  free(dbr), free(dxr), free(dx1r), free(dx), free(dx1);
}

static void test16_rope_docs(tsr_dtype dt, int B, int T, int H, int hd, int pad, tsr_rope theta,
                             const int32_t *doc) {
  char name[160];
  const int n = B * T, stride = H * hd + pad;
  const long len = (long)n * stride;
  t16 x = r16(dt, len, 1);
  uint16_t *y = hdup(x.h, len);
  float *yr = fdup(x.w, len);
  tsr_ops_rope_fwd(dt, y, n, T, H, hd, stride, theta, doc);
  tsr_ops_rope_fwd(TSR_F32, yr, n, T, H, hd, stride, theta, doc);
  double e = diff16(dt, y, yr, len); /* the padding too: it stays as it was */
  tsr_ops_rope_bwd(dt, y, n, T, H, hd, stride, theta, doc);
  for (long i = 0; i < len; i++) yr[i] = from16(dt, y[i]);
  uint16_t *z = hdup(y, len);
  tsr_ops_rope_bwd(dt, z, n, T, H, hd, stride, theta, doc);
  tsr_ops_rope_bwd(TSR_F32, yr, n, T, H, hd, stride, theta, doc);
  e += diff16(dt, z, yr, len);
  snprintf(name, sizeof name, "%s rope n=%d H=%d hd=%d stride=%d%s fwd, bwd bitwise",
           tsr_dtype_name(dt), n, H, hd, stride, doc ? " documents" : "");
  check(name, e, 0);
  free16(&x), free(y), free(yr), free(z);
}
static void test16_rope(tsr_dtype dt, int B, int T, int H, int hd, int pad, tsr_rope theta) {
  test16_rope_docs(dt, B, T, H, hd, pad, theta, NULL);
}

static void test16_attention_docs(tsr_dtype dt, int B, int T, int H, int KV, int hd, int pad,
                                  int threads_check, const int32_t *doc) {
  char name[160], sh[96];
  snprintf(sh, sizeof sh, "%s attention B=%d T=%d H=%d KV=%d hd=%d%s", tsr_dtype_name(dt), B, T,
           H, KV, hd, doc ? " documents" : "");
  const int stride = (H + 2 * KV) * hd + pad, n = B * T;
  const long len = (long)n * stride, olen = (long)n * H * hd, nl = (long)B * H * T;
  t16 qkv = r16(dt, len, 1.5f), dout = r16(dt, olen, 1);
  const int ko = H * hd, vo = (H + KV) * hd;
  uint16_t *out = hnew(olen), *g = hnew(len);
  float *outr = fnan(olen), *lse = fnan(nl), *lser = fnan(nl), *gr = fnan(len);
  tsr_ops_attention_fwd(dt, out, lse, qkv.h, qkv.h + ko, qkv.h + vo, B, T, H, KV, hd, stride, doc);
  tsr_ops_attention_fwd(TSR_F32, outr, lser, qkv.w, qkv.w + ko, qkv.w + vo, B, T, H, KV, hd,
                        stride, doc);
  snprintf(name, sizeof name, "%s fwd out vs fp32 (ulps)", sh);
  check(name, close16_flat(dt, out, outr, olen), 1);
  snprintf(name, sizeof name, "%s fwd lse (fp32) vs fp32", sh);
  check(name, rel_err_ff(lse, lser, nl, 1), TOL_FWD);
  /* the backward of this forward: out as stored, widened, for the reference */
  float *ow = fnew(olen);
  for (long i = 0; i < olen; i++) ow[i] = from16(dt, out[i]);
  tsr_ops_attention_bwd(dt, g, g + ko, g + vo, dout.h, out, lse, qkv.h, qkv.h + ko, qkv.h + vo, B,
                        T, H, KV, hd, stride, doc);
  tsr_ops_attention_bwd(TSR_F32, gr, gr + ko, gr + vo, dout.w, ow, lse, qkv.w, qkv.w + ko,
                        qkv.w + vo, B, T, H, KV, hd, stride, doc);
  const char *part[3] = {"dq", "dk", "dv"};
  const int c0[3] = {0, ko, vo}, w[3] = {H * hd, KV * hd, KV * hd};
  for (int p = 0; p < 3; p++) {
    snprintf(name, sizeof name, "%s %s written, vs fp32 (ulps)", sh, part[p]);
    check(name, close16(dt, g, gr, n, stride, c0[p], w[p]), 1);
  }
  long pad_touched = 0;
  for (long r = 0; r < n; r++)
    for (int c = (H + 2 * KV) * hd; c < stride; c++) pad_touched += g[r * stride + c] != 0xffff;
  if (pad) {
    snprintf(name, sizeof name, "%s bwd leaves stride padding alone", sh);
    check(name, (double)pad_touched, 0);
  }
  if (threads_check) {
    uint16_t *o1 = hnew(olen), *o3 = hnew(olen), *g1 = hnew(len), *g3 = hnew(len);
    float *l1 = fnan(nl), *l3 = fnan(nl);
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
      omp_set_num_threads(k ? 3 : 1);
      uint16_t *o = k ? o3 : o1, *gg = k ? g3 : g1;
      float *l = k ? l3 : l1;
      tsr_ops_attention_fwd(dt, o, l, qkv.h, qkv.h + ko, qkv.h + vo, B, T, H, KV, hd, stride, doc);
      tsr_ops_attention_bwd(dt, gg, gg + ko, gg + vo, dout.h, o, l, qkv.h, qkv.h + ko,
                            qkv.h + vo, B, T, H, KV, hd, stride, doc);
    }
    omp_set_num_threads(saved);
    snprintf(name, sizeof name, "%s bitwise 1/3 threads", sh);
    check(name,
          same_bits(o1, o3, 2 * olen) + same_bits(o1, out, 2 * olen) + same_bits(l1, l3, 4 * nl) +
              same_bits(g1, g3, 2 * len) + same_bits(g1, g, 2 * len),
          0);
    free(o1), free(o3), free(g1), free(g3), free(l1), free(l3);
  }
  free16(&qkv), free16(&dout), free(out), free(g), free(outr), free(lse), free(lser), free(gr);
  free(ow);
}
static void test16_attention(tsr_dtype dt, int B, int T, int H, int KV, int hd, int pad,
                             int threads_check) {
  test16_attention_docs(dt, B, T, H, KV, hd, pad, threads_check, NULL);
}

static void test16_activations(tsr_dtype dt, int n, int F, long n_gelu) {
  char name[160];
  const long in_len = (long)n * 2 * F, out_len = (long)n * F;
  t16 gu = r16(dt, in_len, 4), d = r16(dt, out_len, 1), x = r16(dt, n_gelu, 5);
  uint16_t *out = hnew(out_len), *dgu = hnew(in_len), *gel = hnew(n_gelu);
  float *outr = fnan(out_len), *dgur = fnan(in_len), *gelr = fnan(n_gelu);
  tsr_ops_swiglu_fwd(dt, out, gu.h, n, F);
  tsr_ops_swiglu_fwd(TSR_F32, outr, gu.w, n, F);
  tsr_ops_swiglu_bwd(dt, dgu, d.h, gu.h, n, F);
  tsr_ops_swiglu_bwd(TSR_F32, dgur, d.w, gu.w, n, F);
  snprintf(name, sizeof name, "%s swiglu n=%d F=%d fwd, bwd (written) bitwise",
           tsr_dtype_name(dt), n, F);
  check(name, diff16(dt, out, outr, out_len) + diff16(dt, dgu, dgur, in_len), 0);
  tsr_ops_gelu_fwd(dt, gel, x.h, n_gelu);
  tsr_ops_gelu_fwd(TSR_F32, gelr, x.w, n_gelu);
  snprintf(name, sizeof name, "%s gelu n=%ld fwd bitwise", tsr_dtype_name(dt), n_gelu);
  check(name, diff16(dt, gel, gelr, n_gelu), 0);
  free16(&gu), free16(&d), free16(&x), free(out), free(dgu), free(gel), free(outr), free(dgur);
  free(gelr);
}

/* out = round(x + y) (one rounding of the fp32 sum), out of place and in place; amp
 * scales x and y (tiny: sums among dt's subnormals). */
static void test16_residual(tsr_dtype dt, long n, float amp) {
  char name[160];
  t16 x = r16(dt, n, 3 * amp), y = r16(dt, n, 0.5f * amp);
  uint16_t *out = hnew(n), *xi = hdup(x.h, n), *y0 = hdup(y.h, n);
  float *sum = fnan(n);
  tsr_ops_residual(dt, out, x.h, y.h, n);
  tsr_ops_residual(dt, xi, xi, y.h, n);
  tsr_ops_add(sum, x.w, y.w, n);
  snprintf(name, sizeof name, "%s residual n=%ld |x| < %g: round(x + y) bitwise, in place too",
           tsr_dtype_name(dt), n, 3.0 * amp);
  check(name, diff16(dt, out, sum, n) + diff16(dt, xi, sum, n) + same_bits(y.h, y0, 2 * n), 0);
  free16(&x), free16(&y), free(out), free(xi), free(y0), free(sum);
}

static void test16_xent(tsr_dtype dt, int n, int V) {
  char name[160], sh[64];
  snprintf(sh, sizeof sh, "%s xent n=%d V=%d", tsr_dtype_name(dt), n, V);
  const long len = (long)n * V;
  float *zf = fnew(len);
  fill(zf, len, 3);
  for (int j = 0; j < V; j++) zf[j] += 80.0f;
  t16 z = of16(dt, zf, len);
  int32_t *tgt = malloc(sizeof(int32_t) * n);
  for (int r = 0; r < n; r++) tgt[r] = irand(0, V);
  if (n > 2) tgt[2] = -1;
  const float dloss = 0.37f;
  double a = 0.25, ar = 0.25, b = 0.25, br = 0.25;
  uint16_t *g = hdup(z.h, len);
  float *gr = fdup(z.w, len);
  tsr_ops_xent(dt, &a, 3.0, z.h, tgt, n, V, dloss, 0);
  tsr_ops_xent(TSR_F32, &ar, 3.0, z.w, tgt, n, V, dloss, 0);
  tsr_ops_xent(dt, &b, 3.0, g, tgt, n, V, dloss, 1);
  tsr_ops_xent(TSR_F32, &br, 3.0, gr, tgt, n, V, dloss, 1);
  long untouched = 0;
  for (long i = 0; i < len; i++) untouched += z.h[i] == to16(dt, zf[i]);
  snprintf(name, sizeof name, "%s loss (double) and gradient bitwise", sh);
  check(name, same_bits(&a, &ar, 8) + same_bits(&b, &br, 8) + diff16(dt, g, gr, len), 0);
  snprintf(name, sizeof name, "%s without grad the logits are untouched", sh);
  check(name, (double)(len - untouched), 0);
  /* the vocab-parallel passes on this rank's slice [0, V) (targets from the whole
   * vocabulary [0, 2V): half of them held elsewhere) */
  for (int r = 0; r < n; r++) tgt[r] = irand(0, 2 * V);
  double *m = dnew(n), *mr = dnew(n), *t = dnew(n), *tr = dnew(n), *s = dnew(n), *sr = dnew(n);
  tsr_ops_xent_local_stats(dt, m, t, z.h, tgt, n, V, 0);
  tsr_ops_xent_local_stats(TSR_F32, mr, tr, z.w, tgt, n, V, 0);
  tsr_ops_xent_local_sumexp(dt, s, z.h, mr, n, V);
  tsr_ops_xent_local_sumexp(TSR_F32, sr, z.w, mr, n, V);
  memcpy(g, z.h, 2 * len), memcpy(gr, z.w, 4 * len);
  tsr_ops_xent_grad(dt, g, tgt, mr, sr, n, V, 0, dloss);
  tsr_ops_xent_grad(TSR_F32, gr, tgt, mr, sr, n, V, 0, dloss);
  snprintf(name, sizeof name, "%s vocab-parallel stats, sumexp, gradient bitwise", sh);
  check(name,
        same_bits(m, mr, 8l * n) + same_bits(t, tr, 8l * n) + same_bits(s, sr, 8l * n) +
            diff16(dt, g, gr, len),
        0);
  free(zf), free16(&z), free(tgt), free(g), free(gr), free(m), free(mr), free(t), free(tr);
  free(s), free(sr);
}

/* ------------------------------------------------------------------ casts */

/* Known roundings through tsr_ops_cast (F32 -> dt, then widened by dt -> F32): NaN must
 * stay NaN, signs must match (-0 stays -0). */
static void check_rounding(const char *name, tsr_dtype dt, const float *in, const float *want,
                           int n) {
  uint16_t h[32];
  float out[32];
  if (n > 32) n = 32;
  tsr_ops_cast(dt, h, TSR_F32, in, n);
  tsr_ops_cast(TSR_F32, out, dt, h, n);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int ok = isnan(want[i]) ? isnan(out[i])
                            : out[i] == want[i] && signbit(out[i]) == signbit(want[i]);
    if (!ok) {
      printf("      %a -> %a, want %a\n", (double)in[i], (double)out[i], (double)want[i]);
      bad++;
    }
  }
  check(name, bad, 0);
}

static void test_cast_known(void) {
  const float bin[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.14159f, -2.5f, 1.0f + 0x1p-7f,
                       INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 0x1p-133f, 0x1p-134f,
                       3 * 0x1p-134f, 0x1.fffffep+127f};
  const float bwant[] = {1.0f, 1.0f, 1.0f + 0x1p-6f, 3.140625f, -2.5f, 1.0f + 0x1p-7f,
                         INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 0x1p-133f, 0.0f, 0x1p-132f,
                         INFINITY};
  check_rounding("cast F32->BF16 known values (ties to even, subnormals, inf, NaN)", TSR_BF16,
                 bin, bwant, (int)(sizeof bin / sizeof bin[0]));
  const float hin[] = {1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 3.14159f, 65504.0f, 65519.0f,
                       65520.0f, -1e6f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, 0x1p-26f,
                       -5 * 0x1p-25f, INFINITY, NAN, -0.0f, 0x1p-140f};
  const float hwant[] = {1.0f, 1.0f, 1.0f + 0x1p-9f, 3.140625f, 65504.0f, 65504.0f, INFINITY,
                         -INFINITY, 0x1p-14f, 0x1p-24f, 0.0f, 0x1p-23f, 0.0f, -0x1p-23f,
                         INFINITY, NAN, -0.0f, 0.0f};
  check_rounding("cast F32->F16 known values (ties to even, 65504/inf, subnormals, NaN)",
                 TSR_F16, hin, hwant, (int)(sizeof hin / sizeof hin[0]));
}

/* The casts against dtype.h's scalar conversions, bitwise (NaN payloads included): every
 * 16-bit pattern widened and converted to the other 16-bit type; every 997th fp32 pattern
 * (all exponents, subnormals, inf, NaN; 4.3 million values) rounded to each. */
static void test_cast_sweeps(void) {
  const long n16 = 65536;
  uint16_t *h = malloc(2 * n16), *h2 = malloc(2 * n16);
  float *f = malloc(4 * n16);
  for (int s = 0; s < 2; s++) {
    const tsr_dtype dt = s ? TSR_F16 : TSR_BF16, other = s ? TSR_BF16 : TSR_F16;
    for (long i = 0; i < n16; i++) h[i] = (uint16_t)i;
    tsr_ops_cast(TSR_F32, f, dt, h, n16);
    tsr_ops_cast(other, h2, dt, h, n16);
    long bad = 0;
    for (long i = 0; i < n16; i++) {
      const float x = s ? tsr_f16_to_f32(h[i]) : tsr_bf16_to_f32(h[i]);
      const uint16_t y = s ? tsr_f32_to_bf16(x) : tsr_f32_to_f16(x);
      bad += memcmp(&f[i], &x, 4) != 0 || h2[i] != y;
    }
    char name[128];
    snprintf(name, sizeof name, "cast %s->F32 and ->%s, all 65536 patterns, as dtype.h",
             s ? "F16" : "BF16", s ? "BF16" : "F16");
    check(name, (double)bad, 0);
  }
  const long nf = (long)(0x100000000ull / 997) + 1;
  uint32_t *u = malloc(4 * nf);
  uint16_t *r = malloc(2 * nf);
  for (long i = 0; i < nf; i++) u[i] = (uint32_t)((uint64_t)i * 997);
  for (int s = 0; s < 2; s++) {
    tsr_ops_cast(s ? TSR_F16 : TSR_BF16, r, TSR_F32, u, nf);
    long bad = 0;
    for (long i = 0; i < nf; i++) {
      float x;
      memcpy(&x, &u[i], 4);
      bad += r[i] != (s ? tsr_f32_to_f16(x) : tsr_f32_to_bf16(x));
    }
    char name[128];
    snprintf(name, sizeof name, "cast F32->%s, every 997th fp32 pattern, as dtype.h",
             s ? "F16" : "BF16");
    check(name, (double)bad, 0);
  }
  /* same types: a copy (in place: nothing) */
  float *g = fnew(1000), *g2 = fnan(1000);
  fill(g, 1000, 1);
  tsr_ops_cast(TSR_F32, g2, TSR_F32, g, 1000);
  memcpy(h2, h, 2000);
  tsr_ops_cast(TSR_BF16, h2, TSR_BF16, h2, 1000);
  check("cast to the same type: copy, in place untouched",
        same_bits(g, g2, 4000) + same_bits(h, h2, 2000), 0);
  free(h), free(h2), free(f), free(u), free(r), free(g), free(g2);
}

#ifdef __FLT16_MAX__
/* dtype.h's fp32 -> fp16 against the compiler's own float -> _Float16 conversion, over
 * every 997th float of both signs (all exponents; 4.3 million values). */
static void test_f16_vs_compiler(void) {
  long diff = 0, tried = 0;
  for (uint64_t b = 0; b < 0x100000000ull; b += 997) {
    uint32_t u = (uint32_t)b;
    float x;
    memcpy(&x, &u, 4);
    if (isnan(x)) continue;
    const _Float16 c = (_Float16)x;
    uint16_t cb;
    memcpy(&cb, &c, 2);
    diff += tsr_f32_to_f16(x) != cb;
    tried++;
  }
  if (diff) printf("      %ld of %ld differ from (_Float16)x\n", diff, tried);
  check("tsr_f32_to_f16 bitwise as the compiler's _Float16 conversion", (double)diff, 0);
}
#endif

/* ------------------------------------------------------------------ driver */

static void run16(void) {
  test16_reserve();
  for (int s = 0; s < 2; s++) {
    const tsr_dtype dt = s ? TSR_F16 : TSR_BF16;
    test16_matmul(dt, 1, 7, 5, 0);
    test16_matmul(dt, 5, 7, 6, 0);
    test16_matmul(dt, 37, 300, 270, 0); /* K in three chunks, N over two tiles, ragged */
    test16_matmul(dt, 300, 130, 19, 0); /* dw's K (the rows) in three chunks */
    test16_matmul(dt, 600, 200, 300, 1);
    test16_embedding(dt, 2, 5, 6, 14, 3, 7);
    test16_embedding(dt, 2, 4, 70, 9, 0, 9);
    test16_embedding(dt, 1, 1, 3, 4, 0, 4);
    for (int layer = 0; layer < 2; layer++) {
      test16_norm(dt, layer, 1, 3);
      test16_norm(dt, layer, 6, 19);
      test16_norm(dt, layer, 300, 128); /* blocks of 16 rows, the last one short */
      test16_norm(dt, layer, 3, 3000);  /* rows wider than a block */
    }
    test16_rope(dt, 2, 5, 3, 8, 5, tsr_rope_plain(100.0f));
    test16_rope(dt, 1, 1, 2, 6, 0, tsr_rope_plain(10000.0f));
    test16_rope(dt, 4, 37, 6, 32, 64, tsr_rope_plain(10000.0f));
    test16_rope(dt, 2, 37, 2, 8, 3, llama3_rope);
    test16_attention(dt, 2, 5, 2, 2, 8, 3, 0);
    test16_attention(dt, 1, 1, 2, 1, 4, 0, 0);
    test16_attention(dt, 2, 67, 4, 1, 8, 2, 0);
    test16_attention(dt, 1, 300, 4, 2, 16, 0, 1); /* T past one key chunk */
    { /* document masking */
      int32_t *d1 = make_docs(2, 5, 3), *d2 = make_docs(4, 37, 9), *d3 = make_docs(1, 300, 90);
      test16_embedding_docs(dt, 2, 5, 6, 14, 3, 7, d1);
      test16_rope_docs(dt, 4, 37, 6, 32, 64, tsr_rope_plain(10000.0f), d2);
      test16_rope_docs(dt, 4, 37, 6, 32, 64, llama3_rope, d2);
      test16_attention_docs(dt, 2, 5, 2, 2, 8, 3, 0, d1);
      test16_attention_docs(dt, 1, 300, 4, 2, 16, 0, 1, d3);
      free(d1), free(d2), free(d3);
    }
    test16_activations(dt, 4, 9, 3 * 4096 + 5);
    test16_activations(dt, 1, 1000, 1);
    test16_residual(dt, 3 * 4096 + 33, 1);
    test16_residual(dt, 3 * 4096 + 33, dt == TSR_BF16 ? 1e-38f : 1e-5f); /* subnormals */
    test16_residual(dt, 1, 1);
    test16_xent(dt, 6, 11);
    test16_xent(dt, 70, 3000);
    test16_xent(dt, 1, 5);
    test_adamw_refresh(dt);
  }
  test_cast_known();
  test_cast_sweeps();
}

int main(int argc, char **argv) {
  uint64_t seed;
  if (argc > 1)
    seed = strtoull(argv[1], NULL, 10);
  else
    seed = tsr_mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock());
  rng_state = seed;
  printf("test_ops: seed %llu (rerun: test_ops %llu), %d OpenMP threads\n",
         (unsigned long long)seed, (unsigned long long)seed, omp_get_max_threads());
  double t0 = tsr_now();

  /* The 16-bit checks once more on the portable conversions, in a child process forked
   * before any conversion has picked the instructions (the choice is made once). */
  int portable_status = -1;
  if (!getenv("TSR_CPU_CONVERT")) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("TSR_CPU_CONVERT", "portable", 1);
      printf("---- 16-bit checks with the portable conversions (TSR_CPU_CONVERT=portable)\n");
      tsr_cpu_open(0);
      run16();
      printf("---- portable conversions: %d checks, %d failed\n", n_checks, n_failed);
      fflush(stdout);
      _exit(n_failed ? 1 : 0);
    }
    if (pid < 0 || waitpid(pid, &portable_status, 0) != pid) portable_status = -1;
    printf("---- the same with the conversions this CPU has, and fp32\n");
  }
  rng_state = seed;
  tsr_cpu_open(0);

  test_matmul(5, 7, 6);
  test_matmul(9, 70, 67); /* dbias over two column blocks */
  test_matmul(1, 3, 2);
  test_matmul_gelu(4, 13, 5);
  test_embedding(2, 5, 6, 14, 3, 7);
  test_embedding(2, 4, 70, 9, 0, 9); /* single rank, two column blocks */
  test_norm(0, 6, 19);
  test_norm(0, 5, 70);
  test_norm(1, 6, 19);
  test_norm(1, 5, 70);
  test_rope_hand();
  test_rope(2, 5, 3, 8, 5, tsr_rope_plain(100.0f));
  test_rope(1, 7, 2, 6, 0, tsr_rope_plain(10000.0f));
  test_rope(2, 37, 3, 8, 5, llama3_rope); /* every band: kept, interpolated, scaled */
  test_attention(2, 5, 2, 2, 8, 3, 0);  /* H = KV, padded stride */
  test_attention(1, 13, 4, 2, 6, 0, 0); /* GQA 4:2 */
  test_attention(2, 9, 4, 1, 4, 2, 0);  /* MQA 4:1 */
  test_attention(1, 37, 2, 1, 4, 1, 0); /* T > one key block of the backward */
  test_attention(2, 67, 4, 2, 16, 0, 96);
  test_attention_threads(2, 67, 4, 2, 16);
  test_attention_threads(1, 45, 4, 1, 8);
  /* T beyond one key chunk of the forward's online softmax (and odd sizes) */
  test_attention(1, 300, 4, 2, 16, 0, 300);
  test_attention(2, 260, 2, 1, 8, 3, 200);
  test_attention_threads(1, 300, 4, 2, 16);
  test_attention_threads(2, 257, 6, 3, 64);
  { /* document masking (ops_list.h "Documents"): positions restart, attention stays inside */
    int32_t *d1 = make_docs(2, 5, 3), *d2 = make_docs(1, 13, 4), *d3 = make_docs(2, 67, 20);
    int32_t *d4 = make_docs(1, 300, 90), *d5 = make_docs(2, 260, 60), *d6 = make_docs(2, 4, 2);
    test_embedding_docs(2, 5, 6, 14, 3, 7, d1);
    test_embedding_docs(2, 4, 70, 9, 0, 9, d6); /* two column blocks */
    test_rope_docs(2, 5, 3, 8, 5, tsr_rope_plain(100.0f), d1);
    test_rope_docs(2, 5, 3, 8, 5, llama3_rope, d1);
    test_rope_docs(1, 13, 2, 6, 0, tsr_rope_plain(10000.0f), d2);
    test_attention_docs(2, 5, 2, 2, 8, 3, 0, d1);
    test_attention_docs(1, 13, 4, 2, 6, 0, 0, d2);
    test_attention_docs(2, 67, 4, 2, 16, 0, 96, d3);
    /* documents starting past the first key chunk: the chunks before them are skipped */
    test_attention_docs(1, 300, 4, 2, 16, 0, 300, d4);
    test_attention_docs(2, 260, 2, 1, 8, 3, 200, d5);
    test_attention_threads_docs(2, 67, 4, 2, 16, d3);
    test_attention_threads_docs(1, 300, 4, 2, 16, d4);
    free(d1), free(d2), free(d3), free(d4), free(d5), free(d6);
  }
  test_swiglu(4, 9);
  test_gelu(53);
  test_xent(6, 11, 1);
  test_xent(200, 50, 0);
  test_xent(70, 3000, 0); /* a vocabulary wider than one vector block */
  test_xent_parallel(9, 70, 2);
  test_xent_parallel(40, 3001, 3);
  test_adamw(1, 0.0f, 1.0f);
  test_adamw(3, 0.0f, 1.0f);
  test_adamw(1, 0.1f, 0.5f);
  test_adamw(3, 0.1f, 0.5f);
  test_adamw_refresh(TSR_F32);
  test_elementwise();
  test_reductions();
  test_sumsq_order();
  run16();
#ifdef __FLT16_MAX__
  test_f16_vs_compiler();
#else
  printf("      (no _Float16 in this compiler: the sweep against it is not run)\n");
#endif
  if (!getenv("TSR_CPU_CONVERT"))
    check("the 16-bit checks with the portable conversions (child process) pass",
          portable_status == 0 ? 0.0 : 1.0, 0);

  printf("test_ops: %d checks, %d failed, %.2f s (seed %llu)\n", n_checks, n_failed,
         tsr_now() - t0, (unsigned long long)seed);
  return n_failed ? 1 : 0;
}
