/* plan_search.c — `tessera plan --search` (plan.h): every layout of the deck's model on the
 * machine, planned and ranked by predicted step time among those that fit.  A key given on
 * the command line that the search would vary is held at its value.  When nothing fits,
 * the larger node counts (same GPUs per node) are tried in increasing order, and the
 * smallest at which a layout fits is reported with its fastest layout.  plan_cli.c parses
 * the options and calls tsr_plan_search. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "deck/deck.h"
#include "sched/registry.h"
#include "sched/schedule.h"
#include "plan.h"
#include "core/util.h"

/* ---------------------------------------------------------------- the keys it varies */

static const char *const searched[TSR_PLAN_N_SEARCHED] = {
    "parallel.tp",         "parallel.cp",       "parallel.cp_comm",
    "parallel.pp",         "parallel.virtual_stages",
    "parallel.schedule",   "parallel.sequence_parallel", "parallel.zero_stage",
    "parallel.shard_scope", "train.micro_batch", "parallel.micro_batches",
    "train.recompute",     "parallel.offload", "train.activation_offload"};

unsigned tsr_plan_search_fixed(int n, char *const *overrides) {
  unsigned fixed = 0;
  for (int i = 0; i < n; i++) {
    const char *a = overrides[i], *eq = strchr(a, '=');
    if (!eq) continue;
    while (*a == ' ') a++;
    size_t len = eq > a ? (size_t)(eq - a) : 0;
    while (len && a[len - 1] == ' ') len--;
    for (int k = 0; k < TSR_PLAN_N_SEARCHED; k++) /* deck keys ignore case, as the deck does */
      if (strlen(searched[k]) == len && !strncasecmp(searched[k], a, len)) fixed |= 1u << k;
  }
  return fixed;
}

#define FIXED(k) (o->fixed & (1u << TSR_PLAN_FIX_##k))

/* ---------------------------------------------------------------- candidates */

typedef struct {
  int tp, pp, v, dp, zero, shard, micro_batch, recompute, sp;
  int cp;              /* 1: none */
  tsr_cp_comm cp_comm;
  double mem, step, mfu, tokens_per_s;
  int fits;
  int offload;         /* parallel.offload = 'optimizer' */
  int act;             /* train.activation_offload */
  double host;         /* the offloads' page-locked bytes a node */
  int fits_host;
  const char *schedule; /* the deck's word (tsr_deck_word: static) */
  tsr_schedule_choice kind;
  int64_t scope;   /* parallel.shard_scope */
  double short_gb; /* GB per GPU over the room (negative: to spare) */
} candidate;

typedef struct {
  candidate *c;
  int n, cap, divide, fit;
  int first_fit; /* stop at the first layout that fits (probing a larger node count) */
  int with_cp;   /* cp > 1 is tried (cp_values) */
  int offload;   /* parallel.offload = 'optimizer' with ZeRO 1-3 (unless the command line
                    holds parallel.offload) */
  int act;       /* train.activation_offload (unless the command line holds it) */
} candidates;

static const char *const recompute_modes[] = {"none", "selective", "full"}; /* tsr_recompute */

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
                     g->cp, c->parallel.cp_comm,
                     p.stages[p.worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].peak, p.t_step, p.mfu,
                     p.tokens_per_s, p.fits, tsr_plan_offload_fraction(c) > 0,
                     c->train.activation_offload && strcmp(hw->name, "cpu"), p.host_node,
                     p.fits_host, tsr_deck_word(c, &c->parallel.schedule),
                     c->parallel.schedule, c->parallel.shard_scope, 0};
    k->short_gb = (k->mem + hw->reserved_gb * 1e9) / 1e9 - hw->max_mem_frac * hw->hbm_gb;
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
  if (node_scope && g.shard == g.dpcp) return 0; /* the same as shard_scope 'global' */
  cs->divide++;
  TSR_CALL(candidate_of(c, hw, &g, &k));
  cs->fit += k.fits;
  return keep(cs, &k);
}

/* A short list of values one key takes in the search. */
typedef struct {
  int64_t v[16];
  int n;
} values;

static values one(int64_t x) { return (values){{x}, 1}; }

/* The sequence length from which the search tries context parallelism unasked: the
 * activations of a sequence grow with it, and below it a layer's weights and their
 * collectives outweigh what cp saves (docs/architecture.md "The planner"). */
enum { CP_FROM_SEQ_LEN = 16384 };

/* The cp values a search tries: the held one; else 1, and with `with_cp` every power of 2
 * that cuts seq_len into 2 cp equal chunks and leaves tp x cp x pp within `ranks` (0: no
 * bound, the node-count scan); below CP_FROM_SEQ_LEN (tried because nothing fits without
 * it) only those with the tp x cp ranks of a sequence inside a node of G. */
