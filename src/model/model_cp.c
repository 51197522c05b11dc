/* model_cp.c — context parallelism in the model (docs/context_parallel.md): which rows of
 * a micro-batch a cp rank holds, their positions, and the attention across the split, by
 * a ring of key/value blocks (parallel.cp_comm = 'p2p') or by all-to-alls that trade the
 * sequence split for a head split (a2a, "Ulysses").
 *
 * A rank holds chunks r and 2 cp - 1 - r (cp_attn.h) of each of the B sequences of a
 * micro-batch, chunk-major: row (a B + b) Tc + t is token a-th chunk's t of sequence b.
 * Every op but the attention works row by row; the position ops take each row's offset
 * (slot doc: pos = r % Tc - doc[r]); the loss is the mean over the rank's rows, which the
 * caller sums over cp (dloss and the loss divide by dp x cp).
 *
 * The ring reproduces the schedule tsr_cp_attention_fwd_local / _bwd_local play on one
 * process (cp_attn.c) step for step, so its bits are theirs: at step s rank r holds the
 * keys and values of rank r - s, runs its two query chunks against the two key chunks
 * (the fully masked pair skipped) while the block moves on to r + 1, and merges each
 * partial result into the chunk's running one.  The backward moves the dK, dV sums with
 * the block; after cp hops they are home. */
#include <string.h>

#include "cp_attn.h"
#include "core/util.h"
#include "model_internal.h"

enum { TAG_KV = 0x6370, TAG_DKV = 0x6371 };

static int ring_next(const tsr_model *m) { return (m->cp_rank + 1) % m->cp; }
static int ring_prev(const tsr_model *m) { return (m->cp_rank + m->cp - 1) % m->cp; }

/* The a2a split of heads: H / cp query heads per rank; KVc KV heads, from kv_start(j). */
static int a2a_hc(const tsr_model *m) { return m->H / m->cp; }
static int a2a_kvc(const tsr_model *m) { return m->KV >= m->cp ? m->KV / m->cp : 1; }
static int a2a_kv_start(const tsr_model *m, int j) {
  return j * a2a_hc(m) / (m->H / m->KV); /* the KV head of rank j's first query head */
}

int model_cp_init(tsr_model *m, tsr_comm *cp) {
  const tsr_model_sizes *sz = &m->sz;
  m->cp = (int)sz->cp;
  m->Tc = (int)sz->Tc;
  m->Tseq = (int)(sz->T * sz->cp);
  m->Tpos = m->cp > 1 ? m->Tc : m->T;
  if (m->cp == 1) return 0;
  TSR_CHECK(cp && tsr_comm_size(cp) == m->cp, TSR_ERR,
            "model: parallel.cp = %d needs a cp group of that size (got %d)", m->cp,
            cp ? tsr_comm_size(cp) : 0);
  m->cpc = cp;
  m->cp_rank = tsr_comm_rank(cp);
  m->cp_a2a = sz->cp_a2a;
  m->cp_in = tsr_calloc((size_t)m->N, sizeof(int32_t));
  m->cp_tg = tsr_calloc((size_t)m->N, sizeof(int32_t));
  m->cp_doc_host = tsr_calloc((size_t)sz->docs, sizeof(int32_t));
  TSR_CHECK(m->cp_in && m->cp_tg && m->cp_doc_host, TSR_ERR, "out of memory");
  if (sz->cp_dt && !(m->cp_dt = tsr_ops_alloc((size_t)sz->cp_dt, m->esz))) return TSR_ERR;
  if (sz->cp_f32 && !(m->cp_f32 = tsr_ops_alloc((size_t)sz->cp_f32, sizeof(float))))
    return TSR_ERR;
  if (!m->docmask) { /* the positions do not change: every slot's, once */
    model_cp_docs(m, &m->slots[0], NULL);
    for (int s = 1; s < m->n_slots; s++)
      tsr_ops_copy(slot_doc(m, &m->slots[s]), slot_doc(m, &m->slots[0]),
                   (size_t)m->N * sizeof(int32_t));
  }
  return 0;
}

