/* plan_search.c — `tessera plan --search` (plan.h): every layout of the deck's model on the
 * machine, planned and ranked by predicted step time among those that fit, then the deck's
 * own layout.  plan_cli.c parses the options and calls tsr_plan_search. */
#include <stdlib.h>
#include <string.h>

#include "deck.h"
#include "plan.h"
#include "util.h"

typedef struct {
  int tp, pp, v, dp, zero, shard, micro_batch, recompute, sp;
  double mem, step, mfu, tokens_per_s;
  int fits;
} candidate;

typedef struct {
  candidate *c;
  int n, cap, divide;
} candidates;

static const char *const recompute_modes[] = {"none", "selective", "full"}; /* by tsr_recompute */

static int keep(candidates *cs, const candidate *c) {
  if (cs->n == cs->cap) {
    const int cap = cs->cap ? 2 * cs->cap : 256;
    candidate *grown = tsr_calloc((size_t)cap, sizeof *grown);
    TSR_CHECK(grown, TSR_ERR, "out of memory");
    if (cs->c) memcpy(grown, cs->c, (size_t)cs->n * sizeof *grown);
    tsr_free(&cs->c);
    cs->c = grown;
    cs->cap = cap;
  }
  cs->c[cs->n++] = *c;
  return 0;
}

/* The plan of one layout, as a row of the search. */
static int candidate_of(const tsr_config *c, const tsr_hardware *hw, const tsr_plan_grid *g,
                        candidate *k) {
  tsr_plan p;
  const int rc = tsr_plan_make(&p, c, hw, g, 0);
  if (!rc) {
    const int r = (int)c->train.recompute;
    *k = (candidate){g->tp, g->pp, g->v, g->dp, (int)c->parallel.zero_stage, g->shard,
                     (int)c->train.micro_batch, r, c->parallel.sequence_parallel && g->tp > 1,
                     p.stages[p.worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].peak, p.t_step, p.mfu,
                     p.tokens_per_s, p.fits};
  }
  tsr_plan_destroy(&p);
  return rc;
}

/* Plan one layout (c's parallel and train keys) and keep it when it divides; with
 * `node_scope`, only when the node-wide shard group differs from the whole dp group. */
static int try_layout(const tsr_config *c, const tsr_hardware *hw, int world, int node_scope,
                      candidates *cs) {
  tsr_plan_grid g;
  candidate k;
  if (tsr_plan_layout(c, world, hw->gpus_per_node, &g, NULL, 0)) return 0;
  if (node_scope && g.shard == g.dp) return 0; /* the same as shard_scope 'global' */
  cs->divide++;
  TSR_CALL(candidate_of(c, hw, &g, &k));
  return keep(cs, &k);
}

/* For one (tp, pp, v): every ZeRO stage and shard scope, recompute mode, micro-batch. */
static int search_inner(tsr_config *c, const tsr_hardware *hw, int world, candidates *cs) {
  const int64_t dp = world / (c->parallel.tp * c->parallel.pp);
  for (int zs = 0; zs <= 3; zs++)
    for (int node = 0; node <= (zs > 0); node++)
      for (int r = 0; r < 3; r++)
        for (int64_t mb = 1; mb <= 64 && mb * dp <= c->train.global_batch; mb *= 2) {
          c->parallel.zero_stage = zs;
          c->parallel.shard_scope = node ? TSR_SHARD_NODE : TSR_SHARD_GLOBAL;
          c->train.recompute = (tsr_recompute)r;
          c->train.micro_batch = mb;
          TSR_CALL(try_layout(c, hw, world, node, cs));
        }
  return 0;
}

static int search_all(const tsr_config *cfg, const tsr_hardware *hw, int world, candidates *cs) {
  tsr_config c = *cfg;
  c.parallel.micro_batches = 0;
  for (int tp = 1; tp <= hw->gpus_per_node; tp++) {
    if (hw->gpus_per_node % tp) continue;
    for (int pp = 1; pp <= cfg->model.n_layer && tp * pp <= world; pp++) {
      if (cfg->model.n_layer % pp || world % (tp * pp)) continue;
      for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) {
        c.parallel.tp = tp;
        c.parallel.pp = pp;
        c.parallel.virtual_stages = v;
        c.parallel.sequence_parallel = tp > 1;
        c.parallel.schedule = v > 1 ? TSR_SCHEDULE_INTERLEAVED : TSR_SCHEDULE_1F1B;
        TSR_CALL(search_inner(&c, hw, world, cs));
      }
    }
  }
  return 0;
}

static int by_fit_then_time(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (x->fits != y->fits) return y->fits - x->fits;
  return (x->step > y->step) - (x->step < y->step);
}

