/* cp_attn.h — context parallelism's attention without the communication: which chunks a
 * cp rank holds, and the ring's schedule of attention blocks played on one process.
 *
 * docs/context_parallel.md.  Each sequence of T = 2 cp Tc tokens is cut into 2 cp chunks
 * of Tc; cp rank r holds chunks r and 2 cp - 1 - r (one early, one late: every rank has the
 * same causal work).  In the ring, at step s = 0 .. cp-1 rank r holds the keys and values
 * of rank (r - s) mod cp and runs attention_block_fwd for each pair (its query chunk, a
 * held key chunk) that is not fully masked, merging into its running result
 * (attention_merge); the backward walks the same steps, adding into dq and into the dk,
 * dv that travel with the key block.
 *
 * The functions below do all cp ranks' work on one process, in the order the ring does
 * it (steps outer, ranks inner; within a rank its chunks in the order above), so a run
 * here sums every output in the ring's order: the single-rank reference of the ring, and
 * what the tests check against a whole-sequence attention.
 *
 * Layout, chunk-major: the 2 cp chunks of B sequences, chunk c's rows at (c B + b) Tc + t
 * (each chunk is a compact [B Tc] block: what the block ops take).  q rows q_stride apart,
 * k and v kv_stride apart (dt); out and dout [2 cp B Tc, H hd]; lse [2 cp][B H Tc] (chunk c
 * at c B H Tc, inside as attention_block_fwd's lse); dq [2 cp B Tc, H hd], dk and dv
 * [2 cp B Tc, KV hd], fp32. */
#ifndef TSR_CP_ATTN_H
#define TSR_CP_ATTN_H

#include "ops/ops.h"

/* chunk `which` (0: the early one, 1: the late one) of cp rank r, of 2 cp */
static inline int tsr_cp_chunk(int cp, int r, int which) { return which ? 2 * cp - 1 - r : r; }

/* The ring's block at step s of cp rank r: its query chunk qa (0, 1) against key chunk e
 * (0, 1) of the rank whose keys it holds then, (r - s) mod cp; *qc and *kc their chunk
 * numbers; returns tsr_ops_attn_block_kind's verdict (chunks of Tc tokens). */
static inline int tsr_cp_ring_block(int cp, int r, int s, int qa, int e, long Tc, int *qc,
                                    int *kc) {
  *qc = tsr_cp_chunk(cp, r, qa);
  *kc = tsr_cp_chunk(cp, ((r - s) % cp + cp) % cp, e);
  return tsr_ops_attn_block_kind(*qc * Tc, (int)Tc, *kc * Tc, (int)Tc);
}

/* The forward: out (fp32) and lse of every chunk's queries over the keys before them.
 * scratch: fp32 [B Tc (H hd + H)], one block's partial result. */
void tsr_cp_attention_fwd_local(tsr_dtype dt, float *out, float *lse, float *scratch,
                                const void *q, const void *k, const void *v, int cp, int B,
                                int Tc, int H, int KV, int hd, int q_stride, int kv_stride);

/* The backward, given the final out (dt), lse and dout: ADDS every block's terms into dq,
 * dk, dv (fp32; the caller zeroes them first for the gradient itself). */
void tsr_cp_attention_bwd_local(tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                                const void *out, const float *lse, const void *q, const void *k,
                                const void *v, int cp, int B, int Tc, int H, int KV, int hd,
                                int q_stride, int kv_stride);

#endif
