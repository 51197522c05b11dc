/* plan_cost.c — what one micro-batch costs in one pipeline chunk on one GPU (plan_sim.h),
 * kernel by kernel as model_layer.c and model.c call them, priced by the machine's
 * profile (plan_profile.h).
 *
 * A layer of N = micro_batch x seq_len tokens on a tp rank (sizes from tsr_model_sizes_of,
 * the model's own; Ns of them in the residual stream, N / tp with sequence parallelism):
 *   forward   GEMMs qkv [N, C] -> qkv_dim, out [N, H hd] -> C, up [N, C] -> fc_dim, down
 *             [N, F] -> C; causal attention over the rank's heads; element-wise: the first
 *             norm (2 Ns C values moved), RoPE on q and k (llama: 2 N (H + KV) hd), the
 *             residual add fused into the second norm (4 Ns C), the MLP activation
 *             (SwiGLU 3 N F, GELU 2 N F), the closing residual add (3 Ns C);
 *   backward  every GEMM's input gradient (B) and weight gradient (W), each the forward's
 *             FLOPs; attention's backward; the activation's backward (SwiGLU 5 N F; GELU's
 *             rides in the down GEMM's), two norm backwards adding to the stream (4 Ns C
 *             each), RoPE's (llama); a split backward keeps two [N, C] output gradients
 *             for W (2 copies);
 *   recompute 'full' runs the forward again before the backward, 'selective' the norms
 *             and the activation;
 *   tp        without sequence parallelism two all-reduces of the [N, C] activation in
 *             forward and two in backward (Megatron's count), with it an all-gather and a
 *             reduce-scatter in place of each, the norms' weight gradients all-reduced
 *             and, with recomputation, the norm outputs gathered again; replicated KV
 *             heads all-reduce their weight gradient; all inside a node, less the
 *             profile's tp_overlap.
 * Chunk 0 adds the embedding lookup and its backward (and its vocab-parallel sum over tp);
 * the last chunk the final norm, the LM head's GEMMs and the fused cross-entropy (three
 * reads and a write of the [N, V] logits, in the forward: model.c computes the loss and
 * its gradient there), and the head's input-gradient sum over tp.  Values are in the
 * storage type (2 bytes for bf16 and fp16, 4 for fp32).  Document masking scales the
 * attention's time by the share of its pairs it computes (tsr_plan_doc_attention_share).  Norm statistics, biases and
 * the optimizer are left out here; plan_sim.c prices AdamW.  With train.activation_offload
 * on a GPU each layer's block crosses PCIe once in the forward and once in the backward
 * (and once more in a split backward's W pass), overlapping the next layer
 * (tsr_plan_act_offload_s): what it does not hide is added. */
#include "plan_sim.h"

#include <math.h>
#include <string.h>

#include "model/model.h"
#include "sched/pipeline.h"
#include "core/util.h"

typedef struct {
  const tsr_hardware *hw;
  int half;
  double e;  /* bytes per stored value */
  tsr_plan_chunk *out;
  double attn_share; /* of the causal attention's pairs, what document masking computes */
  int cp, a2a;       /* context-parallel ranks of a sequence; all-to-alls (else the ring) */
  int cp_link;       /* the cp group's link (TSR_LINK_*) */
  tsr_plan_cp_elems cpx; /* what a cp rank sends per layer (plan.c) */
} pricer;

/* (plan.h; here, below plan.c, which prices the stages with this file's costs) */
double tsr_plan_doc_attention_share(const tsr_config *cfg) {
  const double L = (double)cfg->data.mean_doc_tokens, T = (double)cfg->model.seq_len;
  if (!cfg->data.document_mask || L <= 0 || T <= 0) return 1.0;
  if (L <= 1) return 2.0 / (T + 1.0); /* every token its own document */
  const double p = 1.0 / L, q = 1.0 - p;
  const double one_minus_qT = -expm1(T * log1p(-p)); /* 1 - q^T */
  const double pairs = (T - q * one_minus_qT / p) / p;
  const double share = pairs / (T * (T + 1.0) / 2.0);
  return share < 0 ? 0 : share > 1 ? 1 : share;
}

