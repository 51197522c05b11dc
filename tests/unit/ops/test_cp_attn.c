/* test_cp_attn.c — the attention block ops (attention_block_fwd, attention_block_bwd,
 * attention_merge) and their composition into a causal attention over a sequence cut into
 * chunks (src/model/cp_attn.h, docs/context_parallel.md), against a whole-sequence
 * attention in double precision.
 *
 *  - The ring's schedule on one process: sequences cut into 2 cp chunks (cp = 2 and 4),
 *    cp rank r holding chunks r and 2 cp - 1 - r, every (query chunk, visible key chunk)
 *    pair run as a block and merged with the log-sum-exp, fully masked blocks skipped.
 *    Forward out and lse, and the backward's dq, dk, dv (summed over the blocks) against
 *    the double reference: 1e-5 (forward) and 1e-4 (gradients) of the tensor's largest
 *    value, as test_ops.  GQA with one KV head, two, and none shared; q, k, v in one fused
 *    buffer (their own strides).  fp32 and bf16 storage: the bf16 inputs are rounded
 *    first and the reference sees the rounded values; the block ops compute in fp32 and
 *    keep fp32 results, so the tolerances are the same.  The backward's out is the
 *    forward's result stored as dt, and the reference's D is formed from that same out.
 *  - Uneven cuts: queries and keys cut at unrelated places (blocks of every kind, rows
 *    that see no key of a block), every pair run, the masked ones too, and merged.
 *    A second backward adds as much again (dq alone: dk, dv NULL are not computed).
 *  - One block is the attention: q0 = k0, Tq = Tk = T gives attention_fwd's out and lse
 *    and attention_bwd's dq, dk, dv (added to zeros) bitwise (fp32).
 *  - A fully masked block: out 0 and lse -inf, merging it changes no bit, its backward
 *    adds nothing; causal 0 on a block left of the queries is bitwise the causal block.
 *
 * Data are random with a fresh seed each run (printed); rerun with `test_cp_attn SEED`.
 * Exit 0 = all checks pass, 1 = some failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "cpu/ops_cpu.h"
#include "model/cp_attn.h"
#include "ops/ops.h"

#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4

static int n_checks = 0, n_failed = 0;

static void check(const char *name, int ok, const char *fmt, double v) {
  n_checks++;
  if (!ok) n_failed++;
  printf("%s: %s (", ok ? "PASS" : "FAIL", name);
  printf(fmt, v);
  printf(")\n");
  fflush(stdout);
}

static uint64_t rng_state;
static double urand(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) / (double)(1ULL << 52) - 1.0;
}

static void *xalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) abort();
  return p;
}

/* max |a - ref| / max |ref| */
static double rel_err(const float *a, const double *ref, long n) {
  double e = 0, m = 0;
  for (long i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - ref[i]);
    e = d > e || d != d ? d : e;
    m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
  }
  return e / (m > 0 ? m : 1);
}

