/* test_layout.c — the tensor table: names and shapes of docs/model.md "Tensor names
 * and shapes",
 * contiguous non-overlapping offsets, fusable weights adjacent, and initialisation
 * that depends only on (seed, tensor name, element index).  Then the parts
 * (docs/sharding.md): over a grid of (L, tp, pp, virtual stages, shard count, dp
 * copies), every element of every logical tensor is held by the pieces and written by
 * exactly one; pieces -> rectangles -> elements round-trip; the tied head's copy and
 * GQA's shared KV heads are marked; fused weights stay adjacent in every part; a part
 * initialises to the whole model's values; bad splits are refused with a message. */
#include <math.h>
#include <string.h>

#include "deck/deck.h"
#include "sched/registry.h"
#include "model/layout.h"
#include "testutil.h"
#include "core/util.h"

static tsr_model_config model(const char *arch, int L, int tied) {
  tsr_config c;
  tsr_deck_defaults(&c);
  tsr_model_config m = c.model;
  m.arch = strcmp(arch, "gpt2") == 0 ? TSR_ARCH_GPT2 : TSR_ARCH_LLAMA;
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

/* ---- parts: (stage, tp rank) layouts, shards and writers ---- */

static tsr_model_config small(const char *arch, int L, int n_kv_head, int tied) {
  tsr_model_config m = model(arch, L, tied);
  m.d_model = 24; /* rows of 24 (or 6, 12) floats: shard cuts of 64 x S fall mid-row */
  m.n_head = 4;
  m.n_kv_head = n_kv_head;
  m.d_ff = 40;
  m.vocab_size = 36;
  m.seq_len = 8;
  return m;
}

static int64_t whole_offset(const tsr_layout *whole, const tsr_tensor *t) {
  return whole->tensors[t->logical_index].offset;
}

/* One layout of the grid: every (stage, tp rank) part, its flat buffer cut into S shards
 * (padded to 64 S like ZeRO, or not padded at all: shards of unequal size), and R dp
 * copies of each shard.  Counts, per logical element, the pieces that hold it and the
 * writers; checks the piece rectangles against the element-by-element mapping. */
static void grid_case(const tsr_model_config *m, const char *split, tsr_schedule_choice kind,
                      int T, int pp, int v, int S, int pad, int R, int *bad_cases,
                      int *n_cases) {
  tsr_layout *whole = NULL;
  tsr_layout_create(&whole, m);
  int *held = tsr_calloc((size_t)whole->n_params, sizeof *held);
  int *written = tsr_calloc((size_t)whole->n_params, sizeof *written);
  int ok = 1;
  for (int p = 0; p < pp && ok; p++)
    for (int r = 0; r < T && ok; r++) {
      tsr_layout *part = NULL;
      if (tsr_layout_create_split(&part, m, T, r, pp, p, v, split, kind)) {
        ok = 0;
        break;
      }
      const int64_t q = pad ? 64 * (int64_t)S : 1;
      const int64_t n = (part->n_params + q - 1) / q * q;
      for (int s = 0; s < S; s++) {
        const int64_t s0 = s * n / S, s1 = (s + 1) * n / S;
        for (int i = 0; i < part->n_tensors; i++) {
          const tsr_tensor *t = &part->tensors[i];
          int64_t i0, i1;
          tsr_rect rect[3];
          int nr = tsr_layout_piece(t, s0, s1, &i0, &i1, rect);
          /* the rectangles, walked row-major, are local elements i0, i0+1, ... */
          int64_t e = i0, covered = 0;
          for (int k = 0; k < nr; k++)
            for (int64_t a = 0; a < rect[k].rows; a++)
              for (int64_t b = 0; b < rect[k].cols; b++, e++, covered++) {
                int64_t lg = (rect[k].row + a) * t->shape[1] + rect[k].col + b;
                if (e >= i1 || lg != tsr_layout_logical_index(t, e)) ok = 0;
                if (e < i1 && (t->offset + e < s0 || t->offset + e >= s1)) ok = 0;
                if (!ok) break;
                held[whole_offset(whole, t) + lg]++;
                for (int c = 0; c < R; c++) written[whole_offset(whole, t) + lg] += tsr_layout_writes(t, c, R);
              }
          if (covered != i1 - i0 || nr > 3) ok = 0;
        }
      }
      tsr_layout_destroy(&part);
    }
  for (int64_t j = 0; j < whole->n_params && ok; j++)
    if (held[j] < 1 || written[j] != 1) ok = 0;
  if (!ok) {
    (*bad_cases)++;
    printf("  grid case %s L=%lld kv=%lld tied=%d: tp %d pp %d v %d%s split '%s' shards %d pad "
           "%d copies %d FAILS\n", m->arch == TSR_ARCH_GPT2 ? "gpt2" : "llama",
           (long long)m->n_layer, (long long)m->n_kv_head, m->tie_embeddings, T, pp, v,
           kind == TSR_SCHEDULE_ZB_V ? " (V)" : "", split, S, pad, R);
  }
  (*n_cases)++;
  tsr_free(&held);
  tsr_free(&written);
  tsr_layout_destroy(&whole);
}

/* Uneven splits (parallel.stage_layers): each stage holds exactly its chunks' layers, the
 * embedding stays on stage 0 and the head with the last chunk (the last stage, or stage 0
 * under zb_v's V), and the parts still tile the model. */
static int stage_layers_in(const tsr_model_config *m, tsr_schedule_choice kind, int pp, int v,
                           const char *split, int stage, const char *want) {
  tsr_layout *lay = NULL;
  if (tsr_layout_create_split(&lay, m, 1, 0, pp, stage, v, split, kind)) return 0;
  char got[128] = "";
  size_t o = 0;
  int last = -1;
  for (int i = 0; i < lay->n_tensors; i++) {
    const int l = lay->tensors[i].layer;
    if (l >= 0 && l != last) o += (size_t)snprintf(got + o, sizeof got - o, "%s%d", o ? "," : "", l);
    if (l >= 0) last = l;
  }
  const int head = kind == TSR_SCHEDULE_ZB_V ? 0 : pp - 1;
  const int ends = (tsr_layout_find(lay, "embed.weight") != NULL) == (stage == 0) &&
                   (tsr_layout_find(lay, "final_norm.weight") != NULL) == (stage == head) &&
                   lay->embeds == (stage == 0) && lay->heads == (stage == head);
  tsr_layout_destroy(&lay);
  if (!strcmp(got, want) && ends) return 1;
  printf("    '%s' on pp %d v %d, stage %d: layers %s (want %s)%s\n", split, pp, v, stage, got,
         want, ends ? "" : ", embedding or head misplaced");
  return 0;
}

static int stage_layers_are(const tsr_model_config *m, int pp, int v, const char *split, int stage,
                            const char *want) {
  return stage_layers_in(m, TSR_SCHEDULE_1F1B, pp, v, split, stage, want);
}

static void test_uneven(void) {
  tsr_model_config m = small("llama", 7, 2, 0);
  TU_CHECK(stage_layers_are(&m, 2, 1, "4,3", 0, "0,1,2,3") &&
               stage_layers_are(&m, 2, 1, "4,3", 1, "4,5,6") &&
               stage_layers_are(&m, 2, 1, "3,4", 0, "0,1,2") &&
               stage_layers_are(&m, 3, 1, "3,2,2", 1, "3,4") &&
               stage_layers_are(&m, 3, 1, "3,2,2", 2, "5,6") &&
               stage_layers_are(&m, 2, 2, "2,2,2,1", 0, "0,1,4,5") &&
               stage_layers_are(&m, 2, 2, "2,2,2,1", 1, "2,3,6"),
           "7 layers: 4+3, 3+4, 3+2+2 and interleaved 2,2,2,1 put each layer on its chunk's stage");
  /* this shape's head, 2 V C = 1728 FLOPs per token, costs 0.18 of a layer (9600) */
  TU_CHECK(stage_layers_are(&m, 2, 1, "auto", 0, "0,1,2,3") &&
               stage_layers_are(&m, 3, 1, "auto", 1, "2,3,4") &&
               stage_layers_are(&m, 3, 1, "auto", 2, "5,6"),
           "'auto' on 7 small layers (a cheap head): pp 2 holds 4+3, pp 3 2+3+2");
  const tsr_schedule_choice F = TSR_SCHEDULE_1F1B, V = TSR_SCHEDULE_ZB_V;
  TU_CHECK(stage_layers_in(&m, V, 2, 2, "2,2,2,1", 0, "0,1,6") &&
               stage_layers_in(&m, V, 2, 2, "2,2,2,1", 1, "2,3,4,5") &&
               stage_layers_in(&m, V, 3, 2, "1,1,1,1,1,2", 0, "0,5,6") &&
               stage_layers_in(&m, V, 3, 2, "1,1,1,1,1,2", 1, "1,4") &&
               stage_layers_in(&m, V, 3, 2, "1,1,1,1,1,2", 2, "2,3"),
           "zb_v's V: stage s holds chunks s and 2 pp - 1 - s, the embedding and the head both "
           "on stage 0");
  TU_CHECK(tsr_layout_stage_of_layer(&m, 3, 1, "3,2,2", F, 2) == 0 &&
               tsr_layout_stage_of_layer(&m, 3, 1, "3,2,2", F, 3) == 1 &&
               tsr_layout_stage_of_layer(&m, 2, 2, "2,2,2,1", F, 6) == 1 &&
               tsr_layout_stage_of_layer(&m, 2, 2, "2,2,2,1", V, 6) == 0 &&
               tsr_layout_stage_of_layer(&m, 2, 2, "2,2,2,1", V, 4) == 1 &&
               tsr_layout_stage_of_layer(&m, 2, 1, "4,4", F, 0) == -1,
           "stage of a layer under a split and a placement; -1 for a bad split");
  int bad = 0, cases = 0;
  const struct {
    int pp, v;
    const char *split;
    tsr_schedule_choice kind;
  } splits[] = {{2, 1, "4,3", F},       {2, 1, "1,6", F},   {3, 1, "3,2,2", F},
                {2, 2, "2,2,2,1", F},   {3, 1, "auto", F},  {2, 2, "2,2,2,1", V},
                {3, 2, "1,1,1,1,1,2", V}, {2, 2, "auto", V}};
  tsr_model_config t = small("gpt2", 7, 4, 1); /* tied: the last stage's copy too */
  for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
    for (int T = 1; T <= 2; T++)
      for (int S = 1; S <= 3; S += 2) {
        grid_case(&m, splits[i].split, splits[i].kind, T, splits[i].pp, splits[i].v, S, 1, 2,
                  &bad, &cases);
        grid_case(&t, splits[i].split, splits[i].kind, T, splits[i].pp, splits[i].v, S, 0, 1,
                  &bad, &cases);
      }
  TU_CHECK(bad == 0, "%d uneven layouts (llama, gpt2 tied; c %% pp and V placements) x tp 1,2 "
                     "x shards 1,3: every element held, written once (%d bad)", cases, bad);
  tsr_layout *x = (tsr_layout *)1;
  TU_CHECK(tsr_layout_create_split(&x, &m, 1, 0, 2, 0, 1, "4,4", F) == TSR_ERR_INPUT && x == NULL,
           "a split summing to 8 of 7 layers refused");
}

static void test_grid(void) {
  const struct {
    const char *arch;
    int kv, tied;
  } models[] = {{"llama", 2, 0}, {"llama", 4, 1}, {"gpt2", 4, 1}, {"gpt2", 1, 0}};
  const int Ls[] = {2, 4}, Ts[] = {1, 2, 4}, pps[] = {1, 2, 4}, vs[] = {1, 2},
            Ss[] = {1, 2, 3, 5};
  int bad = 0, cases = 0;
  for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++)
    for (int li = 0; li < 2; li++) {
      tsr_model_config m = small(models[mi].arch, Ls[li], models[mi].kv, models[mi].tied);
      for (int ti = 0; ti < 3; ti++)
        for (int pi = 0; pi < 3; pi++)
          for (int vi = 0; vi < 2; vi++) {
            if (m.n_layer % (pps[pi] * vs[vi])) continue;
            for (int si = 0; si < 4; si++)
              for (int pad = 0; pad < 2; pad++)
                for (int R = 1; R <= 3; R += 2)
                  for (int V = 0; V <= (vs[vi] == 2 && pps[pi] > 1); V++) /* zb_v's V too */
                    grid_case(&m, "", V ? TSR_SCHEDULE_ZB_V : TSR_SCHEDULE_1F1B, Ts[ti], pps[pi],
                              vs[vi], Ss[si], pad, R, &bad, &cases);
          }
    }
  TU_CHECK(bad == 0 && cases > 500,
           "%d layouts (arch, L, kv heads, tied) x tp 1,2,4 x pp 1,2,4 x v 1,2 x shards 1,2,3,5 "
           "(padded to 64 S, or uneven) x dp copies 1,3: every logical element held, and "
           "written by exactly one piece; piece rectangles == element mapping (%d bad)",
           cases, bad);
}