/* (plan_sim.h; here, below plan.c and plan_sim.c, which use it and the two after it)
 * model.c's own sizes (tsr_model_sizes_of) on a cp rank, which holds seq_len / cp tokens
 * of each sequence: its activations, the recompute target and gradient scratch, the
 * pipeline's messages, the tensor-parallel collectives and the GEMMs' rows all scale with
 * those, and the attention's exchange buffers are its own (cp_dt, cp_f32).  The one place
 * the planner reads the model's sizes. */
void tsr_plan_model_sizes(const tsr_config *cfg, int tp, int cp, int first, int last,
                          int layers_per_chunk, tsr_model_sizes *out) {
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, cfg);
  spec.cp = cp; /* the grid's (a search candidate's) */
  tsr_model_sizes_of(out, &spec, tp, first, last, layers_per_chunk);
}

/* The cp group per micro-batch and layer (docs/context_parallel.md "What the planner
 * counts"; d: a cp rank's sizes, N = B T / cp tokens, H and KV its tp rank's heads, e the
 * storage type's bytes):
 *   p2p  the ring: a rank's K and V, 2 N KV hd elements, go round cp - 1 hops in the
 *        forward (sent and received: comm.c counts both); in the backward K and V again
 *        cp - 1 hops and their fp32 gradient sums dK, dV cp hops (the last one home);
 *   a2a  all-to-alls of (cp - 1) / cp of a tensor each (comm.c: cp - 1 blocks of a peer's
 *        share): forward q, k, v to the head split and out back, (cp - 1) N hd (2 H / cp +
 *        2 KVc) e with KVc = KV / cp, or 1 when cp is a multiple of KV (a peer's KV
 *        head); backward q, k, v, out, dout to the head split and dq, dk, dv back, all in
 *        the storage type, (cp - 1) N hd (4 H / cp + 4 KVc) e;
 * recompute 'full' runs each layer's forward again, its traffic too (plan.c's cp_traffic
 * counts them per step; cp_extra below prices them). */
void tsr_plan_cp_layer(const tsr_config *cfg, const tsr_plan_grid *g, const tsr_model_sizes *d,
                       tsr_plan_cp_elems *x) {
  memset(x, 0, sizeof *x);
  if (g->cp <= 1) return;
  const double N = (double)d->N, hd = (double)d->hd, cp = g->cp;
  if (cfg->parallel.cp_comm == TSR_CP_A2A) {
    const double Hc = (double)d->H / cp, KVc = d->KV % g->cp ? 1 : (double)d->KV / cp;
    x->fwd = (cp - 1) * N * hd * (2 * Hc + 2 * KVc);
    x->bwd = (cp - 1) * N * hd * (4 * Hc + 4 * KVc);
    x->calls_fwd = 4, x->calls_bwd = 8;
    return;
  }
  x->block = 2 * N * (double)d->KV * hd;
  x->fwd = (cp - 1) * x->block;
  x->bwd = (cp - 1) * x->block;
  x->bwd32 = cp * x->block;
}

/* (plan_sim.h) */
int tsr_plan_group_link(int size, long span, int rpn) {
  return size > 1 && (span > rpn || rpn % span) ? TSR_LINK_INTER : TSR_LINK_INTRA;
}

static double gemm(pricer *pr, double m, double n, double k) {
  const double t = tsr_plan_gemm_s(pr->hw, pr->half, m, n, k);
  pr->out->gemm += t;
  return t;
}
static double mem(pricer *pr, double values, double kernels) {
  const double t = tsr_plan_memory_s(pr->hw, values * pr->e, kernels);
  pr->out->memory += t;
  return t;
}
/* The causal attention core of one layer on a cp rank (d: its sizes, T = seq_len / cp).
 * Without cp: the whole sequence.  a2a: the whole sequence (cp T) on H / cp heads.  p2p:
 * the ring's blocks of Tc = T / 2 queries and keys, 2 cp - 1 whole ones and 2 cut by the
 * diagonal (docs/context_parallel.md), 4 cp causal Tc-triangles' worth in 2 cp + 1 kernel
 * calls (step 0: 3 blocks, every later step 2), priced at the block's length. */
