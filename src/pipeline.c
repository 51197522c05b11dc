/* pipeline.c — schedule generator for pipeline parallelism: GPipe, 1F1B (PipeDream-flush)
 * and interleaved 1F1B (Megatron's virtual pipeline).  Pure C: the executor owns MPI.
 *
 * A schedule is built in two steps.
 *
 * 1. The compute order of every stage: the sequence of FORWARD / BACKWARD (mb, chunk).
 *    This is where the three kinds differ, and it is exactly Megatron's order (below).
 *
 * 2. The transfers, placed by replaying all stages' compute orders on an ideal clock
 *    (forward 1, backward 2 time units, free transfers, each computation starting as
 *    soon as its stage is free and its input exists).  A transfer is stamped with the
 *    time its producer finishes; every computation with its start time.  Sorting all
 *    events of the step by (time, transfers before computations, a global id) gives one
 *    global sequence, and each stage's list is that sequence restricted to the stage.
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

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* for messages, by config.h's tsr_schedule_choice */
static const char *kind_names[] = {"gpipe", "1f1b", "interleaved"};

/* Times of the ideal clock used to place transfers (backward ~ 2x forward: it computes
 * gradients w.r.t. both inputs and weights). */
enum { CLOCK_FORWARD = 1, CLOCK_BACKWARD = 2 };

static int valid_kind(tsr_schedule_choice kind) { return kind >= 0 && kind <= TSR_SCHEDULE_INTERLEAVED; }

const char *tsr_pp_op_name(tsr_pp_op op) {
  static const char *names[] = {"RECV_ACT", "FORWARD", "SEND_ACT",
                                "RECV_GRAD", "BACKWARD", "SEND_GRAD"};
  return (unsigned)op < 6 ? names[op] : "?";
}

int tsr_pp_chunk_stage(int pp, int chunk) { return chunk % pp; }

int tsr_pp_chunk_layers(int n_layer, int pp, int v, int chunk, int *first, int *count) {
  TSR_CHECK(pp >= 1 && v >= 1, TSR_ERR_INPUT, "pipeline: parallel.pp = %d and "
            "parallel.virtual_stages = %d must be >= 1", pp, v);
  TSR_CHECK(n_layer % (pp * v) == 0, TSR_ERR_INPUT,
            "pipeline: model.n_layer = %d is not divisible by parallel.pp * "
            "parallel.virtual_stages = %d * %d: choose values that split the layers evenly "
            "(uneven splits are not supported yet)", n_layer, pp, v);
  TSR_CHECK(chunk >= 0 && chunk < pp * v, TSR_ERR, "pipeline: chunk %d outside 0..%d", chunk,
            pp * v - 1);
  *count = n_layer / (pp * v);
  *first = chunk * *count;
  return 0;
}

/* One computation of a stage's compute order. */
typedef struct {
  int backward, micro_batch, chunk;
} work;

/* The i-th forward (backward) of stage s under Megatron's interleaved order: micro-batches
 * go through the stage's chunks in groups of pp, all v chunks of a group before the next
 * group; backward visits the chunks in reverse.  With v = 1 this is simply micro-batch i,
 * which makes 1F1B the v = 1 case of the same loop. */
static work nth_work(int pp, int s, int v, int i, int backward) {
  int group = pp * v, local = (i % group) / pp;
  if (backward) local = v - 1 - local;
  work w = {backward, (i / group) * pp + i % pp, local * pp + s};
  return w;
}

