/* session_ckpt.c — a run's checkpoint writes (session.h): synchronous or from a host
 * snapshot in the background (ckpt_async.h), their reports in the log and metrics.jsonl,
 * and when they happen: every checkpoint.every_steps steps, or at the Young-Daly interval
 * (ckpt_interval.h) with every_steps = 'auto'. */
#include <math.h>
#include <stdlib.h>

#include "ckpt_interval.h"
#include "fault.h"
#include "ops.h"
#include "session.h"
#include "util.h"
#include "watchdog.h"

/* 'auto': the first checkpoint of a run comes this many steps after its start; it
 * measures what a checkpoint costs, and the step times before it the step time. */
#define AUTO_FIRST_STEPS 3

/* Its (stage, tp) part, its ZeRO shard of that, and which of the identical copies of the
 * shard it is (dp replicas at zero 0, hybrid replicas otherwise), so each piece is written
 * once. */
tsr_ckpt_view tsr_session_ckpt_view(const tsr_session *s) {
  tsr_ckpt_view v = {s->lay, tsr_zero_shard_begin(s->zero), tsr_zero_shard_end(s->zero), 0, 1};
  if (s->cfg->parallel.zero_stage == 0)
    v.copy_index = s->grid->dp_rank, v.n_copies = s->grid->dp;
  else
    v.copy_index = s->grid->replicate_rank, v.n_copies = s->grid->replicate_size;
  return v;
}

/* The state's host copy for checkpoint I/O (session.h): the arrays themselves on the CPU,
 * a page-locked copy of a device's. */
int tsr_session_state_host(tsr_session *s, float *hb[3]) {
  float *const dev[3] = {tsr_zero_master(s->zero), tsr_zero_adam_m(s->zero),
                         tsr_zero_adam_v(s->zero)};
  memcpy(hb, dev, sizeof dev);
  if (!s->dev) {
    tsr_ops_sync();
    return 0;
  }
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  const size_t n = (size_t)(view.shard_end - view.shard_begin);
  float *h = tsr_ops_host_alloc(3 * (n ? n : 1) * sizeof(float));
  TSR_CHECK(h, TSR_ERR, "checkpoint: no host memory for a copy of %zu parameters' state", n);
  for (int k = 0; k < 3; k++) {
    hb[k] = dev[k] ? h + (size_t)k * n : NULL;
    if (dev[k]) tsr_ops_copy(hb[k], dev[k], n * sizeof(float));
  }
  tsr_ops_sync();
  return 0;
}

void tsr_session_state_release(tsr_session *s, float *hb[3], int put) {
  if (!s->dev) return;
  float *const dev[3] = {tsr_zero_master(s->zero), tsr_zero_adam_m(s->zero),
                         tsr_zero_adam_v(s->zero)};
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  const size_t n = (size_t)(view.shard_end - view.shard_begin);
  for (int k = 0; put && k < 3; k++)
    if (dev[k]) tsr_ops_copy(dev[k], hb[k], n * sizeof(float));
  tsr_ops_sync();
  for (int k = 0; k < 3; k++)
    if (hb[k]) { /* the copy's start */
      void *h = hb[k] - (size_t)k * n;
      tsr_ops_host_free(&h);
      break;
    }
  hb[0] = hb[1] = hb[2] = NULL;
}

int tsr_session_ckpt_open(tsr_session *s) {
  const tsr_checkpoint_config *cc = &s->cfg->checkpoint;
  s->ckpt_next = s->st.step + AUTO_FIRST_STEPS;
  if (cc->every_steps == TSR_EVERY_AUTO)
    tsr_log("checkpoint: every_steps = 'auto' with an MTBF of %g h: a first checkpoint at step "
            "%lld measures what one costs, then the Young-Daly interval follows",
            cc->mtbf_hours, (long long)s->ckpt_next);
  if (cc->every_steps == 0 && cc->every_minutes <= 0 && !cc->save_last) {
    /* only a stop signal writes one: synchronously, with no snapshot held all run long */
    tsr_log("checkpoint: none planned (every_steps 0, every_minutes 0, save_last .false.); a "
            "stop signal still writes one");
    return 0;
  }
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  return tsr_ckpt_async_create(&s->ckpt_async, s->cfg, &view, s->world);
}

