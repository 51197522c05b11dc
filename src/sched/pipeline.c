/* pipeline.c — the pipeline schedule generator: from a schedule's descriptor (its compute
 * order, schedule.h; the schedules themselves are the other files of src/sched/), one
 * stage's list of computations and transfers.  Pure C: the executor owns MPI.
 *
 * A schedule is built in two steps.
 *
 * 1. The compute order of every stage: the sequence of FORWARD / BACKWARD (mb, chunk),
 *    or FORWARD / B / W when the backward is split.  This is where the schedules differ:
 *    each descriptor's `order` writes it.
 *
 * 2. The transfers, placed by replaying all stages' compute orders on an ideal clock
 *    (forward 1, backward 2 time units, or F = B = W = 1 when split; free transfers;
 *    each computation starting as soon as its stage is free and its input exists).  A
 *    transfer is stamped with the time its producer finishes; every computation with
 *    its start time.  Sorting all events of the step by (time, transfers before
 *    computations, a global id) gives one global sequence, and each stage's list is that
 *    sequence restricted to the stage.  A stage's computations never overlap on the
 *    clock, so the projection keeps its compute order (B before its W included).
 *
 * Why step 2 rather than a local rule such as "send right after the forward, receive
 * right before it": with rendezvous (synchronous) transfers a local rule deadlocks.  In
 * the loop order with w = pp - s - 1 warm-up forwards, stage s sends the activation of micro-batch w before it
 * receives gradient 0, while stage s+1 sends gradient 0 before it receives activation w;
 * Megatron avoids this by posting both at once (batched isend/irecv).  With interleaving
 * the stages form a ring (the last stage feeds chunk pp to stage 0), where even a
 * consistent order on every link is not enough: all stages can block sending.  A global
 * sequence fixes all of it: if the blocking execution were stuck, take the first event
 * of the sequence not yet executed; everything before it on its stage(s) has executed,
 * so its stage(s) stand exactly at it: a computation can run, and both ends of a
 * transfer are at the matching action.  So no blocking execution can deadlock, whatever
 * the real timings, and a non-blocking executor (post early, wait late) cannot either.
 * The ideal clock only decides which interleaving is chosen: the one in which, with
 * typical timings, each RECV appears in the list when its data would be ready. */
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "schedule.h"

/* Times of the ideal clock used to place transfers: a fused backward ~ 2x forward (it
 * computes gradients w.r.t. both inputs and weights), each half of a split one ~ 1x. */
enum { CLOCK_FORWARD = 1, CLOCK_BACKWARD = 2, CLOCK_HALF = 1 };

int tsr_pp_split_backward(tsr_schedule_choice kind) {
  const tsr_sched_desc *d = tsr_sched(kind);
  return d && d->split_backward;
}
static int v_placed(tsr_schedule_choice kind) {
  const tsr_sched_desc *d = tsr_sched(kind);
  return d && d->placement == TSR_PLACE_V;
}

const char *tsr_pp_op_name(tsr_pp_op op) {
  static const char *names[] = {"RECV_ACT",  "FORWARD",   "SEND_ACT",  "RECV_GRAD",
                                "BACKWARD",  "SEND_GRAD", "BACKWARD_B", "BACKWARD_W"};
  return (unsigned)op < 8 ? names[op] : "?";
}

/* The V placement: chunks go up the stages and come back down; for v > 2 the same zigzag. */
int tsr_pp_chunk_owner(tsr_schedule_choice kind, int pp, int v, int chunk) {
  if (pp < 1 || v < 1 || chunk < 0 || chunk >= pp * v) return -1;
  if (v_placed(kind) && (chunk / pp) % 2 == 1) return pp - 1 - chunk % pp;
  return chunk % pp;
}

/* The inverse: local chunk j of stage s is chunk j pp + s, or on a V's way down
 * (j odd, the V placement) chunk j pp + pp - 1 - s. */
int tsr_pp_stage_chunk(tsr_schedule_choice kind, int pp, int v, int stage, int local) {
  if (pp < 1 || v < 1 || stage < 0 || stage >= pp || local < 0 || local >= v) return -1;
  if (v_placed(kind) && local % 2 == 1) return local * pp + pp - 1 - stage;
  return local * pp + stage;
}

int tsr_pp_head_stage(tsr_schedule_choice kind, int pp, int v) {
  return tsr_pp_chunk_owner(kind, pp, v, pp * v - 1);
}

