/* cpu_attention.c — causal grouped-query attention: attention_fwd, attention_bwd, and
 * the block ops of a chunked sequence: attention_block_fwd, attention_block_bwd,
 * attention_merge.
 *
 * Attention works on blocks of ATT_QB query rows against chunks of ATT_KC keys, each
 * block product a single-threaded sgemm, and never stores a T x T matrix.  The forward
 * keeps an online softmax per query row and saves only lse.  The backward rebuilds
 * P = exp(s - lse) block by block; one task per (batch, KV head) owns dk/dv of that head
 * and dq of its query heads, so nothing is shared between tasks and every sum runs in a
 * fixed order (key chunks ascending, then heads, then query blocks): the same bits for
 * every thread count.
 *
 * 16-bit storage.  The same loops run on fp32 copies: a task widens its query block
 * and each key / value chunk (and in the backward the dout and out blocks) into its
 * buffer before the products that read them, and rounds out, dk and dv once when a row
 * is final.  dq is summed over key chunks, so the backward keeps the task's dq rows in
 * fp32 (T x group x head_dim) and rounds them at the end.  The fp32 products see the
 * widened values, with leading dimension head_dim instead of the qkv stride.
 *
 * Documents (doc != NULL, ops_list.h): a query row i sees the keys [doc[i], i].  doc does
 * not decrease within a sequence, so a block's first row has the smallest start: the
 * forward begins at the key chunk holding it, skipping every chunk before it; the
 * backward stops a key chunk's walk down the query blocks at the first block whose first
 * row starts after the chunk's last key.  The chunks crossing a boundary set P = 0 left of
 * each row's start as they do right of the diagonal.
 *
 * Blocks (attention_block_*): the same loops, with the queries and the keys in buffers of
 * their own (Tq and Tk rows, strides of their own) and the diagonal moved: query row i
 * sees key row j when j <= i + off, off = q0 - k0 clamped to [-Tq, Tk] (causal 0: off = Tk,
 * every key).  attention_fwd and attention_bwd are the case Tq = Tk = T, off = 0.  The
 * block forward stores out as fp32 (odt); the block backward adds its fp32 sums into the
 * caller's fp32 dq, dk, dv (acc) instead of writing them. */
#include "cpu_internal.h"

size_t cpu_attention_buf_floats(int T, int group, int hd) {
  const size_t fwd = (size_t)(ATT_QB + 2 * ATT_KC) * hd;
  const size_t bwd = (size_t)T * group * hd + (size_t)(3 * ATT_QB + 2 * ATT_KC) * hd;
  return fwd > bwd ? fwd : bwd;
}

/* dst[0..n) += src */
static inline void acc_row(float *restrict dst, const float *restrict src, int n) {
#pragma omp simd
  for (int d = 0; d < n; d++) dst[d] += src[d];
}