static int bitwise(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* ---------------------------------------------------------------- the reference
 * Whole sequences (B of T tokens, natural order) in double: q [B T, H hd], k and v
 * [B T, KV hd], dout [B T, H hd]; the query at t sees the keys at j <= t. */
typedef struct {
  int B, T, H, KV, hd;
  const double *q, *k, *v;
} ref_attn;

static double ref_score(const ref_attn *a, int b, int h, int t, int j) {
  const int g = h / (a->H / a->KV), hd = a->hd;
  const double *q = a->q + ((long)b * a->T + t) * a->H * hd + h * hd;
  const double *k = a->k + ((long)b * a->T + j) * a->KV * hd + g * hd;
  double d = 0;
  for (int i = 0; i < hd; i++) d += q[i] * k[i];
  return d / sqrt((double)hd);
}

/* out [B T, H hd], lse [(b H + h) T + t] */
static void ref_fwd(const ref_attn *a, double *out, double *lse) {
  const int T = a->T, H = a->H, KV = a->KV, hd = a->hd;
  double *s = xalloc(sizeof(double) * T);
  for (int b = 0; b < a->B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        const int g = h / (H / KV);
        double m = -INFINITY, l = 0;
        for (int j = 0; j <= t; j++) s[j] = ref_score(a, b, h, t, j), m = s[j] > m ? s[j] : m;
        for (int j = 0; j <= t; j++) l += exp(s[j] - m);
        double *o = out + ((long)b * T + t) * H * hd + h * hd;
        for (int i = 0; i < hd; i++) {
          double acc = 0;
          for (int j = 0; j <= t; j++)
            acc += exp(s[j] - m) / l * a->v[((long)b * T + j) * KV * hd + g * hd + i];
          o[i] = acc;
        }
        lse[((long)b * H + h) * T + t] = m + log(l);
      }
  free(s);
}

/* dq, dk, dv (written) of L = sum(out * dout), with P from lse and D_t = dout_t . o_t for
 * the out o given (what the block backward is given) */
static void ref_bwd(const ref_attn *a, const double *lse, const double *o, const double *dout,
                    double *dq, double *dk, double *dv) {
  const int T = a->T, H = a->H, KV = a->KV, hd = a->hd;
  const double scale = 1.0 / sqrt((double)hd);
  memset(dq, 0, sizeof(double) * a->B * T * H * hd);
  memset(dk, 0, sizeof(double) * a->B * T * KV * hd);
  memset(dv, 0, sizeof(double) * a->B * T * KV * hd);
  for (int b = 0; b < a->B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        const int g = h / (H / KV);
        const long qr = ((long)b * T + t) * H * hd + h * hd;
        double D = 0;
        for (int i = 0; i < hd; i++) D += dout[qr + i] * o[qr + i];
        for (int j = 0; j <= t; j++) {
          const long kr = ((long)b * T + j) * KV * hd + g * hd;
          const double p = exp(ref_score(a, b, h, t, j) - lse[((long)b * H + h) * T + t]);
          double dp = 0;
          for (int i = 0; i < hd; i++) dp += dout[qr + i] * a->v[kr + i];
          const double ds = p * (dp - D);
          for (int i = 0; i < hd; i++) {
            dq[qr + i] += scale * ds * a->k[kr + i];
            dk[kr + i] += scale * ds * a->q[qr + i];
            dv[kr + i] += p * dout[qr + i];
          }
        }
      }
}

/* random values, rounded through dt (what dt storage holds) */
static void rand_dt(tsr_dtype dt, float *x, long n) {
  for (long i = 0; i < n; i++) x[i] = (float)urand();
  if (dt == TSR_F32) return;
  void *t = xalloc((size_t)n * tsr_dtype_size(dt));
  tsr_ops_cast(dt, t, TSR_F32, x, n);
  tsr_ops_cast(TSR_F32, x, dt, t, n);
  free(t);
}

static double *to_double(const float *x, long n) {
  double *d = xalloc(sizeof(double) * n);
  for (long i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* ------------------------------------------- the ring's schedule on one process */

/* natural row (b, t = c Tc + u) <-> chunk-major row (c B + b) Tc + u */
static long cm_row(int B, int Tc, int b, int t) { return ((long)(t / Tc) * B + b) * Tc + t % Tc; }

static void test_ring(tsr_dtype dt, int cp, int B, int Tc, int H, int KV, int hd) {
  char name[300], sh[120];
  snprintf(sh, sizeof sh, "%s cp=%d B=%d Tc=%d H=%d KV=%d hd=%d", tsr_dtype_name(dt), cp, B, Tc,
           H, KV, hd);
  const int T = 2 * cp * Tc, stride = (H + 2 * KV) * hd, qw = H * hd, kw = KV * hd;
  const long rows = (long)B * T;
  float *q = xalloc(sizeof(float) * rows * qw), *k = xalloc(sizeof(float) * rows * kw);
  float *v = xalloc(sizeof(float) * rows * kw), *g = xalloc(sizeof(float) * rows * qw);
  rand_dt(dt, q, rows * qw), rand_dt(dt, k, rows * kw), rand_dt(dt, v, rows * kw);
  rand_dt(dt, g, rows * qw);
  /* chunk-major: q, k, v fused [rows, stride] and dout [rows, H hd], fp32 then as dt */
  float *qkv = xalloc(sizeof(float) * rows * stride), *gc = xalloc(sizeof(float) * rows * qw);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const long n = (long)b * T + t, c = cm_row(B, Tc, b, t);
      memcpy(qkv + c * stride, q + n * qw, sizeof(float) * qw);
      memcpy(qkv + c * stride + qw, k + n * kw, sizeof(float) * kw);
      memcpy(qkv + c * stride + qw + kw, v + n * kw, sizeof(float) * kw);
      memcpy(gc + c * qw, g + n * qw, sizeof(float) * qw);
    }
  const size_t es = tsr_dtype_size(dt);
  void *qkv_dt = xalloc(es * rows * stride), *g_dt = xalloc(es * rows * qw);
  tsr_ops_cast(dt, qkv_dt, TSR_F32, qkv, rows * stride);
  tsr_ops_cast(dt, g_dt, TSR_F32, gc, rows * qw);
  const void *qp = qkv_dt, *kp = (char *)qkv_dt + es * qw, *vp = (char *)qkv_dt + es * (qw + kw);

  /* forward */
  float *out = xalloc(sizeof(float) * rows * qw), *lse = xalloc(sizeof(float) * B * H * T);
  float *scratch = xalloc(sizeof(float) * B * Tc * (qw + H));
  tsr_cp_attention_fwd_local(dt, out, lse, scratch, qp, kp, vp, cp, B, Tc, H, KV, hd, stride,
                             stride);
  double *qd = to_double(q, rows * qw), *kd = to_double(k, rows * kw);
  double *vd = to_double(v, rows * kw);
  double *gd = to_double(g, rows * qw);
  const ref_attn ra = {B, T, H, KV, hd, qd, kd, vd};
  double *ro = xalloc(sizeof(double) * rows * qw), *rl = xalloc(sizeof(double) * B * H * T);
  ref_fwd(&ra, ro, rl);
  /* back to natural order */
  float *on = xalloc(sizeof(float) * rows * qw), *ln = xalloc(sizeof(float) * B * H * T);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const long n = (long)b * T + t, c = cm_row(B, Tc, b, t);
      memcpy(on + n * qw, out + c * qw, sizeof(float) * qw);
      const int ch = t / Tc, u = t % Tc;
      for (int h = 0; h < H; h++)
        ln[((long)b * H + h) * T + t] = lse[(long)ch * B * H * Tc + ((long)b * H + h) * Tc + u];
    }
  snprintf(name, sizeof name, "ring %s: fwd out = whole attention", sh);
  double e = rel_err(on, ro, rows * qw);
  check(name, e <= TOL_FWD, "err %.2e", e);
  snprintf(name, sizeof name, "ring %s: fwd lse = whole attention", sh);
  e = rel_err(ln, rl, (long)B * H * T);
  check(name, e <= TOL_FWD, "err %.2e", e);

  /* backward, on out stored as dt */
  void *out_dt = xalloc(es * rows * qw);
  tsr_ops_cast(dt, out_dt, TSR_F32, out, rows * qw);
  float *ow = xalloc(sizeof(float) * rows * qw); /* out as stored, natural order */
  tsr_ops_cast(TSR_F32, out, dt, out_dt, rows * qw);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      memcpy(ow + ((long)b * T + t) * qw, out + cm_row(B, Tc, b, t) * qw, sizeof(float) * qw);
  float *dq = xalloc(sizeof(float) * rows * qw), *dk = xalloc(sizeof(float) * rows * kw);
  float *dv = xalloc(sizeof(float) * rows * kw);
  tsr_cp_attention_bwd_local(dt, dq, dk, dv, g_dt, out_dt, lse, qp, kp, vp, cp, B, Tc, H, KV, hd,
                             stride, stride);
  double *owd = to_double(ow, rows * qw);
  double *rdq = xalloc(sizeof(double) * rows * qw), *rdk = xalloc(sizeof(double) * rows * kw);
  double *rdv = xalloc(sizeof(double) * rows * kw);
  ref_bwd(&ra, rl, owd, gd, rdq, rdk, rdv);
  float *nq = xalloc(sizeof(float) * rows * qw), *nk = xalloc(sizeof(float) * rows * kw);
  float *nv = xalloc(sizeof(float) * rows * kw);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const long n = (long)b * T + t, c = cm_row(B, Tc, b, t);
      memcpy(nq + n * qw, dq + c * qw, sizeof(float) * qw);
      memcpy(nk + n * kw, dk + c * kw, sizeof(float) * kw);
      memcpy(nv + n * kw, dv + c * kw, sizeof(float) * kw);
    }
  const char *gn[3] = {"dq", "dk", "dv"};
  const float *ga[3] = {nq, nk, nv};
  const double *gr[3] = {rdq, rdk, rdv};
  const long gl[3] = {rows * qw, rows * kw, rows * kw};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "ring %s: bwd %s = whole attention", sh, gn[i]);
    e = rel_err(ga[i], gr[i], gl[i]);
    check(name, e <= TOL_GRAD, "err %.2e", e);
  }
  /* a second backward adds its terms again: twice the gradient (up to the rounding of
   * the sums, which now start from the first gradient) */
  float *dq2 = xalloc(sizeof(float) * rows * qw);
  memcpy(dq2, dq, sizeof(float) * rows * qw);
  tsr_cp_attention_bwd_local(dt, dq2, NULL, NULL, g_dt, out_dt, lse, qp, kp, vp, cp, B, Tc, H,
                             KV, hd, stride, stride);
  double e2 = 0, m2 = 0;
  for (long i = 0; i < rows * qw; i++) {
    e2 = fmax(e2, fabs((double)dq2[i] - 2.0 * dq[i]));
    m2 = fmax(m2, fabs(2.0 * dq[i]));
  }
  snprintf(name, sizeof name, "ring %s: bwd adds (dq alone, twice = 2x)", sh);
  check(name, e2 <= 1e-6 * m2, "err %.2e", e2 / (m2 > 0 ? m2 : 1));

  free(q), free(k), free(v), free(g), free(qkv), free(gc), free(qkv_dt), free(g_dt);
  free(out), free(lse), free(scratch), free(qd), free(kd), free(vd), free(gd), free(ro), free(rl);
  free(on), free(ln), free(out_dt), free(ow), free(dq), free(dk), free(dv), free(owd), free(rdq);
  free(rdk), free(rdv), free(nq), free(nk), free(nv), free(dq2);
}