static double attention(pricer *pr, const tsr_model_sizes *d, int backward) {
  const tsr_hardware *hw = pr->hw;
  const double B = (double)d->B, H = (double)d->H, T = (double)d->T, hd = (double)d->hd;
  double t;
  if (pr->cp <= 1) {
    t = tsr_plan_attention_s(hw, pr->half, backward, B, H, T, hd);
  } else if (pr->a2a) {
    t = tsr_plan_attention_s(hw, pr->half, backward, B, H / pr->cp, T * pr->cp, hd);
  } else {
    const double Tc = T / 2, k = hw->prof.kernel_s;
    t = 4 * pr->cp * (tsr_plan_attention_s(hw, pr->half, backward, B, H, Tc, hd) - k) +
        (2 * pr->cp + 1) * k;
  }
  t *= pr->attn_share;
  pr->out->attention += t;
  return t;
}

/* What cp adds to one layer besides the attention core, seconds of element-wise work (into
 * the chunk's time), and in *exposed the cp group's transfers left on the critical path
 * (docs/context_parallel.md "What the planner counts"; the elements are plan.c's,
 * tsr_plan_cp_layer).  p2p: at each of the ring's cp steps a rank computes the blocks in
 * hand, 1 / cp of the layer's attention `att`, while the next block travels: cp - 1 hops
 * (the K and V of a rank's tokens, in the backward with their fp32 dK, dV), each exposed
 * by what it takes beyond its step's attention, and in the backward one more hop of the
 * dK, dV, home, after the last step; the forward merges a block's fp32 partial result
 * into the running one 2 cp - 1 times (out and lse of B Tc rows read twice, written
 * once).  a2a: the all-to-alls (cp - 1 messages each), not overlapped, and their packing
 * (every tensor they move read and written once more). */
static double cp_extra(pricer *pr, const tsr_model_sizes *d, int backward, double att,
                       double *exposed) {
  *exposed = 0;
  if (pr->cp <= 1) return 0;
  const tsr_hardware *hw = pr->hw;
  const tsr_plan_cp_elems *x = &pr->cpx;
  const double cp = pr->cp, e = pr->e;
  if (pr->a2a) {
    const double elems = backward ? x->bwd : x->fwd;
    const int calls = backward ? x->calls_bwd : x->calls_fwd;
    *exposed = tsr_plan_link_s(hw, pr->cp_link, elems * e, calls * (cp - 1));
    return mem(pr, 2 * elems * cp / (cp - 1), 2 * calls);
  }
  const double step = att / cp;
  if (!backward) {
    *exposed = (cp - 1) * fmax(0, tsr_plan_link_s(hw, pr->cp_link, x->block * e, 1) - step);
    const double rows = (double)d->B * (double)d->T / 2; /* B Tc */
    const double merge = tsr_plan_memory_s(hw, 3 * rows * (double)d->H * ((double)d->hd + 1) * 4, 1);
    pr->out->memory += (2 * cp - 1) * merge;
    return (2 * cp - 1) * merge;
  }
  const double hop = tsr_plan_link_s(hw, pr->cp_link, x->block * (e + 4), 2);
  *exposed = (cp - 1) * fmax(0, hop - step) + tsr_plan_link_s(hw, pr->cp_link, x->block * 4, 1);
  return 0;
}

/* Tensor-parallel collectives of one layer (or of the ends), seconds before the overlap. */
typedef struct {
  double ar, gather; /* one all-reduce, one all-gather or reduce-scatter of [N, C] */
} tp_prices;

/* *cp_s: the cp group's exposed transfers (cp_extra). */
static double layer_forward(pricer *pr, const tsr_model_sizes *d, const tp_prices *tp,
                            double *tp_s, double *cp_s) {
  const double N = (double)d->N, Ns = (double)d->Ns, C = (double)d->C, F = (double)d->F;
  const double qd = (double)(d->H * d->hd);
  const double rope = d->gpt2 ? 0 : 2 * N * (double)(d->H + d->KV) * (double)d->hd;
  const double att = attention(pr, d, 0);
  double cp = 0;
  double t = gemm(pr, N, (double)d->qkv_dim, C) + gemm(pr, N, C, qd) +
             gemm(pr, N, (double)d->fc_dim, C) + gemm(pr, N, C, F) + att;
  t += mem(pr, (2 + 4 + 3) * Ns * C + (d->gpt2 ? 2 : 3) * N * F + rope, d->gpt2 ? 4 : 6);
  t += cp_extra(pr, d, 0, att, &cp);
  *tp_s += d->sp ? 4 * tp->gather : 2 * tp->ar;
  *cp_s += cp;
  return t;
}

