/* model.c — forward and backward of the decoder-only transformer on one stage.
 *
 * Block (pre-norm):  h   = x + Wo · attn(rope(Wqkv · norm1(x)))
 *                    out = h + Wdown · act(Wfc · norm2(h))
 * llama: RMSNorm, RoPE, GQA, SwiGLU (Wfc = [w_gate; w_up]), no biases, untied head.
 * gpt2:  LayerNorm, learned positions, GELU (Wfc = w_up), biases, tied head.
 *
 * Activation storage per recompute mode:
 *   none       every layer keeps all its activations;
 *   selective  every layer keeps the GEMM and attention outputs (qkv, attention out,
 *              lse, h, fc); the norm outputs and the MLP activation — cheap
 *              element-wise recomputations — are rebuilt in backward;
 *   full       only each layer's input (the residual stream) is kept; the layer is
 *              recomputed in backward into one shared set of buffers.
 * Recomputation runs the same code on the same inputs, so gradients are bitwise equal
 * across modes.
 *
 * Tensor parallelism (tp > 1, Megatron style): each tp rank holds H/tp query heads (and
 * their KV heads, or the one KV head they share when n_kv_head < tp), d_ff/tp of the MLP
 * and vocab/tp rows of the embedding and LM head.  Column-parallel Q|K|V and gate|up
 * need no communication; row-parallel wo and w_down produce partial sums that are
 * all-reduced over tp (their replicated bias added by tp rank 0 only, so it is counted
 * once); in backward the gradient entering each norm from the column-parallel GEMMs is
 * all-reduced.  That is 2 all-reduces of [tokens, d_model] per layer forward and 2 in
 * backward.  The embedding all-reduces its vocab-parallel lookups; the cross-entropy
 * reduces only per-row statistics (max, sum-exp, target logit): the full logits never
 * exist on one rank.  Replicated parameters (norms, row-parallel biases, positions) see
 * the full, identical activations on every tp rank, so their gradients need no reduction.
 *
 * Storage (bf16, fp16): the compute copy of the parameters, every activation and every
 * activation gradient is a 16-bit array (the run's tsr_dtype; the ops round each output
 * once as they store it); statistics (norm mean and rstd, softmax lse), the loss and the
 * parameter gradients are fp32.  fp16 stores the activation gradients in fp16 like the
 * rest: that is where fp16 underflows and overflows, and what the trainer's dynamic loss
 * scale is for.  fp32 runs store everything in fp32. */
#include "model_internal.h"

#include <math.h>
#include <string.h>

#include "sched/pipeline.h"
#include "core/util.h"

static int64_t off(const tsr_layout *lay, int layer, const char *suffix, int64_t base) {
  const tsr_tensor *t = tsr_layout_layer(lay, layer, suffix);
  return t ? t->offset - base : -1;
}

static int64_t off_global(const tsr_layout *lay, const char *name, int64_t base) {
  const tsr_tensor *t = tsr_layout_find(lay, name);
  return t ? t->offset - base : -1;
}

/* Default provider: the model's own full buffers. */
static const void *own_params_acquire(void *ctx, int u, int next) {
  tsr_model *m = ctx;
  return tsr_dtype_at(m->params, m->dt, m->units[u].begin);
}
static float *own_grads_acquire(void *ctx, int u) {
  tsr_model *m = ctx;
  return m->grads ? m->grads + m->units[u].begin : NULL;
}
static int own_release(void *ctx, int u) { return 0; }

static const void *params_acquire(tsr_model *m, int u, int next) {
  const void *p = m->hooks.params_acquire(m->hooks.ctx, u, next);
  if (!p) tsr_error("model: no parameters for unit %d", u);
  return p;
}
static float *grads_acquire(tsr_model *m, int u) {
  float *g = m->hooks.grads_acquire(m->hooks.ctx, u);
  if (!g) tsr_error("model: no gradient buffer for unit %d", u);
  return g;
}

/* An activation buffer of n elements: stored ones in dt, statistics in fp32. */
static void *alloc_a(tsr_model *m, size_t n) {
  void *p = tsr_ops_alloc(n, m->esz);
  if (p) m->act_bytes += n * m->esz;
  return p;
}
static float *alloc_f(tsr_model *m, size_t n) {
  float *p = tsr_ops_alloc(n, sizeof(float));
  if (p) m->act_bytes += n * sizeof(float);
  return p;
}

/* Split backward: what each B pass of a slot leaves for its W pass (model_sizes.c), stored
 * for the backward as the layers' sets are (counted with them). */
static int alloc_wstash(tsr_model *m, struct act_slot *sl) {
  const tsr_model_sizes *sz = &m->sz;
  const size_t N = (size_t)sz->N, C = (size_t)sz->C, had = m->act_bytes;
  if (!(sl->w = tsr_calloc((size_t)m->Lc, sizeof *sl->w))) return TSR_ERR;
  for (int q = 0; q < m->Lc && !m->aoff; q++) { /* offloaded: in the layers' blocks */
    layer_wstash *w = &sl->w[q];
    if (!(w->d_down = alloc_a(m, N * C)) || !(w->d_o = alloc_a(m, N * C)) ||
        !(w->d_fc = alloc_a(m, N * (size_t)sz->fc_dim)) ||
        !(w->d_qkv = alloc_a(m, N * (size_t)sz->qkv_dim)) || !(w->norm_w = alloc_f(m, 2 * C)) ||
        !(w->norm_b = alloc_f(m, 2 * C)))
      return TSR_ERR;
  }
  m->stored_bytes += m->act_bytes - had;
  if (sz->w_embed && !(sl->w_embed = alloc_a(m, (size_t)sz->w_embed))) return TSR_ERR;
  if (sz->w_head && !(sl->w_head = alloc_f(m, (size_t)sz->w_head))) return TSR_ERR;
  return 0;
}

static void free_wstash(tsr_model *m, struct act_slot *sl) {
  for (int q = 0; sl->w && q < m->Lc; q++) {
    layer_wstash *w = &sl->w[q];
    tsr_ops_free(&w->d_down);
    tsr_ops_free(&w->d_o);
    tsr_ops_free(&w->d_fc);
    tsr_ops_free(&w->d_qkv);
    tsr_ops_free(&w->norm_w);
    tsr_ops_free(&w->norm_b);
  }
  tsr_free(&sl->w);
  tsr_ops_free(&sl->w_embed);
  tsr_ops_free(&sl->w_head);
}