static float attn_scale(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* C[M,N] (ldc) = alpha op(A) op(B) + beta C in the calling thread: the attention tiles,
 * inside a parallel loop (OpenBLAS runs single-threaded there, see tsr_cpu_init). */
static void tile_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* rows x hd values of a dt tensor (leading dimension ld) as fp32: fp32 storage is read in
 * place (*ldo = ld), 16-bit storage widened into dst (*ldo = hd). */
static inline const float *rows_f32(tsr_dtype dt, float *dst, const void *src, size_t ld,
                                    int rows, int hd, int *ldo) {
  if (dt == TSR_F32) {
    *ldo = (int)ld;
    return src;
  }
  widen_block(dt, dst, hd, src, (long)ld, rows, hd);
  *ldo = hd;
  return dst;
}

/* Query rows [i0, i1) of one (batch, head), against keys in chunks of ATT_KC with an
 * online softmax: q, k, v point at the head's row 0, dc at the sequence's document
 * starts (NULL: none).  Each chunk is two GEMMs, S = Q K^T and acc += P V; the chunk
 * holding the diagonal computes its masked corner too (at most ATT_QB^2/2 wasted products
 * per row block) and sets P = 0 there, as a chunk crossing a row's document start does
 * left of it.  buf: the thread's buffer (16-bit storage). */
TSR_CLONES static void attn_fwd_rows(tsr_dtype dt, tsr_dtype odt, void *out, size_t out_stride,
                                     float *lse, const void *q, const void *k, const void *v,
                                     int q_stride, int kv_stride, int hd, int i0, int i1, int Tk,
                                     int off, float scale, const int32_t *dc, float *buf) {
  const int nq = i1 - i0;
  float s[ATT_QB * ATT_KC], acc[ATT_QB * hd], m[ATT_QB], l[ATT_QB];
  float *qw = buf, *kw = qw + ATT_QB * hd, *vw = kw + ATT_KC * hd;
  int ldq, ldk, ldv;
  const float *qb = rows_f32(dt, qw, tsr_dtype_at_c(q, dt, (int64_t)i0 * q_stride), q_stride,
                             nq, hd, &ldq);
  for (int ii = 0; ii < nq; ii++) m[ii] = -INFINITY, l[ii] = 0.0f;
  const int jfirst = dc ? dc[i0] / ATT_KC * ATT_KC : 0; /* no key before it is seen */
  const int jend = i1 + off < Tk ? i1 + off : Tk;         /* nor one from here on */
  for (int j0 = jfirst; j0 < jend; j0 += ATT_KC) {
    const int nk = jend - j0 < ATT_KC ? jend - j0 : ATT_KC;
    const float *kc = rows_f32(dt, kw, tsr_dtype_at_c(k, dt, (int64_t)j0 * kv_stride), kv_stride,
                               nk, hd, &ldk);
    const float *vc = rows_f32(dt, vw, tsr_dtype_at_c(v, dt, (int64_t)j0 * kv_stride), kv_stride,
                               nk, hd, &ldv);
    tile_gemm(CblasNoTrans, CblasTrans, nq, nk, hd, scale, qb, ldq, kc, ldk, 0.0f, s, ATT_KC);
    for (int ii = 0; ii < nq; ii++) {
      const int jn = i0 + ii + off - j0 + 1 < nk ? i0 + ii + off - j0 + 1 : nk; /* j <= i+off */
      /* keys j >= the row's document start (lo may pass jn: the chunk has none for it) */
      const int lo = dc && dc[i0 + ii] > j0 ? (dc[i0 + ii] - j0 < nk ? dc[i0 + ii] - j0 : nk) : 0;
      float *sr = s + ii * ATT_KC, *a = acc + ii * hd;
      float mx = m[ii];
#pragma omp simd reduction(max : mx)
      for (int jj = lo; jj < jn; jj++) mx = sr[jj] > mx ? sr[jj] : mx;
#pragma omp simd
      for (int jj = lo; jj < jn; jj++) sr[jj] = expf_vec(sr[jj] - mx);
      for (int jj = 0; jj < lo; jj++) sr[jj] = 0.0f;
      for (int jj = jn > lo ? jn : lo; jj < nk; jj++) sr[jj] = 0.0f;
      /* online softmax: rescale what was summed under the old max (the first chunk's
       * products overwrite acc; a row with no key so far has m = mx = -inf, nothing to
       * rescale) */
      const float c = j0 == jfirst ? 0.0f : mx > m[ii] ? expf(m[ii] - mx) : 1.0f;
      if (j0 > jfirst) {
#pragma omp simd
        for (int d = 0; d < hd; d++) a[d] *= c;
      }
      l[ii] = l[ii] * c + (jn > lo ? (float)sum_d(sr + lo, jn - lo) : 0.0f);
      m[ii] = mx;
    }
    tile_gemm(CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, s, ATT_KC, vc, ldv,
              j0 == jfirst ? 0.0f : 1.0f, acc, hd);
  }
  if (jend <= jfirst) /* no key of the block for these rows */
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
  for (int ii = 0; ii < nq; ii++) {
    float *a = acc + ii * hd;
    const float inv = l[ii] > 0.0f ? 1.0f / l[ii] : 0.0f; /* no key: out 0, lse -inf */
    if (odt == TSR_F32) {
      float *o = (float *)out + (size_t)(i0 + ii) * out_stride;
#pragma omp simd
      for (int d = 0; d < hd; d++) o[d] = a[d] * inv;
    } else {
#pragma omp simd
      for (int d = 0; d < hd; d++) a[d] = a[d] * inv;
      narrow_row(odt, tsr_dtype_at(out, odt, (int64_t)(i0 + ii) * out_stride), a, hd);
    }
    lse[i0 + ii] = m[ii] + logf(l[ii]);
  }
}

/* out (odt) and lse of B sequences of Tq queries against Tk keys, query row i seeing key
 * row j when j <= i + off (and the keys of its document, doc != NULL) */
static void attn_fwd(tsr_dtype dt, tsr_dtype odt, void *out, float *lse, const void *q,
                     const void *k, const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                     int q_stride, int kv_stride, int off, const int32_t *doc) {
  if (B <= 0 || Tq <= 0 || H <= 0) return;
  const int group = H / KV, nqb = (Tq + ATT_QB - 1) / ATT_QB;
  const float scale = attn_scale(hd);
  const long ntasks = (long)B * H * nqb;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_attention_buf_floats(0, 0, hd));
  /* One task per (b, h, block of query rows); later blocks cost more (causal), hence
   * dynamic scheduling.  A task's result does not depend on which thread computes it. */
#pragma omp parallel for schedule(dynamic, 1)
  for (long task = 0; task < ntasks; task++) {
    const int qb = (int)(task % nqb), h = (int)((task / nqb) % H);
    const int b = (int)(task / ((long)nqb * H)), g = h / group;
    const int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < Tq ? i0 + ATT_QB : Tq;
    const size_t qbase = (size_t)b * Tq * q_stride, kbase = (size_t)b * Tk * kv_stride;
    attn_fwd_rows(dt, odt, tsr_dtype_at(out, odt, (int64_t)b * Tq * H * hd + (int64_t)h * hd),
                  (size_t)H * hd, lse + ((size_t)b * H + h) * Tq,
                  tsr_dtype_at_c(q, dt, (int64_t)(qbase + (size_t)h * hd)),
                  tsr_dtype_at_c(k, dt, (int64_t)(kbase + (size_t)g * hd)),
                  tsr_dtype_at_c(v, dt, (int64_t)(kbase + (size_t)g * hd)), q_stride, kv_stride,
                  hd, i0, i1, Tk, off, scale, doc ? doc + (size_t)b * Tq : NULL,
                  dt == TSR_F32 ? NULL : cpu_buf_thread());
  }
}