/* 'auto': a layer's and the head's forward FLOPs per token, counted as tessera plan
 * counts them (2 per GEMM weight element, 2 seq_len d_model for the attention core). */
static void split_costs(const tsr_model_config *m, double *layer, double *head) {
  const double C = (double)m->d_model, F = (double)m->d_ff, V = (double)m->vocab_size;
  const double hd = m->n_head > 0 ? C / (double)m->n_head : C;
  const double q = (double)m->n_head * hd, kv = (double)m->n_kv_head * hd;
  const double gemm = C * (q + 2 * kv) + q * C + (m->arch == TSR_ARCH_GPT2 ? 2 : 3) * C * F;
  *layer = 2 * gemm + 2 * (double)m->seq_len * C;
  *head = 2 * V * C;
}

static void split_auto(const tsr_model_config *m, int n, int *counts) {
  double layer, head;
  split_costs(m, &layer, &head);
  const double h = layer > 0 ? head / layer : 0; /* the head, in layers */
  for (int c = 0; c < n; c++) counts[c] = 1;
  for (int left = (int)m->n_layer - n; left > 0; left--) {
    int best = -1;
    double best_cost = 0;
    for (int c = 0; c < n; c++) {
      const int plain = c != 0 && c != n - 1;
      const double cost = counts[c] + 1 + (c == n - 1 ? h : 0);
      const int best_plain = best > 0 && best != n - 1;
      if (best < 0 || cost < best_cost - 1e-9 ||
          (cost < best_cost + 1e-9 && plain && !best_plain)) {
        best = c;
        best_cost = cost;
      }
    }
    counts[best]++;
  }
}

int tsr_pp_split_counts(const tsr_model_config *m, int pp, int v, const char *spec, int *counts,
                        char *why, size_t cap) {
  const long long n = (long long)pp * v, L = m->n_layer;
  if (pp < 1 || v < 1) {
    snprintf(why, cap, "parallel.pp = %d and parallel.virtual_stages = %d must be >= 1", pp, v);
    return TSR_ERR_INPUT;
  }
  if (n > L || n > TSR_PP_MAX_CHUNKS) {
    snprintf(why, cap, "%lld chunks (parallel.pp %d * parallel.virtual_stages %d) for %lld "
             "layers: every chunk needs a layer", n, pp, v, L);
    return TSR_ERR_INPUT;
  }
  if (!spec || !*spec) {
    if (L % n) {
      snprintf(why, cap, "model.n_layer = %lld is not divisible by parallel.pp * "
               "parallel.virtual_stages = %d * %d (set parallel.stage_layers for an uneven "
               "split)", L, pp, v);
      return TSR_ERR_INPUT;
    }
    for (int c = 0; c < n; c++) counts[c] = (int)(L / n);
    return 0;
  }
  if (!strcmp(spec, "auto")) {
    split_auto(m, (int)n, counts);
    return 0;
  }
  long long sum = 0;
  int k = 0;
  for (const char *s = spec;; k++) {
    while (*s == ' ' || *s == '\t') s++;
    char *end;
    const long x = (*s >= '0' && *s <= '9') ? strtol(s, &end, 10) : -1;
    if (x < 0) {
      snprintf(why, cap, "item %d is not a number of layers: write 'auto' or one count per "
               "chunk, e.g. '4,3'", k + 1);
      return TSR_ERR_INPUT;
    }
    if (x < 1) {
      snprintf(why, cap, "item %d is %ld: every chunk needs at least one layer", k + 1, x);
      return TSR_ERR_INPUT;
    }
    if (k < n) counts[k] = (int)(x > 1 << 20 ? 1 << 20 : x);
    sum += x > 1 << 20 ? 1 << 20 : x;
    s = end;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) break;
    if (*s != ',' || !s[1]) {
      snprintf(why, cap, "item %d is not followed by ',' and a count", k + 1);
      return TSR_ERR_INPUT;
    }
    s++;
  }
  if (k + 1 != n) {
    snprintf(why, cap, "%d layer counts for %lld chunks (parallel.pp %d * "
             "parallel.virtual_stages %d): give one per chunk, in chunk order", k + 1, n, pp, v);
    return TSR_ERR_INPUT;
  }
  if (sum != L) {
    snprintf(why, cap, "the counts sum to %lld layers, not model.n_layer = %lld", sum, L);
    return TSR_ERR_INPUT;
  }
  return 0;
}