/* Allocate one layer's activation set; `which` selects the buffers to allocate. */
static int alloc_acts(tsr_model *m, layer_acts *a, int which) {
  const tsr_model_layer_sizes *n = &m->sz.layer;
  if (which & A_NORMS) {
    if (!(a->norm1 = alloc_a(m, (size_t)n->norm1)) || !(a->norm2 = alloc_a(m, (size_t)n->norm2)))
      return TSR_ERR;
  }
  if (which & A_CORE) {
    if (!(a->qkv = alloc_a(m, (size_t)n->qkv)) || !(a->atty = alloc_a(m, (size_t)n->atty)) ||
        !(a->lse = alloc_f(m, (size_t)n->lse)) || !(a->h = alloc_a(m, (size_t)n->h)) ||
        !(a->fc = alloc_a(m, (size_t)n->fc)) ||
        !(a->norm1_mean = alloc_f(m, (size_t)n->norm1_mean)) ||
        !(a->norm1_rstd = alloc_f(m, (size_t)n->norm1_rstd)) ||
        !(a->norm2_mean = alloc_f(m, (size_t)n->norm2_mean)) ||
        !(a->norm2_rstd = alloc_f(m, (size_t)n->norm2_rstd)))
      return TSR_ERR;
  }
  if (which & A_ACT) {
    if (!(a->act = alloc_a(m, (size_t)n->act))) return TSR_ERR;
  }
  return 0;
}

static void free_acts(layer_acts *a, int which) {
  if (which & A_NORMS) {
    tsr_ops_free(&a->norm1);
    tsr_ops_free(&a->norm2);
  }
  if (which & A_CORE) {
    tsr_ops_free(&a->qkv);
    tsr_ops_free(&a->atty);
    tsr_ops_free(&a->lse);
    tsr_ops_free(&a->h);
    tsr_ops_free(&a->fc);
    tsr_ops_free(&a->norm1_mean);
    tsr_ops_free(&a->norm1_rstd);
    tsr_ops_free(&a->norm2_mean);
    tsr_ops_free(&a->norm2_rstd);
  }
  if (which & A_ACT) tsr_ops_free(&a->act);
}

int tsr_model_create(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay) {
  return tsr_model_create_ext(out, spec, lay, 1, 1);
}

int tsr_model_create_ext(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay,
                         int own_params, int own_grads) {
  const tsr_model_options o = {own_params, own_grads, NULL, 1, NULL};
  return tsr_model_create_opt(out, spec, lay, &o);
}

/* This stage's layers (in the layout's increasing order), the chunks, and every size. */
static int shape_of(tsr_model *m, const tsr_model_spec *spec, const tsr_layout *lay,
                    const tsr_model_options *opt) {
  const tsr_model_config *mc = &spec->model;
  m->spec = *spec;
  /* the CPU's memory holds everything already: nothing to offload there (session.c says so) */
  if (!tsr_ops_on_device()) m->spec.activation_offload = 0;
  m->lay = lay;
  m->dt = spec->precision;
  m->esz = tsr_dtype_size(m->dt);
  m->tp = opt->tp;
  m->tp_size = m->tp ? tsr_comm_size(m->tp) : 1;
  m->tp_rank = m->tp ? tsr_comm_rank(m->tp) : 0;
  m->layer_ids = tsr_calloc((size_t)mc->n_layer, sizeof(int));
  if (!m->layer_ids) return TSR_ERR;
  for (int i = 0; i < lay->n_tensors; i++) {
    const int l = lay->tensors[i].layer;
    if (l >= 0 && (m->L == 0 || m->layer_ids[m->L - 1] != l)) m->layer_ids[m->L++] = l;
  }
  m->v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
  m->first = lay->embeds;
  m->last = lay->heads;
  /* the chunks' layers: pipeline.c's split, the one the layout was built with */
  m->chunk_q0 = tsr_calloc((size_t)m->v + 1, sizeof(int));
  if (!m->chunk_q0) return TSR_ERR;
  for (int j = 0; j < m->v; j++) {
    const int c = tsr_pp_stage_chunk(lay->placement, lay->pp, m->v, lay->pp_rank, j);
    int l0, n;
    TSR_CALL(tsr_pp_chunk_layers(mc, lay->pp, m->v, lay->stage_layers, c, &l0, &n));
    TSR_CHECK(m->chunk_q0[j] + n <= m->L && m->layer_ids[m->chunk_q0[j]] == l0, TSR_ERR,
              "model: chunk %d's layers %d..%d are not this stage's", c, l0, l0 + n - 1);
    m->chunk_q0[j + 1] = m->chunk_q0[j] + n;
    if (n > m->Lc) m->Lc = n;
  }
  m->n_slots = opt->n_slots > 0 ? opt->n_slots : 1;
  tsr_model_sizes_of(&m->sz, &m->spec, m->tp_size, m->first, m->last, m->Lc);
  const tsr_model_sizes *sz = &m->sz;
  m->gpt2 = sz->gpt2;
  m->recompute = sz->recompute;
  m->aoff = sz->act_offload;
  m->B = (int)sz->B, m->T = (int)sz->T, m->C = (int)sz->C, m->hd = (int)sz->hd;
  m->H = (int)sz->H, m->KV = (int)sz->KV, m->F = (int)sz->F, m->V = (int)sz->V;
  m->vocab = (int)mc->vocab_size;
  m->vocab_start = m->tp_rank * m->V;
  m->N = (int)sz->N;
  m->sp = sz->sp;
  m->Ns = (int)sz->Ns;
  m->row0 = m->sp ? m->tp_rank * m->Ns : 0;
  m->qkv_dim = (int)sz->qkv_dim;
  m->fc_dim = (int)sz->fc_dim;
  m->eps = (float)mc->norm_eps;
  m->rope = tsr_rope_plain((float)mc->rope_theta);
  if (mc->rope_scaling == TSR_ROPE_SCALING_LLAMA3) {
    m->rope.scaling = TSR_ROPE_SCALING_LLAMA3;
    m->rope.factor = mc->rope_factor;
    m->rope.low_freq_factor = mc->rope_low_freq_factor;
    m->rope.high_freq_factor = mc->rope_high_freq_factor;
    m->rope.original_context = (double)mc->rope_original_context;
  }
  m->docmask = spec->document_mask != 0;
  m->eos = m->docmask && spec->eos_id >= 0 ? (int32_t)spec->eos_id : -1;
  m->kv_heads = (int)mc->n_kv_head;
  m->kv_shared = sz->kv_shared;
  if (m->kv_shared) {
    m->kv_head = m->tp_rank / (m->tp_size / m->kv_heads);
    m->kv_seg = (int)sz->kv_seg; /* wk, wv rows (+ bk, bv) */
  }
  if (m->sp && m->N % m->tp_size != 0) {
    tsr_error("model: sequence parallelism needs micro_batch * seq_len = %d divisible by tp %d",
              m->N, m->tp_size);
    return TSR_ERR_INPUT;
  }
  TSR_CHECK(m->L > 0 && m->chunk_q0[m->v] == m->L, TSR_ERR,
            "model: this stage holds %d layers, its %d chunks %d", m->L, m->v, m->chunk_q0[m->v]);
  return 0;
}

