/* test_ops.c — every CPU op against an independent double-precision reference.
 *
 * For each op the test writes a small, naive forward in double (explicit causal mask,
 * textbook formulas) and checks:
 *   forward:  fp32 op vs the double reference,
 *   backward: the analytic fp32 gradient of L = sum(out * r) (r random) for every input
 *             and parameter vs central finite differences of the DOUBLE reference,
 *             and that the backward accumulates (two calls = twice the gradient) where it
 *             does: weight gradients and the norms' and attention's input gradients; the
 *             GEMMs' dx and the activations' backward write theirs (checked on NaN).
 * Errors are max|a - ref| / max|ref| over a tensor.  Tolerances:
 *   forward 1e-5 — fp32 sums of at most a few hundred O(1) terms err by ~1e-7 relative;
 *   gradient 1e-4 — the FD of the double reference is accurate to ~1e-9 (eps = 1e-5,
 *   truncation O(eps^2), rounding 1e-16/eps), so the error is the fp32 analytic gradient
 *   itself (~1e-6); 1e-4 still catches any wrong term, sign, index or missing factor.
 * Data are random with a fresh seed each run (printed); rerun with `test_ops SEED`.
 * Exit 0 = all checks pass, 1 = some failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"
#include "util.h"

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
  printf("%s  %-58s max rel err %.3e  (tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, tol);
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
/* two fp32 tensors; ref = 2*b when twice != 0 (accumulation check) */
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
} mm_ctx;
static void mm_ref(const void *vc, double *y) {
  const mm_ctx *c = vc;
  for (int r = 0; r < c->n; r++)
    for (int o = 0; o < c->out; o++) {
      double s = c->b ? c->b[o] : 0;
      for (int i = 0; i < c->in; i++) s += c->x[r * c->in + i] * c->w[o * c->in + i];
      y[r * c->out + o] = s;
    }
}

