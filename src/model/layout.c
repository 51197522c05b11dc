/* layout.c — the table of logical tensors, the local slice a (pipeline stage, tp rank)
 * holds of each, and where it sits in the flat buffer (docs/sharding.md). */
#include "layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "deck/layout_check.h"
#include "sched/pipeline.h"
#include "core/util.h"

/* How a tensor is cut over tp ranks: the split kinds of layout.h, with KV rows apart. */
typedef enum { CUT_WHOLE, CUT_ROWS, CUT_KV_ROWS, CUT_COLS } cut;

typedef struct {
  tsr_layout *lay;
  int cap;
  int logical;     /* logical tensors seen so far, held here or not */
  int held;        /* 1: the tensors being added live on this stage */
  int64_t kv_rows; /* rows of one KV head (head_dim) */
} builder;

static int add_tensor(builder *b, const char *name, int ndim, int64_t rows, int64_t cols,
                      int layer, tsr_split split, cut how, double init_std, float init_value,
                      int logical, int tied_copy) {
  tsr_layout *lay = b->lay;
  if (lay->n_tensors == b->cap) {
    int cap = b->cap ? 2 * b->cap : 64;
    tsr_tensor *t = tsr_calloc((size_t)cap, sizeof *t);
    if (!t) return TSR_ERR;
    if (lay->tensors) memcpy(t, lay->tensors, (size_t)lay->n_tensors * sizeof *t);
    tsr_free(&lay->tensors);
    lay->tensors = t;
    b->cap = cap;
  }
  const int64_t T = lay->tp, r = lay->tp_rank;
  tsr_tensor *t = &lay->tensors[lay->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = ndim == 2 ? cols : 1;
  t->layer = layer;
  t->split = split;
  t->decay = (ndim == 2);
  t->init_std = init_std;
  t->init_value = init_value;
  t->lshape[0] = t->shape[0];
  t->lshape[1] = t->shape[1];
  t->tp_copies = 1;
  switch (how) {
    case CUT_WHOLE:
      t->tp_copies = (int)T;
      t->tp_copy = (int)r;
      break;
    case CUT_ROWS:
      t->lshape[0] = rows / T;
      t->row0 = r * rows / T;
      break;
    case CUT_KV_ROWS: {
      const int64_t heads = rows / b->kv_rows;
      if (heads >= T) {
        t->lshape[0] = rows / T;
        t->row0 = r * rows / T;
      } else { /* T / heads ranks share one head */
        const int64_t share = T / heads;
        t->lshape[0] = b->kv_rows;
        t->row0 = r / share * b->kv_rows;
        t->tp_copies = (int)share;
        t->tp_copy = (int)(r % share);
      }
      break;
    }
    case CUT_COLS:
      t->lshape[1] = t->shape[1] / T;
      t->col0 = r * t->shape[1] / T;
      break;
  }
  t->numel = t->lshape[0] * t->lshape[1];
  t->offset = lay->n_params;
  t->tied_copy = tied_copy;
  t->logical_index = logical;
  lay->n_params += t->numel;
  return 0;
}

/* The next logical tensor of the whole model's list; kept when this stage holds it. */
static int add(builder *b, const char *name, int ndim, int64_t rows, int64_t cols, int layer,
               tsr_split split, cut how, double init_std, float init_value) {
  const int logical = b->logical++;
  if (!b->held) return 0;
  return add_tensor(b, name, ndim, rows, cols, layer, split, how, init_std, init_value, logical, 0);
}

static int add_norm(builder *b, const char *prefix, int layer, int64_t C, int layernorm) {
  char name[TSR_NAME_MAX];
  snprintf(name, sizeof name, "%s.weight", prefix);
  TSR_CALL(add(b, name, 1, C, 1, layer, TSR_SPLIT_REPLICATED, CUT_WHOLE, 0.0, 1.0f));
  if (layernorm) {
    snprintf(name, sizeof name, "%s.bias", prefix);
    TSR_CALL(add(b, name, 1, C, 1, layer, TSR_SPLIT_REPLICATED, CUT_WHOLE, 0.0, 0.0f));
  }
  return 0;
}

int tsr_layout_stage_of_layer(const tsr_model_config *m, int pp, int virtual_stages,
                              const char *split, tsr_schedule_choice placement, int layer) {
  const int c = tsr_pp_layer_chunk(m, pp, virtual_stages, split, layer);
  return c < 0 ? -1 : tsr_pp_chunk_owner(placement, pp, virtual_stages, c);
}

/* The divisibility the split rules need, named by deck key. */
static int check_part(const tsr_model_config *m, int tp, int tp_rank, int pp, int pp_rank,
                      int v, const char *split, tsr_schedule_choice placement) {
  TSR_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, TSR_ERR_INPUT,
            "layout: tp rank %d is not in [0, parallel.tp = %d)", tp_rank, tp);
  TSR_CHECK(pp >= 1 && pp_rank >= 0 && pp_rank < pp, TSR_ERR_INPUT,
            "layout: pipeline stage %d is not in [0, parallel.pp = %d)", pp_rank, pp);
  TSR_CHECK(v >= 1, TSR_ERR_INPUT, "layout: parallel.virtual_stages = %d must be >= 1", v);
  /* the model's divisibility rules are layout_check's, on a layout of just tp, pp and v */
  tsr_config c; /* zeroed: no world, no sequence parallelism, shard_scope 'global' */
  memset(&c, 0, sizeof c);
  c.model = *m;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.parallel.virtual_stages = v;
  const tsr_sched_desc *sd = tsr_sched(placement);
  TSR_CHECK(sd, TSR_ERR_INPUT, "layout: schedule %d is not one of the registry's", (int)placement);
  c.parallel.schedule = tsr_sched_for(sd->placement, v); /* one that places v chunks so */
  TSR_CHECK(strlen(split) < sizeof c.parallel.stage_layers, TSR_ERR_INPUT,
            "layout: parallel.stage_layers is too long");
  strcpy(c.parallel.stage_layers, split);
  tsr_layout_issue is;
  if (tsr_layout_check(&c, 0, 0, &is, 1) > 0) {
    char text[1024];
    tsr_layout_issue_text(&is, &c, NULL, NULL, text, sizeof text);
    tsr_error("layout: %s", text);
    return TSR_ERR_INPUT;
  }
  return 0;
}

