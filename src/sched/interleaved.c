/* interleaved.c — Megatron's virtual pipeline: the loop order with v chunks per stage on
 * the round placement, micro-batches through a stage's chunks in groups of pp.  The loop
 * order here is also the default schedule's (v = 1), and the bubble formula below also
 * holds for all forwards first. */
#include "sched_internal.h"

/* The i-th forward (backward) of stage s: micro-batches go through the stage's chunks in
 * groups of pp, all v chunks of a group before the next group; backward visits the
 * chunks in reverse.  With v = 1 this is simply micro-batch i. */
static tsr_sched_work nth_work(int pp, int s, int v, int i, int backward) {
  const int group = pp * v;
  int local = (i % group) / pp;
  if (backward) local = v - 1 - local;
  return (tsr_sched_work){backward ? TSR_PASS_B : TSR_PASS_F, (i / group) * pp + i % pp,
                          local * pp + s};
}

/* Warm-up forwards, then steady one-forward-one-backward, then cool-down backwards.
 * v = 1: stage s runs pp - s - 1 forwards ahead, so with the steady forward it holds at
 * most pp - s activations.  v > 1 (Megatron): (pp - s - 1) 2 + (v - 1) pp ahead: (v - 1) pp
 * forwards of the first pp micro-batches through this stage's first v - 1 chunks while
 * micro-batch 0 travels to its last chunk, plus 2 per later stage for the round trip to
 * the final stage and back.  With m == pp Megatron runs all forwards first, and so do we. */
void tsr_sched_loop_order(int pp, int s, int m, int v, tsr_sched_work *w) {
  const int n = m * v;
  int k = 0, warm;
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

/* The warm-up's forwards plus the steady one: min(m, pp - stage) for one chunk; with
 * several, min(v m, 2 (pp - stage - 1) + (v - 1) pp + 1), all of v m when m = pp. */
int tsr_sched_loop_in_flight(int pp, int stage, int m, int v) {
  if (v == 1) return m < pp - stage ? m : pp - stage;
  if (m == pp) return m * v;
  const int warm = (pp - stage - 1) * 2 + (v - 1) * pp + 1;
  return m * v < warm ? m * v : warm;
}

/* With forward and backward of one stage's share of the model taking f and b, and free
 * transfers, every stage computes for m (f + b).  All forwards first and the one-chunk
 * loop order both finish in
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
 * tests/unit/sched/test_schedule.c replays the generated lists (forward 1 and backward 1
 * or 2 units) and finds every stage's idle fraction equal to these, exactly. */
double tsr_sched_loop_bubble(int pp, int m, int v) {
  return (double)(pp - 1) / (double)(v * m + pp - 1);
}

const tsr_sched_desc tsr_sched_interleaved = {
    .word = "interleaved",
    .chunks = 0,
    .placement = TSR_PLACE_ROUND,
    .min_pp = 1,
    .chunked_divides = 1,
    .search_chunks = 2,
    .order = tsr_sched_loop_order,
    .bubble = tsr_sched_loop_bubble,
    .bubble_formula = "(p-1)/(v m + p-1)",
    .in_flight = tsr_sched_loop_in_flight,
};
