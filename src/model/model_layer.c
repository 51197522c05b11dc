/* model_layer.c — the model's math, which model.c drives: one transformer layer of its
 * stage (forward, the recomputation of what the recompute mode did not keep, backward),
 * with the tensor-parallel sums and the sequence-parallel gathers around them; the head
 * (final norm, LM head) and the loss on the (vocab-parallel) logits; the master's
 * rounding into the compute copy.  Every op the model calls is called here (but the
 * embedding's, in model.c).  The model's header comment (model.c) describes the block
 * and the layouts. */
#include "model_internal.h"

#include "core/util.h"

/* Norm of this rank's rows into the full-size output out [N, C]: of x [Ns, C], or, with
 * y (a branch's output: the residual add fused in), of h = x + y, which is stored at h.
 * With sequence parallelism the rows are computed here and the rest all-gathered from
 * the tp group (the column-parallel GEMM that follows needs every token). */
int model_norm_fwd(tsr_model *m, const void *pr, void *out, float *mean, float *rstd, void *h,
                    const void *x, const void *y, int64_t w, int64_t b) {
  void *o = A(m, out, (int64_t)m->row0 * m->C);
  if (m->gpt2)
    tsr_ops_layernorm_fwd(m->dt, o, mean, rstd, h, x, y, PC(m, pr, w), PC(m, pr, b), m->Ns, m->C,
                          m->eps);
  else
    tsr_ops_rmsnorm_fwd(m->dt, o, rstd, h, x, y, PC(m, pr, w), m->Ns, m->C, m->eps);
  if (m->sp) TSR_CALL(tsr_comm_all_gather(m->tp, o, out, (size_t)m->Ns * m->C, m->dt));
  return 0;
}

/* Backward of a norm over this rank's rows: dx [Ns, C] gets the gradient of x from dout
 * [Ns, C], added to what dx holds (acc: the residual stream's gradient) or written.  With
 * sequence parallelism the weight (and bias) gradients cover only these rows: they are
 * formed apart and summed over tp before joining the accumulated gradient. */
int model_norm_bwd(tsr_model *m, const void *pr, float *gr, void *dx, const void *dout,
                    const void *x, const float *mean, const float *rstd, int64_t w, int64_t b,
                    int acc, float *sw, float *sb) {
  const int C = m->C;
  float *dw = m->sp ? m->norm_dw : sw ? sw : P(gr, w);
  float *db = m->sp ? m->norm_db : sw ? sb : P(gr, b);
  if (m->sp) {
    tsr_ops_zero(m->norm_dw, (size_t)C * sizeof(float));
    tsr_ops_zero(m->norm_db, (size_t)C * sizeof(float));
  } else if (sw) {
    tsr_ops_zero(sw, (size_t)C * sizeof(float));
    tsr_ops_zero(sb, (size_t)C * sizeof(float));
  }
  if (m->gpt2)
    tsr_ops_layernorm_bwd(m->dt, dx, dw, b >= 0 ? db : NULL, dout, x, PC(m, pr, w), mean, rstd,
                          m->Ns, C, acc);
  else
    tsr_ops_rmsnorm_bwd(m->dt, dx, dw, dout, x, PC(m, pr, w), rstd, m->Ns, C, acc);
  if (!m->sp) return 0;
  TSR_CALL(tsr_comm_all_reduce(m->tp, m->norm_dw, (size_t)C, TSR_F32));
  if (sw)
    tsr_ops_copy(sw, m->norm_dw, (size_t)C * sizeof(float));
  else
    tsr_ops_acc(P(gr, w), m->norm_dw, C);
  if (b >= 0) {
    TSR_CALL(tsr_comm_all_reduce(m->tp, m->norm_db, (size_t)C, TSR_F32));
    if (sw)
      tsr_ops_copy(sb, m->norm_db, (size_t)C * sizeof(float));
    else
      tsr_ops_acc(P(gr, b), m->norm_db, C);
  }
  return 0;
}

static void mlp_act_fwd(const tsr_model *m, void *act, const void *fc) {
  if (m->gpt2)
    tsr_ops_gelu_fwd(m->dt, act, fc, (long)m->N * m->F);
  else
    tsr_ops_swiglu_fwd(m->dt, act, fc, m->N, m->F);
}

/* Sum the partial results of a row-parallel GEMM (or of the column-parallel GEMMs'
 * input gradient) over the tp group. */