void tsr_cpu_attention_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                           const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                           const int32_t *doc) {
  attn_fwd(dt, dt, out, lse, q, k, v, B, T, T, H, KV, hd, qkv_stride, qkv_stride, 0, doc);
}

/* The block's diagonal as a row offset: query row i sees key row j when j <= i + off
 * (off = Tk: every key; off <= -Tq: none) */
static int block_off(int Tq, int Tk, long q0, long k0, int causal) {
  if (!causal) return Tk;
  const long d = q0 - k0;
  return d > Tk ? Tk : d < -(long)Tq ? -Tq : (int)d;
}

void tsr_cpu_attention_block_fwd(tsr_dtype dt, float *out, float *lse, const void *q,
                                 const void *k, const void *v, int B, int Tq, int Tk, int H,
                                 int KV, int hd, int q_stride, int kv_stride, long q0, long k0,
                                 int causal, const int32_t *doc) {
  attn_fwd(dt, TSR_F32, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride, kv_stride,
           block_off(Tq, Tk, q0, k0, causal), doc);
}

/* The backward of one (batch, KV head) over its query heads h0 .. h0+group-1.  Pointers
 * are at the batch's row 0 (q, dq, dout, out: head 0; k, v, dk, dv: this KV head); a
 * NULL gradient is not computed.  For each chunk of ATT_KC keys, and each query block
 * at or below it: S = Q K^T, P = exp(scale S - lse), dP = dO V^T, dS = P (dP - D) with
 * D = rowsum(dO O); then dV += P^T dO, dK += scale dS^T Q (both kept for the chunk and
 * written after it), dQ += scale dS K (fp32 storage: into dq directly, zeroed first —
 * this task owns those rows; 16-bit: into an fp32 copy, rounded at the end).  dc: the
 * sequence's document starts (NULL: none).  acc: dq, dk, dv are fp32 sums that the
 * results are added to (rows dq_ld and dkv_ld floats apart), whatever dt. */