void model_cp_rows(const tsr_model *m, int32_t *dst, const int32_t *src) {
  for (int a = 0; a < 2; a++) {
    const int c = tsr_cp_chunk(m->cp, m->cp_rank, a);
    for (int b = 0; b < m->B; b++)
      memcpy(dst + ((size_t)a * m->B + b) * m->Tc, src + (size_t)b * m->Tseq + (size_t)c * m->Tc,
             (size_t)m->Tc * sizeof(int32_t));
  }
}

/* starts: the micro-batch's document starts [B, Tseq] (host), or NULL: one document a
 * sequence.  Row r of the rank at global position p = c Tc + t gets doc[r] = t - pos,
 * pos = p - start.  With documents there follow, for the a2a attention, the whole starts;
 * for the ring, for each of the rank's 2 query chunks and each of the 2 cp key chunks kc,
 * its rows' starts in kc's rows ([B Tc] each, clamped to [0, Tc]: the block ops' doc). */
void model_cp_docs(tsr_model *m, struct act_slot *sl, const int32_t *starts) {
  int32_t *d = m->cp_doc_host;
  for (int a = 0; a < 2; a++) {
    const int c = tsr_cp_chunk(m->cp, m->cp_rank, a);
    for (int b = 0; b < m->B; b++)
      for (int t = 0; t < m->Tc; t++) {
        const int p = c * m->Tc + t;
        const int start = starts ? starts[(size_t)b * m->Tseq + p] : 0;
        d[((size_t)a * m->B + b) * m->Tc + t] = t - (p - start);
      }
  }
  size_t n = (size_t)m->N;
  if (starts && m->cp_a2a) {
    memcpy(d + m->N, starts, (size_t)m->B * m->Tseq * sizeof(int32_t));
    n += (size_t)m->B * m->Tseq;
  } else if (starts) {
    for (int a = 0; a < 2; a++) {
      const int c = tsr_cp_chunk(m->cp, m->cp_rank, a);
      for (int kc = 0; kc < 2 * m->cp; kc++) {
        int32_t *bd = d + n + (size_t)(a * 2 * m->cp + kc) * m->B * m->Tc;
        for (int b = 0; b < m->B; b++)
          for (int t = 0; t < m->Tc; t++) {
            const int j = starts[(size_t)b * m->Tseq + c * m->Tc + t] - kc * m->Tc;
            bd[(size_t)b * m->Tc + t] = j < 0 ? 0 : j > m->Tc ? m->Tc : j;
          }
      }
    }
    n += (size_t)4 * m->cp * m->B * m->Tc;
  }
  tsr_ops_copy(slot_doc(m, sl), d, n * sizeof(int32_t));
}

/* ------------------------------------------------------------------ the ring (p2p) */

/* Sends *cur on to the next rank and receives the previous rank's into *nxt. */
static int ring_pass(tsr_model *m, const void *cur, void *nxt, size_t bytes, int tag,
                     tsr_comm_handle h[2]) {
  TSR_CALL(tsr_comm_irecv(m->cpc, nxt, bytes, ring_prev(m), tag, &h[0]));
  return tsr_comm_isend(m->cpc, cur, bytes, ring_next(m), tag, &h[1]);
}

/* The K|V block of this rank's rows: [N, 2 KV hd] (k then v, as in the fused qkv row). */
/* With documents, query chunk qa's starts in the rows of key chunk kc (model_cp_docs). */
static const int32_t *block_doc(const tsr_model *m, int qa, int kc) {
  return m->doc_full ? m->doc_full + (size_t)(qa * 2 * m->cp + kc) * m->B * m->Tc : NULL;
}

static void pack_kv(tsr_model *m, void *kv, const void *qkv) {
  const long kvd = (long)m->KV * m->hd, esz = (long)m->esz;
  tsr_ops_copy_2d(kv, 2 * kvd * esz, tsr_dtype_at_c(qkv, m->dt, (long)m->H * m->hd),
                  (long)m->qkv_dim * esz, 2 * kvd * esz, m->N);
}

