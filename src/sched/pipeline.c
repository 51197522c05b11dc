/* pipeline.c — schedule generator for pipeline parallelism: GPipe, 1F1B (PipeDream-flush),
 * interleaved 1F1B (Megatron's virtual pipeline) and the zero-bubble schedules ZB-H1 and
 * ZB-V (Qi et al., ICLR 2024), which split a backward into B and W.  Pure C: the
 * executor owns MPI.
 *
 * A schedule is built in two steps.
 *
 * 1. The compute order of every stage: the sequence of FORWARD / BACKWARD (mb, chunk),
 *    or FORWARD / B / W for the split kinds.  This is where the kinds differ: Megatron's
 *    order for the first three (below), the handcrafted zero-bubble orders for the others.
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
 * 1F1B with w = pp - s - 1, stage s sends the activation of micro-batch w before it
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

/* for messages, by config.h's tsr_schedule_choice */
static const char *kind_names[] = {"gpipe", "1f1b", "interleaved", "zb_h1", "zb_v"};

/* Times of the ideal clock used to place transfers: a fused backward ~ 2x forward (it
 * computes gradients w.r.t. both inputs and weights), each half of a split one ~ 1x. */
enum { CLOCK_FORWARD = 1, CLOCK_BACKWARD = 2, CLOCK_HALF = 1 };

static int valid_kind(tsr_schedule_choice kind) {
  return kind >= 0 && kind <= TSR_SCHEDULE_ZB_V;
}
int tsr_pp_split_backward(tsr_schedule_choice kind) {
  return kind == TSR_SCHEDULE_ZB_H1 || kind == TSR_SCHEDULE_ZB_V;
}

const char *tsr_pp_op_name(tsr_pp_op op) {
  static const char *names[] = {"RECV_ACT",  "FORWARD",   "SEND_ACT",  "RECV_GRAD",
                                "BACKWARD",  "SEND_GRAD", "BACKWARD_B", "BACKWARD_W"};
  return (unsigned)op < 8 ? names[op] : "?";
}

/* zb_v: chunks go up the stages and come back down (a V); for v > 2 the same zigzag. */
int tsr_pp_chunk_owner(tsr_schedule_choice kind, int pp, int v, int chunk) {
  if (pp < 1 || v < 1 || chunk < 0 || chunk >= pp * v) return -1;
  if (kind == TSR_SCHEDULE_ZB_V && (chunk / pp) % 2 == 1) return pp - 1 - chunk % pp;
  return chunk % pp;
}

/* The inverse: local chunk j of stage s is chunk j pp + s, or on a V's way down
 * (j odd, zb_v) chunk j pp + pp - 1 - s. */