static int tp_sum(tsr_model *m, void *x, long n) {
  if (m->tp_size == 1) return 0;
  return tsr_comm_all_reduce(m->tp, x, (size_t)n, m->dt);
}

/* The partial [N, C] output of a row-parallel GEMM, summed over tp: all-reduced in
 * place, or (sequence parallel) reduce-scattered to this rank's rows.  Returns where the
 * summed rows [Ns, C] are. */
void *model_tp_rows(tsr_model *m, void *partial) {
  if (!m->sp) return tp_sum(m, partial, (long)m->N * m->C) ? NULL : partial;
  if (tsr_comm_reduce_scatter(m->tp, partial, m->tmp_s, (size_t)m->Ns * m->C, m->dt)) return NULL;
  return m->tmp_s;
}

/* The gradient of this rank's rows D [Ns, C] on all N rows (sequence parallel), as the
 * row-parallel GEMMs' backward needs it; D itself otherwise. */
const void *model_tp_gather_rows(tsr_model *m, const void *D) {
  if (!m->sp) return D;
  if (tsr_comm_all_gather(m->tp, D, m->d_full, (size_t)m->Ns * m->C, m->dt)) return NULL;
  return m->d_full;
}

/* The gradient of a norm output [N, C] from column-parallel GEMMs, summed over tp: in
 * place, or (sequence parallel) reduce-scattered to this rank's rows. */
void *model_tp_grad_rows(tsr_model *m, void *partial) {
  if (!m->sp) return tp_sum(m, partial, (long)m->N * m->C) ? NULL : partial;
  if (tsr_comm_reduce_scatter(m->tp, partial, m->d_shard, (size_t)m->Ns * m->C, m->dt))
    return NULL;
  return m->d_shard;
}

/* A replicated bias of a row-parallel GEMM enters the partial sums on tp rank 0 only. */
const void *model_tp_bias(const tsr_model *m, const void *b) { return m->tp_rank == 0 ? b : NULL; }

/* Forward of layer l with parameters pr (its unit): x (input) -> out; activations into a. */
int model_layer_fwd(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a,
                     void *out) {
  const layer_params *p = &m->lp[l];
  const int N = m->N, C = m->C, qd = m->H * m->hd, kvd = m->KV * m->hd;
  const tsr_dtype dt = m->dt;
  TSR_CALL(model_norm_fwd(m, pr, a->norm1, a->norm1_mean, a->norm1_rstd, NULL, x, NULL, p->norm1_w,
                    p->norm1_b));
  tsr_ops_matmul_fwd(dt, a->qkv, a->norm1, PC(m, pr, p->wqkv), PC(m, pr, p->bqkv), N, C,
                     m->qkv_dim);
  if (!m->gpt2) {
    tsr_ops_rope_fwd(dt, a->qkv, N, m->Tpos, m->H, m->hd, m->qkv_dim, m->rope, m->doc);
    tsr_ops_rope_fwd(dt, A(m, a->qkv, qd), N, m->Tpos, m->KV, m->hd, m->qkv_dim, m->rope, m->doc);
  }
  if (m->cp > 1)
    TSR_CALL(model_cp_attention_fwd(m, a));
  else
    tsr_ops_attention_fwd(dt, a->atty, a->lse, a->qkv, A(m, a->qkv, qd), A(m, a->qkv, qd + kvd),
                          m->B, m->T, m->H, m->KV, m->hd, m->qkv_dim, m->doc);
  tsr_ops_matmul_fwd(dt, m->tmp_nc, a->atty, PC(m, pr, p->wo), model_tp_bias(m, PC(m, pr, p->bo)), N,
                     qd, C);
  const void *proj = model_tp_rows(m, m->tmp_nc);
  if (!proj) return TSR_ERR;
  /* h = x + proj and its norm, in one pass */
  TSR_CALL(model_norm_fwd(m, pr, a->norm2, a->norm2_mean, a->norm2_rstd, a->h, x, proj, p->norm2_w,
                    p->norm2_b));
  tsr_ops_matmul_fwd(dt, a->fc, a->norm2, PC(m, pr, p->wfc), PC(m, pr, p->bfc), N, C, m->fc_dim);
  mlp_act_fwd(m, a->act, a->fc);
  tsr_ops_matmul_fwd(dt, m->tmp_nc, a->act, PC(m, pr, p->wdown),
                     model_tp_bias(m, PC(m, pr, p->bdown)), N, m->F, C);
  if (!(proj = model_tp_rows(m, m->tmp_nc))) return TSR_ERR;
  /* activation offload: out is the next window set's, which waits for its last copy */
  if (m->out_ev) tsr_ops_event_wait(m->out_ev);
  tsr_ops_residual(dt, out, a->h, proj, (long)m->Ns * C);
  return 0;
}