static values cp_values(const tsr_config *deck, const tsr_plan_search_opts *o, int with_cp,
                        int64_t tp, int64_t pp, int64_t ranks, int64_t G) {
  if (FIXED(CP)) return one(deck->parallel.cp);
  values v = one(1);
  const int in_node = deck->model.seq_len < CP_FROM_SEQ_LEN;
  for (int64_t cp = 2; with_cp && v.n < 16 && cp <= 65536; cp *= 2) {
    if (deck->model.seq_len % (2 * cp)) break; /* nor any multiple of it */
    if ((ranks > 0 && tp * cp * pp > ranks) || (in_node && tp * cp > G)) break;
    v.v[v.n++] = cp;
  }
  return v;
}

/* For one (tp, pp, v): every ZeRO stage and shard scope, recompute mode, micro-batch. */
static int search_inner(tsr_config *c, const tsr_config *deck, const tsr_hardware *hw,
                        int world, const tsr_plan_search_opts *o, candidates *cs) {
  const int64_t dp = world / (c->parallel.tp * c->parallel.cp * c->parallel.pp);
  const int64_t gb = c->train.global_batch;
  values zs = {{0, 1, 2, 3}, 4}, rs = {{0, 1, 2}, 3}, mbs = {{0}, 0};
  if (FIXED(ZERO)) zs = one(deck->parallel.zero_stage);
  if (FIXED(RECOMPUTE)) rs = one((int64_t)deck->train.recompute);
  if (FIXED(MICRO_BATCH)) mbs = one(deck->train.micro_batch);
  for (int64_t mb = 1; !FIXED(MICRO_BATCH) && mb <= 64 && mb * dp <= gb; mb *= 2)
    mbs.v[mbs.n++] = mb;
  for (int z = 0; z < zs.n; z++) {
    values scopes = {{TSR_SHARD_GLOBAL, TSR_SHARD_NODE}, zs.v[z] > 0 ? 2 : 1};
    if (FIXED(SHARD_SCOPE)) scopes = one(deck->parallel.shard_scope);
    for (int s = 0; s < scopes.n; s++)
      for (int r = 0; r < rs.n; r++)
        for (int b = 0; b < mbs.n; b++) {
          c->parallel.zero_stage = zs.v[z];
          c->parallel.shard_scope = scopes.v[s];
          c->train.recompute = (tsr_recompute)rs.v[r];
          c->train.micro_batch = mbs.v[b];
          const int node = !FIXED(SHARD_SCOPE) && scopes.v[s] == TSR_SHARD_NODE;
          TSR_CALL(try_layout(c, hw, world, node, cs));
          if (cs->first_fit && cs->fit) return 0;
        }
  }
  return 0;
}

static int pipe_key(tsr_schedule_choice k) {
  const tsr_sched_desc *d = tsr_sched(k);
  return d->search_chunks * 4 + (int)d->placement * 2 + d->split_backward;
}

/* tp dividing the node, pp dividing the layers (any pp when parallel.stage_layers is set:
 * the layout check keeps those its split goes with), cp (cs->with_cp: the powers of 2 that
 * cut the sequence evenly, each with the ring and with the all-to-alls; the layout check
 * keeps those whose heads go with it), every schedule of the registry that says how many
 * chunks to try it with (its search_chunks; with pp > 1, else only the default), sequence
 * parallelism with tp; a fixed key takes the deck's value instead. */