/* The mean step time of this run, its first step (warm-up) left out once there are more;
 * with background writes, of the steps no write overlapped where there are some (what a
 * write costs the steps it overlaps is counted in C instead). */
static double step_time(const tsr_session *s) {
  if (s->ckpt_async && s->ckpt_free_n > 0) return s->ckpt_free_sum_s / (double)s->ckpt_free_n;
  return s->ckpt_steps > 1 ? s->ckpt_step_sum_s / (double)(s->ckpt_steps - 1)
                           : s->ckpt_step_first_s;
}

int tsr_session_ckpt_due(tsr_session *s, double step_s) {
  if (s->ckpt_writing) step_s += atof(tsr_fault_str("ckpt_overlap_s", "0"));
  if (s->ckpt_steps++ == 0) {
    s->ckpt_step_first_s = step_s;
  } else {
    s->ckpt_step_sum_s += step_s;
    if (s->ckpt_writing)
      s->ckpt_busy_sum_s += step_s, s->ckpt_busy_n++;
    else
      s->ckpt_free_sum_s += step_s, s->ckpt_free_n++;
  }
  const int64_t every = s->cfg->checkpoint.every_steps;
  if (every == TSR_EVERY_AUTO) return s->st.step >= s->ckpt_next;
  return every > 0 && s->st.step % every == 0;
}

/* 'auto', after each checkpoint once a step has been timed: the next checkpoint step from
 * C = blocked_s (the time this checkpoint held training up) plus, for background writes,
 * what the last one cost the steps it overlapped (a writer sharing the cores with the
 * training slows its steps: that time is a checkpoint's cost too), the mean step time and,
 * for background writes, the last one's duration (the next checkpoint should find it
 * done); the largest of each over the ranks, so that every rank chooses the same step.
 * The test hooks ckpt_cost and ckpt_step_time (fault.h) replace the measured C and step
 * time. */
static void schedule(tsr_session *s, double blocked_s) {
  const tsr_config *cfg = s->cfg;
  if (cfg->checkpoint.every_steps != TSR_EVERY_AUTO || s->ckpt_steps == 0 ||
      s->st.step >= cfg->run.max_steps)
    return;
  double x[4] = {blocked_s + s->ckpt_slowed_s, step_time(s), s->ckpt_async ? s->ckpt_write_s : 0,
                 s->ckpt_slowed_s};
  const double cost = atof(tsr_fault_str("ckpt_cost", "-1"));
  const double step = atof(tsr_fault_str("ckpt_step_time", "-1"));
  if (cost >= 0) x[0] = cost;
  if (step > 0) x[1] = step;
  MPI_Allreduce(MPI_IN_PLACE, x, 4, MPI_DOUBLE, MPI_MAX, s->world);
  const double mtbf_s = cfg->checkpoint.mtbf_hours * 3600.0;
  const tsr_ckpt_interval r = tsr_ckpt_young_daly(x[0], mtbf_s, x[1], x[2]);
  s->ckpt_next = s->st.step + r.steps;
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
          "(1 - C/T - T/(2 MTBF), T = %.6g s)", (long long)r.steps, (long long)s->ckpt_next,
          x[0], slowed, x[1], cfg->checkpoint.mtbf_hours, r.period_s, floor, r.goodput,
          (double)r.steps * x[1]);
}

