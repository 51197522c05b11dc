/* cp_attn.c — the ring's schedule of attention blocks on one process (cp_attn.h). */
#include "cp_attn.h"

typedef struct {
  int qc, kc;  /* query chunk, key chunk */
  int partial; /* cut by the diagonal (else fully visible) */
} ring_block;

/* The blocks the ring computes, in its order: at step s, each cp rank r's two query chunks
 * against the two key chunks of the rank whose keys it holds then; fully masked pairs left
 * out.  b holds 4 cp^2; returns how many. */
static int ring_blocks(int cp, int Tc, ring_block *b) {
  int n = 0;
  for (int s = 0; s < cp; s++)
    for (int r = 0; r < cp; r++)
      for (int a = 0; a < 2; a++)
        for (int e = 0; e < 2; e++) {
          int qc, kc;
          const int kind = tsr_cp_ring_block(cp, r, s, a, e, Tc, &qc, &kc);
          if (kind != TSR_ATT_BLOCK_SKIP)
            b[n++] = (ring_block){qc, kc, kind == TSR_ATT_BLOCK_PARTIAL};
        }
  return n;
}

void tsr_cp_attention_fwd_local(tsr_dtype dt, float *out, float *lse, float *scratch,
                                const void *q, const void *k, const void *v, int cp, int B,
                                int Tc, int H, int KV, int hd, int q_stride, int kv_stride) {
  if (cp <= 0 || B <= 0 || Tc <= 0) return;
  const long rows = (long)B * Tc, width = (long)H * hd;
  float *po = scratch, *pl = scratch + rows * width; /* one block's partial result */
  int seen[2 * cp]; /* a chunk's first block writes its result, later ones merge into it */
  for (int c = 0; c < 2 * cp; c++) seen[c] = 0;
  ring_block blocks[4 * cp * cp];
  const int n = ring_blocks(cp, Tc, blocks);
  for (int i = 0; i < n; i++) {
    const int qc = blocks[i].qc, kc = blocks[i].kc;
    float *o = out + qc * rows * width, *l = lse + qc * rows * H;
    const int first = !seen[qc]++;
    tsr_ops_attention_block_fwd(dt, first ? o : po, first ? l : pl,
                                tsr_dtype_at_c(q, dt, qc * rows * q_stride),
                                tsr_dtype_at_c(k, dt, kc * rows * kv_stride),
                                tsr_dtype_at_c(v, dt, kc * rows * kv_stride), B, Tc, Tc, H, KV, hd,
                                q_stride, kv_stride, (long)qc * Tc, (long)kc * Tc,
                                blocks[i].partial, NULL);
    if (!first) tsr_ops_attention_merge(o, l, o, l, po, pl, B, Tc, H, hd);
  }
}

void tsr_cp_attention_bwd_local(tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                                const void *out, const float *lse, const void *q, const void *k,
                                const void *v, int cp, int B, int Tc, int H, int KV, int hd,
                                int q_stride, int kv_stride) {
  if (cp <= 0 || B <= 0 || Tc <= 0) return;
  const long rows = (long)B * Tc, width = (long)H * hd, kvw = (long)KV * hd;
  ring_block blocks[4 * cp * cp];
  const int n = ring_blocks(cp, Tc, blocks);
  for (int i = 0; i < n; i++) {
    const int qc = blocks[i].qc, kc = blocks[i].kc;
    const long qo = qc * rows, ko = kc * rows;
    tsr_ops_attention_block_bwd(
        dt, dq ? dq + qo * width : NULL, dk ? dk + ko * kvw : NULL, dv ? dv + ko * kvw : NULL,
        tsr_dtype_at_c(dout, dt, qo * width), tsr_dtype_at_c(out, dt, qo * width),
        lse + qc * rows * H, tsr_dtype_at_c(q, dt, qo * q_stride),
        tsr_dtype_at_c(k, dt, ko * kv_stride), tsr_dtype_at_c(v, dt, ko * kv_stride), B, Tc, Tc,
        H, KV, hd, q_stride, kv_stride, (long)qc * Tc, (long)kc * Tc, blocks[i].partial, NULL);
  }
}