/* Rebuild what the recompute mode did not keep for layer l: the same ops on the same
 * stored inputs, so the rebuilt values are bitwise the forward's. */
int model_layer_recompute(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a) {
  const layer_params *p = &m->lp[l];
  if (m->recompute == TSR_RECOMPUTE_FULL) {
    TSR_CALL(model_layer_fwd(m, l, pr, x, a, m->d_nc)); /* the output is not needed: d_nc is free */
  } else if (m->recompute == TSR_RECOMPUTE_SELECTIVE) {
    TSR_CALL(model_norm_fwd(m, pr, a->norm1, a->norm1_mean, a->norm1_rstd, NULL, x, NULL, p->norm1_w,
                      p->norm1_b));
    TSR_CALL(model_norm_fwd(m, pr, a->norm2, a->norm2_mean, a->norm2_rstd, NULL, a->h, NULL,
                      p->norm2_w, p->norm2_b));
    mlp_act_fwd(m, a->act, a->fc);
  }
  return 0;
}

/* The gradient regions of a replicated KV head in a layer's unit: wk|wv rows (adjacent)
 * and, for gpt2, bk|bv (adjacent). */
static void kv_regions(const tsr_model *m, const layer_params *p, float *gr, float **w, float **b) {
  *w = gr + p->wqkv + (int64_t)m->H * m->hd * m->C;
  *b = p->bqkv >= 0 ? gr + p->bqkv + (int64_t)m->H * m->hd : NULL;
}

/* Before the QKV backward: set aside the KV gradient accumulated so far, so that the
 * region holds only this micro-batch's contribution when it is summed. */
static void kv_set_aside(tsr_model *m, const layer_params *p, float *gr) {
  float *w, *b;
  kv_regions(m, p, gr, &w, &b);
  const size_t nw = (size_t)2 * m->hd * m->C, nb = b ? (size_t)2 * m->hd : 0;
  tsr_ops_copy(m->kv_keep, w, nw * sizeof(float));
  tsr_ops_zero(w, nw * sizeof(float));
  if (b) {
    tsr_ops_copy(m->kv_keep + nw, b, nb * sizeof(float));
    tsr_ops_zero(b, nb * sizeof(float));
  }
}

/* After it: sum this micro-batch's KV gradient over the ranks sharing the head (an
 * all-reduce over tp of a buffer with one slot per KV head, each rank filling its own
 * head's slot), then add back what was set aside. */
static int kv_reduce(tsr_model *m, const layer_params *p, float *gr) {
  float *w, *b;
  kv_regions(m, p, gr, &w, &b);
  const size_t nw = (size_t)2 * m->hd * m->C, nb = b ? (size_t)2 * m->hd : 0;
  float *slot = m->kv_sum + (size_t)m->kv_head * m->kv_seg;
  tsr_ops_zero(m->kv_sum, (size_t)m->kv_seg * m->kv_heads * sizeof(float));
  tsr_ops_copy(slot, w, nw * sizeof(float));
  if (b) tsr_ops_copy(slot + nw, b, nb * sizeof(float));
  TSR_CALL(tsr_comm_all_reduce(m->tp, m->kv_sum, (size_t)m->kv_seg * m->kv_heads, TSR_F32));
  tsr_ops_add(w, m->kv_keep, slot, (long)nw);
  if (b) tsr_ops_add(b, m->kv_keep + nw, slot + nw, (long)nb);
  return 0;
}

/* Backward of layer l (parameters pr, gradients gr of its unit): m->d_resid holds
 * d(out) and becomes d(x).  The GEMMs, the activations and the attention write their
 * input gradients; the norms add theirs to the residual stream's.  With ws (the B pass of
 * a split backward) no weight gradient is formed: each GEMM's output gradient is kept in
 * ws (written there directly, or copied where the buffer is the residual stream's) and
 * the norms' weight gradients go to ws too; gr is not touched. */