static int ring_fwd(tsr_model *m, layer_acts *a) {
  const tsr_dtype dt = m->dt;
  const int cp = m->cp, r = m->cp_rank, B = m->B, Tc = m->Tc, H = m->H, KV = m->KV, hd = m->hd;
  const long rows = (long)B * Tc, qd = (long)H * hd, kvd = (long)KV * hd, N = m->N;
  void *kv[2] = {m->cp_dt, A(m, m->cp_dt, N * 2 * kvd)};
  float *out = m->cp_f32, *po = out + N * qd, *pl = po + rows * qd;
  pack_kv(m, kv[0], a->qkv);
  const size_t kv_bytes = (size_t)N * 2 * kvd * m->esz;
  for (int s = 0, cur = 0; s < cp; s++, cur ^= 1) {
    tsr_comm_handle h[2] = {NULL, NULL};
    if (s < cp - 1) TSR_CALL(ring_pass(m, kv[cur], kv[cur ^ 1], kv_bytes, TAG_KV, h));
    for (int qa = 0; qa < 2; qa++)
      for (int e = 0; e < 2; e++) {
        int qc, kc;
        const int kind = tsr_cp_ring_block(cp, r, s, qa, e, Tc, &qc, &kc);
        if (kind == TSR_ATT_BLOCK_SKIP) continue;
        float *o = out + qa * rows * qd, *l = a->lse + qa * rows * H;
        /* step 0's own early key chunk is the first block of both query chunks (with
         * documents a row may see none of it: lse -inf, which the merges pass over) */
        const int first = s == 0 && e == 0;
        const void *kb = tsr_dtype_at_c(kv[cur], dt, e * rows * 2 * kvd);
        tsr_ops_attention_block_fwd(dt, first ? o : po, first ? l : pl,
                                    tsr_dtype_at_c(a->qkv, dt, qa * rows * m->qkv_dim), kb,
                                    tsr_dtype_at_c(kb, dt, kvd), B, Tc, Tc, H, KV, hd,
                                    m->qkv_dim, (int)(2 * kvd), (long)qc * Tc, (long)kc * Tc,
                                    kind == TSR_ATT_BLOCK_PARTIAL, block_doc(m, qa, kc));
        if (!first) tsr_ops_attention_merge(o, l, o, l, po, pl, B, Tc, H, hd);
      }
    TSR_CALL(tsr_comm_waitall(2, h));
  }
  tsr_ops_cast(dt, a->atty, TSR_F32, out, N * qd);
  return 0;
}