/* The units ([0, layer 0), each layer, [end of the last layer, n_flat)) and where each
 * tensor sits in its unit. */
static int locate(tsr_model *m, const tsr_layout *lay) {
  const tsr_model_config *mc = &m->spec.model;
  m->n_units = m->L + 2;
  m->units = tsr_calloc((size_t)m->n_units, sizeof *m->units);
  m->lp = tsr_calloc((size_t)m->L, sizeof *m->lp);
  if (!m->units || !m->lp) return TSR_ERR;
  for (int l = 0; l < m->L; l++) {
    int64_t b = INT64_MAX, e = 0;
    for (int i = 0; i < lay->n_tensors; i++) {
      const tsr_tensor *t = &lay->tensors[i];
      if (t->layer != m->layer_ids[l]) continue;
      b = t->offset < b ? t->offset : b;
      e = t->offset + t->numel > e ? t->offset + t->numel : e;
    }
    m->units[1 + l] = (tsr_unit){b, e};
  }
  m->units[0] = (tsr_unit){0, m->units[1].begin};
  m->units[m->L + 1] = (tsr_unit){m->units[m->L].end, lay->n_flat};
  const int64_t head_base = m->units[m->L + 1].begin;
  m->embed = off_global(lay, "embed.weight", 0);
  m->pos_embed = off_global(lay, "pos_embed.weight", 0);
  m->final_w = off_global(lay, "final_norm.weight", head_base);
  m->final_b = off_global(lay, "final_norm.bias", head_base);
  /* Tied head: where one stage holds both the embedding and the head (one stage, or
   * stage 0 of a V placement) the head is unit 0's embed.weight; otherwise the head's stage holds its
   * own copy of embed.weight after final_norm (docs/sharding.md "Tied embeddings across
   * stages"), whose gradient zero.c sums with the first stage's before the data-parallel
   * reduction. */
  const int tied_here = mc->tie_embeddings && lay->embeds && lay->heads;
  m->head_unit = tied_here ? 0 : m->L + 1;
  m->head = tied_here            ? m->embed
            : mc->tie_embeddings ? off_global(lay, "embed.weight", head_base)
                                 : off_global(lay, "lm_head.weight", head_base);
  TSR_CHECK(!(m->first && (m->embed < 0 || (m->gpt2 && m->pos_embed < 0) ||
                           m->units[0].end < m->embed + (int64_t)m->V * m->C)) &&
                !(m->last && (m->final_w < 0 || m->head < 0)),
            TSR_ERR, "model: layout lacks embed/final_norm/lm_head tensors in their units");
  for (int i = 0; i < m->L; i++) {
    layer_params *p = &m->lp[i];
    const int l = m->layer_ids[i]; /* global layer id: the tensor names */
    const int64_t b = m->units[1 + i].begin;
    p->norm1_w = off(lay, l, "attn_norm.weight", b);
    p->norm1_b = off(lay, l, "attn_norm.bias", b);
    p->wqkv = off(lay, l, "attn.wq.weight", b); /* wq, wk, wv are adjacent: one matrix */
    p->bqkv = off(lay, l, "attn.wq.bias", b);
    p->wo = off(lay, l, "attn.wo.weight", b);
    p->bo = off(lay, l, "attn.wo.bias", b);
    p->norm2_w = off(lay, l, "mlp_norm.weight", b);
    p->norm2_b = off(lay, l, "mlp_norm.bias", b);
    p->wfc = m->gpt2 ? off(lay, l, "mlp.w_up.weight", b) : off(lay, l, "mlp.w_gate.weight", b);
    p->bfc = off(lay, l, "mlp.w_up.bias", b);
    p->wdown = off(lay, l, "mlp.w_down.weight", b);
    p->bdown = off(lay, l, "mlp.w_down.bias", b);
    const tsr_tensor *wk = tsr_layout_layer(lay, l, "attn.wk.weight");
    const tsr_tensor *wv = tsr_layout_layer(lay, l, "attn.wv.weight");
    TSR_CHECK(p->wqkv >= 0 && wk && wv &&
                  wk->offset - b == p->wqkv + (int64_t)m->H * m->hd * m->C &&
                  wv->offset == wk->offset + wk->numel,
              TSR_ERR, "model: layer %d: wq, wk, wv are not adjacent in the flat layout", l);
  }
  return 0;
}

/* What the recompute mode does not keep of a layer's set aliases the shared scratch. */
static void share_scratch(tsr_model *m, layer_acts *a, int own) {
  const layer_acts *sc = &m->scratch;
  if (!(own & A_NORMS)) a->norm1 = sc->norm1, a->norm2 = sc->norm2;
  if (!(own & A_CORE)) {
    a->qkv = sc->qkv, a->atty = sc->atty, a->lse = sc->lse, a->h = sc->h, a->fc = sc->fc;
    a->norm1_mean = sc->norm1_mean, a->norm1_rstd = sc->norm1_rstd;
    a->norm2_mean = sc->norm2_mean, a->norm2_rstd = sc->norm2_rstd;
  }
  if (!(own & A_ACT)) a->act = sc->act;
}

/* The activation offload's window: TSR_MODEL_OFFLOAD_WINDOW device blocks of one layer's
 * stored set and input each (model_offload_layout), their sets' pointers, an event each. */