int model_layer_bwd(tsr_model *m, int l, const void *pr, float *gr, const void *x,
                    layer_acts *a, layer_wstash *ws) {
  const layer_params *p = &m->lp[l];
  const int N = m->N, C = m->C, qd = m->H * m->hd, kvd = m->KV * m->hd;
  const tsr_dtype dt = m->dt;
  const size_t nc_bytes = (size_t)N * C * m->esz;
  void *D = m->d_resid; /* [Ns, C] */
  void *d_fc = ws ? ws->d_fc : m->d_fc, *d_qkv = ws ? ws->d_qkv : m->d_qkv;
#define GW(o) (ws ? NULL : P(gr, (o))) /* a weight (bias) gradient, or none in B */
  /* MLP branch */
  const void *Dfull = model_tp_gather_rows(m, D);
  if (!Dfull) return TSR_ERR;
  if (ws) tsr_ops_copy(ws->d_down, Dfull, nc_bytes);
  if (m->gpt2) { /* the GELU's backward rides in the down-projection's */
    tsr_ops_matmul_bwd(dt, d_fc, GW(p->wdown), GW(p->bdown), Dfull, a->act,
                       PC(m, pr, p->wdown), a->fc, N, m->F, C);
  } else {
    tsr_ops_matmul_bwd(dt, m->d_act, GW(p->wdown), GW(p->bdown), Dfull, a->act,
                       PC(m, pr, p->wdown), NULL, N, m->F, C);
    tsr_ops_swiglu_bwd(dt, d_fc, m->d_act, a->fc, N, m->F);
  }
  tsr_ops_matmul_bwd(dt, m->d_nc, GW(p->wfc), GW(p->bfc), d_fc, a->norm2, PC(m, pr, p->wfc),
                     NULL, N, C, m->fc_dim);
  void *dn = model_tp_grad_rows(m, m->d_nc);
  if (!dn) return TSR_ERR;
  TSR_CALL(model_norm_bwd(m, pr, gr, D, dn, a->h, a->norm2_mean, a->norm2_rstd, p->norm2_w,
                          p->norm2_b, 1, ws ? ws->norm_w + C : NULL,
                          ws ? ws->norm_b + C : NULL));
  /* attention branch */
  if (!(Dfull = model_tp_gather_rows(m, D))) return TSR_ERR;
  if (ws) tsr_ops_copy(ws->d_o, Dfull, nc_bytes);
  tsr_ops_matmul_bwd(dt, m->d_atty, GW(p->wo), GW(p->bo), Dfull, a->atty, PC(m, pr, p->wo),
                     NULL, N, qd, C);
  if (m->cp > 1)
    TSR_CALL(model_cp_attention_bwd(m, d_qkv, a));
  else
    tsr_ops_attention_bwd(dt, d_qkv, A(m, d_qkv, qd), A(m, d_qkv, qd + kvd), m->d_atty, a->atty,
                          a->lse, a->qkv, A(m, a->qkv, qd), A(m, a->qkv, qd + kvd), m->B, m->T,
                          m->H, m->KV, m->hd, m->qkv_dim, m->doc);
  if (!m->gpt2) {
    tsr_ops_rope_bwd(dt, d_qkv, N, m->Tpos, m->H, m->hd, m->qkv_dim, m->rope, m->doc);
    tsr_ops_rope_bwd(dt, A(m, d_qkv, qd), N, m->Tpos, m->KV, m->hd, m->qkv_dim, m->rope, m->doc);
  }
  if (m->kv_shared && !ws) kv_set_aside(m, p, gr);
  tsr_ops_matmul_bwd(dt, m->d_nc, GW(p->wqkv), GW(p->bqkv), d_qkv, a->norm1,
                     PC(m, pr, p->wqkv), NULL, N, C, m->qkv_dim);
  if (m->kv_shared && !ws) TSR_CALL(kv_reduce(m, p, gr));
  if (!(dn = model_tp_grad_rows(m, m->d_nc))) return TSR_ERR;
  TSR_CALL(model_norm_bwd(m, pr, gr, D, dn, x, a->norm1_mean, a->norm1_rstd, p->norm1_w,
                          p->norm1_b, 1, ws ? ws->norm_w : NULL, ws ? ws->norm_b : NULL));
#undef GW
  return 0;
}

/* The W pass: the four GEMMs' weight (and bias) gradients from the output gradients B
 * kept and the inputs the layer kept, in the whole backward's order, then the norms'. */
