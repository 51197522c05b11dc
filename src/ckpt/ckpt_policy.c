/* ckpt_policy.c — a run's checkpoint policy (ckpt_policy.h): the interval, synchronous or
 * background writes, and their costs; docs/formats.md "Asynchronous checkpoints",
 * "Checkpoint interval". */
#include "ckpt_policy.h"

#include <stdio.h>
#include <stdlib.h>

#include "ckpt_async.h"
#include "ckpt_interval.h"
#include "core/fault.h"
#include "core/util.h"

/* 'auto': the first checkpoint of a run comes this many steps after its start; it
 * measures what a checkpoint costs, and the step times before it the step time. */
#define AUTO_FIRST_STEPS 3

struct tsr_ckpt_policy {
  const tsr_config *cfg;
  MPI_Comm world;
  int rank;
  tsr_metrics *metrics;
  tsr_ckpt_async *writer; /* the background writer; NULL: synchronous writes */
  double blocked_s;       /* the write in flight: how long it held training up */
  double write_s;         /* the last background write's duration (0: none yet) */
  int64_t next;           /* every_steps = 'auto': the step of the next checkpoint */
  int64_t saved_step;     /* the step of the last checkpoint written or started; -1 */
  int64_t steps;          /* steps this run has taken (tsr_ckpt_policy_due) */
  double step_first_s, step_sum_s; /* their times: the first, the others' sum */
  /* 'auto' with background writes: the steps (but the first) taken while a write was in
   * flight and while none was, their time sums, and what the last write cost the steps
   * it overlapped (their count times the difference of the two means; 0 when unknown) */
  int writing;
  int64_t busy_n, free_n;
  double busy_sum_s, free_sum_s, slowed_s;
};

int tsr_ckpt_policy_open(tsr_ckpt_policy **out, const tsr_config *cfg,
                         const tsr_ckpt_view *view, int64_t step, tsr_metrics *metrics,
                         MPI_Comm world) {
  const tsr_checkpoint_config *cc = &cfg->checkpoint;
  tsr_ckpt_policy *p = tsr_calloc(1, sizeof *p);
  TSR_CHECK(p, TSR_ERR, "out of memory");
  p->cfg = cfg, p->world = world, p->metrics = metrics, p->saved_step = -1;
  MPI_Comm_rank(world, &p->rank);
  p->next = step + AUTO_FIRST_STEPS;
  *out = p;
  if (cc->every_steps == TSR_EVERY_AUTO)
    tsr_log("checkpoint: every_steps = 'auto' with an MTBF of %g h: a first checkpoint at step "
            "%lld measures what one costs, then the Young-Daly interval follows",
            cc->mtbf_hours, (long long)p->next);
  if (cc->every_steps == 0 && cc->every_minutes <= 0 && !cc->save_last) {
    /* only a stop signal writes one: synchronously, with no snapshot held all run long */
    tsr_log("checkpoint: none planned (every_steps 0, every_minutes 0, save_last .false.); a "
            "stop signal still writes one");
    return 0;
  }
  return tsr_ckpt_async_create(&p->writer, cfg, view, world);
}

int tsr_ckpt_policy_background(const tsr_ckpt_policy *p) { return p->writer != NULL; }

int tsr_ckpt_policy_claim(tsr_ckpt_policy *p, int64_t step) {
  if (p->saved_step == step) return 1;
  p->saved_step = step;
  return 0;
}

/* The mean step time of this run, its first step (warm-up) left out once there are more;
 * with background writes, of the steps no write overlapped where there are some (what a
 * write costs the steps it overlaps is counted in C instead). */
static double step_time(const tsr_ckpt_policy *p) {
  if (p->writer && p->free_n > 0) return p->free_sum_s / (double)p->free_n;
  return p->steps > 1 ? p->step_sum_s / (double)(p->steps - 1) : p->step_first_s;
}

int tsr_ckpt_policy_due(tsr_ckpt_policy *p, int64_t step, double step_s) {
  if (p->writing) step_s += atof(tsr_fault_str("ckpt_overlap_s", "0"));
  if (p->steps++ == 0) {
    p->step_first_s = step_s;
  } else {
    p->step_sum_s += step_s;
    if (p->writing)
      p->busy_sum_s += step_s, p->busy_n++;
    else
      p->free_sum_s += step_s, p->free_n++;
  }
  const int64_t every = p->cfg->checkpoint.every_steps;
  if (every == TSR_EVERY_AUTO) return step >= p->next;
  return every > 0 && step % every == 0;
}

/* 'auto', after each checkpoint once a step has been timed: the next checkpoint step from
 * C = blocked_s (the time this checkpoint held training up) plus, for background writes,
 * what the last one cost the steps it overlapped (a writer sharing the cores with the
 * training slows its steps: that time is a checkpoint's cost too), the mean step time and,
 * for background writes, the last one's duration (the next checkpoint should find it
 * done); the largest of each over the ranks, so that every rank chooses the same step.
 * The test hooks ckpt_cost and ckpt_step_time (fault.h) replace the measured C and step
 * time. */