static int alloc_window(tsr_model *m) {
  const offload_layout *o = &m->ol;
  model_offload_layout(&m->sz, (int64_t)m->esz, &m->ol);
  for (int w = 0; w < TSR_MODEL_OFFLOAD_WINDOW; w++) {
    struct offload_win *win = &m->win[w];
    if (!(win->block = tsr_ops_alloc((size_t)o->bytes, 1)) ||
        !(win->ev = tsr_ops_event_create()))
      return TSR_ERR;
    m->act_bytes += (size_t)o->bytes;
    m->stored_bytes += (size_t)o->bytes;
    char *b = win->block;
    layer_acts *a = &win->acts;
#define AT(field) (o->field < 0 ? NULL : (void *)(b + o->field))
    a->norm1 = AT(norm1), a->norm2 = AT(norm2), a->qkv = AT(qkv), a->atty = AT(atty);
    a->h = AT(h), a->fc = AT(fc), a->act = AT(act), a->lse = AT(lse);
    a->norm1_mean = AT(norm1_mean), a->norm1_rstd = AT(norm1_rstd);
    a->norm2_mean = AT(norm2_mean), a->norm2_rstd = AT(norm2_rstd);
    win->x = AT(x);
    win->ws.d_down = AT(d_down), win->ws.d_o = AT(d_o), win->ws.d_fc = AT(d_fc);
    win->ws.d_qkv = AT(d_qkv), win->ws.norm_w = AT(norm_w), win->ws.norm_b = AT(norm_b);
#undef AT
    share_scratch(m, a, owned_mask(m->recompute));
  }
  return 0;
}

/* Every buffer, at the sizes of m->sz: the owned parameters and gradients, the activation
 * slots (each layer's owned sets, the rest aliasing the shared recompute target), the
 * gradient scratch, the shared-KV and sequence-parallel buffers, the loss statistics. */
static int allocate(tsr_model *m, const tsr_model_options *opt) {
  const tsr_model_sizes *sz = &m->sz;
  const size_t n_flat = (size_t)m->lay->n_flat;
  if ((opt->own_params && !(m->params = tsr_ops_alloc(n_flat, m->esz))) ||
      (opt->own_grads && !(m->grads = tsr_ops_alloc(n_flat, sizeof(float)))))
    return TSR_ERR;
  const int own = owned_mask(m->recompute);
  if (alloc_acts(m, &m->scratch, A_ALL & ~own)) return TSR_ERR;
  m->slots = tsr_calloc((size_t)m->n_slots, sizeof *m->slots);
  if (!m->slots) return TSR_ERR;
  if (m->aoff && alloc_window(m)) return TSR_ERR;
  for (int k = 0; k < m->n_slots; k++) {
    struct act_slot *sl = &m->slots[k];
    const size_t had = m->act_bytes; /* the slot's stored sets and residual stream */
    if (!(sl->acts = tsr_calloc((size_t)m->Lc, sizeof *sl->acts))) return TSR_ERR;
    for (int q = 0; q < m->Lc && !m->aoff; q++) {
      if (alloc_acts(m, &sl->acts[q], own)) return TSR_ERR;
      share_scratch(m, &sl->acts[q], own);
    }
    if (m->aoff) { /* the layers' blocks, page-locked (not op memory) */
      const size_t hb = (size_t)m->Lc * (size_t)m->ol.bytes;
      if (!(sl->host = tsr_ops_host_alloc(hb))) return TSR_ERR;
      m->host_bytes += hb;
    }
    if (!(sl->resid = alloc_a(m, (size_t)sz->resid))) return TSR_ERR;
    m->stored_bytes += m->act_bytes - had;
    if (sz->tokens && !(sl->tokens = tsr_ops_alloc((size_t)sz->tokens, sizeof(int32_t))))
      return TSR_ERR;
    if (m->last && (!(sl->final_norm = alloc_a(m, (size_t)sz->final_norm)) ||
                    !(sl->final_mean = alloc_f(m, (size_t)sz->final_mean)) ||
                    !(sl->final_rstd = alloc_f(m, (size_t)sz->final_rstd)) ||
                    (sz->logits && !(sl->logits = alloc_a(m, (size_t)sz->logits))) ||
                    (sz->head_targets &&
                     !(sl->targets = tsr_ops_alloc((size_t)sz->head_targets, sizeof(int32_t))))))
      return TSR_ERR;
    if (sz->split && alloc_wstash(m, sl)) return TSR_ERR;
  }
  if (!(m->tmp_nc = alloc_a(m, (size_t)sz->tmp_nc)) ||
      !(m->d_resid = alloc_a(m, (size_t)sz->d_resid)) ||
      !(m->d_nc = alloc_a(m, (size_t)sz->d_nc)) || !(m->d_atty = alloc_a(m, (size_t)sz->d_atty)) ||
      !(m->d_qkv = alloc_a(m, (size_t)sz->d_qkv)) || !(m->d_fc = alloc_a(m, (size_t)sz->d_fc)) ||
      (sz->d_act && !(m->d_act = alloc_a(m, (size_t)sz->d_act))))
    return TSR_ERR;
  if (m->kv_shared && (!(m->kv_keep = tsr_ops_alloc((size_t)sz->kv_keep, sizeof(float))) ||
                       !(m->kv_sum = tsr_ops_alloc((size_t)sz->kv_sum, sizeof(float)))))
    return TSR_ERR;
  if (m->sp && (!(m->d_full = alloc_a(m, (size_t)sz->d_full)) ||
                !(m->tmp_s = alloc_a(m, (size_t)sz->tmp_s)) ||
                !(m->d_shard = alloc_a(m, (size_t)sz->d_shard)) ||
                !(m->norm_dw = tsr_ops_alloc((size_t)sz->norm_dw, sizeof(float))) ||
                !(m->norm_db = tsr_ops_alloc((size_t)sz->norm_db, sizeof(float)))))
    return TSR_ERR;
  m->xent_max = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->xent_sum = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->xent_target = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->loss1 = tsr_ops_alloc(1, sizeof(double));
  if (!m->xent_max || !m->xent_sum || !m->xent_target || !m->loss1) return TSR_ERR;
  if (m->last && !(m->targets = tsr_ops_alloc((size_t)sz->xent, sizeof(int32_t))))
    return TSR_ERR;
  if (sz->head_scratch && !(m->head_buf = alloc_a(m, (size_t)sz->head_scratch))) return TSR_ERR;
  if (sz->docs && (!(m->doc_host = tsr_calloc((size_t)sz->docs, sizeof(int32_t))) ||
                   !(m->docs = tsr_ops_alloc((size_t)m->n_slots * sz->docs, sizeof(int32_t)))))
    return TSR_ERR;
  return 0;
}

int tsr_model_create_opt(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay,
                         const tsr_model_options *opt) {
  *out = NULL;
  tsr_model *m = tsr_calloc(1, sizeof *m);
  if (!m) return TSR_ERR;
  int rc = shape_of(m, spec, lay, opt);
  if (!rc) rc = locate(m, lay);
  if (!rc) rc = allocate(m, opt);
  if (!rc) rc = model_cp_init(m, opt ? opt->cp : NULL);
  if (rc) {
    tsr_model_destroy(&m);
    return rc;
  }
  m->hooks = (tsr_model_hooks){m, own_params_acquire, own_release, own_grads_acquire, own_release};
  *out = m;
  return 0;
}

