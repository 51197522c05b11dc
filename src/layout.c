/* layout.c — the table of logical tensors and their offsets in the flat buffer. */
#include "layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

typedef struct {
  tsr_layout *lay;
  int cap;
} builder;

static int add(builder *b, const char *name, int ndim, int64_t rows, int64_t cols, int layer,
               tsr_split split, double init_std, float init_value) {
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
  tsr_tensor *t = &lay->tensors[lay->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = ndim == 2 ? cols : 1;
  t->layer = layer;
  t->split = split;
  t->decay = (ndim == 2);
  t->offset = lay->n_params;
  t->numel = t->shape[0] * t->shape[1];
  t->init_std = init_std;
  t->init_value = init_value;
  lay->n_params += t->numel;
  return 0;
}

static int add_norm(builder *b, const char *prefix, int layer, int64_t C, int layernorm) {
  char name[TSR_NAME_MAX];
  snprintf(name, sizeof name, "%s.weight", prefix);
  TSR_CALL(add(b, name, 1, C, 1, layer, TSR_SPLIT_REPLICATED, 0.0, 1.0f));
  if (layernorm) {
    snprintf(name, sizeof name, "%s.bias", prefix);
    TSR_CALL(add(b, name, 1, C, 1, layer, TSR_SPLIT_REPLICATED, 0.0, 0.0f));
  }
  return 0;
}

int tsr_layout_create(tsr_layout **out, const tsr_model_config *m) {
  *out = NULL;
  tsr_layout *lay = tsr_calloc(1, sizeof *lay);
  if (!lay) return TSR_ERR;
  builder b = {lay, 0};
  const int gpt2 = strcmp(m->arch, "gpt2") == 0;
  const int64_t C = m->d_model, V = m->vocab_size, F = m->d_ff;
  const int64_t hd = m->d_model / m->n_head;
  const int64_t q_dim = m->n_head * hd, kv_dim = m->n_kv_head * hd;
  const double std = m->init_std;
  /* GPT-2 / Megatron convention: projections into the residual stream are scaled
   * down by sqrt(2 L) so the residual variance does not grow with depth. */
  const double std_out = m->init_std / sqrt(2.0 * (double)m->n_layer);
  char name[TSR_NAME_MAX];
  int rc = 0;

#define ADD(...)            \
  do {                      \
    rc = add(&b, __VA_ARGS__); \
    if (rc) goto fail;      \
  } while (0)

  ADD("embed.weight", 2, V, C, -1, TSR_SPLIT_VOCAB, std, 0.0f);
  if (gpt2) ADD("pos_embed.weight", 2, m->seq_len, C, -1, TSR_SPLIT_REPLICATED, std, 0.0f);
  for (int l = 0; l < (int)m->n_layer; l++) {
    char p[16]; /* "layers.NNN." */
    snprintf(p, sizeof p, "layers.%03d.", l % 10000);
#define NM(s) (snprintf(name, sizeof name, "%s%s", p, s), name)
    snprintf(name, sizeof name, "%sattn_norm", p);
    if ((rc = add_norm(&b, name, l, C, gpt2))) goto fail;
    ADD(NM("attn.wq.weight"), 2, q_dim, C, l, TSR_SPLIT_COLUMN, std, 0.0f);
    ADD(NM("attn.wk.weight"), 2, kv_dim, C, l, TSR_SPLIT_COLUMN, std, 0.0f);
    ADD(NM("attn.wv.weight"), 2, kv_dim, C, l, TSR_SPLIT_COLUMN, std, 0.0f);
    if (gpt2) {
      ADD(NM("attn.wq.bias"), 1, q_dim, 1, l, TSR_SPLIT_COLUMN, 0.0, 0.0f);
      ADD(NM("attn.wk.bias"), 1, kv_dim, 1, l, TSR_SPLIT_COLUMN, 0.0, 0.0f);
      ADD(NM("attn.wv.bias"), 1, kv_dim, 1, l, TSR_SPLIT_COLUMN, 0.0, 0.0f);
    }
    ADD(NM("attn.wo.weight"), 2, C, q_dim, l, TSR_SPLIT_ROW, std_out, 0.0f);
    if (gpt2) ADD(NM("attn.wo.bias"), 1, C, 1, l, TSR_SPLIT_REPLICATED, 0.0, 0.0f);
    snprintf(name, sizeof name, "%smlp_norm", p);
    if ((rc = add_norm(&b, name, l, C, gpt2))) goto fail;
    if (!gpt2) ADD(NM("mlp.w_gate.weight"), 2, F, C, l, TSR_SPLIT_COLUMN, std, 0.0f);
    ADD(NM("mlp.w_up.weight"), 2, F, C, l, TSR_SPLIT_COLUMN, std, 0.0f);
    if (gpt2) ADD(NM("mlp.w_up.bias"), 1, F, 1, l, TSR_SPLIT_COLUMN, 0.0, 0.0f);
    ADD(NM("mlp.w_down.weight"), 2, C, F, l, TSR_SPLIT_ROW, std_out, 0.0f);
    if (gpt2) ADD(NM("mlp.w_down.bias"), 1, C, 1, l, TSR_SPLIT_REPLICATED, 0.0, 0.0f);
#undef NM
  }
  if ((rc = add_norm(&b, "final_norm", -1, C, gpt2))) goto fail;
  if (!m->tie_embeddings) ADD("lm_head.weight", 2, V, C, -1, TSR_SPLIT_VOCAB, std, 0.0f);
#undef ADD
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
      for (int64_t j = 0; j < t->numel; j++)
        p[j] = (float)(t->init_std * tsr_rand_normal(key, (uint64_t)j));
    } else {
      for (int64_t j = 0; j < t->numel; j++) p[j] = t->init_value;
    }
  }
  for (int64_t j = lay->n_params; j < lay->n_flat; j++) flat[j] = 0.0f;
}
