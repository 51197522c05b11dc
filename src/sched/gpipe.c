/* gpipe.c — GPipe: every forward of the step, then every backward. */
#include "sched_internal.h"

/* All forwards, then all backwards in the same (ascending) micro-batch order: the last
 * stage can start the backward of micro-batch 0 at once, and gradients flow down in the
 * order activations flowed up.  Either order gives the loop order's bubble
 * (sched_internal.h). */
static void order(int pp, int s, int m, int v, tsr_sched_work *w) {
  (void)pp, (void)v;
  int k = 0;
  for (int mb = 0; mb < m; mb++) w[k++] = (tsr_sched_work){TSR_PASS_F, mb, s};
  for (int mb = 0; mb < m; mb++) w[k++] = (tsr_sched_work){TSR_PASS_B, mb, s};
}

/* every micro-batch's activations wait for the first backward */
static int in_flight(int pp, int stage, int m, int v) {
  (void)pp, (void)stage, (void)v;
  return m;
}

static double bubble(int pp, int m, int v) {
  (void)v;
  return tsr_sched_loop_bubble(pp, m, 1);
}

const tsr_sched_desc tsr_sched_gpipe = {
    .word = "gpipe",
    .chunks = 1,
    .placement = TSR_PLACE_ROUND,
    .min_pp = 1,
    .order = order,
    .bubble = bubble,
    .bubble_formula = "(p-1)/(v m + p-1)",
    .in_flight = in_flight,
};