/* ------------------------------------------------------------ uneven cuts (B = 1)
 * Queries cut at qcut[], keys at kcut[] (increasing, from 0 to T): every pair run, the
 * fully masked ones too (out 0, lse -inf, merged as no-ops), in key order. */
static void test_cuts(int T, int H, int KV, int hd, const int *qcut, int nq, const int *kcut,
                      int nk) {
  char name[300], sh[100];
  snprintf(sh, sizeof sh, "T=%d H=%d KV=%d hd=%d, %d x %d blocks", T, H, KV, hd, nq, nk);
  const int qw = H * hd, kw = KV * hd;
  float *q = xalloc(sizeof(float) * T * qw), *k = xalloc(sizeof(float) * T * kw);
  float *v = xalloc(sizeof(float) * T * kw), *g = xalloc(sizeof(float) * T * qw);
  rand_dt(TSR_F32, q, (long)T * qw), rand_dt(TSR_F32, k, (long)T * kw);
  rand_dt(TSR_F32, v, (long)T * kw), rand_dt(TSR_F32, g, (long)T * qw);
  float *out = xalloc(sizeof(float) * T * qw), *lse = xalloc(sizeof(float) * H * T);
  float *po = xalloc(sizeof(float) * T * qw), *pl = xalloc(sizeof(float) * H * T);
  float *dq = xalloc(sizeof(float) * T * qw), *dk = xalloc(sizeof(float) * T * kw);
  float *dv = xalloc(sizeof(float) * T * kw);
  int kinds[3] = {0, 0, 0};
  for (int a = 0; a < nq; a++) {
    const int q0 = qcut[a], Tq = qcut[a + 1] - q0;
    float *lq = xalloc(sizeof(float) * H * Tq); /* this chunk's lse, [h][t] */
    for (int e = 0; e < nk; e++) {
      const int k0 = kcut[e], Tk = kcut[e + 1] - k0;
      kinds[tsr_ops_attn_block_kind(q0, Tq, k0, Tk)]++;
      tsr_ops_attention_block_fwd(TSR_F32, e ? po : out + (long)q0 * qw, e ? pl : lq,
                                  q + (long)q0 * qw, k + (long)k0 * kw, v + (long)k0 * kw, 1, Tq,
                                  Tk, H, KV, hd, qw, kw, q0, k0, 1, NULL);
      if (e)
        tsr_ops_attention_merge(out + (long)q0 * qw, lq, out + (long)q0 * qw, lq, po, pl, 1, Tq,
                                H, hd);
    }
    for (int h = 0; h < H; h++)
      for (int t = 0; t < Tq; t++) lse[(long)h * T + q0 + t] = lq[(long)h * Tq + t];
    free(lq);
  }
  double *qd = to_double(q, (long)T * qw), *kd = to_double(k, (long)T * kw);
  double *vd = to_double(v, (long)T * kw), *gd = to_double(g, (long)T * qw);
  const ref_attn ra = {1, T, H, KV, hd, qd, kd, vd};
  double *ro = xalloc(sizeof(double) * T * qw), *rl = xalloc(sizeof(double) * H * T);
  ref_fwd(&ra, ro, rl);
  snprintf(name, sizeof name, "cuts %s (%d skipped, %d full, %d partial): fwd out", sh,
           kinds[TSR_ATT_BLOCK_SKIP], kinds[TSR_ATT_BLOCK_FULL], kinds[TSR_ATT_BLOCK_PARTIAL]);
  double e = rel_err(out, ro, (long)T * qw);
  check(name, e <= TOL_FWD, "err %.2e", e);
  snprintf(name, sizeof name, "cuts %s: fwd lse", sh);
  e = rel_err(lse, rl, (long)H * T);
  check(name, e <= TOL_FWD, "err %.2e", e);
  /* backward: the query chunk's lse as [h][t] of the chunk */
  for (int a = 0; a < nq; a++) {
    const int q0 = qcut[a], Tq = qcut[a + 1] - q0;
    float *lq = xalloc(sizeof(float) * H * Tq);
    for (int h = 0; h < H; h++)
      for (int t = 0; t < Tq; t++) lq[(long)h * Tq + t] = lse[(long)h * T + q0 + t];
    for (int c = 0; c < nk; c++) {
      const int k0 = kcut[c], Tk = kcut[c + 1] - k0;
      tsr_ops_attention_block_bwd(TSR_F32, dq + (long)q0 * qw, dk + (long)k0 * kw,
                                  dv + (long)k0 * kw, g + (long)q0 * qw, out + (long)q0 * qw, lq,
                                  q + (long)q0 * qw, k + (long)k0 * kw, v + (long)k0 * kw, 1, Tq,
                                  Tk, H, KV, hd, qw, kw, q0, k0, 1, NULL);
    }
    free(lq);
  }
  double *od = to_double(out, (long)T * qw);
  double *rdq = xalloc(sizeof(double) * T * qw), *rdk = xalloc(sizeof(double) * T * kw);
  double *rdv = xalloc(sizeof(double) * T * kw);
  ref_bwd(&ra, rl, od, gd, rdq, rdk, rdv);
  const char *gn[3] = {"dq", "dk", "dv"};
  const float *ga[3] = {dq, dk, dv};
  const double *gr[3] = {rdq, rdk, rdv};
  const long gl[3] = {(long)T * qw, (long)T * kw, (long)T * kw};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "cuts %s: bwd %s", sh, gn[i]);
    e = rel_err(ga[i], gr[i], gl[i]);
    check(name, e <= TOL_GRAD, "err %.2e", e);
  }
  free(q), free(k), free(v), free(g), free(out), free(lse), free(po), free(pl), free(dq);
  free(dk), free(dv), free(qd), free(kd), free(vd), free(gd), free(ro), free(rl), free(od);
  free(rdq), free(rdk), free(rdv);
}