static int ring_bwd(tsr_model *m, void *d_qkv, const layer_acts *a) {
  const tsr_dtype dt = m->dt;
  const int cp = m->cp, r = m->cp_rank, B = m->B, Tc = m->Tc, H = m->H, KV = m->KV, hd = m->hd;
  const long rows = (long)B * Tc, qd = (long)H * hd, kvd = (long)KV * hd, N = m->N;
  const long esz = (long)m->esz;
  void *kv[2] = {m->cp_dt, A(m, m->cp_dt, N * 2 * kvd)};
  void *tmp = A(m, m->cp_dt, 2 * N * 2 * kvd);
  float *dq = m->cp_f32, *dkv0 = dq + N * qd + rows * qd + (long)B * H * Tc;
  float *dkv[2] = {dkv0, dkv0 + N * 2 * kvd}; /* [dK: N kvd][dV: N kvd] each */
  tsr_ops_zero(dq, (size_t)(N * qd) * sizeof(float));
  tsr_ops_zero(dkv[0], (size_t)(N * 2 * kvd) * sizeof(float));
  pack_kv(m, kv[0], a->qkv);
  const size_t kv_bytes = (size_t)N * 2 * kvd * m->esz, dkv_bytes = (size_t)N * 2 * kvd * 4;
  int cur = 0;
  for (int s = 0; s < cp; s++, cur ^= 1) {
    tsr_comm_handle h[4] = {NULL, NULL, NULL, NULL};
    if (s < cp - 1) TSR_CALL(ring_pass(m, kv[cur], kv[cur ^ 1], kv_bytes, TAG_KV, h));
    for (int qa = 0; qa < 2; qa++)
      for (int e = 0; e < 2; e++) {
        int qc, kc;
        const int kind = tsr_cp_ring_block(cp, r, s, qa, e, Tc, &qc, &kc);
        if (kind == TSR_ATT_BLOCK_SKIP) continue;
        const long qo = qa * rows;
        const void *kb = tsr_dtype_at_c(kv[cur], dt, e * rows * 2 * kvd);
        tsr_ops_attention_block_bwd(
            dt, dq + qo * qd, dkv[cur] + e * rows * kvd, dkv[cur] + N * kvd + e * rows * kvd,
            tsr_dtype_at_c(m->d_atty, dt, qo * qd), tsr_dtype_at_c(a->atty, dt, qo * qd),
            a->lse + qo * H, tsr_dtype_at_c(a->qkv, dt, qo * m->qkv_dim), kb,
            tsr_dtype_at_c(kb, dt, kvd), B, Tc, Tc, H, KV, hd, m->qkv_dim, (int)(2 * kvd),
            (long)qc * Tc, (long)kc * Tc, kind == TSR_ATT_BLOCK_PARTIAL, block_doc(m, qa, kc));
      }
    /* the sums go on with their block; after the last step, home */
    TSR_CALL(ring_pass(m, dkv[cur], dkv[cur ^ 1], dkv_bytes, TAG_DKV, h + 2));
    TSR_CALL(tsr_comm_waitall(4, h));
  }
  /* after cp passes the sums of this rank's own keys are in dkv[cur] */
  tsr_ops_cast(dt, tmp, TSR_F32, dq, N * qd);
  tsr_ops_copy_2d(d_qkv, (long)m->qkv_dim * esz, tmp, qd * esz, qd * esz, N);
  for (int kvp = 0; kvp < 2; kvp++) { /* dK, then dV */
    tsr_ops_cast(dt, tmp, TSR_F32, dkv[cur] + kvp * N * kvd, N * kvd);
    tsr_ops_copy_2d(tsr_dtype_at(d_qkv, dt, qd + kvp * kvd), (long)m->qkv_dim * esz, tmp,
                    kvd * esz, kvd * esz, N);
  }
  return 0;
}

/* ------------------------------------------------------------------ all-to-all (a2a) */

/* The whole-sequence rows of rank i's chunks: its chunk-major block [2][B][Tc][w] and
 * the natural [B][Tseq][w] rows, copied one way (to_whole) or the other. */
static void a2a_place(tsr_model *m, void *whole, void *block, int i, long w, int to_whole) {
  const long esz = (long)m->esz, Tc = m->Tc;
  for (int a = 0; a < 2; a++) {
    const int c = tsr_cp_chunk(m->cp, i, a);
    void *wp = tsr_dtype_at(whole, m->dt, (long)c * Tc * w);
    void *bp = tsr_dtype_at(block, m->dt, (long)a * m->B * Tc * w);
    if (to_whole)
      tsr_ops_copy_2d(wp, (long)m->Tseq * w * esz, bp, Tc * w * esz, Tc * w * esz, m->B);
    else
      tsr_ops_copy_2d(bp, Tc * w * esz, wp, (long)m->Tseq * w * esz, Tc * w * esz, m->B);
  }
}

/* The a2a's send and receive blocks (cp_dt, after q|k|v and its gradient: a2a_bufs),
 * each room for [Nf, (Hc + 2 KVc) hd]. */
static void a2a_stage(tsr_model *m, void **send, void **recv) {
  const long Nf = (long)m->N * m->cp, W = (long)(a2a_hc(m) + 2 * a2a_kvc(m)) * m->hd;
  *send = A(m, m->cp_dt, 2 * Nf * W);
  *recv = A(m, m->cp_dt, 3 * Nf * W);
}

/* Sequence split -> head split: of this rank's rows of `src` (columns [c0 + j w0, +w0) for
 * rank j, `src` rows src_w apart; and kv: also [k0 + kv_start(j) hd, + KVc hd) twice,
 * k then v), every rank gets its columns of every rank's rows, placed in whole sequences
 * [B][Tseq][W] in `whole`.  W = (Hc + 2 KVc) hd with kv, Hc hd without. */