int tsr_layout_create(tsr_layout **out, const tsr_model_config *m) {
  return tsr_layout_create_part(out, m, 1, 0, 1, 0, 1);
}

int tsr_layout_create_part(tsr_layout **out, const tsr_model_config *m, int tp, int tp_rank,
                           int pp, int pp_rank, int virtual_stages) {
  return tsr_layout_create_split(out, m, tp, tp_rank, pp, pp_rank, virtual_stages, "",
                                 tsr_sched_for(TSR_PLACE_ROUND, virtual_stages));
}

int tsr_layout_create_split(tsr_layout **out, const tsr_model_config *m, int tp, int tp_rank,
                            int pp, int pp_rank, int virtual_stages, const char *split,
                            tsr_schedule_choice placement) {
  *out = NULL;
  if (!split) split = "";
  TSR_CALL(check_part(m, tp, tp_rank, pp, pp_rank, virtual_stages, split, placement));
  tsr_layout *lay = tsr_calloc(1, sizeof *lay);
  if (!lay) return TSR_ERR;
  lay->model = *m;
  lay->tp = tp;
  lay->tp_rank = tp_rank;
  lay->pp = pp;
  lay->pp_rank = pp_rank;
  lay->virtual_stages = virtual_stages;
  lay->placement = placement;
  strcpy(lay->stage_layers, split); /* fits: check_part */
  const int first = pp_rank == 0;
  const int last = pp_rank == tsr_pp_head_stage(placement, pp, virtual_stages);
  lay->embeds = first;
  lay->heads = last;
  const int gpt2 = m->arch == TSR_ARCH_GPT2;
  const int64_t C = m->d_model, V = m->vocab_size, F = m->d_ff;
  const int64_t hd = m->d_model / m->n_head;
  const int64_t q_dim = m->n_head * hd, kv_dim = m->n_kv_head * hd;
  builder b = {lay, 0, 0, first, hd};
  const double std = m->init_std;
  /* GPT-2 / Megatron convention: projections into the residual stream are scaled
   * down by sqrt(2 L) so the residual variance does not grow with depth. */
  const double std_out = m->init_std / sqrt(2.0 * (double)m->n_layer);
  char name[TSR_NAME_MAX];
  int rc = 0;

#define ADD(...)                 \
  do {                           \
    rc = add(&b, __VA_ARGS__);   \
    if (rc) goto fail;           \
  } while (0)

  ADD("embed.weight", 2, V, C, -1, TSR_SPLIT_VOCAB, CUT_ROWS, std, 0.0f);
  if (gpt2)
    ADD("pos_embed.weight", 2, tsr_max_positions(m), C, -1, TSR_SPLIT_REPLICATED, CUT_WHOLE, std,
        0.0f);
  for (int l = 0; l < (int)m->n_layer; l++) {
    char p[16]; /* "layers.NNN." */
    snprintf(p, sizeof p, "layers.%03d.", l % 10000);
    b.held = tsr_layout_stage_of_layer(m, pp, virtual_stages, split, placement, l) == pp_rank;
#define NM(s) (snprintf(name, sizeof name, "%s%s", p, s), name)
    snprintf(name, sizeof name, "%sattn_norm", p);
    if ((rc = add_norm(&b, name, l, C, gpt2))) goto fail;
    ADD(NM("attn.wq.weight"), 2, q_dim, C, l, TSR_SPLIT_COLUMN, CUT_ROWS, std, 0.0f);
    ADD(NM("attn.wk.weight"), 2, kv_dim, C, l, TSR_SPLIT_COLUMN, CUT_KV_ROWS, std, 0.0f);
    ADD(NM("attn.wv.weight"), 2, kv_dim, C, l, TSR_SPLIT_COLUMN, CUT_KV_ROWS, std, 0.0f);
    if (gpt2) {
      ADD(NM("attn.wq.bias"), 1, q_dim, 1, l, TSR_SPLIT_COLUMN, CUT_ROWS, 0.0, 0.0f);
      ADD(NM("attn.wk.bias"), 1, kv_dim, 1, l, TSR_SPLIT_COLUMN, CUT_KV_ROWS, 0.0, 0.0f);
      ADD(NM("attn.wv.bias"), 1, kv_dim, 1, l, TSR_SPLIT_COLUMN, CUT_KV_ROWS, 0.0, 0.0f);
    }
    ADD(NM("attn.wo.weight"), 2, C, q_dim, l, TSR_SPLIT_ROW, CUT_COLS, std_out, 0.0f);
    if (gpt2) ADD(NM("attn.wo.bias"), 1, C, 1, l, TSR_SPLIT_REPLICATED, CUT_WHOLE, 0.0, 0.0f);
    snprintf(name, sizeof name, "%smlp_norm", p);
    if ((rc = add_norm(&b, name, l, C, gpt2))) goto fail;
    if (!gpt2)
      ADD(NM("mlp.w_gate.weight"), 2, F, C, l, TSR_SPLIT_COLUMN, CUT_ROWS, std, 0.0f);
    ADD(NM("mlp.w_up.weight"), 2, F, C, l, TSR_SPLIT_COLUMN, CUT_ROWS, std, 0.0f);
    if (gpt2) ADD(NM("mlp.w_up.bias"), 1, F, 1, l, TSR_SPLIT_COLUMN, CUT_ROWS, 0.0, 0.0f);
    ADD(NM("mlp.w_down.weight"), 2, C, F, l, TSR_SPLIT_ROW, CUT_COLS, std_out, 0.0f);
    if (gpt2)
      ADD(NM("mlp.w_down.bias"), 1, C, 1, l, TSR_SPLIT_REPLICATED, CUT_WHOLE, 0.0, 0.0f);
#undef NM
  }
  b.held = last;
  if ((rc = add_norm(&b, "final_norm", -1, C, gpt2))) goto fail;
  if (!m->tie_embeddings)
    ADD("lm_head.weight", 2, V, C, -1, TSR_SPLIT_VOCAB, CUT_ROWS, std, 0.0f);
  else if (last && !first) /* the head's copy of embed.weight (logical tensor 0) */
    rc = add_tensor(&b, "embed.weight", 2, V, C, -1, TSR_SPLIT_VOCAB, CUT_ROWS, std, 0.0f, 0, 1);
  if (rc) goto fail;
#undef ADD
  lay->n_logical = b.logical;
  lay->n_flat = (lay->n_params + 63) / 64 * 64;
  *out = lay;
  return 0;
fail:
  tsr_layout_destroy(&lay);
  return rc ? rc : TSR_ERR;
}