static void test_matmul(int n, int in, int out) {
  char name[128];
  float *x = fnew((long)n * in), *w = fnew((long)out * in), *b = fnew(out), *y = fnew((long)n * out);
  fill(x, (long)n * in, 1), fill(w, (long)out * in, 1), fill(b, out, 1);
  mm_ctx c = {n, in, out, to_d(x, (long)n * in), to_d(w, (long)out * in), to_d(b, out)};
  double *yref = dnew((long)n * out);

  tsr_ops_matmul_fwd(y, x, w, b, n, in, out);
  mm_ref(&c, yref);
  snprintf(name, sizeof name, "matmul %dx%d->%d fwd (bias)", n, in, out);
  check(name, rel_err(y, yref, (long)n * out), TOL_FWD);
  double *bsave = c.b;
  c.b = NULL;
  tsr_ops_matmul_fwd(y, x, w, NULL, n, in, out);
  mm_ref(&c, yref);
  c.b = bsave;
  snprintf(name, sizeof name, "matmul %dx%d->%d fwd (no bias)", n, in, out);
  check(name, rel_err(y, yref, (long)n * out), TOL_FWD);

  float *r = fnew((long)n * out);
  fill(r, (long)n * out, 1);
  double *rd = to_d(r, (long)n * out);
  float *dx = fnew((long)n * in), *dw = fnew((long)out * in), *db = fnew(out);
  tsr_ops_matmul_bwd(dx, dw, db, r, x, w, n, in, out);
  objective o = {mm_ref, &c, (long)n * out, rd, yref};
  snprintf(name, sizeof name, "matmul %dx%d->%d dx vs FD", n, in, out);
  check(name, fd_err(&o, c.x, (long)n * in, dx), TOL_GRAD);
  snprintf(name, sizeof name, "matmul %dx%d->%d dw vs FD", n, in, out);
  check(name, fd_err(&o, c.w, (long)out * in, dw), TOL_GRAD);
  snprintf(name, sizeof name, "matmul %dx%d->%d dbias vs FD", n, in, out);
  check(name, fd_err(&o, c.b, out, db), TOL_GRAD);

  /* dx is written (it starts NaN here), dw and dbias accumulate */
  float *dx2 = fnew((long)n * in), *dw2 = fnew((long)out * in), *db2 = fnew(out);
  for (long i = 0; i < (long)n * in; i++) dx2[i] = NAN;
  tsr_ops_matmul_bwd(dx2, dw2, db2, r, x, w, n, in, out);
  tsr_ops_matmul_bwd(dx2, NULL, NULL, r, x, w, n, in, out); /* NULLs: skipped */
  tsr_ops_matmul_bwd(NULL, dw2, db2, r, x, w, n, in, out);
  double e = rel_err_ff(dx2, dx, (long)n * in, 1);
  double e2 = rel_err_ff(dw2, dw, (long)out * in, 2), e3 = rel_err_ff(db2, db, out, 2);
  snprintf(name, sizeof name, "matmul %dx%d->%d bwd writes dx, accumulates dw, db (NULLs)", n, in,
           out);
  check(name, fmax(e, fmax(e2, e3)), TOL_ACC);

  free(x), free(w), free(b), free(y), free(c.x), free(c.w), free(c.b), free(yref), free(r);
  free(rd), free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

/* --------------------------------------------------------------- embedding */

typedef struct {
  int n, T, C, vs, vl;
  const int32_t *tok;
  double *wte, *wpe;
} emb_ctx;
static void emb_ref(const void *vc, double *out) {
  const emb_ctx *c = vc;
  for (int r = 0; r < c->n; r++)
    for (int k = 0; k < c->C; k++) {
      int t = c->tok[r];
      double v = (t >= c->vs && t < c->vs + c->vl) ? c->wte[(t - c->vs) * c->C + k] : 0.0;
      out[r * c->C + k] = v + (c->wpe ? c->wpe[(r % c->T) * c->C + k] : 0.0);
    }
}

static void test_embedding(int B, int T, int C, int vocab, int vs, int vl) {
  char name[128];
  int n = B * T;
  int32_t *tok = malloc(sizeof(int32_t) * n);
  for (int r = 0; r < n; r++) tok[r] = irand(0, vocab);
  tok[0] = vs - 1 >= 0 ? vs - 1 : vocab - 1; /* out of range below (or above) */
  tok[1] = vs + vl < vocab ? vs + vl : 0;     /* out of range above (or below) */
  tok[2] = tok[3] = vs;                       /* a repeated in-range token */
  float *wte = fnew((long)vl * C), *wpe = fnew((long)T * C), *out = fnew((long)n * C);
  fill(wte, (long)vl * C, 1), fill(wpe, (long)T * C, 1);
  emb_ctx c = {n, T, C, vs, vl, tok, to_d(wte, (long)vl * C), to_d(wpe, (long)T * C)};
  double *ref = dnew((long)n * C);

  tsr_ops_embedding_fwd(out, tok, wte, wpe, n, T, C, vs, vl);
  emb_ref(&c, ref);
  snprintf(name, sizeof name, "embedding n=%d C=%d vocab[%d,%d) fwd", n, C, vs, vs + vl);
  check(name, rel_err(out, ref, (long)n * C), TOL_FWD);
  double *wpe_save = c.wpe;
  c.wpe = NULL;
  tsr_ops_embedding_fwd(out, tok, wte, NULL, n, T, C, vs, vl);
  emb_ref(&c, ref);
  c.wpe = wpe_save;
  snprintf(name, sizeof name, "embedding n=%d C=%d fwd without positions", n, C);
  check(name, rel_err(out, ref, (long)n * C), TOL_FWD);

  float *r = fnew((long)n * C);
  fill(r, (long)n * C, 1);
  double *rd = to_d(r, (long)n * C);
  float *dwte = fnew((long)vl * C), *dwpe = fnew((long)T * C);
  tsr_ops_embedding_bwd(dwte, dwpe, r, tok, n, T, C, vs, vl);
  objective o = {emb_ref, &c, (long)n * C, rd, ref};
  snprintf(name, sizeof name, "embedding n=%d C=%d dwte vs FD", n, C);
  check(name, fd_err(&o, c.wte, (long)vl * C, dwte), TOL_GRAD);
  snprintf(name, sizeof name, "embedding n=%d C=%d dwpe vs FD", n, C);
  check(name, fd_err(&o, c.wpe, (long)T * C, dwpe), TOL_GRAD);

  float *dwte2 = fnew((long)vl * C), *dwpe2 = fnew((long)T * C);
  tsr_ops_embedding_bwd(dwte2, dwpe2, r, tok, n, T, C, vs, vl);
  tsr_ops_embedding_bwd(dwte2, dwpe2, r, tok, n, T, C, vs, vl);
  double e = fmax(rel_err_ff(dwte2, dwte, (long)vl * C, 2), rel_err_ff(dwpe2, dwpe, (long)T * C, 2));
  snprintf(name, sizeof name, "embedding n=%d C=%d bwd accumulates", n, C);
  check(name, e, TOL_ACC);

  free(tok), free(wte), free(wpe), free(out), free(c.wte), free(c.wpe), free(ref), free(r);
  free(rd), free(dwte), free(dwpe), free(dwte2), free(dwpe2);
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

static void test_norm(int layer, int n, int C) {
  char name[128];
  const char *nm = layer ? "layernorm" : "rmsnorm";
  const float eps = 1e-5f;
  float *x = fnew((long)n * C), *w = fnew(C), *b = fnew(C), *out = fnew((long)n * C);
  float *mean = fnew(n), *rstd = fnew(n);
  fill(x, (long)n * C, 2), fill(w, C, 1.5), fill(b, C, 1);
  for (long i = 0; i < C; i++) x[i] += 3.0f; /* one row with a large mean */
  norm_ctx c = {n, C, layer, eps, to_d(x, (long)n * C), to_d(w, C), to_d(b, C)};
  double *ref = dnew((long)n * C);
  if (layer)
    tsr_ops_layernorm_fwd(out, mean, rstd, x, w, b, n, C, eps);
  else
    tsr_ops_rmsnorm_fwd(out, rstd, x, w, n, C, eps);
  norm_ref(&c, ref);
  snprintf(name, sizeof name, "%s n=%d C=%d fwd", nm, n, C);
  check(name, rel_err(out, ref, (long)n * C), TOL_FWD);

  float *r = fnew((long)n * C);
  fill(r, (long)n * C, 1);
  double *rd = to_d(r, (long)n * C);
  float *dx[2], *dw[2], *db[2];
  for (int k = 0; k < 2; k++) {
    dx[k] = fnew((long)n * C), dw[k] = fnew(C), db[k] = fnew(C);
    for (int rep = 0; rep <= k; rep++) {
      if (layer)
        tsr_ops_layernorm_bwd(dx[k], dw[k], db[k], r, x, w, mean, rstd, n, C);
      else
        tsr_ops_rmsnorm_bwd(dx[k], dw[k], r, x, w, rstd, n, C);
    }
  }
  objective o = {norm_ref, &c, (long)n * C, rd, ref};
  snprintf(name, sizeof name, "%s n=%d C=%d dx vs FD", nm, n, C);
  check(name, fd_err(&o, c.x, (long)n * C, dx[0]), TOL_GRAD);
  snprintf(name, sizeof name, "%s n=%d C=%d dw vs FD", nm, n, C);
  check(name, fd_err(&o, c.w, C, dw[0]), TOL_GRAD);
  double e = fmax(rel_err_ff(dx[1], dx[0], (long)n * C, 2), rel_err_ff(dw[1], dw[0], C, 2));
  if (layer) {
    snprintf(name, sizeof name, "%s n=%d C=%d db vs FD", nm, n, C);
    check(name, fd_err(&o, c.b, C, db[0]), TOL_GRAD);
    e = fmax(e, rel_err_ff(db[1], db[0], C, 2));
  }
  snprintf(name, sizeof name, "%s n=%d C=%d bwd accumulates", nm, n, C);
  check(name, e, TOL_ACC);

  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(c.x), free(c.w), free(c.b);
  free(ref), free(r), free(rd);
  for (int k = 0; k < 2; k++) free(dx[k]), free(dw[k]), free(db[k]);
}

/* -------------------------------------------------------------------- RoPE */

typedef struct {
  int n, T, H, hd, stride;
  double theta;
  double *x;
} rope_ctx;
static void rope_ref(const void *vc, double *out) {
  const rope_ctx *c = vc;
  memcpy(out, c->x, sizeof(double) * c->n * c->stride);
  for (int r = 0; r < c->n; r++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < c->hd / 2; i++) {
        double ang = (r % c->T) * pow(c->theta, -2.0 * i / c->hd);
        long ia = (long)r * c->stride + h * c->hd + i, ib = ia + c->hd / 2;
        out[ia] = c->x[ia] * cos(ang) - c->x[ib] * sin(ang);
        out[ib] = c->x[ia] * sin(ang) + c->x[ib] * cos(ang);
      }
}

static void test_rope_hand(void) {
  /* hd = 4, theta = 1e4, pos 2: pair (x0, x2) turns by 2 rad, (x1, x3) by 2*1e4^-0.5 =
   * 0.02 rad.  x = (1, 2, 3, 4); values from cos/sin by hand (10 digits). */
  float x[3 * 4];
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 4; i++) x[r * 4 + i] = (float)(i + 1);
  tsr_ops_rope_fwd(x, 3, 3, 1, 4, 4, 10000.0f);
  const double want[4] = {-3.1440391170, 1.9196053466, -0.3391430828, 4.0391973601};
  const double pos0[4] = {1, 2, 3, 4};
  double e = fmax(rel_err(x + 8, want, 4), rel_err(x, pos0, 4));
  check("rope hand case (hd=4, pos 0 and 2, theta=1e4)", e, 1e-6);
}

static void test_rope(int B, int T, int H, int hd, int pad, float theta) {
  char name[128];
  int n = B * T, stride = H * hd + pad;
  long len = (long)n * stride;
  float *x = fnew(len);
  fill(x, len, 1);
  rope_ctx c = {n, T, H, hd, stride, theta, to_d(x, len)};
  double *ref = dnew(len);
  float *y = fdup(x, len);
  tsr_ops_rope_fwd(y, n, T, H, hd, stride, theta);
  rope_ref(&c, ref);
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d stride=%d theta=%g fwd", n, H, hd, stride,
           (double)theta);
  check(name, rel_err(y, ref, len), TOL_FWD);
  /* bwd is the inverse rotation applied in place: the analytic gradient of
   * sum(rope(x) * r) is rope_bwd(r); the pad columns of r must pass through. */
  float *r = fnew(len);
  fill(r, len, 1);
  double *rd = to_d(r, len);
  float *g = fdup(r, len);
  tsr_ops_rope_bwd(g, n, T, H, hd, stride, theta);
  objective o = {rope_ref, &c, len, rd, ref};
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d dx vs FD", n, H, hd);
  check(name, fd_err(&o, c.x, len, g), TOL_GRAD);
  tsr_ops_rope_bwd(y, n, T, H, hd, stride, theta);
  snprintf(name, sizeof name, "rope n=%d H=%d hd=%d bwd(fwd(x)) == x", n, H, hd);
  check(name, rel_err(y, c.x, len), 1e-6);
  free(x), free(c.x), free(ref), free(y), free(r), free(rd), free(g);
}