static int a2a_to_heads(tsr_model *m, void *whole, const void *src, long src_w, int kv) {
  const int cp = m->cp, Hc = a2a_hc(m), KVc = a2a_kvc(m), hd = m->hd;
  const long esz = (long)m->esz, N = m->N, qd = (long)m->H * hd, kvd = (long)m->KV * hd;
  const long W = kv ? (long)(Hc + 2 * KVc) * hd : (long)Hc * hd;
  void *send, *recv;
  a2a_stage(m, &send, &recv);
  for (int j = 0; j < cp; j++) {
    void *blk = A(m, send, j * N * W);
    tsr_ops_copy_2d(blk, W * esz, tsr_dtype_at_c(src, m->dt, (long)j * Hc * hd), src_w * esz,
                    (long)Hc * hd * esz, N);
    if (!kv) continue;
    const long ks = (long)a2a_kv_start(m, j) * hd;
    for (int kvp = 0; kvp < 2; kvp++)
      tsr_ops_copy_2d(A(m, blk, (long)(Hc + kvp * KVc) * hd), W * esz,
                      tsr_dtype_at_c(src, m->dt, qd + kvp * kvd + ks), src_w * esz,
                      (long)KVc * hd * esz, N);
  }
  TSR_CALL(tsr_comm_all_to_all(m->cpc, send, recv, (size_t)(N * W * esz)));
  for (int i = 0; i < cp; i++) a2a_place(m, whole, A(m, recv, i * N * W), i, W, 1);
  return 0;
}

/* Head split -> sequence split: out [B][Tseq][Hc hd] (this rank's heads) back to every
 * rank's rows; this rank's rows of all heads into dst [N][H hd]. */
static int a2a_out_to_rows(tsr_model *m, void *dst, void *whole) {
  const int cp = m->cp, Hc = a2a_hc(m), hd = m->hd;
  const long esz = (long)m->esz, N = m->N, w = (long)Hc * hd;
  void *send, *recv;
  a2a_stage(m, &send, &recv);
  for (int i = 0; i < cp; i++) a2a_place(m, whole, A(m, send, i * N * w), i, w, 0);
  TSR_CALL(tsr_comm_all_to_all(m->cpc, send, recv, (size_t)(N * w * esz)));
  for (int j = 0; j < cp; j++)
    tsr_ops_copy_2d(tsr_dtype_at(dst, m->dt, j * w), (long)m->H * hd * esz, A(m, recv, j * N * w),
                    w * esz, w * esz, N);
  return 0;
}

/* The a2a buffers (cp_dt): q|k|v of whole sequences [Nf, W], its gradient, the send and
 * receive blocks, out and dout of whole sequences [Nf, Hc hd]. */
static void a2a_bufs(tsr_model *m, void **qkv, void **dqkv, void **out, void **dout) {
  const long Nf = (long)m->N * m->cp, W = (long)(a2a_hc(m) + 2 * a2a_kvc(m)) * m->hd;
  const long w = (long)a2a_hc(m) * m->hd;
  *qkv = m->cp_dt;
  *dqkv = A(m, m->cp_dt, Nf * W);
  *out = A(m, m->cp_dt, 4 * Nf * W);
  *dout = A(m, m->cp_dt, 4 * Nf * W + Nf * w);
}

static int a2a_fwd(tsr_model *m, layer_acts *a) {
  const int Hc = a2a_hc(m), KVc = a2a_kvc(m), hd = m->hd;
  const long W = (long)(Hc + 2 * KVc) * hd;
  void *g, *dg, *o, *dout;
  a2a_bufs(m, &g, &dg, &o, &dout);
  TSR_CALL(a2a_to_heads(m, g, a->qkv, m->qkv_dim, 1));
  /* lse: [B][Hc][Tseq], the same count as the rank's [B H T] */
  tsr_ops_attention_fwd(m->dt, o, a->lse, g, A(m, g, (long)Hc * hd),
                        A(m, g, (long)(Hc + KVc) * hd), m->B, m->Tseq, Hc, KVc, hd, (int)W,
                        m->doc_full);
  return a2a_out_to_rows(m, a->atty, o);
}