int tsr_pp_stage_chunk(tsr_schedule_choice kind, int pp, int v, int stage, int local) {
  if (pp < 1 || v < 1 || stage < 0 || stage >= pp || local < 0 || local >= v) return -1;
  if (kind == TSR_SCHEDULE_ZB_V && local % 2 == 1) return local * pp + pp - 1 - stage;
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

/* One computation of a stage's compute order: pass 0 forward, 1 backward (the whole
 * backward, or its B half for the split kinds), 2 the W half. */
enum { PASS_F, PASS_B, PASS_W };
typedef struct {
  int pass, micro_batch, chunk;
} work;

/* The i-th forward (backward) of stage s under Megatron's interleaved order: micro-batches
 * go through the stage's chunks in groups of pp, all v chunks of a group before the next
 * group; backward visits the chunks in reverse.  With v = 1 this is simply micro-batch i,
 * which makes 1F1B the v = 1 case of the same loop. */
static work nth_work(int pp, int s, int v, int i, int backward) {
  int group = pp * v, local = (i % group) / pp;
  if (backward) local = v - 1 - local;
  work w = {backward ? PASS_B : PASS_F, (i / group) * pp + i % pp, local * pp + s};
  return w;
}

/* A split-kind stage's order under construction: n[c][pass] counts the passes issued
 * for its local chunk c; micro-batches >= m are counted but not emitted (zb_v pads). */
typedef struct {
  work *w;
  int k, m, chunk[2], n[2][3];
} builder;

static void put(builder *b, int pass, int local) {
  int mb = b->n[local][pass]++;
  if (mb < b->m) b->w[b->k++] = (work){pass, mb, b->chunk[local]};
}

/* ZB-H1 on stage s (chunk s), p = pp.  The warm-up is 1F1B's: p - s forwards, p - s - 1
 * of them ahead of the first B.  Then s rounds of B F without W: the W's are held back
 * until the stage has p micro-batches in flight (F done, W not), the most 1F1B holds (on
 * stage 0).  From there B W F keeps it at p.  In the cool-down each B is followed by one
 * held-back W, and the remaining W's close the step. */
static int order_zb_h1(int pp, int s, int m, work *w) {
  builder b = {w, 0, m, {s, s}, {{0}}};
  int *n = b.n[0];
  for (int i = 0; i < pp - s && n[PASS_F] < m; i++) put(&b, PASS_F, 0);
  for (int i = 0; i < s && n[PASS_F] < m; i++) {
    put(&b, PASS_B, 0);
    put(&b, PASS_F, 0);
  }
  while (n[PASS_F] < m) {
    put(&b, PASS_B, 0);
    put(&b, PASS_W, 0);
    put(&b, PASS_F, 0);
  }
  while (n[PASS_B] < m) {
    put(&b, PASS_B, 0);
    put(&b, PASS_W, 0);
  }
  while (n[PASS_W] < m) put(&b, PASS_W, 0);
  return b.k;
}

/* ZB-V on stage s: local chunk 0 is chunk s (the way up), local chunk 1 is chunk
 * 2 p - 1 - s (the way down), p = pp.  The order is built for n = max(m, 2 p - 1)
 * micro-batches, the fewest for which the pattern below is complete, and the passes of
 * micro-batches >= m are dropped (their slots become idle time).
 *   warm-up:   2 (p - s) - 1 forwards of chunk 0; s pairs (F of chunk 1, F of chunk 0);
 *              p - s triples F B W of chunk 1 (the way down turns round quickly);
 *   steady:    F B W of chunk 0, then F B W of chunk 1, while forwards are left;
 *   cool-down: s pairs (B of chunk 0, B of chunk 1), holding their W's back; p - s
 *              pairs B W of chunk 0; then the held-back W's, chunk 1's first.
 * A stage holds at most 2 p chunk activation sets, i.e. p micro-batches' worth: 1F1B's
 * most. */
static int order_zb_v(int pp, int s, int m, work *w) {
  builder b = {w, 0, m, {s, 2 * pp - 1 - s}, {{0}}};
  int n = m > 2 * pp - 1 ? m : 2 * pp - 1, *up = b.n[0], *down = b.n[1];
  for (int i = 0; i < 2 * (pp - s) - 1; i++) put(&b, PASS_F, 0);
  for (int i = 0; i < s; i++) {
    put(&b, PASS_F, 1);
    put(&b, PASS_F, 0);
  }
  for (int i = 0; i < pp - s; i++) {
    put(&b, PASS_F, 1);
    put(&b, PASS_B, 1);
    put(&b, PASS_W, 1);
  }
  while (down[PASS_F] < up[PASS_F] || up[PASS_F] < n) {
    if (up[PASS_F] < n) put(&b, PASS_F, 0);
    put(&b, PASS_B, 0);
    put(&b, PASS_W, 0);
    put(&b, PASS_F, 1);
    put(&b, PASS_B, 1);
    put(&b, PASS_W, 1);
  }
  for (int i = 0; i < s; i++) {
    put(&b, PASS_B, 0);
    put(&b, PASS_B, 1);
  }
  for (int i = 0; i < pp - s; i++) {
    put(&b, PASS_B, 0);
    put(&b, PASS_W, 0);
  }
  while (down[PASS_W] < n) put(&b, PASS_W, 1);
  while (up[PASS_W] < n) put(&b, PASS_W, 0);
  return b.k;
}

/* Compute order of stage s: 2 m v entries (3 m v for the split kinds). */
static void compute_order(int kind, int pp, int s, int m, int v, work *w) {
  int n = m * v, k = 0;
  if (kind == TSR_SCHEDULE_ZB_H1) {
    order_zb_h1(pp, s, m, w);
    return;
  }
  if (kind == TSR_SCHEDULE_ZB_V) {
    order_zb_v(pp, s, m, w);
    return;
  }
  if (kind == TSR_SCHEDULE_GPIPE) {
    /* All forwards, then all backwards in the same (ascending) micro-batch order: the
     * last stage can start backward of mb 0 at once, and gradients flow down in the
     * order activations flowed up.  Either order gives the same bubble. */
    for (int mb = 0; mb < m; mb++) w[k++] = (work){PASS_F, mb, s};
    for (int mb = 0; mb < m; mb++) w[k++] = (work){PASS_B, mb, s};
    return;
  }
  /* Warm-up forwards, then steady one-forward-one-backward, then cool-down backwards.
   * 1F1B: stage s runs pp - s - 1 forwards ahead, so with the steady forward it holds at
   * most pp - s activations.  Interleaved (Megatron): (pp - s - 1) 2 + (v - 1) pp ahead:
   * (v - 1) pp forwards of the first pp micro-batches through this stage's first v - 1
   * chunks while micro-batch 0 travels to its last chunk, plus 2 per later stage for the
   * round trip to the final stage and back.  With m == pp Megatron runs all forwards
   * first, and so do we. */
  int warm;
  if (v == 1)
    warm = pp - s - 1;
  else if (m == pp)
    warm = n;
  else
    warm = (pp - s - 1) * 2 + (v - 1) * pp;
  if (warm > n) warm = n;
  for (int i = 0; i < warm; i++) w[k++] = nth_work(pp, s, v, i, 0);
  for (int i = 0; i < n - warm; i++) {
    w[k++] = nth_work(pp, s, v, warm + i, 0);
    w[k++] = nth_work(pp, s, v, i, 1);
  }
  for (int i = n - warm; i < n; i++) w[k++] = nth_work(pp, s, v, i, 1);
}

/* Replays every stage's compute order on the ideal clock.  end[p][mb * C + c] receives
 * the finishing time of pass p (PASS_F, PASS_B, PASS_W) of (mb, c). */
static int ideal_clock(int kind, int pp, int m, int v, long *end[3]) {
  int C = pp * v, split = tsr_pp_split_backward(kind), n = (split ? 3 : 2) * m * v, rc = 0;
  work *order = tsr_calloc((size_t)pp * (size_t)n, sizeof *order);
  int *pos = tsr_calloc((size_t)pp, sizeof *pos);
  long *clock = tsr_calloc((size_t)pp, sizeof *clock);
  if (!order || !pos || !clock) {
    rc = TSR_ERR;
    goto done;
  }
  for (int s = 0; s < pp; s++) compute_order(kind, pp, s, m, v, order + (size_t)s * (size_t)n);
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
                kind_names[kind], pp, m, v);
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
  TSR_CHECK(valid_kind(kind), TSR_ERR_INPUT,
            "pipeline: schedule kind %d is not gpipe, 1f1b, interleaved, zb_h1 or zb_v",
            (int)kind);
  TSR_CHECK(pp >= 1 && stage >= 0 && stage < pp, TSR_ERR_INPUT,
            "pipeline: stage %d is not in 0..pp-1 with parallel.pp = %d", stage, pp);
  TSR_CHECK(m >= 1, TSR_ERR_INPUT, "pipeline: parallel.micro_batches = %d must be >= 1", m);
  TSR_CHECK(v >= 1, TSR_ERR_INPUT, "pipeline: parallel.virtual_stages = %d must be >= 1", v);
  if (kind == TSR_SCHEDULE_ZB_V) {
    TSR_CHECK(v == 2, TSR_ERR_INPUT,
              "pipeline: parallel.schedule = 'zb_v' places exactly 2 chunks on each stage: "
              "set parallel.virtual_stages = 2, not %d", v);
    TSR_CHECK(pp >= 2, TSR_ERR_INPUT,
              "pipeline: parallel.schedule = 'zb_v' needs parallel.pp >= 2 (with one stage "
              "there is no bubble to shrink)");
  } else {
    TSR_CHECK(v == 1 || kind == TSR_SCHEDULE_INTERLEAVED, TSR_ERR_INPUT,
              "pipeline: parallel.virtual_stages = %d needs parallel.schedule = "
              "'interleaved' or 'zb_v' (v = 2), not '%s'", v, kind_names[kind]);
    TSR_CHECK(v == 1 || pp >= 2, TSR_ERR_INPUT,
              "pipeline: parallel.virtual_stages = %d needs parallel.pp >= 2 (with one stage "
              "there is no bubble to shrink)", v);
    TSR_CHECK(v == 1 || m % pp == 0, TSR_ERR_INPUT,
              "pipeline: parallel.schedule = 'interleaved' needs parallel.micro_batches "
              "divisible by parallel.pp, but micro_batches = %d, pp = %d: use a multiple of "
              "%d (set through train.global_batch)", m, pp, pp);
  }

  int C = pp * v, rc = 0, n_events = 0, split = tsr_pp_split_backward(kind);
  size_t n_pairs = (size_t)m * (size_t)C; /* (micro-batch, chunk) pairs */
  long *end[3] = {tsr_calloc(n_pairs, sizeof(long)), tsr_calloc(n_pairs, sizeof(long)),
                  tsr_calloc(n_pairs, sizeof(long))};
  event *ev = tsr_calloc((size_t)7 * (size_t)(m * v), sizeof *ev); /* <= 7 per owned pair */
  tsr_pp_schedule *s = tsr_calloc(1, sizeof *s);
  if (!end[0] || !end[1] || !end[2] || !ev || !s) {
    rc = TSR_ERR;
    goto done;
  }
  if ((rc = ideal_clock(kind, pp, m, v, end)) != 0) goto done;

  /* This stage's computations at their start times, and each transfer that touches this
   * stage at its producer's finishing time.  Consecutive chunks on the same stage (zb_v's
   * bend) exchange nothing: the stage's own order already puts producer before consumer. */
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

/* With forward and backward of one stage's share of the model taking f and b, and free
 * transfers, every stage computes for m (f + b).  GPipe and 1F1B both finish in
 * (m + p - 1)(f + b): micro-batch 0 needs (p - 1) f to reach the last stage, and the last
 * backward needs (p - 1) b to come back to stage 0, and no stage idles otherwise.  So
 * each stage idles (p - 1)(f + b) and
 *     bubble = idle / step = (p - 1) / (m + p - 1).
 * Interleaving gives a chunk f / v and b / v; each stage runs v m chunk passes and the
 * fill and drain cross p - 1 chunks: idle (p - 1)(f + b) / v, so
 *     bubble = (p - 1) / (v m + p - 1).
 * Megatron's paper quotes (p - 1) / m and (p - 1) / (v m): the same idle time divided by
 * the ideal compute time instead of the step time.  For a ratio r the fraction of the
 * step is r / (1 + r), which is what an executor can measure, so that is the one here.
 * tests/unit/sched/test_schedule.c replays the generated lists (forward 1 and backward 1 or 2 units)
 * and finds every stage's idle fraction equal to these, exactly, for all three kinds.
 *
 * The split kinds, with F = B = W = 1 unit per chunk and p = pp.  Every stage computes
 * 3 m v units, so with T the step time each stage idles I = T - 3 m v and the bubble is
 * I / (3 m v + I), the same on every stage.
 *
 * ZB-H1 (v = 1), m >= p.  F of micro-batch j runs on stage s at s + j during the
 * warm-up, and B of micro-batch 0 reaches stage s at 2p - 1 - s (p forwards up, then one
 * unit per stage down): stage s idles s before its first forward and p - 1 - s after its
 * p - s warm-up forwards, p - 1 in all.  After that it never waits: in the s rounds of
 * B F, B_j starts at 2p - 1 - s + 2j, exactly when stage s + 1's B_j (its own round j)
 * ends, and the F it runs is the one stage s - 1 just finished; in the steady B W F,
 * B_j starts at 2p - 1 + 3j - 2s, one unit after stage s + 1's B_j ends, and F_(p+k) at
 * 2p + 1 + s + 3k, when stage s - 1's ends.  In the cool-down stage s's B's come every
 * 2 units, each exactly when stage s + 1's (which entered its cool-down one unit later)
 * ends, and a held-back W fills the unit between them: stage s has p W's pending at its
 * last F and only p - s B's left, so there is always one.  So the stage ends at
 * s + (p - 1 - s) + 3m and
 *     T = 3m + p - 1,  I = p - 1:  a third of 1F1B's 3 (p - 1) units (F + B + W each).
 * m < p.  Now every stage alternates B with F or W from its first B on (the W's of its
 * own earlier B's are there), so B_j reaches stage s at 2p - 1 - s + 2j: stage 0 ends
 * with B_(m-1) at 2p + 2m - 3 and its W: T = 2m + 2p - 1, I = 2p - 1 - m.  Both cases:
 *     I = p - 1 + max(0, p - m),   bubble = I / (3m + I),
 * less than 1F1B's 3 (p - 1) / (3m + 3 (p - 1)) for every m when p >= 2.
 *
 * ZB-V (v = 2, units of one chunk, half a stage's share).  m >= 2p - 1: the order of
 * order_zb_v is the paper's handcrafted V, in which each pass finds its input ready when
 * the stage reaches it (the V's building block of F F B B W W over 2p chunks repeats
 * every 6 units on each stage without collision), so stage s only idles s units before
 * chunk s's first forward arrives and ends 6m units later; the last stage ends last:
 *     T = 6m + p - 1,  I = p - 1.
 * m < 2p - 1: the order is the one for 2p - 1 micro-batches with the missing ones'
 * passes dropped.  The step is then set by stage p - 1, which holds both chunks of the
 * bend: once its forwards run out its loop is B W of chunk p - 1, B W of chunk p, so it
 * starts a B of chunk p - 1 every 4 units, the first at 3p + 1 (2p forwards to the last
 * chunk, p - 1 B's down to chunk p, chunk p's own B and W).  B_(m-1) of chunk p - 1
 * thus ends at 3p + 4m - 2; the B's of chunks p - 2 .. 0 take p - 1 more units, and
 * stage 0's last W one more: T = 4m + 4p - 2.  Both cases:
 *     I = max(p - 1, 4p - 2 - 2m),   bubble = I / (6m + I).
 * The small-m branch is read off the order rather than derived step by step.
 * tests/unit/sched/test_schedule.c replays the lists and checks both split-kind formulas exactly:
 * pp 1..4 (zb_v 2..4) with m 1..8, and pp 2, 4, 8 with m from 4 to 32. */
double tsr_pp_ideal_bubble(tsr_schedule_choice kind, int pp, int m, int v) {
  if (!valid_kind(kind) || pp < 1 || m < 1 || v < 1) return -1.0;
  if (kind == TSR_SCHEDULE_ZB_H1) {
    double idle = pp - 1 + (m < pp ? pp - m : 0);
    return idle / (3.0 * m + idle);
  }
  if (kind == TSR_SCHEDULE_ZB_V) {
    double idle = pp - 1 > 4 * pp - 2 - 2 * m ? pp - 1 : 4 * pp - 2 - 2 * m;
    return idle / (6.0 * m + idle);
  }
  if (kind != TSR_SCHEDULE_INTERLEAVED) v = 1;
  return (double)(pp - 1) / (double)(v * m + pp - 1);
}

int tsr_pp_peak_in_flight(const tsr_pp_schedule *s) {
  int live = 0, peak = 0;
  for (int k = 0; k < s->n; k++) {
    if (s->a[k].op == TSR_PP_FORWARD && ++live > peak) peak = live;
    if (s->a[k].op == TSR_PP_BACKWARD || s->a[k].op == TSR_PP_BACKWARD_W) live--;
  }
  return peak;
}