int tsr_pp_chunk_layers(const tsr_model_config *m, int pp, int v, const char *spec, int chunk,
                        int *first, int *count) {
  int counts[TSR_PP_MAX_CHUNKS];
  char why[256];
  if (tsr_pp_split_counts(m, pp, v, spec, counts, why, sizeof why)) {
    tsr_error("pipeline: parallel.stage_layers = '%s': %s", spec ? spec : "", why);
    return TSR_ERR_INPUT;
  }
  TSR_CHECK(chunk >= 0 && chunk < pp * v, TSR_ERR, "pipeline: chunk %d outside 0..%d", chunk,
            pp * v - 1);
  *first = 0;
  for (int c = 0; c < chunk; c++) *first += counts[c];
  *count = counts[chunk];
  return 0;
}

int tsr_pp_layer_chunk(const tsr_model_config *m, int pp, int v, const char *spec, int layer) {
  int counts[TSR_PP_MAX_CHUNKS];
  char why[256];
  if (tsr_pp_split_counts(m, pp, v, spec, counts, why, sizeof why)) return -1;
  for (int c = 0, end = 0; c < pp * v; c++)
    if (layer < (end += counts[c])) return layer >= 0 ? c : -1;
  return -1;
}

int tsr_pp_split_text(const tsr_model_config *m, tsr_schedule_choice kind, int pp, int v,
                      const char *spec, char *buf, size_t cap) {
  int counts[TSR_PP_MAX_CHUNKS];
  char why[256];
  if (tsr_pp_split_counts(m, pp, v, spec, counts, why, sizeof why)) return TSR_ERR_INPUT;
  if (!spec) spec = "";
  size_t o = (size_t)snprintf(buf, cap, "%s split of the layers (parallel.stage_layers = '%s'): ",
                              !spec[0] ? "equal" : strcmp(spec, "auto") ? "explicit" : "balanced",
                              spec);
  for (int st = 0; st < pp && o < cap; st++) {
    o += (size_t)snprintf(buf + o, cap - o, st ? ", stage %d layers" : "stage %d holds layers", st);
    for (int j = 0; j < v && o < cap; j++) {
      const int c = tsr_pp_stage_chunk(kind, pp, v, st, j);
      int first = 0;
      for (int k = 0; k < c; k++) first += counts[k];
      o += (size_t)snprintf(buf + o, cap - o, counts[c] > 1 ? " %d..%d" : " %d", first,
                            first + counts[c] - 1);
    }
  }
  if (o >= cap && cap > 4) strcpy(buf + cap - 4, "...");
  return 0;
}

int tsr_pp_stage_max_chunk(const tsr_model_config *m, tsr_schedule_choice kind, int pp, int v,
                           const char *spec, int stage) {
  int counts[TSR_PP_MAX_CHUNKS], most = 0;
  char why[256];
  if (tsr_pp_split_counts(m, pp, v, spec, counts, why, sizeof why)) return -1;
  for (int j = 0; j < v; j++) {
    const int c = tsr_pp_stage_chunk(kind, pp, v, stage, j);
    if (c >= 0 && counts[c] > most) most = counts[c];
  }
  return most;
}

enum { PASS_F = TSR_PASS_F, PASS_B = TSR_PASS_B, PASS_W = TSR_PASS_W };
typedef tsr_sched_work work;

/* Replays every stage's compute order on the ideal clock.  end[p][mb * C + c] receives
 * the finishing time of pass p (PASS_F, PASS_B, PASS_W) of (mb, c). */