/* A background write has ended: the log and metrics (rank 0), or its failure. */
static int finished(tsr_session *s, const tsr_ckpt_async_done *d) {
  if (d->rc) {
    if (s->rank == 0)
      tsr_error("checkpoint: the background write of step %lld failed (see above): the run "
                "stops as after a failed synchronous write (exit %d)", (long long)d->step, d->rc);
    return d->rc;
  }
  s->ckpt_write_s = d->write_s;
  /* what the write cost the steps it overlapped, against the steps no write overlapped */
  s->ckpt_writing = 0;
  s->ckpt_slowed_s = 0;
  if (s->ckpt_busy_n > 0 && s->ckpt_free_n > 0) {
    const double extra = s->ckpt_busy_sum_s - (double)s->ckpt_busy_n * s->ckpt_free_sum_s /
                                                  (double)s->ckpt_free_n;
    s->ckpt_slowed_s = extra > 0 ? extra : 0;
  }
  tsr_log("checkpoint: step %lld written in the background in %.3f s; training was held up "
          "%.3f s for it", (long long)d->step, d->write_s, s->ckpt_blocked_s);
  tsr_metrics_checkpoint(s->metrics, d->step, 1, s->ckpt_blocked_s, d->write_s);
  return 0;
}

int tsr_session_ckpt_poll(tsr_session *s) {
  tsr_ckpt_async_done d;
  return tsr_ckpt_async_poll(s->ckpt_async, &d) ? finished(s, &d) : 0;
}

int tsr_session_ckpt_wait(tsr_session *s) {
  tsr_ckpt_async_done d;
  if (!s->ckpt_async) return 0;
  tsr_watchdog_activity(s->st.step, "waiting for a checkpoint write");
  return tsr_ckpt_async_wait(s->ckpt_async, &d) ? finished(s, &d) : 0;
}

void tsr_session_ckpt_close(tsr_session *s) {
  tsr_session_ckpt_wait(s);
  tsr_ckpt_async_destroy(&s->ckpt_async);
}

int tsr_session_save(tsr_session *s, const char *deck_text, int wait) {
  if (s->ckpt_saved_step == s->st.step) { /* a stop right after a periodic checkpoint */
    tsr_log("checkpoint: step %lld is written already%s", (long long)s->st.step,
            wait && s->ckpt_async ? " (or being written: waiting for it)" : "");
    return wait ? tsr_session_ckpt_wait(s) : 0;
  }
  s->ckpt_saved_step = s->st.step;
  const double t0 = tsr_now();
  tsr_watchdog_activity(s->st.step, "a checkpoint write");
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  const float *master = tsr_zero_master(s->zero), *m = tsr_zero_adam_m(s->zero),
              *v = tsr_zero_adam_v(s->zero);
  if (!s->ckpt_async) { /* from the state itself, or from a host copy of a device's */
    float *hb[3];
    TSR_CALL(tsr_session_state_host(s, hb));
    const int rc = tsr_ckpt_save_view(s->cfg, &view, hb[0], hb[1], hb[2], &s->st, deck_text,
                                      s->world);
    tsr_session_state_release(s, hb, 0);
    TSR_CALL(rc);
    const double dt = tsr_now() - t0;
    tsr_metrics_checkpoint(s->metrics, s->st.step, 0, dt, dt);
    schedule(s, dt);
    return 0;
  }
  TSR_CALL(tsr_session_ckpt_poll(s)); /* a write that has ended is reported first */
  double waited_s, copy_s;
  tsr_ckpt_async_done prev;
  const int rc = tsr_ckpt_async_start(s->ckpt_async, master, m, v, &s->st, deck_text,
                                      &waited_s, &copy_s, &prev);
  if (prev.step >= 0) {
    tsr_log("checkpoint: step %lld: waiting for the previous checkpoint write (step %lld) "
            "took %.3f s", (long long)s->st.step, (long long)prev.step, waited_s);
    TSR_CALL(finished(s, &prev));
  }
  TSR_CALL(rc);
  s->ckpt_writing = 1, s->ckpt_busy_n = 0, s->ckpt_busy_sum_s = 0;
  /* held up: the wait and the copy (not the wait for the other ranks at the next step) */
  s->ckpt_blocked_s = waited_s + copy_s;
  schedule(s, s->ckpt_blocked_s);
  return wait ? tsr_session_ckpt_wait(s) : 0;
}