static int search_all(const tsr_config *deck, const tsr_hardware *hw, int world,
                      const tsr_plan_search_opts *o, candidates *cs) {
  tsr_config c = *deck;
  if (!FIXED(MICRO_BATCHES)) c.parallel.micro_batches = 0;
  if (!FIXED(OFFLOAD)) {
    c.parallel.offload = cs->offload ? TSR_OFFLOAD_OPTIMIZER : TSR_OFFLOAD_NONE;
    if (cs->offload) c.parallel.offload_fraction = 1; /* the trainer offloads all of it */
  }
  if (!FIXED(ACT_OFFLOAD)) c.train.activation_offload = cs->act;
  const int64_t G = hw->gpus_per_node, L = deck->model.n_layer;
  const int64_t tp_max = FIXED(TP) ? deck->parallel.tp : G;
  const int64_t pp_max = FIXED(PP) ? deck->parallel.pp : L;
  for (int64_t tp = FIXED(TP) ? tp_max : 1; tp <= tp_max; tp++) {
    if (!FIXED(TP) && G % tp) continue;
    for (int64_t pp = FIXED(PP) ? pp_max : 1; pp <= pp_max; pp++) {
      const int divides = deck->parallel.stage_layers[0] || L % pp == 0;
      if (!FIXED(PP) && (!divides || tp * pp > world || world % (tp * pp))) continue;
      /* (chunks, schedule): the registry's searched schedules in its order (the layout
       * check refuses those whose constraints the deck breaks, such as a split backward
       * with recompute); one entry with held virtual_stages, and with a held schedule one
       * per number of chunks */
      struct { int64_t v; tsr_schedule_choice kind; } pipes[TSR_SCHEDULE_COUNT];
      int n_pipes = 0;
      for (int k = 0; k < TSR_SCHEDULE_COUNT; k++) {
        const tsr_sched_desc *d = tsr_sched(k);
        if (d->search_chunks > 0 && (pp > 1 || k == TSR_SCHEDULE_DEFAULT))
          pipes[n_pipes].v = d->search_chunks, pipes[n_pipes++].kind = k;
      }
      /* fewer chunks first, then the round placement, then the fused backward */
      for (int i = 1; i < n_pipes; i++)
        for (int j = i; j > 0 && pipe_key(pipes[j].kind) < pipe_key(pipes[j - 1].kind); j--) {
          const int64_t v = pipes[j].v;
          const tsr_schedule_choice k = pipes[j].kind;
          pipes[j] = pipes[j - 1];
          pipes[j - 1].v = v, pipes[j - 1].kind = k;
        }
      if (FIXED(VIRTUAL_STAGES)) {
        const int64_t v = deck->parallel.virtual_stages;
        pipes[0].v = v, pipes[0].kind = tsr_sched_for(TSR_PLACE_ROUND, (int)v);
        n_pipes = 1;
      }
      if (FIXED(SCHEDULE) && n_pipes > 1) { /* one entry per distinct number of chunks */
        int kept = 0;
        for (int i = 0; i < n_pipes; i++) {
          int seen = 0;
          for (int j = 0; j < kept; j++) seen |= pipes[j].v == pipes[i].v;
          if (!seen) pipes[kept++] = pipes[i];
        }
        n_pipes = kept;
      }
      /* cp: 1, or each value with the ring, then with the all-to-alls (held: the deck's) */
      const values cps = cp_values(deck, o, cs->with_cp, tp, pp, world, G);
      for (int ci = 0; ci < cps.n; ci++) {
        const int64_t cp = cps.v[ci];
        if (!FIXED(CP) && world % (tp * cp * pp)) continue;
        const int one_comm = FIXED(CP_COMM) || cp == 1;
        for (int cc = 0; cc < (one_comm ? 1 : 2); cc++) {
          c.parallel.cp = cp;
          c.parallel.cp_comm = one_comm ? deck->parallel.cp_comm : cc ? TSR_CP_A2A : TSR_CP_P2P;
          for (int i = 0; i < n_pipes; i++) {
            if (pp == 1 && pipes[i].v > 1) continue; /* chunks without a pipeline: never proposed */
            c.parallel.tp = tp;
            c.parallel.pp = pp;
            c.parallel.virtual_stages = pipes[i].v;
            c.parallel.sequence_parallel = tp > 1;
            if (FIXED(SEQUENCE_PARALLEL))
              c.parallel.sequence_parallel = deck->parallel.sequence_parallel;
            c.parallel.schedule = FIXED(SCHEDULE) ? deck->parallel.schedule : pipes[i].kind;
            TSR_CALL(search_inner(&c, deck, hw, world, o, cs));
            if (cs->first_fit && cs->fit) return 0;
          }
        }
      }
    }
  }
  return 0;
}

/* Those that fit first, by predicted step time; then those that do not, closest to fitting
 * (least memory) first. */
static int by_fit_then_time(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (x->fits != y->fits) return y->fits - x->fits;
  if (!x->fits && x->mem != y->mem) return (x->mem > y->mem) - (x->mem < y->mem);
  return (x->step > y->step) - (x->step < y->step);
}

/* The search on `nodes` nodes, ranked (fitting first by predicted step time, then the rest
 * by memory). */
static int search_on(const tsr_config *deck, const tsr_hardware *hw, int nodes,
                     const tsr_plan_search_opts *o, int with_cp, int offload, int act,
                     candidates *cs) {
  *cs = (candidates){NULL, 0, 0, 0, 0, 0, with_cp, offload, act};
  const int rc = search_all(deck, hw, nodes * hw->gpus_per_node, o, cs);
  if (!rc && cs->n) qsort(cs->c, (size_t)cs->n, sizeof *cs->c, by_fit_then_time);
  return rc;
}

/* ---------------------------------------------------------------- more nodes */

/* The most nodes the scan for a fitting node count goes to. */
enum { MAX_NODES = 65536 };

static int add_count(int **list, int *n, int *cap, int count) {
  if (*n == *cap) {
    const int grown_cap = *cap ? 2 * *cap : 64;
    int *grown = tsr_calloc((size_t)grown_cap, sizeof *grown);
    TSR_CHECK(grown, TSR_ERR, "out of memory");
    if (*list) memcpy(grown, *list, (size_t)*n * sizeof *grown);
    tsr_free(list);
    *list = grown;
    *cap = grown_cap;
  }
  (*list)[(*n)++] = count;
  return 0;
}