/* Compute order of stage s: 2 m v entries. */
static void compute_order(int kind, int pp, int s, int m, int v, work *w) {
  int n = m * v, k = 0;
  if (kind == TSR_SCHEDULE_GPIPE) {
    /* All forwards, then all backwards in the same (ascending) micro-batch order: the
     * last stage can start backward of mb 0 at once, and gradients flow down in the
     * order activations flowed up.  Either order gives the same bubble. */
    for (int mb = 0; mb < m; mb++) w[k++] = (work){0, mb, s};
    for (int mb = 0; mb < m; mb++) w[k++] = (work){1, mb, s};
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

/* Replays every stage's compute order on the ideal clock.  end[b][mb * C + c] receives
 * the finishing time of forward (b = 0) / backward (b = 1) of (mb, c). */
static int ideal_clock(int kind, int pp, int m, int v, long *end[2]) {
  int C = pp * v, n = 2 * m * v, rc = 0;
  work *order = tsr_calloc((size_t)pp * (size_t)n, sizeof *order);
  int *pos = tsr_calloc((size_t)pp, sizeof *pos);
  long *clock = tsr_calloc((size_t)pp, sizeof *clock);
  if (!order || !pos || !clock) {
    rc = TSR_ERR;
    goto done;
  }
  for (int s = 0; s < pp; s++) compute_order(kind, pp, s, m, v, order + (size_t)s * (size_t)n);
  for (int i = 0; i < m * C; i++) end[0][i] = end[1][i] = -1;
  for (int left = pp * n, progress = 1; left > 0 && progress;) {
    progress = 0;
    for (int s = 0; s < pp; s++) {
      for (; pos[s] < n; pos[s]++, left--, progress = 1) {
        work w = order[(size_t)(s * n + pos[s])];
        int i = w.micro_batch * C + w.chunk;
        long ready; /* when the input of this computation exists */
        if (!w.backward)
          ready = w.chunk == 0 ? 0 : end[0][i - 1];
        else
          ready = w.chunk == C - 1 ? end[0][i] : end[1][i + 1];
        if (ready < 0) break;
        if (ready > clock[s]) clock[s] = ready;
        clock[s] += w.backward ? CLOCK_BACKWARD : CLOCK_FORWARD;
        end[w.backward][i] = clock[s];
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
            "pipeline: schedule kind %d is not gpipe, 1f1b or interleaved", (int)kind);
  TSR_CHECK(pp >= 1 && stage >= 0 && stage < pp, TSR_ERR_INPUT,
            "pipeline: stage %d is not in 0..pp-1 with parallel.pp = %d", stage, pp);
  TSR_CHECK(m >= 1, TSR_ERR_INPUT, "pipeline: parallel.micro_batches = %d must be >= 1", m);
  TSR_CHECK(v >= 1, TSR_ERR_INPUT, "pipeline: parallel.virtual_stages = %d must be >= 1", v);
  TSR_CHECK(v == 1 || kind == TSR_SCHEDULE_INTERLEAVED, TSR_ERR_INPUT,
            "pipeline: parallel.virtual_stages = %d needs parallel.schedule = 'interleaved', "
            "not '%s'", v, kind_names[kind]);
  TSR_CHECK(v == 1 || pp >= 2, TSR_ERR_INPUT,
            "pipeline: parallel.virtual_stages = %d needs parallel.pp >= 2 (with one stage "
            "there is no bubble to shrink)", v);
  TSR_CHECK(v == 1 || m % pp == 0, TSR_ERR_INPUT,
            "pipeline: parallel.schedule = 'interleaved' needs parallel.micro_batches "
            "divisible by parallel.pp, but micro_batches = %d, pp = %d: use a multiple of %d "
            "(set through train.global_batch)", m, pp, pp);

  int C = pp * v, rc = 0, n_events = 0;
  size_t n_pairs = (size_t)m * (size_t)C; /* (micro-batch, chunk) pairs */
  long *end[2] = {tsr_calloc(n_pairs, sizeof(long)), tsr_calloc(n_pairs, sizeof(long))};
  event *ev = tsr_calloc((size_t)6 * (size_t)(m * v), sizeof *ev); /* <= 6 per owned pair */
  tsr_pp_schedule *s = tsr_calloc(1, sizeof *s);
  if (!end[0] || !end[1] || !ev || !s) {
    rc = TSR_ERR;
    goto done;
  }
  if ((rc = ideal_clock(kind, pp, m, v, end)) != 0) goto done;

  /* This stage's computations at their start times, and each transfer that touches this
   * stage at its producer's finishing time.  Consecutive chunks are on different stages
   * whenever pp >= 2, and pp = 1 has a single chunk, so no transfer is stage-local. */
  for (int mb = 0; mb < m; mb++) {
    for (int c = stage; c < C; c += pp) {
      int i = mb * C + c;
      long id_act = (long)i, id_grad = (long)m * C + i; /* transfers leaving (mb, c) */
      ev[n_events++] = make_event(end[0][i] - CLOCK_FORWARD, 1, 0, TSR_PP_FORWARD, mb, c, -1);
      ev[n_events++] = make_event(end[1][i] - CLOCK_BACKWARD, 1, 0, TSR_PP_BACKWARD, mb, c, -1);
      if (c > 0) {
        int prev = tsr_pp_chunk_stage(pp, c - 1);
        ev[n_events++] = make_event(end[0][i - 1], 0, id_act - 1, TSR_PP_RECV_ACT, mb, c, prev);
        ev[n_events++] = make_event(end[1][i], 0, id_grad, TSR_PP_SEND_GRAD, mb, c, prev);
      }
      if (c < C - 1) {
        int next = tsr_pp_chunk_stage(pp, c + 1);
        ev[n_events++] = make_event(end[0][i], 0, id_act, TSR_PP_SEND_ACT, mb, c, next);
        ev[n_events++] = make_event(end[1][i + 1], 0, id_grad + 1, TSR_PP_RECV_GRAD, mb, c, next);
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
  *out = s;
  s = NULL;
done:
  tsr_free(&end[0]);
  tsr_free(&end[1]);
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
 * tests/test_schedule.c replays the generated lists (forward 1 and backward 1 or 2 units)
 * and finds every stage's idle fraction equal to these, exactly, for all three kinds. */
double tsr_pp_ideal_bubble(tsr_schedule_choice kind, int pp, int m, int v) {
  if (!valid_kind(kind) || pp < 1 || m < 1 || v < 1) return -1.0;
  if (kind != TSR_SCHEDULE_INTERLEAVED) v = 1;
  return (double)(pp - 1) / (double)(v * m + pp - 1);
}

int tsr_pp_peak_in_flight(const tsr_pp_schedule *s) {
  int live = 0, peak = 0;
  for (int k = 0; k < s->n; k++) {
    if (s->a[k].op == TSR_PP_FORWARD && ++live > peak) peak = live;
    if (s->a[k].op == TSR_PP_BACKWARD) live--;
  }
  return peak;
}