const tsr_model_spec *tsr_model_spec_get(const tsr_model *m) { return &m->spec; }

double tsr_model_table_bytes(const tsr_model_sizes *s, int n_layer, int layers, int chunks,
                             int n_slots) {
  const double Lc = s->layers_per_chunk;
  const double slot = sizeof(struct act_slot) + Lc * sizeof(layer_acts) +
                      (s->split ? Lc * sizeof(layer_wstash) : 0);
  return (double)sizeof(tsr_model) + (double)n_layer * sizeof(int) +
         (chunks + 1.0) * sizeof(int) + (layers + 2.0) * sizeof(*((tsr_model *)0)->units) +
         (double)layers * sizeof(*((tsr_model *)0)->lp) + n_slots * slot +
         (double)s->docs * sizeof(int32_t) +
         (s->cp > 1 ? (2.0 * (double)s->N + (double)s->docs) * sizeof(int32_t) : 0.0);
}

void tsr_model_destroy(tsr_model **mp) {
  if (!mp || !*mp) return;
  tsr_model *m = *mp;
  const int own = owned_mask(m->recompute);
  if (m->slots)
    for (int k = 0; k < m->n_slots; k++) {
      struct act_slot *sl = &m->slots[k];
      if (sl->acts)
        for (int q = 0; q < m->Lc; q++) free_acts(&sl->acts[q], own);
      tsr_free(&sl->acts);
      tsr_ops_free(&sl->resid);
      tsr_ops_free(&sl->tokens);
      tsr_ops_free(&sl->final_norm);
      tsr_ops_free(&sl->final_mean);
      tsr_ops_free(&sl->final_rstd);
      tsr_ops_free(&sl->logits);
      tsr_ops_free(&sl->targets);
      tsr_ops_host_free(&sl->host);
      free_wstash(m, sl);
    }
  tsr_free(&m->slots);
  for (int w = 0; w < TSR_MODEL_OFFLOAD_WINDOW; w++) {
    tsr_ops_free(&m->win[w].block);
    tsr_ops_event_destroy(&m->win[w].ev);
  }
  free_acts(&m->scratch, A_ALL & ~own);
  tsr_free(&m->layer_ids);
  tsr_free(&m->chunk_q0);
  tsr_free(&m->lp);
  tsr_free(&m->units);
  tsr_ops_free(&m->params);
  tsr_ops_free(&m->grads);
  tsr_ops_free(&m->tmp_nc);
  tsr_ops_free(&m->d_resid);
  tsr_ops_free(&m->d_nc);
  tsr_ops_free(&m->d_atty);
  tsr_ops_free(&m->d_qkv);
  tsr_ops_free(&m->d_fc);
  tsr_ops_free(&m->d_act);
  tsr_ops_free(&m->xent_max);
  tsr_ops_free(&m->xent_sum);
  tsr_ops_free(&m->xent_target);
  tsr_ops_free(&m->loss1);
  tsr_ops_free(&m->targets);
  tsr_ops_free(&m->head_buf);
  tsr_free(&m->doc_host);
  tsr_ops_free(&m->docs);
  tsr_free(&m->cp_in);
  tsr_free(&m->cp_tg);
  tsr_free(&m->cp_doc_host);
  tsr_ops_free(&m->cp_dt);
  tsr_ops_free(&m->cp_f32);
  tsr_ops_free(&m->kv_keep);
  tsr_ops_free(&m->kv_sum);
  tsr_ops_free(&m->d_full);
  tsr_ops_free(&m->tmp_s);
  tsr_ops_free(&m->d_shard);
  tsr_ops_free(&m->norm_dw);
  tsr_ops_free(&m->norm_db);
  tsr_free(mp);
}

const void *tsr_model_params(const tsr_model *m) { return m->params; }
void *tsr_model_params_mut(tsr_model *m) { return m->params; }
float *tsr_model_grads(tsr_model *m) { return m->grads; }
size_t tsr_model_activation_bytes(const tsr_model *m) { return m->act_bytes; }

int tsr_model_stored_bytes(const tsr_model *m, size_t *dev, size_t *host, size_t *set) {
  *dev = m->stored_bytes;
  *host = m->host_bytes;
  *set = m->aoff ? (size_t)m->ol.bytes : 0;
  return m->aoff;
}

int tsr_model_n_units(const tsr_model *m) { return m->n_units; }
tsr_unit tsr_model_unit(const tsr_model *m, int u) { return m->units[u]; }

void tsr_model_set_hooks(tsr_model *m, const tsr_model_hooks *hooks) {
  if (hooks)
    m->hooks = *hooks;
  else
    m->hooks = (tsr_model_hooks){m, own_params_acquire, own_release, own_grads_acquire, own_release};
}

tsr_dtype tsr_model_dtype(const tsr_model *m) { return m->dt; }

void tsr_model_set_eos(tsr_model *m, int32_t eos) { m->eos = eos; }

void tsr_model_set_params(tsr_model *m, const float *master) {
  if (m->params) tsr_model_to_compute(m, m->params, master, m->lay->n_flat);
}

void tsr_model_zero_grads(tsr_model *m) {
  if (m->grads) tsr_ops_zero(m->grads, (size_t)m->lay->n_flat * sizeof(float));
}

/* Entry q of the slot's residual stream; with the activation offload the slot keeps only
 * the chunk's output (q = Lc), the layers' inputs being in their window sets. */
static void *resid(const tsr_model *m, struct act_slot *sl, int q) {
  if (m->aoff) return q == m->Lc ? sl->resid : NULL;
  return A(m, sl->resid, (int64_t)q * m->Ns * m->C);
}

/* ---- the activation offload (docs/offload.md "Activation offload") ----
 * Each layer's stored set and its input are one block (model_offload_layout).  The
 * forward computes a layer in a window set and then copies the block to the slot's host
 * block on the copy queue; the backward copies a layer's block back into a window set,
 * the next lower layer's while this one's backward runs.  Every copy starts after the
 * ops queued before it, and records the set's event; the ops wait for that event before
 * they touch the set again: the output of a forward layer before it is written (the set's
 * copy to the host overlaps the rest of the layer), a backward layer before it starts. */