static void print_candidate(FILE *out, int rank, const candidate *k, int json) {
  if (json) {
    fprintf(out, "    {\"rank\": %d, \"tp\": %d, \"pp\": %d, \"virtual_stages\": %d, \"dp\": %d, "
            "\"zero_stage\": %d, \"shard\": %d, \"micro_batch\": %d, \"recompute\": \"%s\", "
            "\"sequence_parallel\": %s, \"memory_gb\": %.4f, \"step_s\": %.6g, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.4f, \"fits\": %s}", rank,
            k->tp, k->pp, k->v, k->dp, k->zero, k->shard, k->micro_batch,
            recompute_modes[k->recompute], k->sp ? "true" : "false", k->mem / 1e9, k->step,
            k->tokens_per_s, k->mfu, k->fits ? "true" : "false");
    return;
  }
  fprintf(out, "  %4d %3d %3d %2d %4d %4d %5d %4d %-9s %-3s %8.2f %9.3f %11.4g %6.3f\n", rank,
          k->tp, k->pp, k->v, k->dp, k->zero, k->shard, k->micro_batch,
          recompute_modes[k->recompute], k->sp ? "yes" : "no", k->mem / 1e9, k->step,
          k->tokens_per_s, k->mfu);
}

/* The deck's own layout among the candidates: its row and how many that fit are faster. */
static void print_deck_layout(const tsr_config *cfg, const tsr_hardware *hw, int world,
                              const candidates *cs, int json) {
  tsr_plan_grid g;
  candidate k;
  if (tsr_plan_layout(cfg, world, hw->gpus_per_node, &g, NULL, 0) ||
      candidate_of(cfg, hw, &g, &k)) {
    printf(json ? "\"deck\": null" : "the deck's own layout does not divide on these GPUs\n");
    return;
  }
  int rank = 1;
  for (int i = 0; i < cs->n; i++) rank += cs->c[i].fits && cs->c[i].step < k.step;
  if (json) {
    printf("\"deck\": \n");
    print_candidate(stdout, rank, &k, 1);
    return;
  }
  printf("the deck's own layout (%s, %s):\n", k.fits ? "fits" : "does NOT fit",
         k.fits ? "ranked among those that fit" : "ranked as if it did");
  print_candidate(stdout, rank, &k, 0);
}

/* "80 GB" or "0.9 x 80 GB = 72 GB" */
static void fit_room(char *buf, size_t len, const tsr_hardware *hw) {
  if (hw->max_mem_frac < 1)
    snprintf(buf, len, "%.3g x %.4g GB = %.4g GB", hw->max_mem_frac, hw->hbm_gb,
             hw->max_mem_frac * hw->hbm_gb);
  else
    snprintf(buf, len, "%.4g GB", hw->hbm_gb);
}

int tsr_plan_search(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_search_opts *o,
                    int *any_fit) {
  const int nodes = o->nodes, world = o->nodes * hw->gpus_per_node, top = o->top, json = o->json;
  candidates cs = {NULL, 0, 0, 0};
  int rc = search_all(cfg, hw, world, &cs);
  if (!rc) qsort(cs.c, (size_t)cs.n, sizeof *cs.c, by_fit_then_time);
  int fit = 0;
  for (int i = 0; i < cs.n; i++) fit += cs.c[i].fits;
  const int shown = fit < top ? fit : top;
  char room[96];
  fit_room(room, sizeof room, hw);
  if (!rc && json) {
    printf("{\"search\": {\"nodes\": %d, \"gpus_per_node\": %d, \"hardware\": \"%s\", "
           "\"max_mem_frac\": %.6g, \"divide\": %d, \"fit\": %d,\n  ", nodes, hw->gpus_per_node,
           hw->name, hw->max_mem_frac, cs.divide, fit);
    print_deck_layout(cfg, hw, world, &cs, 1);
    printf(",\n  \"layouts\": [\n");
    for (int i = 0; i < shown; i++) {
      printf("%s", i ? ",\n" : "");
      print_candidate(stdout, i + 1, &cs.c[i], 1);
    }
    printf("\n]}}\n");
  } else if (!rc) {
    printf("search on %d node(s) x %d GPUs (%s): %d layouts divide, %d fit in %s with %.1f GB "
           "reserved; the %d fastest (predicted):\n", nodes, hw->gpus_per_node, hw->name,
           cs.divide, fit, room, hw->reserved_gb, shown);
    printf("  %4s %3s %3s %2s %4s %4s %5s %4s %-9s %-3s %8s %9s %11s %6s\n", "rank", "tp", "pp",
           "v", "dp", "zero", "shard", "mb", "recompute", "sp", "mem GB", "step s", "tokens/s",
           "MFU");
    for (int i = 0; i < shown; i++) print_candidate(stdout, i + 1, &cs.c[i], 0);
    print_deck_layout(cfg, hw, world, &cs, 0);
  }
  *any_fit = fit > 0;
  tsr_free(&cs.c);
  return rc;
}
