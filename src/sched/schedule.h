/* schedule.h — a pipeline schedule as a descriptor: everything the rest of the code needs
 * to know about one schedule (how many chunks a stage holds and where they go, whether
 * the backward is split, its constraints, its compute order, its ideal bubble and the
 * activations it keeps in flight).  Each schedule is one file of src/sched/ that fills
 * one of these; registry.c lists them.  Code outside src/sched/ asks the descriptor of
 * the configured schedule (tsr_sched) and never branches on which schedule it is. */
#ifndef TSR_SCHED_SCHEDULE_H
#define TSR_SCHED_SCHEDULE_H

#include <stddef.h>

#include "core/config.h" /* tsr_schedule_choice */

/* One computation of a stage's compute order: pass F (forward), B (the whole backward,
 * or its input-gradient half when the schedule splits it) or W (the weight-gradient
 * half), of micro-batch `micro_batch` through global chunk `chunk`. */
enum { TSR_PASS_F, TSR_PASS_B, TSR_PASS_W };
typedef struct {
  int pass, micro_batch, chunk;
} tsr_sched_work;

/* Where chunk c (of pp v) lives: ROUND puts it on stage c % pp (stage s holds s, s + pp,
 * s + 2 pp, ...); V folds every second round back (chunk c on pp - 1 - c % pp when
 * (c / pp) is odd), so with two chunks stage s holds chunks s and 2 pp - 1 - s: the first
 * and the last chunk both on stage 0, chunks pp - 1 and pp both on stage pp - 1. */
typedef enum { TSR_PLACE_ROUND, TSR_PLACE_V } tsr_sched_placement;

typedef struct tsr_sched_desc {
  const char *word;  /* parallel.schedule's value */
  /* chunks per stage: exactly this many, or 0 for parallel.virtual_stages (any >= 1); and
   * for a fixed count above 1, why (ends "... : parallel.virtual_stages must be N") */
  int chunks;
  const char *chunks_why;
  tsr_sched_placement placement;
  int split_backward; /* backward as B (input gradients) and a later W (weight gradients) */
  int min_pp;         /* fewest stages it takes (2: one that exists to fill a bubble) */
  int chunked_divides; /* with several chunks, micro-batches per step must divide by pp */
  int search_chunks;  /* chunks per stage tessera plan's search tries it with; 0: not tried */
  /* Stage s's compute order for m micro-batches and v chunks per stage: 2 m v entries, or
   * 3 m v when the backward is split; each F of (mb, c) before its B, B before W. */
  void (*order)(int pp, int s, int m, int v, tsr_sched_work *w);
  /* The ideal bubble (pipeline.h) and its formula in words (tessera plan's report). */
  double (*bubble)(int pp, int m, int v);
  const char *bubble_formula;
  /* Activation sets stage `stage` keeps alive at most (in chunks), pp >= 2. */
  int (*in_flight)(int pp, int stage, int m, int v);
} tsr_sched_desc;

/* The descriptor of schedule `id` (registry.h); NULL when there is none. */
const tsr_sched_desc *tsr_sched(tsr_schedule_choice id);
/* The schedule a layout of v chunks per stage placed by `placement` runs by default:
 * the V placement's, else the default schedule for v = 1, else the first that takes any
 * number of chunks. */
tsr_schedule_choice tsr_sched_for(tsr_sched_placement placement, int v);
/* The words of the schedules that take v > 1 chunks per stage, "'a' or 'b'", for messages. */
const char *tsr_sched_chunked_words(void);

/* A descriptor's constraints, stated once: the deck's layout rules (layout_check.c) and
 * the generator (tsr_pp_schedule_create) each word the ones they check. */
typedef enum {
  TSR_SCHED_FEW_STAGES,    /* pp below min_pp */
  TSR_SCHED_RECOMPUTE,     /* a split backward keeps every activation: no recompute */
  TSR_SCHED_CHUNK_COUNT,   /* a fixed count of chunks above 1, and v is not it */
  TSR_SCHED_NOT_CHUNKED,   /* v > 1 on a schedule of one chunk per stage */
  TSR_SCHED_ONE_STAGE,     /* v > 1 on one stage: chunks are there to pass between stages */
  TSR_SCHED_MICRO_BATCHES, /* v > 1 with micro-batches a step not divisible by pp */
} tsr_sched_rule;
/* The rules d breaks on pp stages of v chunks with m micro-batches a step and recompute
 * (1: train.recompute is not 'none'), as a mask of 1u << rule; m < 1 or recompute < 0:
 * not known, the rules that need them not checked. */
unsigned tsr_sched_broken(const tsr_sched_desc *d, int pp, int v, int m, int recompute);

#endif
