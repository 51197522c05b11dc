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
#include "model.h"

#include <math.h>
#include <string.h>

#include "comm.h"
#include "ops.h"
#include "util.h"

typedef struct { /* offsets of one layer's tensors relative to its unit (-1: absent) */
  int64_t norm1_w, norm1_b, wqkv, bqkv, wo, bo, norm2_w, norm2_b, wfc, bfc, wdown, bdown;
} layer_params;

typedef struct { /* one layer's activations (pointers may alias shared scratch) */
  void *norm1;                     /* [N,C] (the run's storage type, as every void * here) */
  float *norm1_mean, *norm1_rstd; /* [N], [N] (fp32, as every float * here) */
  void *qkv;                       /* [N, qkv_dim] (after RoPE) */
  void *atty;                      /* [N, H*hd] attention output */
  float *lse;                      /* [B*H*T] */
  void *h;                         /* [Ns,C] residual after attention */
  void *norm2;
  float *norm2_mean, *norm2_rstd;
  void *fc;  /* [N, fc_dim] */
  void *act; /* [N, F] */
} layer_acts;

struct tsr_model {
  tsr_config cfg;
  const tsr_layout *lay;
  int gpt2;
  tsr_dtype dt; /* storage of the parameters' compute copy, activations and their gradients */
  size_t esz;   /* its bytes per element */
  tsr_recompute recompute;
  /* H, KV, F, V: this tp rank's query heads, KV heads, MLP width and vocabulary rows */
  int B, T, C, H, KV, hd, F, V, L, N, qkv_dim, fc_dim;
  tsr_model_sizes sz; /* every buffer's size (tsr_model_sizes_of) */
  int vocab, vocab_start; /* full vocabulary; first row held here */
  tsr_comm *tp;           /* NULL or a group of size 1: no tensor parallelism */
  int tp_size, tp_rank;
  /* sequence parallel: the residual stream and norms hold Ns = N / tp tokens (rows
   * [row0, row0 + Ns) of the micro-batch); without it Ns = N, row0 = 0 */
  int sp, Ns, row0;
  void *d_full;       /* [N,C] a gathered residual gradient */
  void *tmp_s;        /* [Ns,C] a reduce-scattered projection */
  void *d_shard;      /* [Ns,C] a reduce-scattered norm-output gradient */
  float *norm_dw, *norm_db; /* [C] one micro-batch's norm gradients before the tp sum */
  double *xent_max, *xent_sum, *xent_target; /* [N] vocab-parallel loss statistics */
  double *loss1; /* one double: tsr_model_forward / fwd_bwd's loss, or a sink for none */
  int32_t *targets; /* [N] last stage: the micro-batch's targets, copied where ops read */
  /* n_kv_head < tp: KV heads are replicated, each shared by tp / n_kv_head ranks whose
   * query heads all contribute to its gradient; these buffers sum those contributions */
  int kv_shared, kv_head, kv_heads, kv_seg;
  float *kv_keep, *kv_sum;
  float eps, theta;
  /* offsets relative to their unit: embed, pos_embed in unit 0; final norm in the head
   * unit; lm_head in the head unit, or embed in unit 0 when tied */
  int64_t embed, pos_embed, final_w, final_b, head;
  int head_unit; /* unit holding the LM head weight: L+1, or 0 when tied */
  layer_params *lp;
  int n_units;
  tsr_unit *units;
  tsr_model_hooks hooks;

  void *params;  /* compute copy (dt), n_flat (NULL when a provider owns them) */
  float *grads;  /* fp32, n_flat (NULL when a provider owns them) */

  /* pipeline: this stage's layers (L of them, global ids layer_ids), in v chunks of Lc;
   * first: holds the embedding (global chunk 0); last: the head (the last chunk) */
  int *layer_ids;
  int v, Lc, first, last;
  /* Activations of a micro-batch in flight through one chunk live in a slot; a stage
   * keeps as many slots as its schedule has micro-batch-chunks in flight. */
  int n_slots;
  struct act_slot {
    layer_acts *acts; /* [Lc] */
    void *resid;      /* [(Lc+1) * Ns*C]: the chunk's input, then each layer's output */
    void *final_norm; /* last stage: the head */
    float *final_mean, *final_rstd;
    void *logits; /* [N, V]: the logits, then their gradient */
    int32_t *tokens;  /* first stage: the inputs (for the embedding backward) */
  } *slots;
  layer_acts scratch; /* recompute target */
  void *tmp_nc;       /* [N,C] projection outputs */
  void *d_resid;      /* [Ns,C] gradient of the residual stream */
  void *d_nc;         /* [N,C] gradient of a norm output */
  void *d_atty, *d_qkv, *d_fc, *d_act;
  size_t act_bytes;
};

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

/* Tensor o (an offset in its unit; -1: absent) of a unit's fp32 gradient / compute-copy
 * parameters. */
static float *P(float *base, int64_t o) { return o < 0 ? NULL : base + o; }
static const void *PC(const tsr_model *m, const void *base, int64_t o) {
  return o < 0 ? NULL : tsr_dtype_at_c(base, m->dt, o);
}
/* Element i of a stored (dt) activation buffer. */
static void *A(const tsr_model *m, void *base, int64_t i) { return tsr_dtype_at(base, m->dt, i); }

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