TSR_CLONES static void attn_bwd_head(tsr_dtype dt, int acc, void *dq, size_t dq_ld, void *dk,
                                     void *dv, size_t dkv_ld, const void *dout, const void *out,
                                     size_t out_stride, const float *lse, const void *q,
                                     int q_stride, const void *k, const void *v, int kv_stride,
                                     int Tq, int Tk, int off, int hd, int h0, int group,
                                     float scale, const int32_t *dc, float *buf) {
  float p[ATT_QB * ATT_KC], dp[ATT_QB * ATT_KC], dkl[ATT_KC * hd], dvl[ATT_KC * hd], D[ATT_QB];
  const int dq_cols = group * hd; /* dq columns of this task's heads, per row */
  float *dqf = NULL;         /* dq (fp32 storage or acc) or its fp32 copy, at head h0 */
  int lddq = (int)dq_ld;
  float *qw = NULL, *gw = NULL, *ow = NULL, *kw = NULL, *vw = NULL;
  if (dt == TSR_F32 || acc) {
    if (dq) {
      dqf = (float *)dq + (size_t)h0 * hd;
      if (!acc)
        for (int t = 0; t < Tq; t++)
          memset(dqf + (size_t)t * dq_ld, 0, (size_t)dq_cols * sizeof(float));
    }
  }
  if (dt != TSR_F32) {
    qw = buf, gw = qw + ATT_QB * hd, ow = gw + ATT_QB * hd, kw = ow + ATT_QB * hd;
    vw = kw + ATT_KC * hd;
    if (dq && !acc) {
      dqf = vw + ATT_KC * hd;
      lddq = dq_cols;
      memset(dqf, 0, (size_t)Tq * dq_cols * sizeof(float));
    }
  }
  for (int j0 = 0; j0 < Tk; j0 += ATT_KC) {
    const int nk = Tk - j0 < ATT_KC ? Tk - j0 : ATT_KC;
    int ldk, ldv, ldq, ldg, ldo;
    const float *kc = rows_f32(dt, kw, tsr_dtype_at_c(k, dt, (int64_t)j0 * kv_stride), kv_stride,
                               nk, hd, &ldk);
    const float *vc = rows_f32(dt, vw, tsr_dtype_at_c(v, dt, (int64_t)j0 * kv_stride), kv_stride,
                               nk, hd, &ldv);
    memset(dkl, 0, sizeof dkl);
    memset(dvl, 0, sizeof dvl);
    /* the first query block that sees key j0 holds row j0 - off */
    const int ifirst = j0 - off > 0 ? (j0 - off) / ATT_QB * ATT_QB : 0;
    for (int h = h0; h < h0 + group; h++)
      for (int i0 = ifirst; i0 < Tq; i0 += ATT_QB) {
        if (dc && dc[i0] >= j0 + nk) break; /* this block's rows and all below start later */
        const int nq = Tq - i0 < ATT_QB ? Tq - i0 : ATT_QB;
        const int nkb = i0 + nq + off - j0 < nk ? i0 + nq + off - j0 : nk; /* j < i0+nq+off */
        if (nkb <= 0) continue; /* (a block past the last query row sees none of the chunk) */
        const float *qb = rows_f32(dt, qw,
                                   tsr_dtype_at_c(q, dt, (int64_t)i0 * q_stride + h * hd),
                                   q_stride, nq, hd, &ldq);
        const int64_t ob_at = (int64_t)i0 * out_stride + h * hd;
        const float *gb = rows_f32(dt, gw, tsr_dtype_at_c(dout, dt, ob_at), out_stride, nq, hd,
                                   &ldg);
        const float *ob = rows_f32(dt, ow, tsr_dtype_at_c(out, dt, ob_at), out_stride, nq, hd,
                                   &ldo);
        const float *L = lse + (size_t)h * Tq + i0;
        for (int ii = 0; ii < nq; ii++)
          D[ii] = dotf(gb + (size_t)ii * ldg, ob + (size_t)ii * ldo, hd);
        tile_gemm(CblasNoTrans, CblasTrans, nq, nkb, hd, scale, qb, ldq, kc, ldk, 0.0f, p, ATT_KC);
        tile_gemm(CblasNoTrans, CblasTrans, nq, nkb, hd, 1.0f, gb, ldg, vc, ldv, 0.0f, dp, ATT_KC);
        for (int ii = 0; ii < nq; ii++) {
          const int i = i0 + ii, e = i + off - j0 + 1, jn = e < 0 ? 0 : e < nkb ? e : nkb;
          /* keys j >= the row's document start: [lo, jn) (empty when lo >= jn) */
          const int lo = dc && dc[i] > j0 ? (dc[i] - j0 < nkb ? dc[i] - j0 : nkb) : 0;
          float *pr = p + ii * ATT_KC, *dr = dp + ii * ATT_KC;
          const float Li = L[ii], Di = D[ii];
#pragma omp simd
          for (int jj = lo; jj < jn; jj++) {
            const float pij = expf_vec(pr[jj] - Li);
            pr[jj] = pij;
            dr[jj] = pij * (dr[jj] - Di); /* dS / scale */
          }
          for (int jj = 0; jj < lo; jj++) pr[jj] = dr[jj] = 0.0f;
          for (int jj = jn > lo ? jn : lo; jj < nkb; jj++) pr[jj] = dr[jj] = 0.0f;
        }
        if (dv)
          tile_gemm(CblasTrans, CblasNoTrans, nkb, hd, nq, 1.0f, p, ATT_KC, gb, ldg, 1.0f, dvl, hd);
        if (dk)
          tile_gemm(CblasTrans, CblasNoTrans, nkb, hd, nq, scale, dp, ATT_KC, qb, ldq, 1.0f, dkl,
                    hd);
        if (dq)
          tile_gemm(CblasNoTrans, CblasNoTrans, nq, hd, nkb, scale, dp, ATT_KC, kc, ldk, 1.0f,
                    dqf + (size_t)i0 * lddq + (size_t)(h - h0) * hd, lddq);
      }
    for (int jj = 0; jj < nk; jj++) { /* the chunk's dk, dv rows are final */
      const int64_t o = (int64_t)(j0 + jj) * dkv_ld;
      if (acc) {
        if (dk) acc_row((float *)dk + o, dkl + jj * hd, hd);
        if (dv) acc_row((float *)dv + o, dvl + jj * hd, hd);
        continue;
      }
      if (dk) narrow_row(dt, tsr_dtype_at(dk, dt, o), dkl + jj * hd, hd);
      if (dv) narrow_row(dt, tsr_dtype_at(dv, dt, o), dvl + jj * hd, hd);
    }
  }
  if (dq && !acc && dt != TSR_F32)
    for (int t = 0; t < Tq; t++)
      narrow_row(dt, tsr_dtype_at(dq, dt, (int64_t)t * dq_ld + (int64_t)h0 * hd),
                 dqf + (size_t)t * dq_cols, dq_cols);
}