/* One part in detail: stage contents, tp slices, copies, adjacency, init. */
static void test_parts(void) {
  tsr_layout *whole = NULL, *part = NULL;
  /* llama, 4 layers, pp 2 x v 2: chunks of one layer; stage 0 has layers 0, 2. */
  tsr_model_config m = small("llama", 4, 2, 0);
  tsr_layout_create(&whole, &m);
  int layers_ok = 1, ends_ok = 1, tile_ok = 1, fused_ok = 1, gqa_ok = 1, split_ok = 1,
      init_ok = 1;
  float *wflat = tsr_calloc((size_t)whole->n_flat, sizeof(float));
  tsr_layout_init(whole, wflat, 7);
  for (int p = 0; p < 2; p++)
    for (int r = 0; r < 4; r++) {
      if (tsr_layout_create_part(&part, &m, 4, r, 2, p, 2)) {
        layers_ok = 0;
        continue;
      }
      int prev = -1;
      for (int i = 0; i < part->n_tensors; i++) {
        const tsr_tensor *t = &part->tensors[i];
        const int64_t next = i + 1 < part->n_tensors ? part->tensors[i + 1].offset : part->n_params;
        if (t->offset + t->numel != next || t->numel != t->lshape[0] * t->lshape[1]) tile_ok = 0;
        if (t->layer >= 0) {
          if (t->layer < prev || t->layer % 2 != p) layers_ok = 0;
          prev = t->layer;
        }
      }
      ends_ok &= (tsr_layout_find(part, "embed.weight") != NULL) == (p == 0) &&
                 (tsr_layout_find(part, "lm_head.weight") != NULL) == (p == 1) &&
                 (tsr_layout_find(part, "final_norm.weight") != NULL) == (p == 1);
      for (int l = p; l < 4; l += 2) {
        const tsr_tensor *wq = tsr_layout_layer(part, l, "attn.wq.weight");
        const tsr_tensor *wk = tsr_layout_layer(part, l, "attn.wk.weight");
        const tsr_tensor *wv = tsr_layout_layer(part, l, "attn.wv.weight");
        const tsr_tensor *wg = tsr_layout_layer(part, l, "mlp.w_gate.weight");
        const tsr_tensor *wu = tsr_layout_layer(part, l, "mlp.w_up.weight");
        const tsr_tensor *wo = tsr_layout_layer(part, l, "attn.wo.weight");
        const tsr_tensor *wd = tsr_layout_layer(part, l, "mlp.w_down.weight");
        const tsr_tensor *nm = tsr_layout_layer(part, l, "mlp_norm.weight");
        if (!wq || !wk || !wv || !wg || !wu || !wo || !wd || !nm) {
          fused_ok = 0;
          continue;
        }
        fused_ok &= wk->offset == wq->offset + wq->numel && wv->offset == wk->offset + wk->numel &&
                    wu->offset == wg->offset + wg->numel;
        /* n_kv_head 2 < tp 4: rank r holds KV head r / 2 whole (6 rows), shared by 2 ranks */
        gqa_ok &= wk->lshape[0] == 6 && wk->row0 == (r / 2) * 6 && wk->tp_copies == 2 &&
                  wk->tp_copy == r % 2 && wv->row0 == wk->row0 && wk->shape[0] == 12;
        split_ok &= wq->lshape[0] == 6 && wq->row0 == 6 * r && wq->lshape[1] == 24 &&
                    wq->shape[0] == 24 && wq->tp_copies == 1 && wg->row0 == 10 * r &&
                    wg->lshape[0] == 10 && wo->col0 == 6 * r && wo->lshape[1] == 6 &&
                    wo->lshape[0] == 24 && wd->col0 == 10 * r && wd->lshape[1] == 10 &&
                    nm->tp_copies == 4 && nm->tp_copy == r && nm->numel == 24;
      }
      const tsr_tensor *e = tsr_layout_find(part, p == 0 ? "embed.weight" : "lm_head.weight");
      split_ok &= e && e->row0 == 9 * r && e->lshape[0] == 9 && e->tp_copies == 1;
      float *pflat = tsr_calloc((size_t)part->n_flat, sizeof(float));
      tsr_layout_init(part, pflat, 7);
      for (int i = 0; i < part->n_tensors; i++) {
        const tsr_tensor *t = &part->tensors[i];
        const float *w = wflat + whole->tensors[t->logical_index].offset;
        for (int64_t j = 0; j < t->numel; j++)
          if (memcmp(&pflat[t->offset + j], &w[tsr_layout_logical_index(t, j)], sizeof(float)))
            init_ok = 0;
      }
      tsr_free(&pflat);
      tsr_layout_destroy(&part);
    }
  TU_CHECK(layers_ok, "pp 2 x v 2: stage p holds layers p, p+2 in increasing order");
  TU_CHECK(ends_ok, "embed on stage 0, final_norm and lm_head on the last stage");
  TU_CHECK(tile_ok, "every part's local slices tile [0, n_params), numel = lshape[0] x lshape[1]");
  TU_CHECK(fused_ok, "wq|wk|wv and w_gate|w_up local slices adjacent in every part");
  TU_CHECK(gqa_ok, "n_kv_head 2 < tp 4: wk/wv of rank r = the 6 rows of KV head r/2, 2 copies");
  TU_CHECK(split_ok, "column (wq, w_gate), row (wo, w_down), vocab and replicated slices per rank");
  TU_CHECK(init_ok, "a part initialises to the whole model's values, element by logical element");
  tsr_free(&wflat);
  tsr_layout_destroy(&whole);

  /* gpt2 tied, pp 2: the last stage's embed.weight is a marked copy, never a writer */
  m = small("gpt2", 2, 4, 1);
  int tied_ok = 1;
  for (int r = 0; r < 2; r++) {
    tsr_layout *first = NULL, *last = NULL;
    tied_ok &= tsr_layout_create_part(&first, &m, 2, r, 2, 0, 1) == 0 &&
               tsr_layout_create_part(&last, &m, 2, r, 2, 1, 1) == 0;
    if (!tied_ok) break;
    const tsr_tensor *e0 = tsr_layout_find(first, "embed.weight");
    const tsr_tensor *e1 = tsr_layout_find(last, "embed.weight");
    const tsr_tensor *fn = tsr_layout_find(last, "final_norm.bias");
    tied_ok &= e0 && e1 && fn && !e0->tied_copy && e1->tied_copy && e1->logical_index == 0 &&
               e1->row0 == e0->row0 && e1->numel == e0->numel && e1->offset == fn->offset + fn->numel &&
               !tsr_layout_find(last, "lm_head.weight") && !tsr_layout_find(last, "pos_embed.weight");
    for (int c = 0; c < 3; c++) tied_ok &= !tsr_layout_writes(e1, c, 3);
    const tsr_tensor *bq = tsr_layout_layer(first, 0, "attn.wq.bias");
    const tsr_tensor *bk = tsr_layout_layer(first, 0, "attn.wk.bias");
    const tsr_tensor *bv = tsr_layout_layer(first, 0, "attn.wv.bias");
    const tsr_tensor *bo = tsr_layout_layer(first, 0, "attn.wo.bias");
    tied_ok &= bq && bk && bv && bo && bk->offset == bq->offset + 12 && bv->offset == bk->offset + 12 &&
               bo->tp_copies == 2 && bo->numel == 24;
    tsr_layout_destroy(&first);
    tsr_layout_destroy(&last);
  }
  TU_CHECK(tied_ok, "gpt2 tied, pp 2: last stage holds a tied_copy of embed (after final_norm), "
           "no writer; q|k|v bias slices adjacent; wo.bias replicated");
  tsr_layout *one = NULL;
  m = small("gpt2", 2, 4, 1);
  TU_CHECK(tsr_layout_create_part(&one, &m, 2, 1, 1, 0, 1) == 0 && tsr_layout_find(one, "embed.weight") &&
               !tsr_layout_find(one, "embed.weight")->tied_copy,
           "tied, pp 1: a single embed.weight, not a copy");
  tsr_layout_destroy(&one);

  /* bad splits: TSR_ERR_INPUT, no layout */
  struct {
    int T, pp, v, kv;
    int64_t vocab, L;
    const char *why;
  } bad[] = {{3, 1, 1, 2, 36, 4, "n_head 4 over tp 3"},      {2, 1, 1, 2, 35, 4, "vocab 35 over tp 2"},
             {1, 2, 1, 2, 36, 3, "3 layers over pp 2"},      {1, 2, 2, 2, 36, 2, "2 layers over pp 2 x v 2"},
             {4, 1, 1, 3, 36, 4, "n_kv_head 3 with tp 4"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tsr_model_config b = small("llama", (int)bad[i].L, bad[i].kv, 0);
    b.n_head = bad[i].kv == 3 ? 12 : 4;
    b.vocab_size = bad[i].vocab;
    tsr_layout *x = (tsr_layout *)1;
    int rc = tsr_layout_create_part(&x, &b, bad[i].T, 0, bad[i].pp, 0, bad[i].v);
    TU_CHECK(rc == TSR_ERR_INPUT && x == NULL, "refused: %s (rc=%d)", bad[i].why, rc);
  }
}

int main(void) {
  test_uneven();
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
           "llama names and [out, in] shapes as docs/model.md");
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

  test_parts();
  test_grid();
  return tu_summary("test_layout");
}
