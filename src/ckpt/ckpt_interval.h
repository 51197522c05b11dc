/* ckpt_interval.h — how often to checkpoint: the Young-Daly interval and the goodput it
 * gives (docs/formats.md "Checkpoint interval").  Pure arithmetic, shared by the trainer's
 * checkpoint.every_steps = 'auto' (session.c) and `tessera plan` (plan_ckpt.c).
 *
 * With C the time one checkpoint costs training (the time it holds training up; for a
 * background write also what it slows the steps it overlaps: session_ckpt.c) and M the
 * mean time between failures,
 * the period of training between checkpoints that loses the least time is about
 *     T = sqrt(2 C M)
 * (Young 1974; Daly 2006, first order), and the expected fraction of time spent on useful
 * work (the goodput) at period T is about
 *     G = 1 - C / T - T / (2 M)
 * (a checkpoint's cost every T, and half a period lost on average at each failure); the
 * restart itself and the write latency of an asynchronous checkpoint are left out. */
#ifndef TSR_CKPT_INTERVAL_H
#define TSR_CKPT_INTERVAL_H

#include <stdint.h>

typedef struct {
  double period_s;     /* sqrt(2 C M) */
  int64_t steps;       /* the interval: max(1, round(period / step time), floor_steps) */
  int64_t floor_steps; /* ceil(write / step time): the fewest steps a background write of
                        * `write_s` takes, so that it ends before the next checkpoint; 0 */
  double goodput;      /* G at T = steps x step time, clamped to [0, 1] */
} tsr_ckpt_interval;

/* cost_s: C; mtbf_s: M; step_s: the time of one step; write_s: the duration of a
 * background write that should end before the next checkpoint starts (0: none).  All > 0
 * except write_s; a step time <= 0 gives an interval of 1. */
tsr_ckpt_interval tsr_ckpt_young_daly(double cost_s, double mtbf_s, double step_s,
                                      double write_s);
/* G = 1 - C/T - T/(2 M) clamped to [0, 1]; 0 when T or M is not > 0. */
double tsr_ckpt_goodput(double cost_s, double period_s, double mtbf_s);

#endif