/* --------------------------------------------------------------- attention */

typedef struct {
  int B, T, H, KV, hd, stride;
  double *qkv;
  double *lse; /* optional output */
} attn_ctx;
/* Naive O(T^2) attention with an explicit causal mask on the full score matrix. */
static void attn_ref(const void *vc, double *out) {
  const attn_ctx *c = vc;
  const int T = c->T, hd = c->hd;
  double *s = dnew(T);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++) {
      int g = h / (c->H / c->KV);
      for (int t = 0; t < T; t++) {
        const double *q = c->qkv + ((long)b * T + t) * c->stride + h * hd;
        double m = -INFINITY, l = 0;
        for (int j = 0; j < T; j++) {
          const double *k = c->qkv + ((long)b * T + j) * c->stride + (c->H + g) * hd;
          double d = 0;
          for (int i = 0; i < hd; i++) d += q[i] * k[i];
          s[j] = j <= t ? d / sqrt((double)hd) : -INFINITY;
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
static void test_attention(int B, int T, int H, int KV, int hd, int pad, int n_fd_samples) {
  char name[160], shape[96];
  snprintf(shape, sizeof shape, "B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
  const int stride = (H + 2 * KV) * hd + pad, n = B * T;
  const long len = (long)n * stride, olen = (long)n * H * hd;
  float *qkv = fnew(len), *out = fnew(olen), *lse = fnew((long)B * H * T);
  fill(qkv, len, 1.5f);
  const float *q = qkv, *k = qkv + H * hd, *v = qkv + (H + KV) * hd;
  attn_ctx c = {B, T, H, KV, hd, stride, to_d(qkv, len), dnew((long)B * H * T)};
  double *ref = dnew(olen);
  tsr_ops_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, stride);
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
  float *g1 = fnew(len), *g2 = fnew(len);
  float *dq = g1, *dk = g1 + H * hd, *dv = g1 + (H + KV) * hd;
  tsr_ops_attention_bwd(dq, dk, dv, r, out, lse, q, k, v, B, T, H, KV, hd, stride);
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
  double pad_max = 0;
  for (long rr = 0; rr < n; rr++)
    for (int cc = (H + 2 * KV) * hd; cc < stride; cc++) pad_max = fmax(pad_max, fabs(g1[rr * stride + cc]));
  if (pad) {
    snprintf(name, sizeof name, "attention %s bwd leaves stride padding alone", shape);
    check(name, pad_max, 0);
  }
  for (int rep = 0; rep < 2; rep++)
    tsr_ops_attention_bwd(g2, g2 + H * hd, g2 + (H + KV) * hd, r, out, lse, q, k, v, B, T, H, KV,
                          hd, stride);
  snprintf(name, sizeof name, "attention %s bwd accumulates", shape);
  check(name, rel_err_ff(g2, g1, len, 2), TOL_ACC);

  free(qkv), free(out), free(lse), free(c.qkv), free(ref), free(r), free(rd), free(g1), free(g2);
  free(num);
}

/* Forward and backward must be bitwise identical for 1, 2 and 3 threads. */
static void test_attention_threads(int B, int T, int H, int KV, int hd) {
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
    tsr_ops_attention_fwd(out[k], lse[k], qkv, qkv + H * hd, qkv + (H + KV) * hd, B, T, H, KV, hd,
                          stride);
    tsr_ops_attention_bwd(g[k], g[k] + H * hd, g[k] + (H + KV) * hd, r, out[k], lse[k], qkv,
                          qkv + H * hd, qkv + (H + KV) * hd, B, T, H, KV, hd, stride);
  }
  omp_set_num_threads(saved);
  int same = 1;
  for (int k = 1; k < 3; k++)
    same &= !memcmp(out[0], out[k], sizeof(float) * olen) &&
            !memcmp(lse[0], lse[k], sizeof(float) * B * H * T) &&
            !memcmp(g[0], g[k], sizeof(float) * len);
  snprintf(name, sizeof name, "attention B=%d T=%d H=%d KV=%d hd=%d bitwise 1/2/3 threads", B, T,
           H, KV, hd);
  check(name, same ? 0.0 : 1.0, 0);
  for (int k = 0; k < 3; k++) free(out[k]), free(lse[k]), free(g[k]);
  free(qkv), free(r);
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
static void gelu_ref(const void *vc, double *out) {
  const act_ctx *c = vc;
  for (int i = 0; i < c->n; i++) {
    double x = c->x[i];
    out[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
}

static void test_swiglu(int n, int F) {
  char name[128];
  long in_len = (long)n * 2 * F, out_len = (long)n * F;
  float *x = fnew(in_len), *out = fnew(out_len), *r = fnew(out_len);
  fill(x, in_len, 4), fill(r, out_len, 1);
  act_ctx c = {n, F, to_d(x, in_len)};
  double *ref = dnew(out_len), *rd = to_d(r, out_len);
  tsr_ops_swiglu_fwd(out, x, n, F);
  swiglu_ref(&c, ref);
  snprintf(name, sizeof name, "swiglu n=%d F=%d fwd", n, F);
  check(name, rel_err(out, ref, out_len), TOL_FWD);
  float *g1 = fnew(in_len), *g2 = fnew(in_len);
  for (long i = 0; i < in_len; i++) g2[i] = NAN; /* written, not accumulated */
  tsr_ops_swiglu_bwd(g1, r, x, n, F);
  tsr_ops_swiglu_bwd(g2, r, x, n, F);
  tsr_ops_swiglu_bwd(g2, r, x, n, F);
  objective o = {swiglu_ref, &c, out_len, rd, ref};
  snprintf(name, sizeof name, "swiglu n=%d F=%d dgate_up vs FD", n, F);
  check(name, fd_err(&o, c.x, in_len, g1), TOL_GRAD);
  snprintf(name, sizeof name, "swiglu n=%d F=%d bwd writes (twice on NaN: bitwise once)", n, F);
  check(name, memcmp(g1, g2, sizeof(float) * in_len) ? 1.0 : 0.0, 0);
  free(x), free(out), free(r), free(c.x), free(ref), free(rd), free(g1), free(g2);
}

static void test_gelu(int n) {
  char name[128];
  float *x = fnew(n), *out = fnew(n), *r = fnew(n);
  fill(x, n, 5), fill(r, n, 1);
  act_ctx c = {n, 0, to_d(x, n)};
  double *ref = dnew(n), *rd = to_d(r, n);
  tsr_ops_gelu_fwd(out, x, n);
  gelu_ref(&c, ref);
  snprintf(name, sizeof name, "gelu n=%d fwd", n);
  check(name, rel_err(out, ref, n), TOL_FWD);
  float *g1 = fnew(n), *g2 = fnew(n);
  for (int i = 0; i < n; i++) g2[i] = NAN; /* written, not accumulated */
  tsr_ops_gelu_bwd(g1, r, x, n);
  tsr_ops_gelu_bwd(g2, r, x, n);
  tsr_ops_gelu_bwd(g2, r, x, n);
  objective o = {gelu_ref, &c, n, rd, ref};
  snprintf(name, sizeof name, "gelu n=%d dx vs FD", n);
  check(name, fd_err(&o, c.x, n, g1), TOL_GRAD);
  snprintf(name, sizeof name, "gelu n=%d bwd writes (twice on NaN: bitwise once)", n);
  check(name, memcmp(g1, g2, sizeof(float) * n) ? 1.0 : 0.0, 0);
  free(x), free(out), free(r), free(c.x), free(ref), free(rd), free(g1), free(g2);
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
  double l_eval = tsr_ops_xent_fwd(z, tgt, n, V);
  float *g = fdup(z, len);
  double l = tsr_ops_xent_fwd_bwd(g, tgt, n, V, dloss);
  int untouched = 1;
  for (long i = 0; i < len; i++) untouched &= z[i] == (float)c.z[i];
  snprintf(name, sizeof name, "xent n=%d V=%d loss vs double log-softmax", n, V);
  check(name, fabs(l - ref) / fabs(ref), 1e-6);
  snprintf(name, sizeof name, "xent n=%d V=%d fwd == fwd_bwd loss, logits untouched", n, V);
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
  double l1 = tsr_ops_xent_fwd(z, tgt, n, V);
  omp_set_num_threads(3);
  double l3 = tsr_ops_xent_fwd(z, tgt, n, V);
  omp_set_num_threads(saved);
  snprintf(name, sizeof name, "xent n=%d V=%d loss bitwise 1/3 threads", n, V);
  check(name, l1 == l3 && l1 == l_eval ? 0.0 : 1.0, 0);
  /* the _acc forms add sum / div to an accumulator, bitwise as the caller would */
  double acc = 0.375, want = 0.375 + l_eval / (double)n + l / (double)n;
  tsr_ops_xent_fwd_acc(&acc, (double)n, z, tgt, n, V);
  float *g2 = malloc(len * sizeof(float));
  memcpy(g2, z, len * sizeof(float));
  tsr_ops_xent_fwd_bwd_acc(&acc, (double)n, g2, tgt, n, V, dloss);
  snprintf(name, sizeof name, "xent n=%d V=%d _acc forms: acc + sum / n, same gradient", n, V);
  check(name, acc == want && !memcmp(g2, g, len * sizeof(float)) ? 0.0 : 1.0, 0);
  free(g2);
  free(z), free(tgt), free(c.z), free(g);
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
    tsr_ops_adamw(p, m, v, g, n, lr, b1, b2, eps, wd, t, grad_scale, NULL, TSR_PREC_FP32);
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

/* AdamW with the compute copy refreshed in its pass (out): p, m, v bitwise as without
 * out, and out bitwise the rounding (or copy) of the new p, over several of the op's
 * blocks and a ragged tail. */
static void test_adamw_refresh(tsr_prec prec, const char *what) {
  char name[128];
  const long n = 3 * 512 + 77;
  float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n), *out = fnew(n);
  fill(p, n, 1), fill(m, n, 0.1f), fill(g, n, 2);
  for (long i = 0; i < n; i++) v[i] = 1e-3f * (float)urand();
  float *p2 = fdup(p, n), *m2 = fdup(m, n), *v2 = fdup(v, n), *want = fnew(n);
  for (long i = 0; i < n; i++) out[i] = NAN; /* poisoned: every element must be written */
  tsr_ops_adamw(p, m, v, g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f, out, prec);
  tsr_ops_adamw(p2, m2, v2, g, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 0.5f, NULL, prec);
  if (prec == TSR_PREC_BF16)
    tsr_ops_round_bf16(want, p2, n);
  else if (prec == TSR_PREC_FP16)
    tsr_ops_round_fp16(want, p2, n);
  else
    memcpy(want, p2, sizeof(float) * n);
  long rounded = 0; /* elements the rounding changed: the check must see some */
  for (long i = 0; i < n; i++) rounded += want[i] != p2[i];
  const int same = !memcmp(p, p2, sizeof(float) * n) && !memcmp(m, m2, sizeof(float) * n) &&
                   !memcmp(v, v2, sizeof(float) * n) && !memcmp(out, want, sizeof(float) * n);
  snprintf(name, sizeof name, "adamw with the %s refresh fused: p, m, v, out bitwise", what);
  check(name, same && (prec == TSR_PREC_FP32 || rounded > n / 2) ? 0.0 : 1.0, 0);
  free(p), free(m), free(v), free(g), free(out), free(p2), free(m2), free(v2), free(want);
}

/* The fused residual add against its three-op composition (round y, add, round), bitwise,
 * out of place (out poisoned) and in place (out == x), y untouched; over several blocks. */
static void test_residual(tsr_prec prec, const char *what) {
  char name[128];
  const long n = 3 * 4096 + 33;
  float *x = fnew(n), *y = fnew(n), *out = fnew(n), *want = fnew(n);
  fill(x, n, 3), fill(y, n, 0.5f);
  float *y0 = fdup(y, n), *yr = fdup(y, n), *xi = fdup(x, n);
  void (*rnd)(float *, const float *, long) =
      prec == TSR_PREC_BF16 ? tsr_ops_round_bf16 : prec == TSR_PREC_FP16 ? tsr_ops_round_fp16 : NULL;
  if (rnd) rnd(yr, yr, n);
  tsr_ops_add(want, x, yr, n);
  if (rnd) rnd(want, want, n);
  for (long i = 0; i < n; i++) out[i] = NAN;
  tsr_ops_residual(out, x, y, n, prec);
  tsr_ops_residual(xi, xi, y, n, prec); /* in place */
  long rounded = 0;
  for (long i = 0; i < n; i++) rounded += want[i] != x[i] + y[i];
  const int same = !memcmp(out, want, sizeof(float) * n) && !memcmp(xi, want, sizeof(float) * n) &&
                   !memcmp(y, y0, sizeof(float) * n);
  snprintf(name, sizeof name, "residual %s: round(x + round(y)) bitwise, in place too", what);
  check(name, same && (!rnd || rounded > n / 2) ? 0.0 : 1.0, 0);
  free(x), free(y), free(out), free(want), free(y0), free(yr), free(xi);
}

/* ------------------------------------------------------ casts, reductions */

/* A rounding op against known results, out of place and in place (NaN must stay NaN;
 * signs must match, so -0 stays -0). */
static void check_rounding(const char *name, void (*op)(float *, const float *, long),
                           const float *in, const float *want, int n) {
  float out[32], inplace[32];
  if (n > 32) n = 32;
  memcpy(inplace, in, (size_t)n * sizeof *in);
  op(out, in, n);
  op(inplace, inplace, n);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int ok = isnan(want[i]) ? isnan(out[i]) && isnan(inplace[i])
                            : out[i] == want[i] && inplace[i] == want[i] &&
                                  signbit(out[i]) == signbit(want[i]);
    if (!ok) {
      printf("      %.9g -> %.9g (in place %.9g), want %.9g\n", (double)in[i], (double)out[i],
             (double)inplace[i], (double)want[i]);
      bad++;
    }
  }
  check(name, bad, 0);
}

static void test_bf16(void) {
  const float in[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.14159f, -2.5f, 1.0f + 0x1p-7f,
                      INFINITY, -INFINITY, NAN, 0.0f};
  const float want[] = {1.0f, 1.0f, 1.0f + 0x1p-6f, 3.140625f, -2.5f, 1.0f + 0x1p-7f,
                        INFINITY, -INFINITY, NAN, 0.0f};
  check_rounding("round_bf16 known values (ties to even, 3.14159, inf, NaN, in place)",
                 tsr_ops_round_bf16, in, want, (int)(sizeof in / sizeof in[0]));
}

static void test_fp16(void) {
  const float in[] = {1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 3.14159f, 65504.0f, 65519.0f,
                      65520.0f, -1e6f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, 0x1p-26f,
                      -5 * 0x1p-25f, INFINITY, NAN, -0.0f};
  const float want[] = {1.0f, 1.0f, 1.0f + 0x1p-9f, 3.140625f, 65504.0f, 65504.0f, INFINITY,
                        -INFINITY, 0x1p-14f, 0x1p-24f, 0.0f, 0x1p-23f, 0.0f, -0x1p-23f,
                        INFINITY, NAN, -0.0f};
  check_rounding("round_fp16 known values (ties to even, 65504/inf, subnormals, NaN, in place)",
                 tsr_ops_round_fp16, in, want, (int)(sizeof in / sizeof in[0]));
#ifdef __FLT16_MAX__
  /* against the compiler's own float -> _Float16 conversion, over every 997th float of
   * both signs (all exponents; 4.3 million values) */
  long diff = 0, tried = 0;
  for (uint64_t b = 0; b < 0x100000000ull; b += 997) {
    uint32_t u = (uint32_t)b;
    float x;
    memcpy(&x, &u, 4);
    if (isnan(x)) continue;
    float r = tsr_round_fp16(x), c = (float)(_Float16)x;
    diff += memcmp(&r, &c, 4) != 0;
    tried++;
  }
  if (diff) printf("      %ld of %ld differ from (float)(_Float16)x\n", diff, tried);
  check("round_fp16 bitwise as the compiler's _Float16 conversion", (double)diff, 0);
#else
  printf("      (no _Float16 in this compiler: the sweep against it is not run)\n");
#endif
}

static void test_reductions(void) {
  const long n = 100003;
  float *x = fnew(n), *y = fnew(n), *z = fnew(n);
  fill(x, n, 3), fill(y, n, 1);
  long double ref = 0;
  for (long i = 0; i < n; i++) ref += (long double)x[i] * x[i];
  double s = tsr_ops_sumsq(x, n);
  check("sumsq n=100003 vs long double", fabs(s - (double)ref) / (double)ref, 1e-12);
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  double s1 = tsr_ops_sumsq(x, n);
  omp_set_num_threads(3);
  double s3 = tsr_ops_sumsq(x, n);
  omp_set_num_threads(saved);
  check("sumsq bitwise 1/3 threads", s1 == s3 && s1 == s ? 0.0 : 1.0, 0);
  check("sumsq n=5 (tiny) vs long double",
        fabs(tsr_ops_sumsq(x, 5) - (double)((long double)x[0] * x[0] + (long double)x[1] * x[1] +
                                            (long double)x[2] * x[2] + (long double)x[3] * x[3] +
                                            (long double)x[4] * x[4])),
        1e-12);

  int bad = !tsr_ops_all_finite(x, n);
  float keep = x[77777];
  x[77777] = NAN;
  bad += tsr_ops_all_finite(x, n);
  x[77777] = keep;
  x[n - 1] = INFINITY;
  bad += tsr_ops_all_finite(x, n);
  x[n - 1] = 1.0f;
  x[0] = -INFINITY;
  bad += tsr_ops_all_finite(x, n);
  x[0] = 1.0f;
  bad += !tsr_ops_all_finite(x, n) + !tsr_ops_all_finite(x, 0);
  check("all_finite (finite, NaN, +inf, -inf, empty)", bad, 0);

  bad = 0;
  tsr_ops_add(z, x, y, n);
  for (long i = 0; i < n; i++) bad += z[i] != x[i] + y[i];
  tsr_ops_acc(z, y, n);
  for (long i = 0; i < n; i++) bad += z[i] != (x[i] + y[i]) + y[i];
  tsr_ops_scale(z, 0.5f, n);
  for (long i = 0; i < n; i++) bad += z[i] != ((x[i] + y[i]) + y[i]) * 0.5f;
  check("add, acc, scale exact", bad, 0);
  free(x), free(y), free(z);
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
  tsr_ops_init(0);
  double t0 = tsr_now();

  test_matmul(5, 7, 6);
  test_matmul(9, 70, 67); /* dbias over two column blocks */
  test_embedding(2, 5, 6, 14, 3, 7);
  test_embedding(2, 4, 70, 9, 0, 9); /* single rank, two column blocks */
  test_norm(0, 6, 19);
  test_norm(0, 5, 70);
  test_norm(1, 6, 19);
  test_norm(1, 5, 70);
  test_rope_hand();
  test_rope(2, 5, 3, 8, 5, 100.0f);
  test_rope(1, 7, 2, 6, 0, 10000.0f);
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
  test_swiglu(4, 9);
  test_gelu(53);
  test_xent(6, 11, 1);
  test_xent(200, 50, 0);
  test_xent(70, 3000, 0); /* a vocabulary wider than one vector block */
  test_adamw(1, 0.0f, 1.0f);
  test_adamw(3, 0.0f, 1.0f);
  test_adamw(1, 0.1f, 0.5f);
  test_adamw(3, 0.1f, 0.5f);
  test_adamw_refresh(TSR_PREC_FP32, "fp32");
  test_residual(TSR_PREC_FP32, "fp32");
  test_residual(TSR_PREC_BF16, "bf16");
  test_residual(TSR_PREC_FP16, "fp16");
  test_adamw_refresh(TSR_PREC_BF16, "bf16");
  test_adamw_refresh(TSR_PREC_FP16, "fp16");
  test_bf16();
  test_fp16();
  test_reductions();

  printf("test_ops: %d checks, %d failed, %.2f s (seed %llu)\n", n_checks, n_failed,
         tsr_now() - t0, (unsigned long long)seed);
  return n_failed ? 1 : 0;
}
