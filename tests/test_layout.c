/* test_layout.c — the tensor table: names and shapes as DESIGN.md's checkpoint table,
 * contiguous non-overlapping offsets, fusable weights adjacent, and initialisation
 * that depends only on (seed, tensor name, element index). */
#include <math.h>
#include <string.h>

#include "deck.h"
#include "layout.h"
#include "testutil.h"
#include "util.h"

static tsr_model_config model(const char *arch, int L, int tied) {
  tsr_config c;
  tsr_deck_defaults(&c);
  tsr_model_config m = c.model;
  snprintf(m.arch, sizeof m.arch, "%s", arch);
  m.n_layer = L;
  m.d_model = 64;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_ff = 96;
  m.vocab_size = 97;
  m.seq_len = 16;
  m.tie_embeddings = tied;
  m.init_std = 0.02;
  return m;
}

static int shape_is(const tsr_layout *lay, const char *name, int64_t r, int64_t c) {
  const tsr_tensor *t = tsr_layout_find(lay, name);
  return t && t->shape[0] == r && t->shape[1] == c;
}

int main(void) {
  tsr_layout *lay;
  /* llama: untied, GQA */
  tsr_model_config m = model("llama", 3, 0);
  TU_CHECK(tsr_layout_create(&lay, &m) == 0, "llama layout created");
  const int64_t C = 64, hd = 16, V = 97, F = 96, L = 3;
  int64_t expect = V * C * 2 + C + L * (2 * C + C * 4 * hd * 2 + 2 * C * 2 * hd + 3 * C * F);
  TU_CHECK(lay->n_params == expect, "llama parameter count %lld == closed form %lld",
           (long long)lay->n_params, (long long)expect);
  TU_CHECK(lay->n_tensors == 2 + 1 + 3 * 9, "llama tensor count %d == 30", lay->n_tensors);
  TU_CHECK(shape_is(lay, "embed.weight", V, C) && shape_is(lay, "lm_head.weight", V, C) &&
               shape_is(lay, "layers.002.attn.wq.weight", 64, C) &&
               shape_is(lay, "layers.002.attn.wk.weight", 32, C) &&
               shape_is(lay, "layers.000.attn.wv.weight", 32, C) &&
               shape_is(lay, "layers.001.attn.wo.weight", C, 64) &&
               shape_is(lay, "layers.001.mlp.w_gate.weight", F, C) &&
               shape_is(lay, "layers.001.mlp.w_up.weight", F, C) &&
               shape_is(lay, "layers.001.mlp.w_down.weight", C, F) &&
               shape_is(lay, "layers.000.attn_norm.weight", C, 1) &&
               shape_is(lay, "final_norm.weight", C, 1),
           "llama names and [out, in] shapes as DESIGN.md");
  TU_CHECK(!tsr_layout_find(lay, "pos_embed.weight") &&
               !tsr_layout_find(lay, "layers.000.attn.wq.bias") &&
               !tsr_layout_find(lay, "final_norm.bias"),
           "llama has no positions, biases or norm biases");
  int contiguous = 1, decay_ok = 1;
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    int64_t next = i + 1 < lay->n_tensors ? lay->tensors[i + 1].offset : lay->n_params;
    if (t->offset + t->numel != next) contiguous = 0;
    if (t->decay != (t->ndim == 2)) decay_ok = 0;
  }
  TU_CHECK(contiguous && lay->tensors[0].offset == 0, "tensors tile [0, n_params) in order");
  TU_CHECK(lay->n_flat % 64 == 0 && lay->n_flat >= lay->n_params && lay->n_flat - lay->n_params < 64,
           "flat length %lld padded to a multiple of 64", (long long)lay->n_flat);
  TU_CHECK(decay_ok, "weight decay on exactly the 2-D tensors");
  const tsr_tensor *wq = tsr_layout_layer(lay, 1, "attn.wq.weight");
  const tsr_tensor *wk = tsr_layout_layer(lay, 1, "attn.wk.weight");
  const tsr_tensor *wv = tsr_layout_layer(lay, 1, "attn.wv.weight");
  const tsr_tensor *wg = tsr_layout_layer(lay, 1, "mlp.w_gate.weight");
  const tsr_tensor *wu = tsr_layout_layer(lay, 1, "mlp.w_up.weight");
  TU_CHECK(wk->offset == wq->offset + wq->numel && wv->offset == wk->offset + wk->numel &&
               wu->offset == wg->offset + wg->numel,
           "wq|wk|wv and w_gate|w_up adjacent (fused GEMMs need no copy)");

  /* initialisation: statistics and layout independence */
  float *flat = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  tsr_layout_init(lay, flat, 42);
  const tsr_tensor *emb = tsr_layout_find(lay, "embed.weight");
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < emb->numel; i++) s += flat[emb->offset + i], s2 += flat[emb->offset + i] * (double)flat[emb->offset + i];
  double mean = s / emb->numel, sd = sqrt(s2 / emb->numel - mean * mean);
  TU_CHECK(fabs(sd - 0.02) < 0.002 && fabs(mean) < 0.002, "embed init mean %.5f std %.5f ~ N(0, 0.02)", mean, sd);
  const tsr_tensor *wo = tsr_layout_layer(lay, 0, "attn.wo.weight");
  s2 = 0;
  for (int64_t i = 0; i < wo->numel; i++) s2 += flat[wo->offset + i] * (double)flat[wo->offset + i];
  double want = 0.02 / sqrt(2.0 * 3);
  TU_CHECK(fabs(sqrt(s2 / wo->numel) - want) < 0.15 * want, "wo init std %.5f ~ 0.02/sqrt(2L) = %.5f",
           sqrt(s2 / wo->numel), want);
  const tsr_tensor *n1 = tsr_layout_layer(lay, 2, "mlp_norm.weight");
  int ones = 1;
  for (int64_t i = 0; i < n1->numel; i++) ones &= flat[n1->offset + i] == 1.0f;
  TU_CHECK(ones, "norm weights initialised to 1");
  TU_CHECK(memcmp(flat + wq->offset, flat + tsr_layout_layer(lay, 2, "attn.wq.weight")->offset,
                  sizeof(float) * 16) != 0, "different layers get different values");

  tsr_layout *lay2;
  tsr_model_config m2 = model("llama", 5, 0);
  tsr_layout_create(&lay2, &m2);
  float *flat2 = tsr_calloc((size_t)lay2->n_flat, sizeof(float));
  tsr_layout_init(lay2, flat2, 42);
  int same = 1;
  const char *names[] = {"embed.weight", "layers.000.attn.wk.weight", "layers.002.mlp.w_up.weight",
                         "lm_head.weight"};
  for (int i = 0; i < 4; i++) {
    const tsr_tensor *a = tsr_layout_find(lay, names[i]), *b = tsr_layout_find(lay2, names[i]);
    if (memcmp(flat + a->offset, flat2 + b->offset, (size_t)a->numel * sizeof(float))) same = 0;
  }
  TU_CHECK(same, "a tensor's init depends on its name, not on where it sits (L=3 vs L=5)");
  tsr_layout_init(lay2, flat2, 43);
  TU_CHECK(memcmp(flat + emb->offset, flat2, 64 * sizeof(float)) != 0, "a different seed changes the init");
  tsr_free(&flat);
  tsr_free(&flat2);
  tsr_layout_destroy(&lay);
  tsr_layout_destroy(&lay2);

  /* gpt2: biases, layernorm, learned positions, tied head */
  m = model("gpt2", 2, 1);
  m.n_kv_head = 4;
  TU_CHECK(tsr_layout_create(&lay, &m) == 0, "gpt2 layout created");
  expect = V * C + 16 * C + 2 * C +
           2 * (4 * C + 3 * C * C + 3 * C + C * C + C + 2 * C * F + F + C);
  TU_CHECK(lay->n_params == expect, "gpt2 parameter count %lld == closed form %lld",
           (long long)lay->n_params, (long long)expect);
  TU_CHECK(shape_is(lay, "pos_embed.weight", 16, C) && shape_is(lay, "layers.001.attn.wq.bias", C, 1) &&
               shape_is(lay, "layers.001.mlp.w_up.bias", F, 1) &&
               shape_is(lay, "layers.001.mlp.w_down.bias", C, 1) &&
               shape_is(lay, "final_norm.bias", C, 1) && !tsr_layout_find(lay, "lm_head.weight") &&
               !tsr_layout_find(lay, "layers.000.mlp.w_gate.weight"),
           "gpt2 names: positions, biases, norm biases, no gate, tied head");
  const tsr_tensor *bq = tsr_layout_layer(lay, 0, "attn.wq.bias");
  const tsr_tensor *bv = tsr_layout_layer(lay, 0, "attn.wv.bias");
  TU_CHECK(bv->offset == bq->offset + 2 * C, "gpt2 q|k|v biases adjacent");
  tsr_layout_destroy(&lay);
  return tu_summary("test_layout");
}