static void schedule(tsr_ckpt_policy *p, int64_t step, double blocked_s) {
  const tsr_config *cfg = p->cfg;
  if (cfg->checkpoint.every_steps != TSR_EVERY_AUTO || p->steps == 0 ||
      step >= cfg->run.max_steps)
    return;
  double x[4] = {blocked_s + p->slowed_s, step_time(p), p->writer ? p->write_s : 0,
                 p->slowed_s};
  const double cost = atof(tsr_fault_str("ckpt_cost", "-1"));
  const double step_s = atof(tsr_fault_str("ckpt_step_time", "-1"));
  if (cost >= 0) x[0] = cost;
  if (step_s > 0) x[1] = step_s;
  MPI_Allreduce(MPI_IN_PLACE, x, 4, MPI_DOUBLE, MPI_MAX, p->world);
  const double mtbf_s = cfg->checkpoint.mtbf_hours * 3600.0;
  const tsr_ckpt_interval r = tsr_ckpt_young_daly(x[0], mtbf_s, x[1], x[2]);
  p->next = step + r.steps;
  char floor[96] = "";
  if (r.floor_steps > 0)
    snprintf(floor, sizeof floor, ", at least %lld step(s) for a background write of %.6g s",
             (long long)r.floor_steps, x[2]);
  char slowed[96] = "";
  if (x[3] > 0 && cost < 0)
    snprintf(slowed, sizeof slowed, " (%.6g s of it the steps the last background write "
             "slowed)", x[3]);
  tsr_log("checkpoint: 'auto' interval %lld steps, next at step %lld: C %.6g s%s, step time "
          "%.6g s, MTBF %.6g h, sqrt(2 C MTBF) = %.6g s%s; expected goodput %.4f "
          "(1 - C/T - T/(2 MTBF), T = %.6g s)", (long long)r.steps, (long long)p->next,
          x[0], slowed, x[1], cfg->checkpoint.mtbf_hours, r.period_s, floor, r.goodput,
          (double)r.steps * x[1]);
}

void tsr_ckpt_policy_wrote(tsr_ckpt_policy *p, int64_t step, double write_s) {
  tsr_metrics_checkpoint(p->metrics, step, 0, write_s, write_s);
  schedule(p, step, write_s);
}

/* A background write has ended: the log and metrics (rank 0), or its failure. */
static int finished(tsr_ckpt_policy *p, const tsr_ckpt_async_done *d) {
  if (d->rc) {
    if (p->rank == 0)
      tsr_error("checkpoint: the background write of step %lld failed (see above): the run "
                "stops as after a failed synchronous write (exit %d)", (long long)d->step, d->rc);
    return d->rc;
  }
  p->write_s = d->write_s;
  /* what the write cost the steps it overlapped, against the steps no write overlapped */
  p->writing = 0;
  p->slowed_s = 0;
  if (p->busy_n > 0 && p->free_n > 0) {
    const double extra = p->busy_sum_s - (double)p->busy_n * p->free_sum_s / (double)p->free_n;
    p->slowed_s = extra > 0 ? extra : 0;
  }
  tsr_log("checkpoint: step %lld written in the background in %.3f s; training was held up "
          "%.3f s for it", (long long)d->step, d->write_s, p->blocked_s);
  tsr_metrics_checkpoint(p->metrics, d->step, 1, p->blocked_s, d->write_s);
  return 0;
}

int tsr_ckpt_policy_poll(tsr_ckpt_policy *p) {
  tsr_ckpt_async_done d;
  return p && tsr_ckpt_async_poll(p->writer, &d) ? finished(p, &d) : 0;
}

int tsr_ckpt_policy_wait(tsr_ckpt_policy *p) {
  tsr_ckpt_async_done d;
  if (!p || !p->writer) return 0;
  return tsr_ckpt_async_wait(p->writer, &d) ? finished(p, &d) : 0;
}

int tsr_ckpt_policy_start(tsr_ckpt_policy *p, float *const lo[3], float *const hi[3],
                          int64_t split, const tsr_train_state *st, const char *deck_text) {
  TSR_CALL(tsr_ckpt_policy_poll(p)); /* a write that has ended is reported first */
  double waited_s, copy_s;
  tsr_ckpt_async_done prev;
  const int rc = tsr_ckpt_async_start(p->writer, lo, hi, split, st, deck_text, &waited_s,
                                      &copy_s, &prev);
  if (prev.step >= 0) {
    tsr_log("checkpoint: step %lld: waiting for the previous checkpoint write (step %lld) "
            "took %.3f s", (long long)st->step, (long long)prev.step, waited_s);
    TSR_CALL(finished(p, &prev));
  }
  TSR_CALL(rc);
  p->writing = 1, p->busy_n = 0, p->busy_sum_s = 0;
  /* held up: the wait and the copy (not the wait for the other ranks at the next step) */
  p->blocked_s = waited_s + copy_s;
  schedule(p, st->step, p->blocked_s);
  return 0;
}

void tsr_ckpt_policy_close(tsr_ckpt_policy **pp) {
  if (!pp || !*pp) return;
  tsr_ckpt_policy_wait(*pp);
  tsr_ckpt_async_destroy(&(*pp)->writer);
  tsr_free(pp);
}
