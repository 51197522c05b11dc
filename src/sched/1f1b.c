/* 1f1b.c — 1F1B (PipeDream-flush): stage s runs pp - s - 1 forwards ahead, then one
 * forward and one backward in turn, so it holds at most pp - s activation sets.  It is
 * the one-chunk case of the loop order (sched_internal.h). */
#include "sched_internal.h"

static void order(int pp, int s, int m, int v, tsr_sched_work *w) {
  (void)v;
  tsr_sched_loop_order(pp, s, m, 1, w);
}

static int in_flight(int pp, int stage, int m, int v) {
  (void)v;
  return tsr_sched_loop_in_flight(pp, stage, m, 1);
}

static double bubble(int pp, int m, int v) {
  (void)v;
  return tsr_sched_loop_bubble(pp, m, 1);
}

const tsr_sched_desc tsr_sched_1f1b = {
    .word = "1f1b",
    .chunks = 1,
    .placement = TSR_PLACE_ROUND,
    .min_pp = 1,
    .search_chunks = 1,
    .order = order,
    .bubble = bubble,
    .bubble_formula = "(p-1)/(v m + p-1)",
    .in_flight = in_flight,
};