void tsr_layout_destroy(tsr_layout **lay) {
  if (!lay || !*lay) return;
  tsr_free(&(*lay)->tensors);
  tsr_free(lay);
}

const tsr_tensor *tsr_layout_find(const tsr_layout *lay, const char *name) {
  for (int i = 0; i < lay->n_tensors; i++)
    if (strcmp(lay->tensors[i].name, name) == 0) return &lay->tensors[i];
  return NULL;
}

const tsr_tensor *tsr_layout_layer(const tsr_layout *lay, int layer, const char *suffix) {
  char name[TSR_NAME_MAX];
  snprintf(name, sizeof name, "layers.%03d.%s", layer, suffix);
  return tsr_layout_find(lay, name);
}

void tsr_layout_init(const tsr_layout *lay, float *flat, uint64_t seed) {
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    float *p = flat + t->offset;
    if (t->init_std > 0) {
      uint64_t key = tsr_mix64(seed) ^ tsr_hash_str(t->name);
      /* counter-based draws: the same values whatever the threads (a 1B model's start) */
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < t->numel; j++)
        p[j] = (float)(t->init_std *
                       tsr_rand_normal(key, (uint64_t)tsr_layout_logical_index(t, j)));
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < t->numel; j++) p[j] = t->init_value;
    }
  }
  for (int64_t j = lay->n_params; j < lay->n_flat; j++) flat[j] = 0.0f;
}