/* B: input gradients; *w: weight gradients (W); *cp_s as in layer_forward. */
static double layer_backward(pricer *pr, const tsr_model_sizes *d, int split, double *w,
                             double *cp_s) {
  const double N = (double)d->N, Ns = (double)d->Ns, C = (double)d->C, F = (double)d->F;
  const double qd = (double)(d->H * d->hd);
  const double rope = d->gpt2 ? 0 : 2 * N * (double)(d->H + d->KV) * (double)d->hd;
  const double att = attention(pr, d, 1);
  double cp = 0;
  double t = gemm(pr, N, (double)d->qkv_dim, C) + gemm(pr, N, C, qd) +
             gemm(pr, N, (double)d->fc_dim, C) + gemm(pr, N, C, F) + att;
  t += mem(pr, (d->gpt2 ? 0 : 5 * N * F) + 8 * Ns * C + rope + (split ? 4 * N * C : 0),
           (d->gpt2 ? 2 : 5) + (split ? 2 : 0));
  t += cp_extra(pr, d, 1, att, &cp);
  *cp_s += cp;
  *w = gemm(pr, (double)d->qkv_dim, C, N) + gemm(pr, C, qd, N) + gemm(pr, (double)d->fc_dim, C, N) +
       gemm(pr, C, F, N);
  return t;
}

/* Parameters of one layer and of the end units on a tp rank (weights, norms, biases). */
static double layer_elems(const tsr_model_sizes *d) {
  const double C = (double)d->C, qd = (double)(d->H * d->hd);
  double n = C * (double)d->qkv_dim + qd * C + C * (double)d->fc_dim + (double)d->F * C + 2 * C;
  if (d->gpt2) n += 2 * C + (double)d->qkv_dim + C + (double)d->fc_dim + C;
  return n;
}