static int by_value(const void *a, const void *b) {
  const int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The node counts in (nodes, bound] at which some layout the search tries could divide:
 * tp x cp x pp x dp ranks on whole nodes, dp dividing global_batch / micro_batch.
 * Ascending, each once; *beyond: some count past the bound. */
static int larger_counts(const tsr_config *deck, const tsr_hardware *hw, int nodes, int bound,
                         const tsr_plan_search_opts *o, int with_cp, int **list, int *n,
                         int *beyond) {
  int cap = 0;
  *list = NULL, *n = 0, *beyond = 0;
  const int64_t G = hw->gpus_per_node, L = deck->model.n_layer, gb = deck->train.global_batch;
  const int64_t tp_max = FIXED(TP) ? deck->parallel.tp : G;
  const int64_t pp_max = FIXED(PP) ? deck->parallel.pp : L;
  values mbs = {{0}, 0};
  if (FIXED(MICRO_BATCH)) mbs = one(deck->train.micro_batch);
  for (int64_t mb = 1; !FIXED(MICRO_BATCH) && mb <= 64 && mb <= gb; mb *= 2) mbs.v[mbs.n++] = mb;
  for (int64_t tp = FIXED(TP) ? tp_max : 1; tp <= tp_max; tp++) {
    if (!FIXED(TP) && G % tp) continue;
    for (int64_t pp = FIXED(PP) ? pp_max : 1; pp <= pp_max; pp++) {
      if (!FIXED(PP) && L % pp) continue;
      const values cps = cp_values(deck, o, with_cp, tp, pp, 0, G);
      for (int ci = 0; ci < cps.n; ci++) {
        const int64_t tcp = tp * cps.v[ci] * pp; /* ranks of a dp rank */
        for (int b = 0; b < mbs.n; b++) {
          if (gb % mbs.v[b]) continue;
          const int64_t q = gb / mbs.v[b]; /* dp divides q */
          for (int64_t d = 1; d <= q / d; d++) {
            if (q % d) continue;
            const int64_t dps[2] = {d, q / d};
            for (int j = 0; j < 2; j++) {
              const int64_t dp = dps[j];
              if (tcp > INT64_MAX / dp || (tcp * dp) % G) continue;
              const int64_t count = tcp * dp / G;
              if (count > bound) *beyond = 1;
              if (count > nodes && count <= bound) TSR_CALL(add_count(list, n, &cap, (int)count));
            }
          }
        }
      }
    }
  }
  if (*n) qsort(*list, (size_t)*n, sizeof **list, by_value);
  int u = 0;
  for (int i = 0; i < *n; i++)
    if (!u || (*list)[u - 1] != (*list)[i]) (*list)[u++] = (*list)[i];
  *n = u;
  return 0;
}

/* What the scan above `nodes` found: the smallest node count with a layout that fits (0:
 * none up to `up_to`; `cut`: the scan stopped at MAX_NODES, not where layouts stop
 * dividing), and there the ranked search; `offload`: with the optimizer offload, as a
 * search on that count would try it (`allow_offload`), nothing fitting there without it;
 * `act`: with the activation offload too (`allow_act`), nothing fitting without it. */
typedef struct {
  int count, up_to, cut, offload, act;
  candidates there;
} larger;

static int scan_larger(const tsr_config *deck, const tsr_hardware *hw,
                       const tsr_plan_search_opts *o, int with_cp, int allow_offload,
                       int allow_act, larger *out) {
  const int bound = (int)(INT_MAX / hw->gpus_per_node < MAX_NODES ? INT_MAX / hw->gpus_per_node
                                                                   : MAX_NODES);
  int *list = NULL, n = 0;
  memset(out, 0, sizeof *out);
  TSR_CALL(larger_counts(deck, hw, o->nodes, bound, o, with_cp, &list, &n, &out->cut));
  out->up_to = out->cut ? bound : n ? list[n - 1] : o->nodes;
  if (!o->json && n)
    fprintf(stderr, "tessera plan: nothing fits on %d node(s); trying %d larger node count(s) "
            "up to %d ...\n", o->nodes, n, list[n - 1]);
  int rc = 0;
  /* none; the optimizer offload; the activation offload as well */
  const int tries[3][2] = {{0, 0}, {1, 0}, {1, 1}};
  for (int i = 0; i < n && !rc && !out->count; i++)
    for (int t = 0; t < 3 && !rc && !out->count; t++) {
      if ((tries[t][0] && !tries[t][1] && !allow_offload) || (tries[t][1] && !allow_act))
        continue;
      candidates probe = {NULL, 0, 0, 0, 0, 1, with_cp, tries[t][0], tries[t][1]};
      rc = search_all(deck, hw, list[i] * hw->gpus_per_node, o, &probe);
      if (!rc && probe.fit)
        out->count = list[i], out->offload = tries[t][0], out->act = tries[t][1];
      tsr_free(&probe.c);
    }
  tsr_free(&list);
  if (!rc && out->count)
    rc = search_on(deck, hw, out->count, o, with_cp, out->offload, out->act, &out->there);
  return rc;
}

/* ---------------------------------------------------------------- output */

static void print_candidate(FILE *out, int rank, const candidate *k, int json) {
  if (json) {
    fprintf(out, "{\"rank\": %d, \"tp\": %d, \"cp\": %d, \"cp_comm\": \"%s\", \"pp\": %d, "
            "\"virtual_stages\": %d, \"schedule\": \"%s\", \"dp\": %d, "
            "\"zero_stage\": %d, \"shard\": %d, \"micro_batch\": %d, \"recompute\": \"%s\", "
            "\"sequence_parallel\": %s, \"memory_gb\": %.4f, \"step_s\": %.6g, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.4f, \"fits\": %s, \"offload\": \"%s\", "
            "\"activation_offload\": %s, \"host_gb_per_node\": %.4f, \"fits_host\": %s}", rank,
            k->tp, k->cp, k->cp_comm == TSR_CP_A2A ? "a2a" : "p2p", k->pp, k->v, k->schedule,
            k->dp, k->zero, k->shard, k->micro_batch,
            recompute_modes[k->recompute], k->sp ? "true" : "false", k->mem / 1e9, k->step,
            k->tokens_per_s, k->mfu, k->fits ? "true" : "false",
            k->offload ? "optimizer" : "none", k->act ? "true" : "false", k->host / 1e9,
            k->fits_host ? "true" : "false");
    return;
  }
  char r[16], fit[64], cp[24], host[24];
  snprintf(r, sizeof r, rank > 0 ? "%d" : "-", rank);
  if (k->fits)
    snprintf(fit, sizeof fit, "yes");
  else if (k->short_gb > 0)
    snprintf(fit, sizeof fit, "NO, %.4g GB short", k->short_gb);
  else
    snprintf(fit, sizeof fit, "NO, host memory short");
  if (k->cp > 1)
    snprintf(cp, sizeof cp, "%d/%s", k->cp, k->cp_comm == TSR_CP_A2A ? "a2a" : "p2p");
  else
    snprintf(cp, sizeof cp, "1");
  snprintf(host, sizeof host, k->offload || k->act ? "%.0f" : "-", k->host / 1e9);
  fprintf(out, "  %4s %3d %3d %2d %-11s %4d %-6s %4d %5d %4d %-9s %-3s %8.2f %9.3f %11.4g %6.3f "
          "%7s  %s\n", r, k->tp, k->pp, k->v, k->schedule, k->dp, cp, k->zero, k->shard,
          k->micro_batch, recompute_modes[k->recompute], k->sp ? "yes" : "no", k->mem / 1e9,
          k->step, k->tokens_per_s, k->mfu, host, fit);
}

/* The columns: cp after dp, as "cp/p2p" or "cp/a2a" (1: none), so that rank, tp and pp
 * stay the first three; "host GB" the offloads' page-locked memory a node ("-": no
 * offload). */
static void print_table_head(void) {
  printf("  %4s %3s %3s %2s %-11s %4s %-6s %4s %5s %4s %-9s %-3s %8s %9s %11s %6s %7s  %s\n",
         "rank", "tp", "pp", "v", "schedule", "dp", "cp", "zero", "shard", "mb", "recompute",
         "sp", "mem GB", "step s", "tokens/s", "MFU", "host GB", "fits");
}

/* The deck's own layout among the candidates: its row and how many that fit are faster. */
static void print_deck_layout(const tsr_config *cfg, const tsr_hardware *hw, int world,
                              const candidates *cs, int json, int invalid) {
  tsr_plan_grid g;
  candidate k;
  if (invalid) {
    printf(json ? "\"deck\": null" : "the deck's own layout is not valid with these overrides\n");
    return;
  }
  if (tsr_plan_layout(cfg, world, hw->gpus_per_node, &g, NULL, 0) ||
      candidate_of(cfg, hw, &g, &k)) {
    printf(json ? "\"deck\": null" : "the deck's own layout does not divide on these GPUs\n");
    return;
  }
  int rank = 1;
  for (int i = 0; i < cs->n; i++) rank += cs->c[i].fits && cs->c[i].step < k.step;
  if (json) {
    printf("\"deck\": ");
    print_candidate(stdout, rank, &k, 1);
    return;
  }
  printf("the deck's own layout (%s, %s):\n", k.fits ? "fits" : "does NOT fit",
         k.fits ? "ranked among those that fit" : "ranked as if it did");
  print_candidate(stdout, rank, &k, 0);
}

/* The keys held: "parallel.tp = 8, train.recompute = 'full'" (text) or a JSON object of
 * key: value (the deck's word, unquoted). */
static void print_fixed(const tsr_config *cfg, unsigned fixed, int json) {
  int first = 1;
  if (json) printf("\"fixed\": {");
  for (int k = 0; k < TSR_PLAN_N_SEARCHED; k++) {
    if (!(fixed & (1u << k))) continue;
    char text[TSR_STR_PATH + 160];
    tsr_deck_key_text(cfg, searched[k], text, sizeof text);
    const char *value = strstr(text, " = ");
    value = value ? value + 3 : "?";
    if (json) {
      const size_t n = strlen(value);
      const int quoted = n >= 2 && value[0] == '\'' && value[n - 1] == '\'';
      printf("%s\"%s\": \"%.*s\"", first ? "" : ", ", searched[k], (int)(quoted ? n - 2 : n),
             value + quoted);
    } else {
      printf("%s%s", first ? "held fixed by the command line: " : ", ", text);
    }
    first = 0;
  }
  printf(json ? "}" : first ? "" : "\n");
}

/* "in 80 GB" or "in 0.9 x 80 GB = 72 GB" */
static void fit_room(char *buf, size_t len, const tsr_hardware *hw) {
  if (hw->max_mem_frac < 1)
    snprintf(buf, len, "%.3g x %.4g GB = %.4g GB", hw->max_mem_frac, hw->hbm_gb,
             hw->max_mem_frac * hw->hbm_gb);
  else
    snprintf(buf, len, "%.4g GB", hw->hbm_gb);
}

static void print_larger_text(const tsr_hardware *hw, const tsr_plan_search_opts *o,
                              const larger *l) {
  printf("nothing fits on %d node(s) x %d GPUs", o->nodes, hw->gpus_per_node);
  if (!l->count) {
    if (l->up_to <= o->nodes)
      printf(", and no layout divides on more nodes\n");
    else
      printf(", nor on any node count up to %d (%s)\n", l->up_to,
             l->cut ? "the scan's bound" : "beyond it no layout divides");
    return;
  }
  printf("; the smallest node count that fits is %d (%d x %d = %d GPUs, %d layout(s) fit%s); "
         "the fastest there:\n", l->count, l->count, hw->gpus_per_node,
         l->count * hw->gpus_per_node, l->there.fit,
         l->act       ? " with the optimizer and activation offloads, none without them"
         : l->offload ? " with the optimizer offload, none without it"
                      : "");
  print_table_head();
  print_candidate(stdout, 1, &l->there.c[0], 0);
}

/* ---------------------------------------------------------------- when nothing fits */

/* The layout k with the memory keys changed (zero_stage, recompute, micro_batch) on
 * `world` GPUs; 1 when that does not divide. */
static int replan(const tsr_config *deck, const tsr_hardware *hw, int world, const candidate *k,
                  int zero, int recompute, int64_t mb, candidate *out) {
  tsr_config c = *deck;
  tsr_plan_grid g;
  c.parallel.tp = k->tp, c.parallel.pp = k->pp, c.parallel.virtual_stages = k->v;
  c.parallel.cp = k->cp, c.parallel.cp_comm = k->cp_comm;
  c.parallel.schedule = k->kind, c.parallel.sequence_parallel = k->sp;
  c.parallel.shard_scope = k->scope, c.parallel.zero_stage = zero, c.parallel.micro_batches = 0;
  if (k->offload) c.parallel.offload = TSR_OFFLOAD_OPTIMIZER, c.parallel.offload_fraction = 1;
  else c.parallel.offload = TSR_OFFLOAD_NONE;
  c.train.activation_offload = k->act;
  c.train.recompute = (tsr_recompute)recompute, c.train.micro_batch = mb;
  if (tsr_plan_layout(&c, world, hw->gpus_per_node, &g, NULL, 0)) return 1;
  return candidate_of(&c, hw, &g, out) ? 1 : 0;
}

/* What would close the gap of the layout closest to fitting: each memory key the search
 * varies set to its least-memory value (zero_stage 3, recompute 'full', micro_batch 1) where
 * that layout has another and it lowers the memory, then all of them; more nodes (the
 * scan); a larger GPU.  Without held keys the closest layout has most of these already. */
typedef struct {
  const char *key, *value;
  int held;
  candidate k;
} remedy;

static int remedies(const tsr_config *deck, const tsr_hardware *hw, int world,
                    const tsr_plan_search_opts *o, const candidate *b, remedy *r) {
  int n = 0, z = b->zero, rc = b->recompute;
  int64_t mb = b->micro_batch;
  /* each alone, kept only where it lowers the memory (ZeRO on dp 1 only adds buffers) */
  if (z < 3 && !replan(deck, hw, world, b, 3, rc, mb, &r[n].k) && r[n].k.mem < b->mem)
    r[n].key = "parallel.zero_stage", r[n].value = "3", r[n++].held = !!FIXED(ZERO), z = 3;
  if (rc < 2 && !replan(deck, hw, world, b, b->zero, 2, mb, &r[n].k) && r[n].k.mem < b->mem)
    r[n].key = "train.recompute", r[n].value = "full", r[n++].held = !!FIXED(RECOMPUTE), rc = 2;
  if (mb > 1 && !replan(deck, hw, world, b, b->zero, b->recompute, 1, &r[n].k) &&
      r[n].k.mem < b->mem)
    r[n].key = "train.micro_batch", r[n].value = "1", r[n++].held = !!FIXED(MICRO_BATCH), mb = 1;
  /* then those together */
  if (n > 1 && !replan(deck, hw, world, b, z, rc, mb, &r[n].k))
    r[n].key = "these together", r[n].value = NULL, r[n++].held = 0;
  /* the optimizer offload (hardware 'cpu': nothing to move) */
  candidate off = *b;
  off.offload = 1;
  if (!b->offload && strcmp(hw->name, "cpu") &&
      !replan(deck, hw, world, &off, b->zero, b->recompute, b->micro_batch, &r[n].k) &&
      r[n].k.mem < b->mem)
    r[n].key = "parallel.offload", r[n].value = "optimizer", r[n++].held = !!FIXED(OFFLOAD);
  /* the activation offload */
  candidate act = *b;
  act.act = 1;
  if (!b->act && strcmp(hw->name, "cpu") &&
      !replan(deck, hw, world, &act, b->zero, b->recompute, b->micro_batch, &r[n].k) &&
      r[n].k.mem < b->mem)
    r[n].key = "train.activation_offload", r[n].value = ".true.",
    r[n++].held = !!FIXED(ACT_OFFLOAD);
  return n;
}

/* GB of HBM a GPU needs for layout b at this max_mem_frac and reserve */
static double hbm_needed(const tsr_hardware *hw, const candidate *b) {
  return (b->mem / 1e9 + hw->reserved_gb) / hw->max_mem_frac;
}

static void print_shortfall_text(const tsr_config *deck, const tsr_hardware *hw, int world,
                                 const tsr_plan_search_opts *o, const candidates *cs,
                                 const larger *l, const char *room) {
  if (!cs->n) return;
  const candidate *b = &cs->c[0]; /* sorted: the least memory first when none fits */
  remedy r[6];
  const int n = remedies(deck, hw, world, o, b, r);
  if (b->short_gb > 0)
    printf("closest to fitting: %.4g GB per GPU with %.1f GB reserved, against %s: short by "
           "%.4g GB per GPU (the first layout above)\n", b->mem / 1e9, hw->reserved_gb, room,
           b->short_gb);
  else
    printf("closest to fitting: %.4g GB per GPU fits in %s, but its offloaded optimizer state "
           "takes %.4g GB of page-locked host memory a node, more than hardware.host_memory_gb "
           "= %.6g (the first layout above)\n", b->mem / 1e9, room, b->host / 1e9,
           hw->host_memory_gb);
  printf("what would close it:\n");
  for (int i = 0; i < n; i++) {
    char what[96];
    const char *q = r[i].value && (r[i].value[0] < '0' || r[i].value[0] > '9') &&
                            r[i].value[0] != '.' ? "'" : ""; /* words quoted, not .true. */
    if (r[i].value)
      snprintf(what, sizeof what, "%s = %s%s%s%s", r[i].key, q, r[i].value, q,
               r[i].held ? " (held by the command line)" : "");
    else
      snprintf(what, sizeof what, "%s", r[i].key);
    if (r[i].k.fits)
      printf("  %-52s %.4g GB: fits, %.4g GB to spare\n", what, r[i].k.mem / 1e9,
             -r[i].k.short_gb);
    else
      printf("  %-52s %.4g GB: still %.4g GB short\n", what, r[i].k.mem / 1e9, r[i].k.short_gb);
  }
  if (!n)
    printf("  %-52s (zero_stage 3, recompute 'full', micro_batch 1: this layout has them, or "
           "they add memory here)\n", "no memory key lowers this layout's memory");
  if (l->count)
    printf("  %-52s %d nodes, the fewest where a layout fits (below)\n", "more nodes (--nodes)",
           l->count);
  else
    printf("  %-52s none fits up to %d nodes\n", "more nodes (--nodes)", l->up_to);
  printf("  %-52s %.4g GB per GPU (hardware.hbm_gb; this one has %.4g)\n",
         "a GPU with more memory (--hardware)", hbm_needed(hw, b), hw->hbm_gb);
}

static void print_shortfall_json(const tsr_config *deck, const tsr_hardware *hw, int world,
                                 const tsr_plan_search_opts *o, const candidates *cs) {
  printf(",\n  \"closest\": ");
  if (!cs->n) {
    printf("null");
    return;
  }
  const candidate *b = &cs->c[0];
  remedy r[6];
  const int n = remedies(deck, hw, world, o, b, r);
  printf("{\"short_gb\": %.4f, \"hbm_gb_needed\": %.4f, \"layout\": ", b->short_gb,
         hbm_needed(hw, b));
  print_candidate(stdout, 0, b, 1);
  printf(", \"keys\": [");
  for (int i = 0; i < n; i++)
    printf("%s{\"key\": \"%s\", \"value\": \"%s\", \"held\": %s, \"memory_gb\": %.4f, "
           "\"short_gb\": %.4f, \"fits\": %s}", i ? ", " : "", r[i].key,
           r[i].value ? r[i].value : "", r[i].held ? "true" : "false", r[i].k.mem / 1e9,
           r[i].k.short_gb, r[i].k.fits ? "true" : "false");
  printf("]}");
}

static void print_larger_json(const tsr_plan_search_opts *o, const larger *l) {
  printf(",\n  \"larger\": {\"from_nodes\": %d, \"up_to_nodes\": %d, \"bound_reached\": %s, "
         "\"smallest_nodes\": ", o->nodes, l->up_to, l->cut ? "true" : "false");
  if (!l->count) {
    printf("null, \"fit\": 0, \"fastest\": null}");
    return;
  }
  printf("%d, \"fit\": %d, \"fastest\": ", l->count, l->there.fit);
  print_candidate(stdout, 1, &l->there.c[0], 1);
  printf("}");
}

int tsr_plan_search(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_search_opts *o,
                    int *any_fit) {
  candidates cs;
  larger more;
  memset(&more, 0, sizeof more);
  const int world = o->nodes * hw->gpus_per_node;
  /* cp > 1 for long sequences, or, when nothing fits without it, for any the checks take */
  int with_cp = !FIXED(CP) && cfg->model.seq_len >= CP_FROM_SEQ_LEN;
  int rc = search_on(cfg, hw, o->nodes, o, with_cp, 0, 0, &cs);
  if (!rc && !cs.fit && !with_cp && !FIXED(CP) && cfg->model.seq_len % 4 == 0) {
    tsr_free(&cs.c);
    with_cp = 1;
    rc = search_on(cfg, hw, o->nodes, o, with_cp, 0, 0, &cs);
  }
  /* the optimizer offload, when nothing fits without it (its layouts replace the rows);
   * then the activation offload as well, when nothing fits even so */
  const int on_gpu = strcmp(hw->name, "cpu") != 0;
  int offload = 0, act = 0;
  for (int t = 0; t < 2 && !rc && !cs.fit; t++) {
    if (!on_gpu || (t == 0 ? FIXED(OFFLOAD) : FIXED(ACT_OFFLOAD))) continue;
    candidates off;
    rc = search_on(cfg, hw, o->nodes, o, with_cp, 1, t, &off);
    if (!rc) {
      tsr_free(&cs.c);
      cs = off;
      offload |= t == 0, act = t;
    }
  }
  if (!rc && !cs.fit)
    rc = scan_larger(cfg, hw, o, with_cp, !FIXED(OFFLOAD) && on_gpu, !FIXED(ACT_OFFLOAD) && on_gpu,
                     &more);
  const int shown = cs.fit < o->top ? cs.fit : o->top;
  char room[96];
  fit_room(room, sizeof room, hw);
  if (!rc && o->json) {
    printf("{\"search\": {\"nodes\": %d, \"gpus_per_node\": %d, \"hardware\": \"%s\", "
           "\"max_mem_frac\": %.6g, \"divide\": %d, \"fit\": %d, \"cp_searched\": %s, "
           "\"offload_searched\": %s, \"act_offload_searched\": %s, \"host_memory_gb\": %.6g,\n  ",
           o->nodes, hw->gpus_per_node, hw->name, hw->max_mem_frac, cs.divide, cs.fit,
           with_cp ? "true" : "false", offload ? "true" : "false", act ? "true" : "false",
           hw->host_memory_gb);
    print_fixed(cfg, o->fixed, 1);
    printf(",\n  ");
    print_deck_layout(cfg, hw, world, &cs, 1, o->deck_invalid);
    printf(",\n  \"layouts\": [");
    for (int i = 0; i < shown; i++) {
      printf("%s\n    ", i ? "," : "");
      print_candidate(stdout, i + 1, &cs.c[i], 1);
    }
    printf("%s]", shown ? "\n  " : "");
    if (!cs.fit) {
      print_larger_json(o, &more);
      print_shortfall_json(cfg, hw, world, o, &cs);
    }
    printf("}}\n");
  } else if (!rc) {
    printf("search on %d node(s) x %d GPUs (%s): %d layouts divide, %d fit in %s with %.1f GB "
           "reserved", o->nodes, hw->gpus_per_node, hw->name, cs.divide, cs.fit, room,
           hw->reserved_gb);
    /* fewer than --top fit: the rest of the rows are layouts that do not, closest first */
    const int rows = cs.n < o->top ? cs.n : o->top;
    if (shown)
      printf("; the %d fastest (predicted)%s:\n", shown,
             rows > shown ? ", then the closest to fitting of those that do NOT fit" : "");
    else if (rows)
      printf("; the %d closest to fitting (none fits):\n", rows);
    else
      printf("\n");
    if (with_cp)
      printf("context parallelism tried: cp a power of 2 dividing model.seq_len = %lld into "
             "2 cp chunks, with the ring (p2p) and the all-to-alls (a2a)%s\n",
             (long long)cfg->model.seq_len,
             cfg->model.seq_len >= CP_FROM_SEQ_LEN ? "" : ", as nothing fits without it");
    if (offload)
      printf("optimizer offload tried, as nothing fits without it: parallel.offload = "
             "'optimizer' at every ZeRO stage, the shard's master weights and Adam moments in "
             "page-locked host memory (host GB: a node's, against hardware.host_memory_gb = "
             "%.6g)\n", hw->host_memory_gb);
    if (act)
      printf("activation offload tried as well, as nothing fits%s: train.activation_offload = "
             ".true., every layer's stored activations in page-locked host memory between its "
             "forward and its backward\n",
             FIXED(OFFLOAD) ? " without it" : " with the optimizer offload alone");
    print_fixed(cfg, o->fixed, 0);
    if (rows) print_table_head();
    for (int i = 0; i < rows; i++) {
      if (i == shown && shown) printf("  -- these do NOT fit --\n");
      print_candidate(stdout, i < shown ? i + 1 : 0, &cs.c[i], 0);
    }
    if (!cs.fit) {
      print_shortfall_text(cfg, hw, world, o, &cs, &more, room);
      print_larger_text(hw, o, &more);
    }
    print_deck_layout(cfg, hw, world, &cs, 0, o->deck_invalid);
  }
  *any_fit = cs.fit > 0;
  tsr_free(&cs.c);
  tsr_free(&more.there.c);
  return rc;
}