/* ------------------------------------------------------------ documents
 * Packed documents (start[t]: the position where token t's document begins): the cut
 * blocks with each query row's start in the block's key rows (clamped to [0, Tk]), merged
 * in key order, against the whole sequence's attention_fwd / attention_bwd with the same
 * documents (tested against float64 in test_ops). */
static void test_cuts_docs(int T, int H, int KV, int hd, const int *cut, int n, int doc_len) {
  char name[300], sh[120];
  snprintf(sh, sizeof sh, "T=%d H=%d KV=%d hd=%d, %d chunks, documents of about %d", T, H, KV, hd,
           n, doc_len);
  const int qw = H * hd, kw = KV * hd, stride = qw + 2 * kw;
  float *qkv = xalloc(sizeof(float) * T * stride), *g = xalloc(sizeof(float) * T * qw);
  rand_dt(TSR_F32, qkv, (long)T * stride), rand_dt(TSR_F32, g, (long)T * qw);
  int32_t *start = xalloc(sizeof(int32_t) * T), *bd = xalloc(sizeof(int32_t) * T);
  for (int t = 0, s0 = 0; t < T; t++) { /* documents of doc_len +- a third */
    start[t] = s0;
    if (t + 1 - s0 >= doc_len - doc_len / 3 + (t * 7919) % (2 * (doc_len / 3) + 1)) s0 = t + 1;
  }
  /* the whole sequence */
  float *ro = xalloc(sizeof(float) * T * qw), *rl = xalloc(sizeof(float) * H * T);
  float *rdqkv = xalloc(sizeof(float) * T * stride);
  tsr_ops_attention_fwd(TSR_F32, ro, rl, qkv, qkv + qw, qkv + qw + kw, 1, T, H, KV, hd, stride,
                        start);
  tsr_ops_attention_bwd(TSR_F32, rdqkv, rdqkv + qw, rdqkv + qw + kw, g, ro, rl, qkv, qkv + qw,
                        qkv + qw + kw, 1, T, H, KV, hd, stride, start);
  /* the blocks: queries and keys in separate compact buffers, as a cp rank holds them */
  float *q = xalloc(sizeof(float) * T * qw), *k = xalloc(sizeof(float) * T * kw);
  float *v = xalloc(sizeof(float) * T * kw);
  for (int t = 0; t < T; t++) {
    memcpy(q + (long)t * qw, qkv + (long)t * stride, sizeof(float) * qw);
    memcpy(k + (long)t * kw, qkv + (long)t * stride + qw, sizeof(float) * kw);
    memcpy(v + (long)t * kw, qkv + (long)t * stride + qw + kw, sizeof(float) * kw);
  }
  float *out = xalloc(sizeof(float) * T * qw), *lse = xalloc(sizeof(float) * H * T);
  float *po = xalloc(sizeof(float) * T * qw), *pl = xalloc(sizeof(float) * H * T);
  float *dq = xalloc(sizeof(float) * T * qw), *dk = xalloc(sizeof(float) * T * kw);
  float *dv = xalloc(sizeof(float) * T * kw);
  for (int pass = 0; pass < 2; pass++)
    for (int a = 0; a < n; a++) {
      const int q0 = cut[a], Tq = cut[a + 1] - q0;
      float *lq = xalloc(sizeof(float) * H * Tq);
      if (pass)
        for (int h = 0; h < H; h++)
          for (int t = 0; t < Tq; t++) lq[(long)h * Tq + t] = lse[(long)h * T + q0 + t];
      for (int e = 0, first = 1; e < n; e++) {
        const int k0 = cut[e], Tk = cut[e + 1] - k0;
        if (tsr_ops_attn_block_kind(q0, Tq, k0, Tk) == TSR_ATT_BLOCK_SKIP) continue;
        for (int t = 0; t < Tq; t++) {
          const int j = start[q0 + t] - k0;
          bd[t] = j < 0 ? 0 : j > Tk ? Tk : j;
        }
        const int causal = tsr_ops_attn_block_kind(q0, Tq, k0, Tk) == TSR_ATT_BLOCK_PARTIAL;
        if (pass) {
          tsr_ops_attention_block_bwd(TSR_F32, dq + (long)q0 * qw, dk + (long)k0 * kw,
                                      dv + (long)k0 * kw, g + (long)q0 * qw, out + (long)q0 * qw,
                                      lq, q + (long)q0 * qw, k + (long)k0 * kw, v + (long)k0 * kw,
                                      1, Tq, Tk, H, KV, hd, qw, kw, q0, k0, causal, bd);
          continue;
        }
        tsr_ops_attention_block_fwd(TSR_F32, first ? out + (long)q0 * qw : po, first ? lq : pl,
                                    q + (long)q0 * qw, k + (long)k0 * kw, v + (long)k0 * kw, 1,
                                    Tq, Tk, H, KV, hd, qw, kw, q0, k0, causal, bd);
        if (!first)
          tsr_ops_attention_merge(out + (long)q0 * qw, lq, out + (long)q0 * qw, lq, po, pl, 1,
                                  Tq, H, hd);
        first = 0;
      }
      if (!pass)
        for (int h = 0; h < H; h++)
          for (int t = 0; t < Tq; t++) lse[(long)h * T + q0 + t] = lq[(long)h * Tq + t];
      free(lq);
    }
  double md = 0, ml = 0, mg[3] = {0, 0, 0}, sg[3] = {0, 0, 0};
  for (long i = 0; i < (long)T * qw; i++) md = fmax(md, fabs(out[i] - ro[i]));
  for (long i = 0; i < (long)T * H; i++) ml = fmax(ml, fabs(lse[i] - rl[i]));
  for (int t = 0; t < T; t++)
    for (int c = 0; c < stride; c++) {
      const int w = c < qw ? 0 : c < qw + kw ? 1 : 2;
      const float got = w == 0 ? dq[(long)t * qw + c] : w == 1 ? dk[(long)t * kw + c - qw]
                                                               : dv[(long)t * kw + c - qw - kw];
      const float ref = rdqkv[(long)t * stride + c];
      mg[w] = fmax(mg[w], fabs(got - ref));
      sg[w] = fmax(sg[w], fabs(ref));
    }
  snprintf(name, sizeof name, "documents %s: fwd out and lse == attention_fwd", sh);
  check(name, md <= 1e-5 && ml <= 1e-5, "max diff %.2e", fmax(md, ml));
  const char *gn[3] = {"dq", "dk", "dv"};
  for (int w = 0; w < 3; w++) {
    snprintf(name, sizeof name, "documents %s: bwd %s == attention_bwd", sh, gn[w]);
    check(name, mg[w] <= 1e-5 * fmax(1.0, sg[w]), "max diff %.2e", mg[w]);
  }
  free(qkv), free(g), free(start), free(bd), free(ro), free(rl), free(rdqkv), free(q), free(k);
  free(v), free(out), free(lse), free(po), free(pl), free(dq), free(dk), free(dv);
}