/* The backward of B sequences of Tq queries against Tk keys (query row i sees key row j
 * when j <= i + off): dq [.., dq_ld], dk, dv [.., dkv_ld] written as dt, or (acc) added to
 * as fp32. */
static void attn_bwd(tsr_dtype dt, int acc, void *dq, int dq_ld, void *dk, void *dv, int dkv_ld,
                     const void *dout, const void *out, const float *lse, const void *q,
                     const void *k, const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                     int q_stride, int kv_stride, int off, const int32_t *doc) {
  if (B <= 0 || Tq <= 0 || H <= 0) return;
  const int group = H / KV;
  const float scale = attn_scale(hd);
  const size_t out_stride = (size_t)H * hd;
  const tsr_dtype gdt = acc ? TSR_F32 : dt; /* the gradients' type */
  const long ntasks = (long)B * KV;
  if (dt != TSR_F32) cpu_buf_need(0, cpu_attention_buf_floats(acc ? 0 : Tq, group, hd));
#pragma omp parallel for schedule(dynamic, 1)
  for (long task = 0; task < ntasks; task++) {
    const int g = (int)(task % KV), b = (int)(task / KV);
    const int64_t qbase = (int64_t)b * Tq * q_stride;
    const int64_t kv = (int64_t)b * Tk * kv_stride + (int64_t)g * hd;
    const int64_t dkv = (int64_t)b * Tk * dkv_ld + (int64_t)g * hd;
    const int64_t ob = (int64_t)b * Tq * (int64_t)out_stride;
    attn_bwd_head(dt, acc, tsr_dtype_at(dq, gdt, (int64_t)b * Tq * dq_ld), (size_t)dq_ld,
                  tsr_dtype_at(dk, gdt, dkv), tsr_dtype_at(dv, gdt, dkv), (size_t)dkv_ld,
                  tsr_dtype_at_c(dout, dt, ob), tsr_dtype_at_c(out, dt, ob), out_stride,
                  lse + (size_t)b * H * Tq, tsr_dtype_at_c(q, dt, qbase), q_stride,
                  tsr_dtype_at_c(k, dt, kv), tsr_dtype_at_c(v, dt, kv), kv_stride, Tq, Tk, off,
                  hd, g * group, group, scale, doc ? doc + (size_t)b * Tq : NULL,
                  dt == TSR_F32 ? NULL : cpu_buf_thread());
  }
}