int tsr_plan_chunk_cost(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_grid *g,
                        int chunk, tsr_plan_chunk *out) {
  memset(out, 0, sizeof *out);
  const tsr_model_config *m = &cfg->model;
  const int C_total = g->pp * g->v, first = chunk == 0, last = chunk == C_total - 1;
  int begin = 0, L = 0;
  TSR_CALL(tsr_pp_chunk_layers(m, g->pp, g->v, cfg->parallel.stage_layers, chunk, &begin, &L));
  tsr_model_sizes d;
  tsr_plan_model_sizes(cfg, g->tp, g->cp, first, last, L, &d); /* a cp rank's tokens */
  const int half = cfg->train.precision != TSR_F32;
  pricer pr = {.hw = hw, .half = half, .e = half ? 2.0 : 4.0, .out = out,
               .attn_share = tsr_plan_doc_attention_share(cfg), .cp = g->cp,
               .a2a = g->cp > 1 && cfg->parallel.cp_comm == TSR_CP_A2A,
               .cp_link = tsr_plan_group_link(g->cp, (long)g->cp * g->tp, g->ranks_per_node)};
  tsr_plan_cp_layer(cfg, g, &d, &pr.cpx);
  const int split = tsr_pp_split_backward(cfg->parallel.schedule);
  const int full = cfg->train.recompute == TSR_RECOMPUTE_FULL;
  const int sel = cfg->train.recompute == TSR_RECOMPUTE_SELECTIVE;
  const double N = (double)d.N, Ns = (double)d.Ns, C = (double)d.C, F = (double)d.F;
  const double V = (double)d.V, A = N * C * pr.e;
  const int tp = g->tp;
  const int in = TSR_LINK_INTRA; /* tp stays inside a node (layout_check.c) */
  const tp_prices tpp = {tsr_plan_all_reduce_s(hw, in, tp, A),
                         tsr_plan_gather_s(hw, in, tp, A)};
  const double norm_ar = d.sp ? 2 * tsr_plan_all_reduce_s(hw, in, tp, C * 4 * (d.gpt2 ? 2 : 1))
                              : 0;
  const double kv_ar =
      d.kv_shared ? tsr_plan_all_reduce_s(hw, in, tp, (double)d.kv_seg * m->n_kv_head * 4) : 0;
  double f_tp = 0, b_tp = 0, w_tp = 0, f_cp = 0, b_cp = 0;
  /* the layers */
  for (int l = 0; l < L; l++) {
    double ftp = 0, wl = 0;
    out->f += layer_forward(&pr, &d, &tpp, &ftp, &f_cp);
    f_tp += ftp;
    if (full) { /* the forward again, its collectives too */
      double rtp = 0;
      const double before = out->gemm + out->attention + out->memory;
      layer_forward(&pr, &d, &tpp, &rtp, &b_cp);
      out->recompute += out->gemm + out->attention + out->memory - before;
      b_tp += rtp;
    } else if (sel) {
      const double t = mem(&pr, 4 * Ns * C + (d.gpt2 ? 2 : 3) * N * F, 3);
      out->recompute += t;
      if (d.sp) b_tp += 2 * tpp.gather; /* the norm outputs gathered again */
    }
    out->b += layer_backward(&pr, &d, split, &wl, &b_cp);
    out->w += wl;
    b_tp += d.sp ? 4 * tpp.gather : 2 * tpp.ar;
    *(split ? &w_tp : &b_tp) += norm_ar + kv_ar;
  }
  out->b += out->recompute;
  /* the ends */
  if (first) {
    out->f += mem(&pr, (d.gpt2 ? 3 : 2) * N * C, 1);
    f_tp += d.sp ? tpp.gather : tpp.ar; /* vocab-parallel lookup: its sum over tp */
    out->w += tsr_plan_memory_s(hw, N * C * (pr.e + 8), 1); /* the table's gradient */
  }
  if (last) {
    const double stats = tp > 1 ? 3 * tsr_plan_all_reduce_s(hw, in, tp, N * 8) : 0;
    out->f += mem(&pr, 2 * Ns * C + 4 * N * V, 2) + gemm(&pr, N, V, C);
    f_tp += (d.sp ? tpp.gather : 0) + stats;
    out->b += gemm(&pr, N, C, V) + mem(&pr, 4 * Ns * C, 1);
    out->w += gemm(&pr, V, C, N);
    b_tp += d.sp ? tpp.gather : tpp.ar; /* the head's input gradient */
  }
  /* tensor-parallel time left on the critical path */
  const double keep = 1 - hw->prof.tp_overlap;
  out->f_tp = keep * f_tp, out->b_tp = keep * b_tp, out->w_tp = keep * w_tp;
  out->f += out->f_tp, out->b += out->b_tp, out->w += out->w_tp;
  /* context-parallel transfers left on the critical path (cp_extra) */
  out->f_cp = f_cp, out->b_cp = b_cp;
  out->f += f_cp, out->b += b_cp;
  if (!split) { /* one backward action: B and W together */
    out->b += out->w;
    out->b_tp += out->w_tp;
    out->w = out->w_tp = 0;
  }
  /* train.activation_offload on a GPU: each layer's block to the host in the forward and
   * back in the backward, behind the next layer's compute (model.c's copy stream), and
   * with a split backward to the host again after B (with B's stash for W) and back once
   * more for the W pass; the optimizer offload's copies share the link after the
   * backward, not counted here */
  if (d.act_offload && strcmp(hw->name, "cpu")) {
    out->act_block = (double)d.offload_set; /* with a split backward B's stash for W too */
    const double f = tsr_plan_act_offload_s(hw, out->f, L, out->act_block);
    /* a split backward's B pass also sends each block back to the host (with its stash),
     * on the same copy queue as the next block's load */
    const double b = tsr_plan_act_offload_s(hw, out->b, L, (split ? 2 : 1) * out->act_block);
    const double w = split ? tsr_plan_act_offload_s(hw, out->w, L, out->act_block) : out->w;
    out->act_exposed = f - out->f + b - out->b + w - out->w;
    out->f = f, out->b = b, out->w = w;
  }
  /* the gradient the chunk's units hand to ZeRO */
  out->layers = L;
  out->units = L + first + last;
  out->elems = L * layer_elems(&d);
  if (first) out->elems += V * C + (d.gpt2 ? (double)tsr_max_positions(m) * C : 0);
  if (last)
    out->elems += C * (d.gpt2 ? 2 : 1) + (m->tie_embeddings && g->pp == 1 ? 0 : V * C);
  return 0;
}
