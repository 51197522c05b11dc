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
 * the optimizer are left out here; plan_sim.c prices AdamW. */
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
static double attention(pricer *pr, const tsr_model_sizes *d, int backward) {
  const double t = pr->attn_share * tsr_plan_attention_s(pr->hw, pr->half, backward, (double)d->B,
                                                         (double)d->H, (double)d->T, (double)d->hd);
  pr->out->attention += t;
  return t;
}

/* Tensor-parallel collectives of one layer (or of the ends), seconds before the overlap. */
typedef struct {
  double ar, gather; /* one all-reduce, one all-gather or reduce-scatter of [N, C] */
} tp_prices;

static double layer_forward(pricer *pr, const tsr_model_sizes *d, const tp_prices *tp,
                            double *tp_s) {
  const double N = (double)d->N, Ns = (double)d->Ns, C = (double)d->C, F = (double)d->F;
  const double qd = (double)(d->H * d->hd);
  const double rope = d->gpt2 ? 0 : 2 * N * (double)(d->H + d->KV) * (double)d->hd;
  double t = gemm(pr, N, (double)d->qkv_dim, C) + gemm(pr, N, C, qd) +
             gemm(pr, N, (double)d->fc_dim, C) + gemm(pr, N, C, F) + attention(pr, d, 0);
  t += mem(pr, (2 + 4 + 3) * Ns * C + (d->gpt2 ? 2 : 3) * N * F + rope, d->gpt2 ? 4 : 6);
  *tp_s += d->sp ? 4 * tp->gather : 2 * tp->ar;
  return t;
}

/* B: input gradients; *w: weight gradients (W). */
static double layer_backward(pricer *pr, const tsr_model_sizes *d, int split, double *w) {
  const double N = (double)d->N, Ns = (double)d->Ns, C = (double)d->C, F = (double)d->F;
  const double qd = (double)(d->H * d->hd);
  const double rope = d->gpt2 ? 0 : 2 * N * (double)(d->H + d->KV) * (double)d->hd;
  double t = gemm(pr, N, (double)d->qkv_dim, C) + gemm(pr, N, C, qd) +
             gemm(pr, N, (double)d->fc_dim, C) + gemm(pr, N, C, F) + attention(pr, d, 1);
  t += mem(pr, (d->gpt2 ? 0 : 5 * N * F) + 8 * Ns * C + rope + (split ? 4 * N * C : 0),
           (d->gpt2 ? 2 : 5) + (split ? 2 : 0));
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
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, cfg);
  tsr_model_sizes d;
  tsr_model_sizes_of(&d, &spec, g->tp, first, last, L);
  const int half = cfg->train.precision != TSR_F32;
  pricer pr = {hw, half, half ? 2.0 : 4.0, out, tsr_plan_doc_attention_share(cfg)};
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
  double f_tp = 0, b_tp = 0, w_tp = 0;
  /* the layers */
  for (int l = 0; l < L; l++) {
    double ftp = 0, wl = 0;
    out->f += layer_forward(&pr, &d, &tpp, &ftp);
    f_tp += ftp;
    if (full) { /* the forward again, its collectives too */
      double rtp = 0;
      const double before = out->gemm + out->attention + out->memory;
      layer_forward(&pr, &d, &tpp, &rtp);
      out->recompute += out->gemm + out->attention + out->memory - before;
      b_tp += rtp;
    } else if (sel) {
      const double t = mem(&pr, 4 * Ns * C + (d.gpt2 ? 2 : 3) * N * F, 3);
      out->recompute += t;
      if (d.sp) b_tp += 2 * tpp.gather; /* the norm outputs gathered again */
    }
    out->b += layer_backward(&pr, &d, split, &wl);
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
  if (!split) { /* one backward action: B and W together */
    out->b += out->w;
    out->b_tp += out->w_tp;
    out->w = out->w_tp = 0;
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