static int ideal_clock(const tsr_sched_desc *d, int pp, int m, int v, long *end[3]) {
  int C = pp * v, split = d->split_backward, n = (split ? 3 : 2) * m * v, rc = 0;
  work *order = tsr_calloc((size_t)pp * (size_t)n, sizeof *order);
  int *pos = tsr_calloc((size_t)pp, sizeof *pos);
  long *clock = tsr_calloc((size_t)pp, sizeof *clock);
  if (!order || !pos || !clock) {
    rc = TSR_ERR;
    goto done;
  }
  for (int s = 0; s < pp; s++) d->order(pp, s, m, v, order + (size_t)s * (size_t)n);
  for (int i = 0; i < m * C; i++) end[0][i] = end[1][i] = end[2][i] = -1;
  const long dur[3] = {CLOCK_FORWARD, split ? CLOCK_HALF : CLOCK_BACKWARD, CLOCK_HALF};
  for (int left = pp * n, progress = 1; left > 0 && progress;) {
    progress = 0;
    for (int s = 0; s < pp; s++) {
      for (; pos[s] < n; pos[s]++, left--, progress = 1) {
        work w = order[(size_t)(s * n + pos[s])];
        int i = w.micro_batch * C + w.chunk;
        long ready; /* when the input of this computation exists */
        if (w.pass == PASS_F)
          ready = w.chunk == 0 ? 0 : end[PASS_F][i - 1];
        else if (w.pass == PASS_B)
          ready = w.chunk == C - 1 ? end[PASS_F][i] : end[PASS_B][i + 1];
        else
          ready = end[PASS_B][i]; /* same stage, earlier in its order */
        if (ready < 0) break;
        if (ready > clock[s]) clock[s] = ready;
        clock[s] += dur[w.pass];
        end[w.pass][i] = clock[s];
      }
    }
    if (!progress && left > 0) {
      /* The compute orders themselves wait on each other: a bug here, not user input. */
      tsr_error("pipeline: %s schedule with pp = %d, m = %d, v = %d is infeasible",
                d->word, pp, m, v);
      rc = TSR_ERR;
    }
  }
done:
  tsr_free(&order);
  tsr_free(&pos);
  tsr_free(&clock);
  return rc;
}

/* An action of this stage with its place in the global sequence. */
typedef struct {
  long time;
  int computation; /* 0: transfer, 1: computation (transfers first at equal time) */
  long id;         /* global tie-break, unique per transfer */
  tsr_pp_action action;
} event;

static int event_cmp(const void *pa, const void *pb) {
  const event *a = pa, *b = pb;
  if (a->time != b->time) return a->time < b->time ? -1 : 1;
  if (a->computation != b->computation) return a->computation - b->computation;
  return (a->id > b->id) - (a->id < b->id);
}

static event make_event(long time, int computation, long id, tsr_pp_op op, int mb, int chunk,
                        int peer) {
  event e = {time, computation, id, {op, mb, chunk, peer}};
  return e;
}