/* Allocate one layer's activation set; `which` selects the buffers to allocate. */
enum { A_NORMS = 1, A_CORE = 2, A_ACT = 4, A_ALL = 7 };
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

/* Which buffers each layer owns and which live in the shared scratch set. */
static int owned_mask(tsr_recompute r) {
  return r == TSR_RECOMPUTE_NONE ? A_ALL : r == TSR_RECOMPUTE_SELECTIVE ? A_CORE : 0;
}

void tsr_model_sizes_of(tsr_model_sizes *s, const tsr_config *cfg, int tp, int first, int last,
                        int layers_per_chunk) {
  const tsr_model_config *mc = &cfg->model;
  memset(s, 0, sizeof *s);
  s->gpt2 = mc->arch == TSR_ARCH_GPT2;
  s->recompute = cfg->train.recompute;
  s->first = first;
  s->last = last;
  s->layers_per_chunk = layers_per_chunk;
  s->B = cfg->train.micro_batch;
  s->T = mc->seq_len;
  s->C = mc->d_model;
  s->hd = mc->d_model / mc->n_head;
  s->H = mc->n_head / tp;
  s->KV = mc->n_kv_head >= tp ? mc->n_kv_head / tp : 1;
  s->F = mc->d_ff / tp;
  s->V = mc->vocab_size / tp;
  s->N = s->B * s->T;
  s->sp = cfg->parallel.sequence_parallel && tp > 1;
  s->Ns = s->sp ? s->N / tp : s->N;
  s->qkv_dim = (s->H + 2 * s->KV) * s->hd;
  s->fc_dim = s->gpt2 ? s->F : 2 * s->F;
  s->kv_shared = tp > mc->n_kv_head;
  s->kv_seg = 2 * s->hd * s->C + (s->gpt2 ? 2 * s->hd : 0);
  const int64_t N = s->N, C = s->C, Ns = s->Ns;
  s->layer = (tsr_model_layer_sizes){.norm1 = N * C, .norm2 = N * C, .qkv = N * s->qkv_dim,
                                     .atty = N * s->H * s->hd, .lse = s->B * s->H * s->T,
                                     .h = Ns * C, .fc = N * s->fc_dim, .norm1_mean = N,
                                     .norm1_rstd = N, .norm2_mean = N, .norm2_rstd = N,
                                     .act = N * s->F};
  s->resid = (layers_per_chunk + 1) * Ns * C;
  s->tokens = first ? N : 0;
  if (last) s->final_norm = N * C, s->final_mean = N, s->final_rstd = N, s->logits = N * s->V;
  s->tmp_nc = s->d_resid = s->d_nc = N * C;
  s->d_atty = N * s->H * s->hd;
  s->d_qkv = N * s->qkv_dim;
  s->d_fc = N * s->fc_dim;
  s->d_act = s->gpt2 ? 0 : N * s->F; /* gpt2: the GELU's backward is fused into a GEMM's */
  if (s->kv_shared) s->kv_keep = s->kv_seg, s->kv_sum = s->kv_seg * mc->n_kv_head;
  if (s->sp) s->d_full = N * C, s->tmp_s = s->d_shard = Ns * C, s->norm_dw = s->norm_db = C;
  s->xent = N;
  s->act_elems = Ns * C;
}

/* Bytes of the groups `which` of one layer's activation set: the norm statistics and lse
 * stay fp32. */
static double set_bytes(const tsr_model_sizes *s, int which, double ab) {
  const tsr_model_layer_sizes *n = &s->layer;
  double b = 0;
  if (which & A_NORMS) b += (double)(n->norm1 + n->norm2) * ab;
  if (which & A_CORE)
    b += (double)(n->qkv + n->atty + n->h + n->fc) * ab +
         (double)(n->lse + n->norm1_mean + n->norm1_rstd + n->norm2_mean + n->norm2_rstd) * 4;
  if (which & A_ACT) b += (double)n->act * ab;
  return b;
}

/* The layers of a chunk, its residual stream, the input tokens (int32), the final norm
 * and its statistics, the logits (stored: they become their own gradient). */
double tsr_model_slot_bytes(const tsr_model_sizes *s, double ab) {
  return s->layers_per_chunk * set_bytes(s, owned_mask(s->recompute), ab) +
         (double)s->resid * ab + (double)s->tokens * 4 + (double)(s->final_norm + s->logits) * ab +
         (double)(s->final_mean + s->final_rstd) * 4;
}

/* The recompute target (what the layers do not own), the activation-gradient and
 * projection scratch (stored), the shared-KV parameter-gradient buffers and the sequence-
 * parallel norm gradients (fp32), the loss statistics (double) and, on the last stage,
 * the targets (int32, where the ops can read them). */