static int win_take(tsr_model *m) {
  const int w = m->win_next;
  m->win_next = (w + 1) % TSR_MODEL_OFFLOAD_WINDOW;
  return w;
}
static void *host_block(const tsr_model *m, struct act_slot *sl, int e) {
  return (char *)sl->host + (size_t)e * (size_t)m->ol.bytes;
}
static void win_store(tsr_model *m, int w, struct act_slot *sl, int e) {
  tsr_ops_copy_async(host_block(m, sl, e), m->win[w].block, (size_t)m->ol.bytes, m->win[w].ev);
}
static void win_load(tsr_model *m, int w, struct act_slot *sl, int e) {
  tsr_ops_copy_async(m->win[w].block, host_block(m, sl, e), (size_t)m->ol.bytes, m->win[w].ev);
}

#define REL(call)                         \
  do {                                    \
    if ((call) != 0) return TSR_ERR;      \
  } while (0)

static int check_ids(const tsr_model *m, const int32_t *ids, const char *what) {
  for (int i = 0; i < m->N; i++)
    TSR_CHECK(ids[i] >= 0 && ids[i] < m->vocab, TSR_ERR_INPUT,
              "%s token id %d out of range [0, %d) at position %d of the micro-batch", what,
              ids[i], m->vocab, i);
  return 0;
}

/* The position offsets (or document starts) the ops of slot sl's micro-batch take, and
 * under cp with documents the whole sequences' starts. */
static void set_slot_docs(tsr_model *m, struct act_slot *sl) {
  m->doc = slot_doc(m, sl);
  m->doc_full = m->doc && m->cp > 1 && m->docmask ? m->doc + m->N : NULL; /* (model_cp.c) */
}

/* Document masking: the document starts of the micro-batch (ops_list.h "Documents") from
 * its input tokens, into the slot.  A document ends with its end-of-document token, so
 * the row after one starts the next; row 0 of a sequence starts the document it opens
 * in (one that began in an earlier sample counts its positions from there). */
static int set_docs(tsr_model *m, struct act_slot *sl, const int32_t *inputs) {
  TSR_CHECK(inputs, TSR_ERR, "model: document masking needs the micro-batch's tokens on every "
            "chunk");
  TSR_CHECK(m->eos >= 0, TSR_ERR, "model: document masking without an end-of-document id");
  const int T = m->Tseq; /* whole sequences: under cp the inputs are the micro-batch's */
  for (int b = 0; b < m->B; b++) {
    const int32_t *in = inputs + (size_t)b * T;
    int32_t *d = m->doc_host + (size_t)b * T, start = 0;
    for (int t = 0; t < T; t++) {
      d[t] = start;
      if (in[t] == m->eos) start = t + 1;
    }
  }
  if (m->cp > 1)
    model_cp_docs(m, sl, m->doc_host);
  else
    tsr_ops_copy(slot_doc(m, sl), m->doc_host, (size_t)m->N * sizeof(int32_t));
  return 0;
}

int tsr_model_n_chunks(const tsr_model *m) { return m->v; }
int tsr_model_n_slots(const tsr_model *m) { return m->n_slots; }
size_t tsr_model_act_elems(const tsr_model *m) { return (size_t)m->sz.act_elems; }
void *tsr_model_input_grad(tsr_model *m) { return m->d_resid; }
const void *tsr_model_chunk_output(const tsr_model *m, int slot) {
  return resid(m, &m->slots[slot], m->Lc);
}

const void *tsr_model_row_logits(tsr_model *m, int slot, int row, int *first, int *count) {
  *first = m->vocab_start, *count = m->V;
  if (!m->last) return NULL;
  struct act_slot *sl = &m->slots[slot];
  if (!m->sz.xent_chunk) return A(m, sl->logits, (int64_t)row * m->V);
  /* the fused head keeps no logits: the row's, from the final norm's output */
  const void *pw = params_acquire(m, m->head_unit, -1);
  if (!pw) return NULL;
  model_head_row_logits(m, sl, pw, row);
  if (m->hooks.params_release(m->hooks.ctx, m->head_unit)) return NULL;
  tsr_ops_sync();
  return m->head_buf;
}

/* The fused head (train.xent_chunk_tokens > 0): the forward runs the final norm and keeps
 * the targets.  With grad, the loss and every gradient are left to the backward, which
 * computes each chunk's logits once for all of them and adds the loss to loss_acc then;
 * without grad the loss alone is computed here, when it is wanted. */
static int head_forward_fused(tsr_model *m, struct act_slot *sl, const int32_t *targets,
                              float dloss, int grad, double *loss_acc) {
  const int head = m->L + 1, tied = m->head_unit == 0, loss = !grad && loss_acc;
  void *hc = m->hooks.ctx;
  tsr_ops_copy(sl->targets, targets, (size_t)m->N * sizeof(int32_t));
  const void *ph = params_acquire(m, head, loss && tied ? 0 : -1);
  const void *pw = loss && tied ? params_acquire(m, 0, -1) : ph;
  if (!ph || !pw) return TSR_ERR;
  TSR_CALL(model_head_fwd(m, sl, ph, pw, resid(m, sl, m->Lc)));
  if (loss) TSR_CALL(model_head_xent(m, sl, pw, NULL, NULL, loss_acc, 0.0f));
  if (loss && tied) REL(m->hooks.params_release(hc, 0));
  REL(m->hooks.params_release(hc, head));
  sl->loss_acc = grad ? loss_acc : NULL;
  sl->dloss = dloss;
  return 0;
}