/* ------------------------------------------------- one block, and a masked block */

static void test_one_block(int B, int T, int H, int KV, int hd) {
  char name[160];
  const int stride = (H + 2 * KV) * hd;
  const long rows = (long)B * T, nq = rows * H * hd;
  float *qkv = xalloc(sizeof(float) * rows * stride), *g = xalloc(sizeof(float) * nq);
  rand_dt(TSR_F32, qkv, rows * stride), rand_dt(TSR_F32, g, nq);
  const float *q = qkv, *k = qkv + H * hd, *v = qkv + (H + KV) * hd;
  float *o1 = xalloc(sizeof(float) * nq), *l1 = xalloc(sizeof(float) * B * H * T);
  float *o2 = xalloc(sizeof(float) * nq), *l2 = xalloc(sizeof(float) * B * H * T);
  tsr_ops_attention_fwd(TSR_F32, o1, l1, q, k, v, B, T, H, KV, hd, stride, NULL);
  tsr_ops_attention_block_fwd(TSR_F32, o2, l2, q, k, v, B, T, T, H, KV, hd, stride, stride, 5, 5,
                              1, NULL);
  snprintf(name, sizeof name, "one block B=%d T=%d H=%d KV=%d hd=%d: fwd = attention_fwd", B, T,
           H, KV, hd);
  check(name, bitwise(o1, o2, sizeof(float) * nq) && bitwise(l1, l2, sizeof(float) * B * H * T),
        "%g", 0.0);
  float *d1 = xalloc(sizeof(float) * rows * stride);
  float *dq = xalloc(sizeof(float) * nq), *dk = xalloc(sizeof(float) * rows * KV * hd);
  float *dv = xalloc(sizeof(float) * rows * KV * hd);
  tsr_ops_attention_bwd(TSR_F32, d1, d1 + H * hd, d1 + (H + KV) * hd, g, o1, l1, q, k, v, B, T, H,
                        KV, hd, stride, NULL);
  tsr_ops_attention_block_bwd(TSR_F32, dq, dk, dv, g, o1, l1, q, k, v, B, T, T, H, KV, hd, stride,
                              stride, 0, 0, 1, NULL);
  int same = 1;
  for (long r = 0; r < rows; r++) {
    same &= bitwise(d1 + r * stride, dq + r * H * hd, sizeof(float) * H * hd);
    same &= bitwise(d1 + r * stride + H * hd, dk + r * KV * hd, sizeof(float) * KV * hd);
    same &= bitwise(d1 + r * stride + (H + KV) * hd, dv + r * KV * hd, sizeof(float) * KV * hd);
  }
  snprintf(name, sizeof name, "one block B=%d T=%d H=%d KV=%d hd=%d: bwd = attention_bwd", B, T,
           H, KV, hd);
  check(name, same, "%g", 0.0);

  /* a block right of every query: fully masked */
  const int Tq = T / 2, Tk = T - Tq;
  check("a block right of the queries is SKIP",
        tsr_ops_attn_block_kind(0, Tq, Tq, Tk) == TSR_ATT_BLOCK_SKIP &&
            tsr_ops_attn_block_kind(Tq, Tk, 0, Tq) == TSR_ATT_BLOCK_FULL &&
            tsr_ops_attn_block_kind(0, Tq, 0, Tq) == TSR_ATT_BLOCK_PARTIAL,
        "%g", 0.0);
  float *mo = xalloc(sizeof(float) * nq), *ml = xalloc(sizeof(float) * B * H * Tq);
  for (long i = 0; i < nq; i++) mo[i] = NAN;
  tsr_ops_attention_block_fwd(TSR_F32, mo, ml, q, k, v, B, Tq, Tk, H, KV, hd, stride, stride, 0,
                              Tq, 1, NULL);
  int masked = 1;
  for (long i = 0; i < (long)B * Tq * H * hd; i++) masked &= mo[i] == 0.0f;
  for (long i = 0; i < (long)B * H * Tq; i++) masked &= ml[i] == -INFINITY;
  check("a fully masked block: out 0, lse -inf", masked, "%g", 0.0);
  /* merging it into a result (the block of queries [0, Tq) against keys [0, Tq)) */
  float *ro = xalloc(sizeof(float) * nq), *rl = xalloc(sizeof(float) * B * H * Tq);
  tsr_ops_attention_block_fwd(TSR_F32, ro, rl, q, k, v, B, Tq, Tq, H, KV, hd, stride, stride, 0, 0,
                              1, NULL);
  float *co = xalloc(sizeof(float) * nq), *cl = xalloc(sizeof(float) * B * H * Tq);
  memcpy(co, ro, sizeof(float) * B * Tq * H * hd), memcpy(cl, rl, sizeof(float) * B * H * Tq);
  tsr_ops_attention_merge(co, cl, co, cl, mo, ml, B, Tq, H, hd);
  check("merging a fully masked block changes no bit",
        bitwise(co, ro, sizeof(float) * B * Tq * H * hd) &&
            bitwise(cl, rl, sizeof(float) * B * H * Tq),
        "%g", 0.0);
  tsr_ops_attention_merge(co, cl, mo, ml, co, cl, B, Tq, H, hd);
  check("... on either side", bitwise(co, ro, sizeof(float) * B * Tq * H * hd), "%g", 0.0);
  /* its backward adds nothing */
  for (long i = 0; i < nq; i++) dq[i] = (float)i;
  for (long i = 0; i < rows * KV * hd; i++) dk[i] = dv[i] = (float)-i;
  tsr_ops_attention_block_bwd(TSR_F32, dq, dk, dv, g, ro, rl, q, k, v, B, Tq, Tk, H, KV, hd,
                              stride, stride, 0, Tq, 1, NULL);
  int none = 1;
  for (long i = 0; i < nq; i++) none &= dq[i] == (float)i;
  for (long i = 0; i < rows * KV * hd; i++) none &= dk[i] == (float)-i && dv[i] == (float)-i;
  check("a fully masked block's backward adds nothing", none, "%g", 0.0);
  /* a block left of every query: causal 1 is causal 0 */
  tsr_ops_attention_block_fwd(TSR_F32, mo, ml, q, k, v, B, Tk, Tq, H, KV, hd, stride, stride, Tq, 0,
                              1, NULL);
  tsr_ops_attention_block_fwd(TSR_F32, co, cl, q, k, v, B, Tk, Tq, H, KV, hd, stride, stride, Tq, 0,
                              0, NULL);
  check("a block left of the queries: causal = whole block, bitwise",
        bitwise(co, mo, sizeof(float) * B * Tk * H * hd) &&
            bitwise(cl, ml, sizeof(float) * B * H * Tk),
        "%g", 0.0);
  /* merge in place against the formula in double */
  for (long i = 0; i < (long)B * H * Tq; i++)
    rl[i] = (float)(3 * urand()), cl[i] = (float)(3 * urand());
  for (long i = 0; i < (long)B * Tq * H * hd; i++) ro[i] = (float)urand(), co[i] = (float)urand();
  float *xo = xalloc(sizeof(float) * nq), *xl = xalloc(sizeof(float) * B * H * Tq);
  tsr_ops_attention_merge(xo, xl, ro, rl, co, cl, B, Tq, H, hd);
  double em = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tq; t++)
      for (int h = 0; h < H; h++) {
        const long st = ((long)b * H + h) * Tq + t;
        const double a1 = rl[st], a2 = cl[st], m = a1 > a2 ? a1 : a2;
        const double L = m + log(exp(a1 - m) + exp(a2 - m));
        em = fmax(em, fabs(L - xl[st]));
        for (int d = 0; d < hd; d++) {
          const long i = ((long)b * Tq + t) * H * hd + h * hd + d;
          em = fmax(em, fabs(exp(a1 - L) * ro[i] + exp(a2 - L) * co[i] - xo[i]));
        }
      }
  check("merge = the formula in double", em <= 1e-6, "err %.2e", em);
  free(qkv), free(g), free(o1), free(l1), free(o2), free(l2), free(d1), free(dq), free(dk);
  free(dv), free(mo), free(ml), free(ro), free(rl), free(co), free(cl), free(xo), free(xl);
}