double tsr_model_workspace_bytes(const tsr_model_sizes *s, double ab) {
  const double stored = (double)(s->tmp_nc + s->d_resid + s->d_nc + s->d_atty + s->d_qkv +
                                 s->d_fc + s->d_act + s->d_full + s->tmp_s + s->d_shard);
  const double fp32 = (double)(s->kv_keep + s->kv_sum + s->norm_dw + s->norm_db);
  return set_bytes(s, A_ALL & ~owned_mask(s->recompute), ab) + stored * ab + fp32 * 4 +
         3.0 * (double)s->xent * 8 + (s->last ? (double)s->xent * 4 : 0.0);
}

int tsr_model_create(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay) {
  return tsr_model_create_ext(out, cfg, lay, 1, 1);
}

int tsr_model_create_ext(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay,
                         int own_params, int own_grads) {
  const tsr_model_options o = {own_params, own_grads, NULL, 1};
  return tsr_model_create_opt(out, cfg, lay, &o);
}

int tsr_model_create_opt(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay,
                         const tsr_model_options *opt) {
  *out = NULL;
  tsr_comm *tp = opt->tp;
  const int own_params = opt->own_params, own_grads = opt->own_grads;
  tsr_model *m = tsr_calloc(1, sizeof *m);
  if (!m) return TSR_ERR;
  m->cfg = *cfg;
  m->lay = lay;
  const tsr_model_config *mc = &cfg->model;
  m->dt = cfg->train.precision;
  m->esz = tsr_dtype_size(m->dt);
  m->tp = tp;
  m->tp_size = tp ? tsr_comm_size(tp) : 1;
  m->tp_rank = tp ? tsr_comm_rank(tp) : 0;
  const int tps = m->tp_size;
  /* this stage's layers, in the layout's (increasing) order */
  m->layer_ids = tsr_calloc((size_t)mc->n_layer, sizeof(int));
  if (!m->layer_ids) {
    tsr_model_destroy(&m);
    return TSR_ERR;
  }
  for (int i = 0; i < lay->n_tensors; i++) {
    const int l = lay->tensors[i].layer;
    if (l >= 0 && (m->L == 0 || m->layer_ids[m->L - 1] != l)) m->layer_ids[m->L++] = l;
  }
  m->v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
  m->Lc = m->L / m->v;
  m->first = lay->pp_rank == 0;
  m->last = lay->pp_rank == lay->pp - 1;
  m->n_slots = opt->n_slots > 0 ? opt->n_slots : 1;
  tsr_model_sizes_of(&m->sz, cfg, tps, m->first, m->last, m->Lc);
  const tsr_model_sizes *sz = &m->sz;
  m->gpt2 = sz->gpt2;
  m->recompute = sz->recompute;
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
  m->theta = (float)mc->rope_theta;
  int rc = TSR_ERR;

  /* units: [0, layer 0), each layer, [end of last layer, n_flat) */
  m->n_units = m->L + 2;
  m->units = tsr_calloc((size_t)m->n_units, sizeof *m->units);
  if (!m->units) goto fail;
  if (m->sp && m->N % tps != 0) {
    tsr_error("model: sequence parallelism needs micro_batch * seq_len = %d divisible by tp %d",
              m->N, tps);
    rc = TSR_ERR_INPUT;
    goto fail;
  }
  if (m->L == 0 || m->L % m->v != 0) {
    tsr_error("model: this stage holds %d layers in %d chunks", m->L, m->v);
    goto fail;
  }
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
  m->units[0] = (tsr_unit){0, m->L > 0 ? m->units[1].begin : 0};
  m->units[m->L + 1] = (tsr_unit){m->L > 0 ? m->units[m->L].end : 0, lay->n_flat};
  const int64_t head_base = m->units[m->L + 1].begin;
  m->embed = off_global(lay, "embed.weight", 0);
  m->pos_embed = off_global(lay, "pos_embed.weight", 0);
  m->final_w = off_global(lay, "final_norm.weight", head_base);
  m->final_b = off_global(lay, "final_norm.bias", head_base);
  /* Tied head: with one stage the head is unit 0's embed.weight; with a pipeline the last
   * stage holds its own copy of embed.weight after final_norm (docs/sharding.md "Tied embeddings
   * across stages"), whose
   * gradient zero.c sums with the first stage's before the data-parallel reduction. */
  const int tied_here = mc->tie_embeddings && lay->pp == 1;
  m->head_unit = tied_here ? 0 : m->L + 1;
  m->head = tied_here                ? m->embed
            : mc->tie_embeddings     ? off_global(lay, "embed.weight", head_base)
                                     : off_global(lay, "lm_head.weight", head_base);
  if ((m->first && (m->embed < 0 || (m->gpt2 && m->pos_embed < 0) ||
                    m->units[0].end < m->embed + (int64_t)m->V * m->C)) ||
      (m->last && (m->final_w < 0 || m->head < 0))) {
    tsr_error("model: layout lacks embed/final_norm/lm_head tensors in their units");
    goto fail;
  }
  m->hooks = (tsr_model_hooks){m, own_params_acquire, own_release, own_grads_acquire, own_release};
  m->lp = tsr_calloc((size_t)m->L, sizeof *m->lp);
  if (!m->lp) goto fail;
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
    if (p->wqkv < 0 || !wk || !wv || wk->offset - b != p->wqkv + (int64_t)m->H * m->hd * m->C ||
        wv->offset != wk->offset + wk->numel) {
      tsr_error("model: layer %d: wq, wk, wv are not adjacent in the flat layout", l);
      goto fail;
    }
  }

  if ((own_params && !(m->params = tsr_ops_alloc((size_t)lay->n_flat, m->esz))) ||
      (own_grads && !(m->grads = tsr_ops_alloc((size_t)lay->n_flat, sizeof(float)))))
    goto fail;
  const int own = owned_mask(m->recompute);
  if (alloc_acts(m, &m->scratch, A_ALL & ~own)) goto fail;
  m->slots = tsr_calloc((size_t)m->n_slots, sizeof *m->slots);
  if (!m->slots) goto fail;
  for (int k = 0; k < m->n_slots; k++) {
    struct act_slot *sl = &m->slots[k];
    if (!(sl->acts = tsr_calloc((size_t)m->Lc, sizeof *sl->acts))) goto fail;
    for (int q = 0; q < m->Lc; q++) {
      if (alloc_acts(m, &sl->acts[q], own)) goto fail;
      layer_acts *a = &sl->acts[q], *sc = &m->scratch;
      if (!(own & A_NORMS)) a->norm1 = sc->norm1, a->norm2 = sc->norm2;
      if (!(own & A_CORE)) {
        a->qkv = sc->qkv, a->atty = sc->atty, a->lse = sc->lse, a->h = sc->h, a->fc = sc->fc;
        a->norm1_mean = sc->norm1_mean, a->norm1_rstd = sc->norm1_rstd;
        a->norm2_mean = sc->norm2_mean, a->norm2_rstd = sc->norm2_rstd;
      }
      if (!(own & A_ACT)) a->act = sc->act;
    }
    if (!(sl->resid = alloc_a(m, (size_t)sz->resid))) goto fail;
    if (sz->tokens && !(sl->tokens = tsr_ops_alloc((size_t)sz->tokens, sizeof(int32_t)))) goto fail;
    if (m->last && (!(sl->final_norm = alloc_a(m, (size_t)sz->final_norm)) ||
                    !(sl->final_mean = alloc_f(m, (size_t)sz->final_mean)) ||
                    !(sl->final_rstd = alloc_f(m, (size_t)sz->final_rstd)) ||
                    !(sl->logits = alloc_a(m, (size_t)sz->logits))))
      goto fail;
  }
  if (!(m->tmp_nc = alloc_a(m, (size_t)sz->tmp_nc)) ||
      !(m->d_resid = alloc_a(m, (size_t)sz->d_resid)) ||
      !(m->d_nc = alloc_a(m, (size_t)sz->d_nc)) || !(m->d_atty = alloc_a(m, (size_t)sz->d_atty)) ||
      !(m->d_qkv = alloc_a(m, (size_t)sz->d_qkv)) || !(m->d_fc = alloc_a(m, (size_t)sz->d_fc)) ||
      !(m->d_act = alloc_a(m, (size_t)sz->d_act)))
    goto fail;
  m->kv_heads = (int)mc->n_kv_head;
  m->kv_shared = sz->kv_shared;
  if (m->kv_shared) {
    m->kv_head = m->tp_rank / (tps / m->kv_heads);
    m->kv_seg = (int)sz->kv_seg; /* wk, wv rows (+ bk, bv) */
    if (!(m->kv_keep = tsr_ops_alloc((size_t)sz->kv_keep, sizeof(float))) ||
        !(m->kv_sum = tsr_ops_alloc((size_t)sz->kv_sum, sizeof(float))))
      goto fail;
  }
  if (m->sp && (!(m->d_full = alloc_a(m, (size_t)sz->d_full)) ||
                !(m->tmp_s = alloc_a(m, (size_t)sz->tmp_s)) ||
                !(m->d_shard = alloc_a(m, (size_t)sz->d_shard)) ||
                !(m->norm_dw = tsr_ops_alloc((size_t)sz->norm_dw, sizeof(float))) ||
                !(m->norm_db = tsr_ops_alloc((size_t)sz->norm_db, sizeof(float)))))
    goto fail;
  m->xent_max = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->xent_sum = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->xent_target = tsr_ops_alloc((size_t)sz->xent, sizeof(double));
  m->loss1 = tsr_ops_alloc(1, sizeof(double));
  if (!m->xent_max || !m->xent_sum || !m->xent_target || !m->loss1) goto fail;
  if (m->last && !(m->targets = tsr_ops_alloc((size_t)sz->xent, sizeof(int32_t)))) goto fail;
  *out = m;
  return 0;
