/* zb_h1.c — ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the
 * one-chunk loop order with the backward split into B (input gradients) and W (weight
 * gradients), W delayed into the cool-down, where the loop order idles: a third of its
 * bubble for m >= pp, at its activation memory. */
#include "sched_internal.h"

/* Stage s (chunk s), p = pp.  The warm-up is the loop order's: p - s forwards, p - s - 1 of them
 * ahead of the first B.  Then s rounds of B F without W: the W's are held back until the
 * stage has p micro-batches in flight (F done, W not), the most the loop order holds (on stage 0).
 * From there B W F keeps it at p.  In the cool-down each B is followed by one held-back W,
 * and the remaining W's close the step. */
static void order(int pp, int s, int m, int v, tsr_sched_work *w) {
  (void)v;
  tsr_sched_builder b = {w, 0, m, {s, s}, {{0}}};
  int *n = b.n[0];
  for (int i = 0; i < pp - s && n[TSR_PASS_F] < m; i++) tsr_sched_put(&b, TSR_PASS_F, 0);
  for (int i = 0; i < s && n[TSR_PASS_F] < m; i++) {
    tsr_sched_put(&b, TSR_PASS_B, 0);
    tsr_sched_put(&b, TSR_PASS_F, 0);
  }
  while (n[TSR_PASS_F] < m) {
    tsr_sched_put(&b, TSR_PASS_B, 0);
    tsr_sched_put(&b, TSR_PASS_W, 0);
    tsr_sched_put(&b, TSR_PASS_F, 0);
  }
  while (n[TSR_PASS_B] < m) {
    tsr_sched_put(&b, TSR_PASS_B, 0);
    tsr_sched_put(&b, TSR_PASS_W, 0);
  }
  while (n[TSR_PASS_W] < m) tsr_sched_put(&b, TSR_PASS_W, 0);
}

/* W is held back until every stage has min(m, pp) micro-batches in flight */
static int in_flight(int pp, int stage, int m, int v) {
  (void)stage, (void)v;
  return m < pp ? m : pp;
}

/* With F = B = W = 1 unit per chunk and p = pp, every stage computes 3 m units, so with
 * T the step time each stage idles I = T - 3 m and the bubble is I / (3 m + I), the same
 * on every stage.
 * m >= p.  F of micro-batch j runs on stage s at s + j during the warm-up, and B of
 * micro-batch 0 reaches stage s at 2p - 1 - s (p forwards up, then one unit per stage
 * down): stage s idles s before its first forward and p - 1 - s after its p - s warm-up
 * forwards, p - 1 in all.  After that it never waits: in the s rounds of B F, B_j starts
 * at 2p - 1 - s + 2j, exactly when stage s + 1's B_j (its own round j) ends, and the F it
 * runs is the one stage s - 1 just finished; in the steady B W F, B_j starts at
 * 2p - 1 + 3j - 2s, one unit after stage s + 1's B_j ends, and F_(p+k) at 2p + 1 + s + 3k,
 * when stage s - 1's ends.  In the cool-down stage s's B's come every 2 units, each
 * exactly when stage s + 1's (which entered its cool-down one unit later) ends, and a
 * held-back W fills the unit between them: stage s has p W's pending at its last F and
 * only p - s B's left, so there is always one.  So the stage ends at s + (p - 1 - s) + 3m:
 *     T = 3m + p - 1,  I = p - 1:  a third of the loop order's 3 (p - 1) units (F + B + W each).
 * m < p.  Now every stage alternates B with F or W from its first B on (the W's of its
 * own earlier B's are there), so B_j reaches stage s at 2p - 1 - s + 2j: stage 0 ends
 * with B_(m-1) at 2p + 2m - 3 and its W: T = 2m + 2p - 1, I = 2p - 1 - m.  Both cases:
 *     I = p - 1 + max(0, p - m),   bubble = I / (3m + I),
 * less than the loop order's 3 (p - 1) / (3m + 3 (p - 1)) for every m when p >= 2.
 * tests/unit/sched/test_schedule.c replays the lists and checks it exactly. */
static double bubble(int pp, int m, int v) {
  (void)v;
  const double idle = pp - 1 + (m < pp ? pp - m : 0);
  return idle / (3.0 * m + idle);
}

const tsr_sched_desc tsr_sched_zb_h1 = {
    .word = "zb_h1",
    .chunks = 1,
    .placement = TSR_PLACE_ROUND,
    .split_backward = 1,
    .min_pp = 2,
    .search_chunks = 1,
    .order = order,
    .bubble = bubble,
    .bubble_formula = "I/(3m + I), I = p-1 + max(0, p-m)",
    .in_flight = in_flight,
};