int main(int argc, char **argv) {
  const uint64_t seed =
      argc > 1 ? strtoull(argv[1], NULL, 10)
               : tsr_mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock());
  rng_state = seed;
  printf("test_cp_attn: seed %llu (rerun: test_cp_attn %llu)\n", (unsigned long long)seed,
         (unsigned long long)seed);
  tsr_cpu_open(0);
  test_one_block(2, 100, 4, 2, 16);
  test_one_block(1, 300, 2, 1, 8);
  const tsr_dtype dts[2] = {TSR_F32, TSR_BF16};
  for (int d = 0; d < 2; d++) {
    test_ring(dts[d], 2, 2, 24, 4, 1, 16);
    test_ring(dts[d], 4, 2, 12, 4, 2, 16);
    test_ring(dts[d], 4, 1, 9, 2, 2, 8);
    test_ring(dts[d], 2, 1, 70, 4, 1, 16); /* chunks over the CPU kernel's 64-row tiles */
  }
  test_cuts(150, 4, 1, 16, (const int[]){0, 37, 90, 150}, 3, (const int[]){0, 20, 61, 140, 150},
            4);
  test_cuts(300, 2, 2, 8, (const int[]){0, 70, 300}, 2, (const int[]){0, 260, 300}, 2);
  /* documents: the 2 cp chunks of cp 2 and 4, short and long documents, GQA */
  test_cuts_docs(128, 4, 2, 16, (const int[]){0, 32, 64, 96, 128}, 4, 20);
  test_cuts_docs(256, 4, 1, 8, (const int[]){0, 32, 64, 96, 128, 160, 192, 224, 256}, 8, 45);
  test_cuts_docs(300, 2, 2, 8, (const int[]){0, 70, 140, 300}, 3, 90);
  printf("test_cp_attn: %d checks, %d failed (seed %llu)\n", n_checks, n_failed,
         (unsigned long long)seed);
  return n_failed ? 1 : 0;
}