int model_layer_bwd_w(tsr_model *m, int l, float *gr, layer_acts *a, const layer_wstash *ws) {
  const layer_params *p = &m->lp[l];
  const int N = m->N, C = m->C, qd = m->H * m->hd;
  const tsr_dtype dt = m->dt;
  tsr_ops_matmul_bwd(dt, NULL, P(gr, p->wdown), P(gr, p->bdown), ws->d_down, a->act, NULL,
                     NULL, N, m->F, C);
  tsr_ops_matmul_bwd(dt, NULL, P(gr, p->wfc), P(gr, p->bfc), ws->d_fc, a->norm2, NULL, NULL, N,
                     C, m->fc_dim);
  tsr_ops_acc(P(gr, p->norm2_w), ws->norm_w + C, C);
  if (p->norm2_b >= 0) tsr_ops_acc(P(gr, p->norm2_b), ws->norm_b + C, C);
  tsr_ops_matmul_bwd(dt, NULL, P(gr, p->wo), P(gr, p->bo), ws->d_o, a->atty, NULL, NULL, N, qd,
                     C);
  if (m->kv_shared) kv_set_aside(m, p, gr);
  tsr_ops_matmul_bwd(dt, NULL, P(gr, p->wqkv), P(gr, p->bqkv), ws->d_qkv, a->norm1, NULL, NULL,
                     N, C, m->qkv_dim);
  if (m->kv_shared) TSR_CALL(kv_reduce(m, p, gr));
  tsr_ops_acc(P(gr, p->norm1_w), ws->norm_w, C);
  if (p->norm1_b >= 0) tsr_ops_acc(P(gr, p->norm1_b), ws->norm_b, C);
  return 0;
}

void tsr_model_to_compute(const tsr_model *m, void *dst, const float *src, int64_t n) {
  tsr_ops_cast(m->dt, dst, TSR_F32, src, (long)n);
}

/* The head of the last chunk: final norm of x, then the logits [N, V] = norm · W^T (pw:
 * the unit holding W, the embedding's when tied), which the fused head leaves to
 * model_head_xent. */
int model_head_fwd(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw,
                   const void *x) {
  TSR_CALL(model_norm_fwd(m, ph, sl->final_norm, sl->final_mean, sl->final_rstd, NULL, x, NULL,
                          m->final_w, m->final_b));
  if (sl->logits)
    tsr_ops_matmul_fwd(m->dt, sl->logits, sl->final_norm, PC(m, pw, m->head), NULL, m->N, m->C,
                       m->V);
  return 0;
}

/* The gradient of the final norm's output into m->d_nc (before the tp sum) and, when gw
 * is given, W's into gw: from the logits' gradient, or by the fused head, which also adds
 * the loss that its forward left to the backward. */
static int head_dx(tsr_model *m, struct act_slot *sl, const void *pw, float *gw) {
  float *dw = gw ? P(gw, m->head) : NULL;
  if (m->sz.xent_chunk) return model_head_xent(m, sl, pw, m->d_nc, dw, sl->loss_acc, sl->dloss);
  tsr_ops_matmul_bwd(m->dt, m->d_nc, dw, NULL, sl->logits, sl->final_norm,
                     PC(m, pw, m->head), NULL, m->N, m->C, m->V);
  return 0;
}

/* Its backward from the logits' gradient: W's gradient into gw, the final norm's into gh,
 * and m->d_resid written with the gradient of x (the residual stream's starts here). */
int model_head_bwd(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw, float *gh,
                   float *gw, const void *x) {
  TSR_CALL(head_dx(m, sl, pw, gw));
  void *dn = model_tp_grad_rows(m, m->d_nc);
  if (!dn) return TSR_ERR;
  return model_norm_bwd(m, ph, gh, m->d_resid, dn, x, sl->final_mean, sl->final_rstd,
                        m->final_w, m->final_b, 0, NULL, NULL);
}

int model_head_bwd_b(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw,
                     const void *x) {
  TSR_CALL(head_dx(m, sl, pw, NULL));
  void *dn = model_tp_grad_rows(m, m->d_nc);
  if (!dn) return TSR_ERR;
  return model_norm_bwd(m, ph, NULL, m->d_resid, dn, x, sl->final_mean, sl->final_rstd,
                        m->final_w, m->final_b, 0, sl->w_head, sl->w_head + m->C);
}

int model_head_bwd_w(tsr_model *m, struct act_slot *sl, const void *pw, float *gh, float *gw) {
  if (m->sz.xent_chunk) /* the B pass added the loss */
    TSR_CALL(model_head_xent(m, sl, pw, NULL, P(gw, m->head), NULL, sl->dloss));
  else
    tsr_ops_matmul_bwd(m->dt, NULL, P(gw, m->head), NULL, sl->logits, sl->final_norm, NULL, NULL,
                       m->N, m->C, m->V);
  tsr_ops_acc(P(gh, m->final_w), sl->w_head, m->C);
  if (m->final_b >= 0) tsr_ops_acc(P(gh, m->final_b), sl->w_head + m->C, m->C);
  return 0;
}