static int a2a_bwd(tsr_model *m, void *d_qkv, const layer_acts *a) {
  const int cp = m->cp, Hc = a2a_hc(m), KVc = a2a_kvc(m), hd = m->hd;
  const long esz = (long)m->esz, N = m->N, W = (long)(Hc + 2 * KVc) * hd;
  const long qd = (long)m->H * hd, kvd = (long)m->KV * hd;
  void *g, *dg, *o, *dout;
  a2a_bufs(m, &g, &dg, &o, &dout);
  /* q, k, v, out and dout of this rank's heads over whole sequences, again */
  TSR_CALL(a2a_to_heads(m, g, a->qkv, m->qkv_dim, 1));
  TSR_CALL(a2a_to_heads(m, o, a->atty, qd, 0));
  TSR_CALL(a2a_to_heads(m, dout, m->d_atty, qd, 0));
  tsr_ops_attention_bwd(m->dt, dg, A(m, dg, (long)Hc * hd), A(m, dg, (long)(Hc + KVc) * hd),
                        dout, o, a->lse, g, A(m, g, (long)Hc * hd), A(m, g, (long)(Hc + KVc) * hd),
                        m->B, m->Tseq, Hc, KVc, hd, (int)W, m->doc_full);
  /* back to rows: every rank's rows of dq|dk|dv of this rank's heads */
  void *send, *recv;
  a2a_stage(m, &send, &recv);
  for (int i = 0; i < cp; i++) a2a_place(m, dg, A(m, send, i * N * W), i, W, 0);
  TSR_CALL(tsr_comm_all_to_all(m->cpc, send, recv, (size_t)(N * W * esz)));
  const long pitch = (long)m->qkv_dim * esz;
  for (int j = 0; j < cp; j++) {
    const void *blk = A(m, recv, j * N * W);
    tsr_ops_copy_2d(tsr_dtype_at(d_qkv, m->dt, (long)j * Hc * hd), pitch, blk, W * esz,
                    (long)Hc * hd * esz, N);
    if (m->KV >= cp) /* rank j's KV heads are its own */
      for (int kvp = 0; kvp < 2; kvp++)
        tsr_ops_copy_2d(tsr_dtype_at(d_qkv, m->dt, qd + kvp * kvd + (long)a2a_kv_start(m, j) * hd),
                        pitch, tsr_dtype_at_c(blk, m->dt, (long)(Hc + kvp * KVc) * hd), W * esz,
                        (long)KVc * hd * esz, N);
  }
  if (m->KV >= cp) return 0;
  /* KV heads replicated over cp ranks: each head's gradient is the sum of its ranks', in
   * rank order, in fp32: sums [KV][N][2 hd], then each into d_qkv's k and v columns */
  float *sum = m->cp_f32, *one = sum + (long)m->KV * N * 2 * hd;
  void *tmp = send; /* free again: [N][2 hd] */
  tsr_ops_zero(sum, (size_t)m->KV * N * 2 * hd * sizeof(float));
  for (int j = 0; j < cp; j++) {
    tsr_ops_copy_2d(tmp, 2L * hd * esz, tsr_dtype_at_c(recv, m->dt, j * N * W + (long)Hc * hd),
                    W * esz, 2L * hd * esz, N);
    tsr_ops_cast(TSR_F32, one, m->dt, tmp, N * 2 * hd);
    tsr_ops_acc(sum + (long)a2a_kv_start(m, j) * N * 2 * hd, one, N * 2 * hd);
  }
  for (int g2 = 0; g2 < m->KV; g2++) {
    tsr_ops_cast(m->dt, tmp, TSR_F32, sum + (long)g2 * N * 2 * hd, N * 2 * hd);
    for (int kvp = 0; kvp < 2; kvp++)
      tsr_ops_copy_2d(tsr_dtype_at(d_qkv, m->dt, qd + kvp * kvd + (long)g2 * hd), pitch,
                      A(m, tmp, (long)kvp * hd), 2L * hd * esz, (long)hd * esz, N);
  }
  return 0;
}

int model_cp_attention_fwd(tsr_model *m, layer_acts *a) {
  return m->cp_a2a ? a2a_fwd(m, a) : ring_fwd(m, a);
}

int model_cp_attention_bwd(tsr_model *m, void *d_qkv, const layer_acts *a) {
  return m->cp_a2a ? a2a_bwd(m, d_qkv, a) : ring_bwd(m, d_qkv, a);
}
