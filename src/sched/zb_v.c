/* zb_v.c — ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the split
 * backward on two chunks per stage placed in a V (chunks s and 2 pp - 1 - s on stage s,
 * so stage 0 holds the embedding and the head); with m >= 2 pp - 1 every stage idles only
 * pp - 1 chunk passes per step, at the one-chunk loop order's activation memory. */
#include "sched_internal.h"

/* Stage s: local chunk 0 is chunk s (the way up), local chunk 1 is chunk 2 p - 1 - s (the
 * way down), p = pp.  The order is built for n = max(m, 2 p - 1) micro-batches, the fewest
 * for which the pattern below is complete, and the passes of micro-batches >= m are
 * dropped (their slots become idle time).
 *   warm-up:   2 (p - s) - 1 forwards of chunk 0; s pairs (F of chunk 1, F of chunk 0);
 *              p - s triples F B W of chunk 1 (the way down turns round quickly);
 *   steady:    F B W of chunk 0, then F B W of chunk 1, while forwards are left;
 *   cool-down: s pairs (B of chunk 0, B of chunk 1), holding their W's back; p - s
 *              pairs B W of chunk 0; then the held-back W's, chunk 1's first.
 * A stage holds at most 2 p chunk activation sets, i.e. p micro-batches' worth: the one-chunk
 * loop order's most. */
static void order(int pp, int s, int m, int v, tsr_sched_work *w) {
  (void)v;
  enum { F = TSR_PASS_F, B = TSR_PASS_B, W = TSR_PASS_W };
  tsr_sched_builder b = {w, 0, m, {s, 2 * pp - 1 - s}, {{0}}};
  const int n = m > 2 * pp - 1 ? m : 2 * pp - 1;
  int *up = b.n[0], *down = b.n[1];
  for (int i = 0; i < 2 * (pp - s) - 1; i++) tsr_sched_put(&b, F, 0);
  for (int i = 0; i < s; i++) {
    tsr_sched_put(&b, F, 1);
    tsr_sched_put(&b, F, 0);
  }
  for (int i = 0; i < pp - s; i++) {
    tsr_sched_put(&b, F, 1);
    tsr_sched_put(&b, B, 1);
    tsr_sched_put(&b, W, 1);
  }
  while (down[F] < up[F] || up[F] < n) {
    if (up[F] < n) tsr_sched_put(&b, F, 0);
    tsr_sched_put(&b, B, 0);
    tsr_sched_put(&b, W, 0);
    tsr_sched_put(&b, F, 1);
    tsr_sched_put(&b, B, 1);
    tsr_sched_put(&b, W, 1);
  }
  for (int i = 0; i < s; i++) {
    tsr_sched_put(&b, B, 0);
    tsr_sched_put(&b, B, 1);
  }
  for (int i = 0; i < pp - s; i++) {
    tsr_sched_put(&b, B, 0);
    tsr_sched_put(&b, W, 0);
  }
  while (down[W] < n) tsr_sched_put(&b, W, 1);
  while (up[W] < n) tsr_sched_put(&b, W, 0);
}

/* in chunks (half a stage's layers): min(2 pp, 2 m, m + stage + 1) */
static int in_flight(int pp, int stage, int m, int v) {
  (void)v;
  const int a = 2 * pp < 2 * m ? 2 * pp : 2 * m;
  return a < m + stage + 1 ? a : m + stage + 1;
}

/* Units of one chunk (half a stage's share), F = B = W = 1, p = pp; every stage computes
 * 6 m units.  m >= 2p - 1: the order above is the paper's handcrafted V, in which each
 * pass finds its input ready when the stage reaches it (the V's building block of
 * F F B B W W over 2p chunks repeats every 6 units on each stage without collision), so
 * stage s only idles s units before chunk s's first forward arrives and ends 6m units
 * later; the last stage ends last:
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
 * tests/unit/sched/test_schedule.c replays the lists and checks it exactly: pp 2..4 with
 * m 1..8, and pp 2, 4, 8 with m from 4 to 32. */
static double bubble(int pp, int m, int v) {
  (void)v;
  const double idle = pp - 1 > 4 * pp - 2 - 2 * m ? pp - 1 : 4 * pp - 2 - 2 * m;
  return idle / (6.0 * m + idle);
}

const tsr_sched_desc tsr_sched_zb_v = {
    .word = "zb_v",
    .chunks = 2,
    .chunks_why = "places two chunks on every stage (a V)",
    .placement = TSR_PLACE_V,
    .split_backward = 1,
    .min_pp = 2,
    .search_chunks = 2,
    .order = order,
    .bubble = bubble,
    .bubble_formula = "I/(6m + I), I = max(p-1, 4p-2-2m)",
    .in_flight = in_flight,
};
