/* sched_internal.h — what the schedules' files share to write their compute orders. */
#ifndef TSR_SCHED_INTERNAL_H
#define TSR_SCHED_INTERNAL_H

#include "schedule.h"

/* The loop order of the round placement (Megatron's, which interleaving generalises):
 * warm-up forwards, then one forward and one backward in turn, then the cool-down
 * backwards; micro-batches go through a stage's v chunks in groups of pp (defined with
 * the schedule that takes any number of chunks, like the two below). */
void tsr_sched_loop_order(int pp, int s, int m, int v, tsr_sched_work *w);
/* The loop order's activation sets in flight on stage `stage`. */
int tsr_sched_loop_in_flight(int pp, int stage, int m, int v);
/* The bubble of the loop order, (p - 1) / (v m + p - 1). */
double tsr_sched_loop_bubble(int pp, int m, int v);

/* A split-backward order under construction for a stage's local chunks 0 and 1 (global
 * chunks chunk[0], chunk[1]): n[c][pass] counts the passes issued for local chunk c;
 * passes of micro-batches >= m are counted but not emitted (an order built for more
 * micro-batches than the step has drops them). */
typedef struct {
  tsr_sched_work *w;
  int k, m, chunk[2], n[2][3];
} tsr_sched_builder;

static inline void tsr_sched_put(tsr_sched_builder *b, int pass, int local) {
  const int mb = b->n[local][pass]++;
  if (mb < b->m) b->w[b->k++] = (tsr_sched_work){pass, mb, b->chunk[local]};
}

#endif