int64_t tsr_layout_logical_index(const tsr_tensor *t, int64_t i) {
  return (t->row0 + i / t->lshape[1]) * t->shape[1] + t->col0 + i % t->lshape[1];
}

int tsr_layout_piece(const tsr_tensor *t, int64_t s0, int64_t s1, int64_t *i0, int64_t *i1,
                     tsr_rect rect[3]) {
  const int64_t lc = t->lshape[1];
  int64_t a = s0 > t->offset ? s0 - t->offset : 0;
  int64_t e = s1 - t->offset < t->numel ? s1 - t->offset : t->numel;
  if (e < a) e = a;
  *i0 = a;
  *i1 = e;
  int n = 0;
  int64_t i = a;
  if (i < e && i % lc) { /* partial first row */
    const int64_t r = i / lc, c = i % lc;
    const int64_t ce = e - r * lc < lc ? e - r * lc : lc;
    rect[n++] = (tsr_rect){t->row0 + r, t->col0 + c, 1, ce - c};
    i = r * lc + ce;
  }
  if (e - i >= lc) { /* full rows */
    const int64_t k = (e - i) / lc;
    rect[n++] = (tsr_rect){t->row0 + i / lc, t->col0, k, lc};
    i += k * lc;
  }
  if (i < e) /* partial last row */
    rect[n++] = (tsr_rect){t->row0 + i / lc, t->col0, 1, e - i};
  return n;
}

int tsr_layout_writes(const tsr_tensor *t, int copy_index, int n_copies) {
  if (t->tied_copy) return 0;
  const int64_t holders = (int64_t)t->tp_copies * n_copies;
  const int64_t me = (int64_t)copy_index * t->tp_copies + t->tp_copy;
  return t->logical_index % holders == me;
}