int tsr_model_chunk_forward(tsr_model *m, int chunk, int slot, const int32_t *inputs,
                            const int32_t *targets, const void *x_in, float dloss, int grad,
                            double *loss_acc) {
  const int N = m->N, C = m->C, L = m->L, Lc = m->Lc, head = L + 1;
  const int embeds = m->first && chunk == 0, heads = m->last && chunk == m->v - 1;
  /* the chunk's n layers start at local layer q0 and use slot entries base.. (resid.) */
  const int q0 = m->chunk_q0[chunk], n = m->chunk_q0[chunk + 1] - q0, base = Lc - n;
  const size_t rows_bytes = (size_t)m->Ns * C * m->esz;
  void *hc = m->hooks.ctx;
  struct act_slot *sl = &m->slots[slot];
  /* offload: the first layer's window set (free once its last copy is done) and its input */
  int w = m->aoff ? win_take(m) : -1;
  if (w >= 0) tsr_ops_event_wait(m->win[w].ev);
  void *x0 = w >= 0 ? m->win[w].x : resid(m, sl, base);
  if (m->docmask) TSR_CALL(set_docs(m, sl, inputs));
  set_slot_docs(m, sl);
  if (m->cp > 1) { /* this rank's rows of the micro-batch (model_cp.c) */
    if (inputs) model_cp_rows(m, m->cp_in, inputs), inputs = m->cp_in;
    if (targets) model_cp_rows(m, m->cp_tg, targets), targets = m->cp_tg;
  }
  if (embeds) {
    TSR_CHECK(inputs, TSR_ERR, "model: the first chunk needs the input tokens");
    TSR_CALL(check_ids(m, inputs, "input"));
    tsr_ops_copy(sl->tokens, inputs, (size_t)N * sizeof(int32_t));
    const void *pe = params_acquire(m, 0, 1 + q0);
    if (!pe) return TSR_ERR;
    /* vocab-parallel lookup: rows outside this rank's range give 0; positions added once */
    void *full = m->sp ? m->tmp_nc : x0;
    tsr_ops_embedding_fwd(m->dt, full, sl->tokens, PC(m, pe, m->embed),
                          model_tp_bias(m, PC(m, pe, m->pos_embed)), N, m->Tpos, C, m->vocab_start, m->V,
                          m->doc);
    const void *rows = model_tp_rows(m, full);
    if (!rows) return TSR_ERR;
    if (rows != x0) tsr_ops_copy(x0, rows, rows_bytes);
    REL(m->hooks.params_release(hc, 0));
  } else {
    TSR_CHECK(x_in, TSR_ERR, "model: chunk %d needs its input activation", chunk);
    tsr_ops_copy(x0, x_in, rows_bytes);
  }
  for (int q = 0; q < n; q++) {
    const int i = q0 + q, e = base + q;
    const void *pr = params_acquire(m, 1 + i, q + 1 < n ? 2 + i : heads ? head : -1);
    if (!pr) return TSR_ERR;
    if (w < 0) {
      TSR_CALL(model_layer_fwd(m, i, pr, resid(m, sl, e), &sl->acts[e], resid(m, sl, e + 1)));
    } else { /* the output into the next layer's set, or the chunk's output */
      const int wn = q + 1 < n ? win_take(m) : -1;
      m->out_ev = wn >= 0 ? m->win[wn].ev : NULL;
      const int rc = model_layer_fwd(m, i, pr, m->win[w].x, &m->win[w].acts,
                                     wn >= 0 ? m->win[wn].x : resid(m, sl, Lc));
      m->out_ev = NULL;
      TSR_CALL(rc);
      if (grad) win_store(m, w, sl, e); /* a forward without grad has no backward */
      w = wn;
    }
    REL(m->hooks.params_release(hc, 1 + i));
  }
  if (!heads) return 0;
  TSR_CHECK(targets, TSR_ERR, "model: the last chunk needs the targets");
  TSR_CALL(check_ids(m, targets, "target"));
  if (m->sz.xent_chunk)
    return head_forward_fused(m, sl, targets, dloss / (float)N, grad, loss_acc);
  tsr_ops_copy(m->targets, targets, (size_t)N * sizeof(int32_t));
  const void *ph = params_acquire(m, head, m->head_unit == 0 ? 0 : -1);
  const void *pw = m->head_unit == 0 ? params_acquire(m, 0, -1) : ph;
  if (!ph || !pw) return TSR_ERR;
  TSR_CALL(model_head_fwd(m, sl, ph, pw, resid(m, sl, Lc)));
  if (m->head_unit == 0) REL(m->hooks.params_release(hc, 0));
  REL(m->hooks.params_release(hc, head));
  /* mean loss; with grad, the logits now hold d(dloss * mean loss)/d logits */
  TSR_CALL(model_loss_and_grad(m, sl->logits, m->targets, dloss / (float)N, grad,
                         loss_acc ? loss_acc : m->loss1));
  return 0;
}

/* The backward of a chunk: whole (split 0), or its B pass (split 1: input gradients only,
 * no gradient unit acquired; what the W pass needs stays in the slot). */
static int chunk_backward(tsr_model *m, int chunk, int slot, const void *d_out, int split) {
  const int N = m->N, C = m->C, L = m->L, Lc = m->Lc, head = L + 1, tied = m->head_unit == 0;
  const int embeds = m->first && chunk == 0, heads = m->last && chunk == m->v - 1;
  const int q0 = m->chunk_q0[chunk], n = m->chunk_q0[chunk + 1] - q0, base = Lc - n;
  void *hc = m->hooks.ctx;
  struct act_slot *sl = &m->slots[slot];
  float *ge = NULL;
  /* offload: the top layer's block comes back while the head's backward runs */
  int w = m->aoff ? win_take(m) : -1;
  if (w >= 0) win_load(m, w, sl, base + n - 1);
  set_slot_docs(m, sl); /* the layers' recompute and backward */
  if (heads) {
    /* final norm and LM head.  Tied (pp = 1): the head's weight and gradient are unit
     * 0's, which stays acquired for gradients until the embedding's backward. */
    const void *ph = params_acquire(m, head, tied ? 0 : L);
    const void *pw = tied ? params_acquire(m, 0, L) : ph;
    if (!ph || !pw) return TSR_ERR;
    if (split) {
      TSR_CALL(model_head_bwd_b(m, sl, ph, pw, resid(m, sl, Lc)));
    } else {
      float *gh = grads_acquire(m, head);
      ge = tied ? grads_acquire(m, 0) : NULL;
      if (!gh || (tied && !ge)) return TSR_ERR;
      TSR_CALL(model_head_bwd(m, sl, ph, pw, gh, tied ? ge : gh, resid(m, sl, Lc)));
    }
    if (tied) REL(m->hooks.params_release(hc, 0));
    REL(m->hooks.params_release(hc, head));
    if (!split) REL(m->hooks.grads_release(hc, head));
  } else {
    TSR_CHECK(d_out, TSR_ERR, "model: chunk %d needs the gradient of its output", chunk);
    tsr_ops_copy(m->d_resid, d_out, (size_t)m->Ns * C * m->esz);
  }
  for (int q = n - 1; q >= 0; q--) {
    const int i = q0 + q, e = base + q;
    const void *pr = params_acquire(m, 1 + i, q > 0 ? i : -1);
    float *gr = split ? NULL : grads_acquire(m, 1 + i);
    if (!pr || (!split && !gr)) return TSR_ERR;
    const void *x = resid(m, sl, e);
    layer_acts *a = &sl->acts[e];
    layer_wstash *ws = split ? &sl->w[e] : NULL;
    const int cur = w;
    if (w >= 0) { /* the next lower layer's block comes back while this one runs */
      const int wp = q > 0 ? win_take(m) : -1;
      if (wp >= 0) win_load(m, wp, sl, e - 1);
      tsr_ops_event_wait(m->win[w].ev);
      x = m->win[w].x, a = &m->win[w].acts;
      if (split) ws = &m->win[w].ws;
      w = wp;
    }
    TSR_CALL(model_layer_recompute(m, i, pr, x, a));
    TSR_CALL(model_layer_bwd(m, i, pr, gr, x, a, ws));
    /* a split backward's stash for W goes to the host with the block (W brings it back) */
    if (split && cur >= 0) win_store(m, cur, sl, e);
    REL(m->hooks.params_release(hc, 1 + i));
    if (!split) REL(m->hooks.grads_release(hc, 1 + i));
  }
  if (!embeds) { /* m->d_resid: the gradient of this chunk's input */
    if (ge) REL(m->hooks.grads_release(hc, 0)); /* a V's stage 0: the tied head's part of unit 0 */
    return 0;
  }
  const void *dfull = model_tp_gather_rows(m, m->d_resid);
  if (!dfull) return TSR_ERR;
  if (split) { /* the embedding's gradient is W's */
    tsr_ops_copy(sl->w_embed, dfull, (size_t)N * C * m->esz);
    return 0;
  }
  if (!ge && !(ge = grads_acquire(m, 0))) return TSR_ERR;
  tsr_ops_embedding_bwd(m->dt, P(ge, m->embed), P(ge, m->pos_embed), dfull, sl->tokens, N, m->Tpos,
                        C, m->vocab_start, m->V, m->doc);
  REL(m->hooks.grads_release(hc, 0));
  return 0;
}