fail:
  tsr_model_destroy(&m);
  return rc;
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
    }
  tsr_free(&m->slots);
  free_acts(&m->scratch, A_ALL & ~own);
  tsr_free(&m->layer_ids);
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

static int64_t max_of(int64_t a, int64_t b) { return a > b ? a : b; }
void tsr_model_ops_shapes_of(const tsr_model_sizes *z, tsr_ops_shapes *s) {
  /* the widest GEMM input or output: d_model, qkv, the MLP (fc and its input F), and the
   * head's [N, V_local] output (and its gradient) only on the last stage */
  const int64_t cols =
      max_of(max_of(max_of(z->C, z->qkv_dim), max_of(z->fc_dim, z->H * z->hd)),
             max_of(z->F, z->last ? z->V : 0));
  const long bht = (long)z->B * z->H * z->T;
  memset(s, 0, sizeof *s);
  s->rows = (long)z->N;
  s->cols = (long)cols;
  s->vocab_local = (long)z->V;
  s->attn_bht = bht;
  s->attn_part = z->KV < z->H ? 2 * bht * z->hd : 0;
  s->attn_io = (long)z->B * z->T * (z->H + z->KV) * z->hd;
  s->attn_t = (long)z->T;
  s->attn_hd = (long)z->hd;
}
void tsr_model_ops_shapes(const tsr_model *m, tsr_ops_shapes *s) {
  tsr_model_ops_shapes_of(&m->sz, s);
  s->dt = m->dt;
}
int tsr_model_n_units(const tsr_model *m) { return m->n_units; }
tsr_unit tsr_model_unit(const tsr_model *m, int u) { return m->units[u]; }