int tsr_pp_schedule_create(tsr_pp_schedule **out, tsr_schedule_choice kind, int pp, int stage,
                           int micro_batches, int virtual_stages) {
  int m = micro_batches, v = virtual_stages;
  *out = NULL;
  const tsr_sched_desc *d = tsr_sched(kind);
  TSR_CHECK(d, TSR_ERR_INPUT, "pipeline: schedule %d is not one of the registry's",
            (int)kind);
  TSR_CHECK(pp >= 1 && stage >= 0 && stage < pp, TSR_ERR_INPUT,
            "pipeline: stage %d is not in 0..pp-1 with parallel.pp = %d", stage, pp);
  TSR_CHECK(m >= 1, TSR_ERR_INPUT, "pipeline: parallel.micro_batches = %d must be >= 1", m);
  TSR_CHECK(v >= 1, TSR_ERR_INPUT, "pipeline: parallel.virtual_stages = %d must be >= 1", v);
  const unsigned broken = tsr_sched_broken(d, pp, v, m, -1);
  TSR_CHECK(!(broken & 1u << TSR_SCHED_CHUNK_COUNT), TSR_ERR_INPUT,
            "pipeline: parallel.schedule = '%s' %s: set parallel.virtual_stages = %d, not %d",
            d->word, d->chunks_why, d->chunks, v);
  TSR_CHECK(!(broken & 1u << TSR_SCHED_NOT_CHUNKED), TSR_ERR_INPUT,
            "pipeline: parallel.virtual_stages = %d needs parallel.schedule = %s, not '%s'", v,
            tsr_sched_chunked_words(), d->word);
  TSR_CHECK(!(broken & 1u << TSR_SCHED_ONE_STAGE), TSR_ERR_INPUT,
            "pipeline: parallel.virtual_stages = %d needs parallel.pp >= 2 (with one stage "
            "there is no bubble to shrink)", v);
  TSR_CHECK(!(broken & 1u << TSR_SCHED_MICRO_BATCHES), TSR_ERR_INPUT,
            "pipeline: parallel.schedule = '%s' needs parallel.micro_batches "
            "divisible by parallel.pp, but micro_batches = %d, pp = %d: use a multiple of "
            "%d (set through train.global_batch)", d->word, m, pp, pp);

  int C = pp * v, rc = 0, n_events = 0, split = d->split_backward;
  size_t n_pairs = (size_t)m * (size_t)C; /* (micro-batch, chunk) pairs */
  long *end[3] = {tsr_calloc(n_pairs, sizeof(long)), tsr_calloc(n_pairs, sizeof(long)),
                  tsr_calloc(n_pairs, sizeof(long))};
  event *ev = tsr_calloc((size_t)7 * (size_t)(m * v), sizeof *ev); /* <= 7 per owned pair */
  tsr_pp_schedule *s = tsr_calloc(1, sizeof *s);
  if (!end[0] || !end[1] || !end[2] || !ev || !s) {
    rc = TSR_ERR;
    goto done;
  }
  if ((rc = ideal_clock(d, pp, m, v, end)) != 0) goto done;

  /* This stage's computations at their start times, and each transfer that touches this
   * stage at its producer's finishing time.  Consecutive chunks on the same stage (the
   * V's bend) exchange nothing: the stage's own order already puts producer before consumer. */
  const long back = split ? CLOCK_HALF : CLOCK_BACKWARD;
  for (int mb = 0; mb < m; mb++) {
    for (int c = 0; c < C; c++) {
      if (tsr_pp_chunk_owner(kind, pp, v, c) != stage) continue;
      int i = mb * C + c;
      long id_act = (long)i, id_grad = (long)m * C + i; /* transfers leaving (mb, c) */
      ev[n_events++] = make_event(end[PASS_F][i] - CLOCK_FORWARD, 1, 0, TSR_PP_FORWARD, mb, c,
                                  -1);
      ev[n_events++] = make_event(end[PASS_B][i] - back, 1, 0,
                                  split ? TSR_PP_BACKWARD_B : TSR_PP_BACKWARD, mb, c, -1);
      if (split)
        ev[n_events++] = make_event(end[PASS_W][i] - CLOCK_HALF, 1, 0, TSR_PP_BACKWARD_W, mb,
                                    c, -1);
      int prev = c > 0 ? tsr_pp_chunk_owner(kind, pp, v, c - 1) : stage;
      int next = c < C - 1 ? tsr_pp_chunk_owner(kind, pp, v, c + 1) : stage;
      if (prev != stage) {
        ev[n_events++] = make_event(end[PASS_F][i - 1], 0, id_act - 1, TSR_PP_RECV_ACT, mb, c,
                                    prev);
        ev[n_events++] = make_event(end[PASS_B][i], 0, id_grad, TSR_PP_SEND_GRAD, mb, c, prev);
      }
      if (next != stage) {
        ev[n_events++] = make_event(end[PASS_F][i], 0, id_act, TSR_PP_SEND_ACT, mb, c, next);
        ev[n_events++] = make_event(end[PASS_B][i + 1], 0, id_grad + 1, TSR_PP_RECV_GRAD, mb,
                                    c, next);
      }
    }
  }
  qsort(ev, (size_t)n_events, sizeof *ev, event_cmp);
  s->a = tsr_calloc((size_t)n_events, sizeof *s->a);
  if (!s->a) {
    rc = TSR_ERR;
    goto done;
  }
  for (int k = 0; k < n_events; k++) s->a[k] = ev[k].action;
  s->n = n_events;
  s->stage = stage;
  s->pp = pp;
  s->m = m;
  s->v = v;
  s->kind = kind;
  *out = s;
  s = NULL;
done:
  tsr_free(&end[0]);
  tsr_free(&end[1]);
  tsr_free(&end[2]);
  tsr_free(&ev);
  tsr_pp_schedule_destroy(&s);
  return rc;
}

void tsr_pp_schedule_destroy(tsr_pp_schedule **s) {
  if (!s || !*s) return;
  tsr_free(&(*s)->a);
  tsr_free(s);
}

/* Each schedule's file derives its own formula (the descriptor's bubble). */
double tsr_pp_ideal_bubble(tsr_schedule_choice kind, int pp, int m, int v) {
  const tsr_sched_desc *d = tsr_sched(kind);
  if (!d || pp < 1 || m < 1 || v < 1) return -1.0;
  return d->bubble(pp, m, d->chunks == 0 ? v : d->chunks);
}

int tsr_pp_peak_in_flight(const tsr_pp_schedule *s) {
  int live = 0, peak = 0;
  for (int k = 0; k < s->n; k++) {
    if (s->a[k].op == TSR_PP_FORWARD && ++live > peak) peak = live;
    if (s->a[k].op == TSR_PP_BACKWARD || s->a[k].op == TSR_PP_BACKWARD_W) live--;
  }
  return peak;
}