/* The fused head.  One rank: the xent_head op.  Vocab-parallel: per chunk, the head's
 * GEMM into m->head_buf and the passes of model_loss_and_grad on its rows, whose
 * statistics go to their rows of the [N] buffers, so that the loss is summed over all N
 * rows at the end exactly as the unfused head sums it; then the gradient's GEMMs. */
int model_head_xent(tsr_model *m, struct act_slot *sl, const void *pw, void *dx, float *dw,
                    double *acc, float dloss) {
  const int N = m->N, C = m->C, V = m->V, chunk = (int)m->sz.xent_chunk;
  const void *w = PC(m, pw, m->head);
  if (m->tp_size == 1) {
    tsr_ops_xent_head(m->dt, acc, (double)N, dx, dw, sl->final_norm, w, sl->targets, m->head_buf,
                      N, C, V, chunk, dloss);
    return 0;
  }
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = N - r0 < chunk ? N - r0 : chunk;
    const void *x = A(m, sl->final_norm, (int64_t)r0 * C);
    const int32_t *tg = sl->targets + r0;
    double *mx = m->xent_max + r0, *se = m->xent_sum + r0, *tl = m->xent_target + r0;
    tsr_ops_matmul_fwd(m->dt, m->head_buf, x, w, NULL, rows, C, V);
    tsr_ops_xent_local_stats(m->dt, mx, tl, m->head_buf, tg, rows, V, m->vocab_start);
    TSR_CALL(tsr_comm_all_reduce_double(m->tp, mx, (size_t)rows, TSR_COMM_MAX));
    TSR_CALL(tsr_comm_all_reduce_double(m->tp, tl, (size_t)rows, TSR_COMM_SUM));
    tsr_ops_xent_local_sumexp(m->dt, se, m->head_buf, mx, rows, V);
    TSR_CALL(tsr_comm_all_reduce_double(m->tp, se, (size_t)rows, TSR_COMM_SUM));
    if (!dx && !dw) continue;
    tsr_ops_xent_grad(m->dt, m->head_buf, tg, mx, se, rows, V, m->vocab_start, dloss);
    tsr_ops_matmul_bwd(m->dt, dx ? A(m, dx, (int64_t)r0 * C) : NULL, dw, NULL, m->head_buf, x, w,
                       NULL, rows, C, V);
  }
  if (acc) tsr_ops_xent_rows(acc, (double)N, m->xent_max, m->xent_sum, m->xent_target, N);
  return 0;
}

void model_head_row_logits(tsr_model *m, struct act_slot *sl, const void *pw, int row) {
  tsr_ops_matmul_fwd(m->dt, m->head_buf, A(m, sl->final_norm, (int64_t)row * m->C),
                     PC(m, pw, m->head), NULL, 1, m->C, m->V);
}

/* *acc (op memory) += the mean row loss from the (vocab-parallel) logits; with grad the
 * logits are replaced by dloss * d(loss sum)/d(logits). */
int model_loss_and_grad(tsr_model *m, void *logits, const int32_t *targets, float dloss, int grad,
                         double *acc) {
  const int N = m->N;
  if (m->tp_size == 1) {
    tsr_ops_xent(m->dt, acc, (double)N, logits, targets, N, m->V, dloss, grad);
    return 0;
  }
  tsr_ops_xent_local_stats(m->dt, m->xent_max, m->xent_target, logits, targets, N, m->V,
                           m->vocab_start);
  TSR_CALL(tsr_comm_all_reduce_double(m->tp, m->xent_max, (size_t)N, TSR_COMM_MAX));
  TSR_CALL(tsr_comm_all_reduce_double(m->tp, m->xent_target, (size_t)N, TSR_COMM_SUM));
  tsr_ops_xent_local_sumexp(m->dt, m->xent_sum, logits, m->xent_max, N, m->V);
  TSR_CALL(tsr_comm_all_reduce_double(m->tp, m->xent_sum, (size_t)N, TSR_COMM_SUM));
  tsr_ops_xent_rows(acc, (double)N, m->xent_max, m->xent_sum, m->xent_target, N);
  if (grad)
    tsr_ops_xent_grad(m->dt, logits, targets, m->xent_max, m->xent_sum, N, m->V, m->vocab_start,
                      dloss);
  return 0;
}