int tsr_model_chunk_backward(tsr_model *m, int chunk, int slot, const void *d_out) {
  return chunk_backward(m, chunk, slot, d_out, 0);
}

int tsr_model_chunk_backward_input(tsr_model *m, int chunk, int slot, const void *d_out) {
  TSR_CHECK(m->sz.split, TSR_ERR, "model: a split backward needs a zero-bubble schedule's buffers");
  TSR_CHECK(m->recompute == TSR_RECOMPUTE_NONE, TSR_ERR,
            "model: a split backward keeps every activation until W: train.recompute = 'none'");
  return chunk_backward(m, chunk, slot, d_out, 1);
}

/* The W pass: every weight gradient of the chunk from what its B pass left in the slot,
 * the units acquired and released in the whole backward's order (head, layers last to
 * first, embedding), so ZeRO reduces each once, after its last micro-batch's W. */
int tsr_model_chunk_backward_weight(tsr_model *m, int chunk, int slot) {
  const int N = m->N, C = m->C, L = m->L, Lc = m->Lc, head = L + 1, tied = m->head_unit == 0;
  const int embeds = m->first && chunk == 0, heads = m->last && chunk == m->v - 1;
  const int q0 = m->chunk_q0[chunk], n = m->chunk_q0[chunk + 1] - q0, base = Lc - n;
  void *hc = m->hooks.ctx;
  struct act_slot *sl = &m->slots[slot];
  TSR_CHECK(m->sz.split, TSR_ERR, "model: a split backward needs a zero-bubble schedule's buffers");
  float *ge = NULL;
  if (heads) {
    /* the fused head computes the logits again from W */
    const void *pw = m->sz.xent_chunk ? params_acquire(m, m->head_unit, -1) : NULL;
    if (m->sz.xent_chunk && !pw) return TSR_ERR;
    float *gh = grads_acquire(m, head);
    ge = tied ? grads_acquire(m, 0) : NULL;
    if (!gh || (tied && !ge)) return TSR_ERR;
    TSR_CALL(model_head_bwd_w(m, sl, pw, gh, tied ? ge : gh));
    if (pw) REL(m->hooks.params_release(hc, m->head_unit));
    REL(m->hooks.grads_release(hc, head));
  }
  /* offload: each layer's block comes back a second time (its stored set, and the stash B
   * left for W, which B sent to the host with it), the next lower layer's while this one's
   * weight gradients are computed, as in the backward */
  int w = m->aoff ? win_take(m) : -1;
  if (w >= 0) win_load(m, w, sl, base + n - 1);
  for (int q = n - 1; q >= 0; q--) {
    const int i = q0 + q, e = base + q;
    float *gr = grads_acquire(m, 1 + i);
    if (!gr) return TSR_ERR;
    layer_acts *a = &sl->acts[e];
    const layer_wstash *ws = &sl->w[e];
    if (w >= 0) {
      const int wp = q > 0 ? win_take(m) : -1;
      if (wp >= 0) win_load(m, wp, sl, e - 1);
      tsr_ops_event_wait(m->win[w].ev);
      a = &m->win[w].acts, ws = &m->win[w].ws;
      w = wp;
    }
    TSR_CALL(model_layer_bwd_w(m, i, gr, a, ws));
    REL(m->hooks.grads_release(hc, 1 + i));
  }
  if (!embeds) {
    if (ge) REL(m->hooks.grads_release(hc, 0)); /* a V's stage 0: the tied head's part of unit 0 */
    return 0;
  }
  if (!ge && !(ge = grads_acquire(m, 0))) return TSR_ERR;
  tsr_ops_embedding_bwd(m->dt, P(ge, m->embed), P(ge, m->pos_embed), sl->w_embed, sl->tokens, N,
                        m->Tpos, C, m->vocab_start, m->V, slot_doc(m, sl));
  REL(m->hooks.grads_release(hc, 0));
  return 0;
}

/* *loss from m->loss1 (op memory), once the queued work is done. */
static void read_loss(tsr_model *m, double *loss) {
  if (loss)
    tsr_ops_read(loss, m->loss1, sizeof *loss);
  else
    tsr_ops_sync();
}

int tsr_model_forward(tsr_model *m, const int32_t *inputs, const int32_t *targets, double *loss) {
  TSR_CHECK(m->first && m->last && m->v == 1, TSR_ERR, "model: forward of a pipeline stage");
  tsr_ops_zero(m->loss1, sizeof(double));
  TSR_CALL(
      tsr_model_chunk_forward(m, 0, 0, inputs, targets, NULL, 0.0f, 0, loss ? m->loss1 : NULL));
  read_loss(m, loss);
  return 0;
}

int tsr_model_fwd_bwd(tsr_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                      double *loss) {
  TSR_CHECK(m->first && m->last && m->v == 1, TSR_ERR, "model: fwd_bwd of a pipeline stage");
  tsr_ops_zero(m->loss1, sizeof(double));
  TSR_CALL(tsr_model_chunk_forward(m, 0, 0, inputs, targets, NULL, dloss, 1, m->loss1));
  TSR_CALL(tsr_model_chunk_backward(m, 0, 0, NULL));
  read_loss(m, loss);
  return 0;
}