void tsr_model_set_hooks(tsr_model *m, const tsr_model_hooks *hooks) {
  if (hooks)
    m->hooks = *hooks;
  else
    m->hooks = (tsr_model_hooks){m, own_params_acquire, own_release, own_grads_acquire, own_release};
}

void tsr_model_to_compute(const tsr_model *m, void *dst, const float *src, int64_t n) {
  tsr_ops_cast(m->dt, dst, TSR_F32, src, (long)n);
}

tsr_dtype tsr_model_dtype(const tsr_model *m) { return m->dt; }

void tsr_model_set_params(tsr_model *m, const float *master) {
  if (m->params) tsr_model_to_compute(m, m->params, master, m->lay->n_flat);
}

void tsr_model_zero_grads(tsr_model *m) {
  if (m->grads) tsr_ops_zero(m->grads, (size_t)m->lay->n_flat * sizeof(float));
}

/* Norm of this rank's rows into the full-size output out [N, C]: of x [Ns, C], or, with
 * y (a branch's output: the residual add fused in), of h = x + y, which is stored at h.
 * With sequence parallelism the rows are computed here and the rest all-gathered from
 * the tp group (the column-parallel GEMM that follows needs every token). */
static int norm_fwd(tsr_model *m, const void *pr, void *out, float *mean, float *rstd, void *h,
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
static int norm_bwd(tsr_model *m, const void *pr, float *gr, void *dx, const void *dout,
                    const void *x, const float *mean, const float *rstd, int64_t w, int64_t b,
                    int acc) {
  const int C = m->C;
  float *dw = m->sp ? m->norm_dw : P(gr, w), *db = m->sp ? m->norm_db : P(gr, b);
  if (m->sp) {
    tsr_ops_zero(m->norm_dw, (size_t)C * sizeof(float));
    tsr_ops_zero(m->norm_db, (size_t)C * sizeof(float));
  }
  if (m->gpt2)
    tsr_ops_layernorm_bwd(m->dt, dx, dw, b >= 0 ? db : NULL, dout, x, PC(m, pr, w), mean, rstd,
                          m->Ns, C, acc);
  else
    tsr_ops_rmsnorm_bwd(m->dt, dx, dw, dout, x, PC(m, pr, w), rstd, m->Ns, C, acc);
  if (!m->sp) return 0;
  TSR_CALL(tsr_comm_all_reduce(m->tp, m->norm_dw, (size_t)C, TSR_F32));
  tsr_ops_acc(P(gr, w), m->norm_dw, C);
  if (b >= 0) {
    TSR_CALL(tsr_comm_all_reduce(m->tp, m->norm_db, (size_t)C, TSR_F32));
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
static void *tp_rows(tsr_model *m, void *partial) {
  if (!m->sp) return tp_sum(m, partial, (long)m->N * m->C) ? NULL : partial;
  if (tsr_comm_reduce_scatter(m->tp, partial, m->tmp_s, (size_t)m->Ns * m->C, m->dt)) return NULL;
  return m->tmp_s;
}

/* The gradient of this rank's rows D [Ns, C] on all N rows (sequence parallel), as the
 * row-parallel GEMMs' backward needs it; D itself otherwise. */
static const void *tp_gather_rows(tsr_model *m, const void *D) {
  if (!m->sp) return D;
  if (tsr_comm_all_gather(m->tp, D, m->d_full, (size_t)m->Ns * m->C, m->dt)) return NULL;
  return m->d_full;
}

/* The gradient of a norm output [N, C] from column-parallel GEMMs, summed over tp: in
 * place, or (sequence parallel) reduce-scattered to this rank's rows. */
static void *tp_grad_rows(tsr_model *m, void *partial) {
  if (!m->sp) return tp_sum(m, partial, (long)m->N * m->C) ? NULL : partial;
  if (tsr_comm_reduce_scatter(m->tp, partial, m->d_shard, (size_t)m->Ns * m->C, m->dt))
    return NULL;
  return m->d_shard;
}

/* A replicated bias of a row-parallel GEMM enters the partial sums on tp rank 0 only. */
static const void *tp_bias(const tsr_model *m, const void *b) { return m->tp_rank == 0 ? b : NULL; }

/* Forward of layer l with parameters pr (its unit): x (input) -> out; activations into a. */
static int layer_fwd(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a,
                     void *out) {
  const layer_params *p = &m->lp[l];
  const int N = m->N, C = m->C, qd = m->H * m->hd, kvd = m->KV * m->hd;
  const tsr_dtype dt = m->dt;
  TSR_CALL(norm_fwd(m, pr, a->norm1, a->norm1_mean, a->norm1_rstd, NULL, x, NULL, p->norm1_w,
                    p->norm1_b));
  tsr_ops_matmul_fwd(dt, a->qkv, a->norm1, PC(m, pr, p->wqkv), PC(m, pr, p->bqkv), N, C,
                     m->qkv_dim);
  if (!m->gpt2) {
    tsr_ops_rope_fwd(dt, a->qkv, N, m->T, m->H, m->hd, m->qkv_dim, m->theta);
    tsr_ops_rope_fwd(dt, A(m, a->qkv, qd), N, m->T, m->KV, m->hd, m->qkv_dim, m->theta);
  }
  tsr_ops_attention_fwd(dt, a->atty, a->lse, a->qkv, A(m, a->qkv, qd), A(m, a->qkv, qd + kvd),
                        m->B, m->T, m->H, m->KV, m->hd, m->qkv_dim);
  tsr_ops_matmul_fwd(dt, m->tmp_nc, a->atty, PC(m, pr, p->wo), tp_bias(m, PC(m, pr, p->bo)), N,
                     qd, C);
  const void *proj = tp_rows(m, m->tmp_nc);
  if (!proj) return TSR_ERR;
  /* h = x + proj and its norm, in one pass */
  TSR_CALL(norm_fwd(m, pr, a->norm2, a->norm2_mean, a->norm2_rstd, a->h, x, proj, p->norm2_w,
                    p->norm2_b));
  tsr_ops_matmul_fwd(dt, a->fc, a->norm2, PC(m, pr, p->wfc), PC(m, pr, p->bfc), N, C, m->fc_dim);
  mlp_act_fwd(m, a->act, a->fc);
  tsr_ops_matmul_fwd(dt, m->tmp_nc, a->act, PC(m, pr, p->wdown),
                     tp_bias(m, PC(m, pr, p->bdown)), N, m->F, C);
  if (!(proj = tp_rows(m, m->tmp_nc))) return TSR_ERR;
  tsr_ops_residual(dt, out, a->h, proj, (long)m->Ns * C);
  return 0;
}

/* Rebuild what the recompute mode did not keep for layer l: the same ops on the same
 * stored inputs, so the rebuilt values are bitwise the forward's. */
static int layer_recompute(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a) {
  const layer_params *p = &m->lp[l];
  if (m->recompute == TSR_RECOMPUTE_FULL) {
    TSR_CALL(layer_fwd(m, l, pr, x, a, m->d_nc)); /* the output is not needed: d_nc is free */
  } else if (m->recompute == TSR_RECOMPUTE_SELECTIVE) {
    TSR_CALL(norm_fwd(m, pr, a->norm1, a->norm1_mean, a->norm1_rstd, NULL, x, NULL, p->norm1_w,
                      p->norm1_b));
    TSR_CALL(norm_fwd(m, pr, a->norm2, a->norm2_mean, a->norm2_rstd, NULL, a->h, NULL,
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
 * input gradients; the norms add theirs to the residual stream's. */
static int layer_bwd(tsr_model *m, int l, const void *pr, float *gr, const void *x,
                     layer_acts *a) {
  const layer_params *p = &m->lp[l];
  const int N = m->N, C = m->C, qd = m->H * m->hd, kvd = m->KV * m->hd;
  const tsr_dtype dt = m->dt;
  void *D = m->d_resid; /* [Ns, C] */
  /* MLP branch */
  const void *Dfull = tp_gather_rows(m, D);
  if (!Dfull) return TSR_ERR;
  if (m->gpt2) { /* the GELU's backward rides in the down-projection's */
    tsr_ops_matmul_bwd(dt, m->d_fc, P(gr, p->wdown), P(gr, p->bdown), Dfull, a->act,
                       PC(m, pr, p->wdown), a->fc, N, m->F, C);
  } else {
    tsr_ops_matmul_bwd(dt, m->d_act, P(gr, p->wdown), P(gr, p->bdown), Dfull, a->act,
                       PC(m, pr, p->wdown), NULL, N, m->F, C);
    tsr_ops_swiglu_bwd(dt, m->d_fc, m->d_act, a->fc, N, m->F);
  }
  tsr_ops_matmul_bwd(dt, m->d_nc, P(gr, p->wfc), P(gr, p->bfc), m->d_fc, a->norm2,
                     PC(m, pr, p->wfc), NULL, N, C, m->fc_dim);
  void *dn = tp_grad_rows(m, m->d_nc);
  if (!dn) return TSR_ERR;
  TSR_CALL(norm_bwd(m, pr, gr, D, dn, a->h, a->norm2_mean, a->norm2_rstd, p->norm2_w, p->norm2_b,
                    1));
  /* attention branch */
  if (!(Dfull = tp_gather_rows(m, D))) return TSR_ERR;
  tsr_ops_matmul_bwd(dt, m->d_atty, P(gr, p->wo), P(gr, p->bo), Dfull, a->atty, PC(m, pr, p->wo),
                     NULL, N, qd, C);
  tsr_ops_attention_bwd(dt, m->d_qkv, A(m, m->d_qkv, qd), A(m, m->d_qkv, qd + kvd), m->d_atty,
                        a->atty, a->lse, a->qkv, A(m, a->qkv, qd), A(m, a->qkv, qd + kvd), m->B,
                        m->T, m->H, m->KV, m->hd, m->qkv_dim);
  if (!m->gpt2) {
    tsr_ops_rope_bwd(dt, m->d_qkv, N, m->T, m->H, m->hd, m->qkv_dim, m->theta);
    tsr_ops_rope_bwd(dt, A(m, m->d_qkv, qd), N, m->T, m->KV, m->hd, m->qkv_dim, m->theta);
  }
  if (m->kv_shared) kv_set_aside(m, p, gr);
  tsr_ops_matmul_bwd(dt, m->d_nc, P(gr, p->wqkv), P(gr, p->bqkv), m->d_qkv, a->norm1,
                     PC(m, pr, p->wqkv), NULL, N, C, m->qkv_dim);
  if (m->kv_shared) TSR_CALL(kv_reduce(m, p, gr));
  if (!(dn = tp_grad_rows(m, m->d_nc))) return TSR_ERR;
  TSR_CALL(norm_bwd(m, pr, gr, D, dn, x, a->norm1_mean, a->norm1_rstd, p->norm1_w, p->norm1_b,
                    1));
  return 0;
}

static void *resid(const tsr_model *m, struct act_slot *sl, int q) {
  return A(m, sl->resid, (int64_t)q * m->Ns * m->C);
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

/* *acc (op memory) += the mean row loss from the (vocab-parallel) logits; with grad the
 * logits are replaced by dloss * d(loss sum)/d(logits). */
static int loss_and_grad(tsr_model *m, void *logits, const int32_t *targets, float dloss, int grad,
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

int tsr_model_n_chunks(const tsr_model *m) { return m->v; }
int tsr_model_n_slots(const tsr_model *m) { return m->n_slots; }
size_t tsr_model_act_elems(const tsr_model *m) { return (size_t)m->sz.act_elems; }
void *tsr_model_input_grad(tsr_model *m) { return m->d_resid; }
const void *tsr_model_chunk_output(const tsr_model *m, int slot) {
  return resid(m, &m->slots[slot], m->Lc);
}

int tsr_model_chunk_forward(tsr_model *m, int chunk, int slot, const int32_t *inputs,
                            const int32_t *targets, const void *x_in, float dloss, int grad,
                            double *loss_acc) {
  const int N = m->N, C = m->C, L = m->L, Lc = m->Lc, head = L + 1;
  const int embeds = m->first && chunk == 0, heads = m->last && chunk == m->v - 1;
  const size_t rows_bytes = (size_t)m->Ns * C * m->esz;
  void *hc = m->hooks.ctx;
  struct act_slot *sl = &m->slots[slot];
  if (embeds) {
    TSR_CHECK(inputs, TSR_ERR, "model: the first chunk needs the input tokens");
    TSR_CALL(check_ids(m, inputs, "input"));
    tsr_ops_copy(sl->tokens, inputs, (size_t)N * sizeof(int32_t));
    const void *pe = params_acquire(m, 0, 1 + chunk * Lc);
    if (!pe) return TSR_ERR;
    /* vocab-parallel lookup: rows outside this rank's range give 0; positions added once */
    void *full = m->sp ? m->tmp_nc : resid(m, sl, 0);
    tsr_ops_embedding_fwd(m->dt, full, sl->tokens, PC(m, pe, m->embed),
                          tp_bias(m, PC(m, pe, m->pos_embed)), N, m->T, C, m->vocab_start, m->V);
    const void *rows = tp_rows(m, full);
    if (!rows) return TSR_ERR;
    if (rows != resid(m, sl, 0)) tsr_ops_copy(resid(m, sl, 0), rows, rows_bytes);
    REL(m->hooks.params_release(hc, 0));
  } else {
    TSR_CHECK(x_in, TSR_ERR, "model: chunk %d needs its input activation", chunk);
    tsr_ops_copy(resid(m, sl, 0), x_in, rows_bytes);
  }
  for (int q = 0; q < Lc; q++) {
    const int i = chunk * Lc + q;
    const void *pr = params_acquire(m, 1 + i, q + 1 < Lc ? 2 + i : heads ? head : -1);
    if (!pr) return TSR_ERR;
    TSR_CALL(layer_fwd(m, i, pr, resid(m, sl, q), &sl->acts[q], resid(m, sl, q + 1)));
    REL(m->hooks.params_release(hc, 1 + i));
  }
  if (!heads) return 0;
  TSR_CHECK(targets, TSR_ERR, "model: the last chunk needs the targets");
  TSR_CALL(check_ids(m, targets, "target"));
  tsr_ops_copy(m->targets, targets, (size_t)N * sizeof(int32_t));
  const void *ph = params_acquire(m, head, m->head_unit == 0 ? 0 : -1);
  const void *pw = m->head_unit == 0 ? params_acquire(m, 0, -1) : ph;
  if (!ph || !pw) return TSR_ERR;
  TSR_CALL(norm_fwd(m, ph, sl->final_norm, sl->final_mean, sl->final_rstd, NULL, resid(m, sl, Lc),
                    NULL, m->final_w, m->final_b));
  tsr_ops_matmul_fwd(m->dt, sl->logits, sl->final_norm, PC(m, pw, m->head), NULL, N, C, m->V);
  if (m->head_unit == 0) REL(m->hooks.params_release(hc, 0));
  REL(m->hooks.params_release(hc, head));
  /* mean loss; with grad, the logits now hold d(dloss * mean loss)/d logits */
  TSR_CALL(loss_and_grad(m, sl->logits, m->targets, dloss / (float)N, grad,
                         loss_acc ? loss_acc : m->loss1));
  return 0;
}

int tsr_model_chunk_backward(tsr_model *m, int chunk, int slot, const void *d_out) {
  const int N = m->N, C = m->C, L = m->L, Lc = m->Lc, head = L + 1, tied = m->head_unit == 0;
  const int embeds = m->first && chunk == 0, heads = m->last && chunk == m->v - 1;
  void *hc = m->hooks.ctx;
  struct act_slot *sl = &m->slots[slot];
  float *ge = NULL;
  if (heads) {
    /* final norm and LM head.  Tied (pp = 1): the head's weight and gradient are unit
     * 0's, which stays acquired for gradients until the embedding's backward. */
    const void *ph = params_acquire(m, head, tied ? 0 : L);
    const void *pw = tied ? params_acquire(m, 0, L) : ph;
    float *gh = grads_acquire(m, head);
    ge = tied ? grads_acquire(m, 0) : NULL;
    if (!ph || !pw || !gh || (tied && !ge)) return TSR_ERR;
    tsr_ops_matmul_bwd(m->dt, m->d_nc, P(tied ? ge : gh, m->head), NULL, sl->logits,
                       sl->final_norm, PC(m, pw, m->head), NULL, N, C, m->V);
    void *dn = tp_grad_rows(m, m->d_nc);
    if (!dn) return TSR_ERR;
    /* the residual stream's gradient starts here: written, not added */
    TSR_CALL(norm_bwd(m, ph, gh, m->d_resid, dn, resid(m, sl, Lc), sl->final_mean,
                      sl->final_rstd, m->final_w, m->final_b, 0));
    if (tied) REL(m->hooks.params_release(hc, 0));
    REL(m->hooks.params_release(hc, head));
    REL(m->hooks.grads_release(hc, head));
  } else {
    TSR_CHECK(d_out, TSR_ERR, "model: chunk %d needs the gradient of its output", chunk);
    tsr_ops_copy(m->d_resid, d_out, (size_t)m->Ns * C * m->esz);
  }
  for (int q = Lc - 1; q >= 0; q--) {
    const int i = chunk * Lc + q;
    const void *pr = params_acquire(m, 1 + i, q > 0 ? i : -1);
    float *gr = grads_acquire(m, 1 + i);
    if (!pr || !gr) return TSR_ERR;
    TSR_CALL(layer_recompute(m, i, pr, resid(m, sl, q), &sl->acts[q]));
    TSR_CALL(layer_bwd(m, i, pr, gr, resid(m, sl, q), &sl->acts[q]));
    REL(m->hooks.params_release(hc, 1 + i));
    REL(m->hooks.grads_release(hc, 1 + i));
  }
  if (!embeds) return 0; /* m->d_resid: the gradient of this chunk's input */
  if (!ge && !(ge = grads_acquire(m, 0))) return TSR_ERR;
  const void *dfull = tp_gather_rows(m, m->d_resid);
  if (!dfull) return TSR_ERR;
  tsr_ops_embedding_bwd(m->dt, P(ge, m->embed), P(ge, m->pos_embed), dfull, sl->tokens, N, m->T,
                        C, m->vocab_start, m->V);
  REL(m->hooks.grads_release(hc, 0));
  return 0;
}

/* *loss from m->loss1 (op memory), once the queued work is done. */
static void read_loss(tsr_model *m, double *loss) {
  tsr_ops_sync();
  if (loss) *loss = *m->loss1;
}

int tsr_model_forward(tsr_model *m, const int32_t *inputs, const int32_t *targets, double *loss) {
  TSR_CHECK(m->first && m->last && m->v == 1, TSR_ERR, "model: forward of a pipeline stage");
  tsr_ops_zero(m->loss1, sizeof(double));
  TSR_CALL(tsr_model_chunk_forward(m, 0, 0, inputs, targets, NULL, 0.0f, 0, m->loss1));
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