void tsr_cpu_attention_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                           const void *out, const float *lse, const void *q, const void *k,
                           const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                           const int32_t *doc) {
  attn_bwd(dt, 0, dq, qkv_stride, dk, dv, qkv_stride, dout, out, lse, q, k, v, B, T, T, H, KV, hd,
           qkv_stride, qkv_stride, 0, doc);
}

void tsr_cpu_attention_block_bwd(tsr_dtype dt, float *dq, float *dk, float *dv,
                                 const void *dout, const void *out, const float *lse,
                                 const void *q, const void *k, const void *v, int B, int Tq,
                                 int Tk, int H, int KV, int hd, int q_stride, int kv_stride,
                                 long q0, long k0, int causal, const int32_t *doc) {
  if (Tk <= 0 || (!dq && !dk && !dv)) return;
  const int off = block_off(Tq, Tk, q0, k0, causal);
  if (off <= -Tq) return; /* fully masked: nothing to add */
  attn_bwd(dt, 1, dq, H * hd, dk, dv, KV * hd, dout, out, lse, q, k, v, B, Tq, Tk, H, KV, hd,
           q_stride, kv_stride, off, doc);
}

/* ---------------------------------------------------------------- merge */

void tsr_cpu_attention_merge(float *out, float *lse, const float *o1, const float *lse1,
                             const float *o2, const float *lse2, int B, int T, int H, int hd) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  const long n = (long)B * T * H;
#pragma omp parallel for schedule(static)
  for (long idx = 0; idx < n; idx++) { /* idx = (b*T + t)*H + h: out's row order */
    const long row = idx / H, b = row / T, t = row % T;
    const int h = (int)(idx % H);
    const size_t st = ((size_t)b * H + h) * T + t, o = (size_t)idx * hd;
    float w1, w2, l;
    tsr_ops_attn_merge_weights(lse1[st], lse2[st], &w1, &w2, &l);
    for (int d = 0; d < hd; d++) out[o + d] = w1 * o1[o + d] + w2 * o2[o + d];
    lse[st] = l;
  }
}
