/* train.c — the training loop, on a session (session.h):
 * micro-batch accumulation, clipping, the non-finite skip, AdamW, metrics, evaluation,
 * periodic, timed and final checkpoints, stopping on a signal (what it logs is
 * train_log.c; `tessera eval` is eval.c).
 *
 * Sample accounting (docs/formats.md "Token stream and samples"): optimizer step s
 * (0-based) consumes global samples s*global_batch .. s*global_batch + global_batch - 1,
 * split contiguously over dp replicas, then into micro-batches; the cursor (samples
 * consumed) is saved in the checkpoint, so a resume continues the exact sample stream. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "deck/deck.h"
#include "core/fault.h"
#include "generate.h"
#include "ops/ops.h"
#include "model/optim.h"
#include "precision.h"
#include "core/runctl.h"
#include "session.h"
#include "train_log.h"
#include "core/util.h"
#include "core/watchdog.h"
#include "data/data.h"
#include "comm/grid.h"
#include "core/metrics.h"
#include "model/model.h"
#include "parallel/pp_exec.h"
#include "parallel/zero.h"

/* The micro-batches of this rank's share of the global batch, forward and backward,
 * through the pipeline schedule or one after another; the gradient reductions overlap
 * backward (zero.c).  Returns the forward and backward times (0 through a schedule). */
static int accumulate(tsr_session *s, float dloss, double *fwd_s, double *bwd_s) {
  const tsr_config *cfg = s->cfg;
  const int64_t mb = cfg->train.micro_batch, k = s->grad_accum_steps;
  const int64_t first = s->st.data_cursor + s->dp_rank * (cfg->train.global_batch / s->dp);
  *fwd_s = *bwd_s = 0;
  if (s->exec) { /* pipeline: the schedule runs the k micro-batches */
    tsr_pp_step_stats ps;
    TSR_CALL(tsr_pp_exec_step(s->exec, s->train_data, first, dloss, s->loss_acc, &ps));
    memset(s->bubble, 0, (size_t)s->grid->pp * sizeof(double));
    s->bubble[s->grid->pp_rank] = ps.total_s > 0 ? ps.idle_s / ps.total_s : 0;
    return tsr_comm_all_reduce_double(s->grid->pp_comm, s->bubble, (size_t)s->grid->pp,
                                      TSR_COMM_SUM);
  }
  for (int64_t a = 0; a < k; a++) {
    TSR_CALL(tsr_zero_begin_micro(s->zero, a == k - 1));
    tsr_data_batch(s->train_data, first + a * mb, mb, s->inputs, s->targets);
    const double t_fwd = tsr_now(); /* tsr_model_fwd_bwd, timed in its two phases */
    TSR_CALL(tsr_model_chunk_forward(s->model, 0, 0, s->inputs, s->targets, NULL, dloss, 1,
                                     s->loss_acc));
    const double t_bwd = tsr_now();
    TSR_CALL(tsr_model_chunk_backward(s->model, 0, 0, NULL));
    *fwd_s += t_bwd - t_fwd;
    *bwd_s += tsr_now() - t_bwd;
  }
  return 0;
}

/* One optimizer step: accumulate the gradients, then clip and update, or skip on a
 * non-finite gradient (the norm is bitwise equal on every rank, so every rank decides
 * the same).  The loss is multiplied by fp16's loss scale S (precision.h) and the update
 * divides by it. */
static int train_step(tsr_session *s, tsr_step_result *r) {
  const tsr_config *cfg = s->cfg;
  const int64_t k = s->grad_accum_steps;
  const double S = tsr_loss_scale(&cfg->train, &s->st);
  r->scale = cfg->train.precision == TSR_F16 ? S : 0;
  /* each rank's micro-batch loss is a mean over its tokens (with cp, over its part of
   * each sequence): 1/(k dp cp) makes the gradient summed over dp x cp the mean over the
   * global batch */
  const float dloss = (float)(S / ((double)k * s->dpcp));
  /* a mixture: its blend's state at this step's first sample (every rank reads from it) */
  tsr_data_mix_seek(s->train_data, s->st.data_cursor);
  const double t_begin = tsr_now();
  TSR_CALL(tsr_zero_begin_step(s->zero));
  const double opt_s = tsr_now() - t_begin;
  /* the micro-batch losses add up in op memory: no host round trip per micro-batch */
  tsr_ops_zero(s->loss_acc, sizeof(double));
  double fwd_s, bwd_s;
  TSR_CALL(accumulate(s, dloss, &fwd_s, &bwd_s));
  const double t_opt = tsr_now();
  TSR_CALL(tsr_zero_reduce_grads(s->zero));
  /* fault injection for the tests (fault.h): poison one gradient at the given step */
  if (tsr_fault_int("nan_grad_step", -1) == s->st.step + 1 && s->rank == 0)
    tsr_zero_poison_grad(s->zero, NAN);
  TSR_CALL(tsr_zero_grad_norm(s->zero, &r->grad_norm));
  r->grad_norm /= S; /* of the unscaled gradient (exact: S is a power of two) */
  double loss_sum;
  tsr_ops_read(&loss_sum, s->loss_acc, sizeof loss_sum);
  tsr_fault_host_read(s->st.step + 1, s->rank, tsr_zero_reduced_grads(s->zero)); /* tests */
  if (s->exec) /* the last stage's (0 on the others) */
    TSR_CALL(tsr_comm_sum_ordered(s->grid->pp_comm, loss_sum, &loss_sum));
  TSR_CALL(tsr_comm_sum_ordered(s->grid->dp_comm, loss_sum / (double)k, &r->loss));
  r->loss /= (double)s->dpcp;
  const int64_t step = s->st.step + 1;
  r->lr = tsr_optim_lr(&cfg->optim, cfg->run.max_steps, step);
  r->skipped = !isfinite(r->grad_norm);
  if (r->skipped) {
    s->st.skipped++;
  } else {
    const double scale = tsr_optim_clip_scale(r->grad_norm, cfg->train.grad_clip) / S;
    /* Adam's bias correction counts the updates actually made (skipped steps do not
     * advance it, as with torch's GradScaler skipping optimizer.step()). */
    TSR_CALL(tsr_zero_update(s->zero, &cfg->optim, r->lr, step - s->st.skipped, scale));
  }
  tsr_loss_scale_update(&cfg->train, &s->st, r->skipped);
  s->st.step = step;
  s->st.data_cursor += cfg->train.global_batch;
  s->st.tokens += cfg->train.global_batch * cfg->model.seq_len;
  /* a pipeline schedule interleaves forward and backward: only the optimizer is apart;
   * on a GPU the host only queues the forward and backward (the step synchronises once,
   * at the gradient norm), so none of the three is the device's time */
  r->phase_s[0] = s->exec || s->dev ? NAN : fwd_s;
  r->phase_s[1] = s->exec || s->dev ? NAN : bwd_s;
  r->phase_s[2] = s->dev ? NAN : opt_s + (tsr_now() - t_opt);
  return tsr_ops_status(); /* a failed device call fails the step */
}

/* tessera.log opens before the session, so that what setting up the device, the grid and
 * the transports logs is in the file too; metrics.jsonl is rank 0's, once it has a session. */
static int open_log(const tsr_config *cfg) {
  char path[TSR_STR_PATH + 32];
  TSR_CALL(tsr_run_make_dirs(cfg->run.out_dir));
  snprintf(path, sizeof path, "%s/tessera.log", cfg->run.out_dir);
  return tsr_log_open(path);
}

static int open_metrics(tsr_session *s) {
  if (s->rank != 0) return 0;
  char path[TSR_STR_PATH + 32];
  snprintf(path, sizeof path, "%s/metrics.jsonl", s->cfg->run.out_dir);
  return tsr_metrics_open(&s->metrics, path);
}

int tsr_train(const tsr_config *cfg, const char *deck_text, MPI_Comm world) {
  tsr_session s;
  int rc = tsr_run_agree_start(world, open_log(cfg), "while starting");
  if (rc) return rc;
  tsr_train_log_start(world);
  rc = tsr_session_open(&s, cfg, world, 1);
  if (!rc) rc = tsr_fault_init();
  if (!rc) rc = open_metrics(&s);
  if ((rc = tsr_run_agree_start(world, rc, "while setting up")) != 0) {
    tsr_session_close(&s);
    tsr_log_close();
    return rc;
  }
  /* GO: an error every rank shares (checkpoint I/O); GO_ALONE: one that may be this
   * rank's alone (a step, an evaluation): the job is aborted. */
#define GO(expr)                       \
  do {                                 \
    if ((rc = (expr)) != 0) goto done; \
  } while (0)
#define GO_ALONE(expr)                                       \
  do {                                                       \
    if ((rc = (expr)) != 0) tsr_run_abort(world, rc, #expr); \
  } while (0)
  tsr_log("effective deck:\n%s", deck_text);
  tsr_train_log_setup(&s);
  tsr_fault_start_pause("resume");
  GO(tsr_run_agree_start(world, tsr_session_resume(&s), "while resuming"));
  if (cfg->checkpoint.save_initial && s.st.step == 0) GO(tsr_session_save(&s, deck_text, 0));

  const double t_start = tsr_now();
  double t_last_ckpt = t_start, t_window = t_start;
  int64_t window_steps = 0;
  const int64_t first_step = s.st.step;
  while (s.st.step < cfg->run.max_steps) {
    /* Decisions every rank must take together, agreed at the step boundary: stop on a
     * signal (any rank's), a time-based checkpoint (rank 0's clock decides), and stop
     * when a background checkpoint write has failed (seen by any rank). */
    int flags[3] = {tsr_run_stop_signal(), /* the number: MAX over ranks gives one */
                    s.rank == 0 && cfg->checkpoint.every_minutes > 0 && s.st.step > first_step &&
                        tsr_now() - t_last_ckpt >= 60.0 * cfg->checkpoint.every_minutes,
                    tsr_session_ckpt_poll(&s)};
    GO_ALONE(tsr_comm_all_reduce_int(s.grid->world, flags, 3, TSR_COMM_MAX));
    if ((rc = flags[2]) != 0) goto done;
    if (flags[0] && s.st.step == first_step) {
      /* before this run's first step: its state is the checkpoint it resumed from, or the
       * seed's (save_initial wrote it if wanted); writing it again would only cost time */
      tsr_run_log_early_stop(flags[0], "after start-up");
      rc = TSR_ERR_SIGNAL;
      goto done;
    }
    if (flags[0]) {
      tsr_log("signal %d received: writing a checkpoint at step %lld and stopping (exit 3)",
              flags[0], (long long)s.st.step);
      GO(tsr_session_save(&s, deck_text, 1));
      tsr_log("stopped cleanly at step %lld with its checkpoint written: exit 3 (requeue, or "
              "run again, to go on from there)", (long long)s.st.step);
      rc = TSR_ERR_SIGNAL;
      goto done;
    }
    if (flags[1]) {
      GO(tsr_session_save(&s, deck_text, 0));
      t_last_ckpt = tsr_now();
    }
    const double t0 = tsr_now();
    tsr_step_result r;
    tsr_grid_reset_traffic(s.grid);
    tsr_watchdog_activity(s.st.step + 1, "a training step");
    /* fault injection for the tests (fault.h): one rank stops responding at the given step */
    tsr_fault_hang(s.st.step + 1, s.rank);
    GO_ALONE(train_step(&s, &r));
    const double dt = tsr_now() - t0;
    const int64_t step = s.st.step;
    window_steps++;
    const double tok_per_s = (double)(cfg->train.global_batch * cfg->model.seq_len) / dt;
    const double mfu = tsr_session_mfu(&s, tok_per_s);
    tsr_step_metrics sm = {step, r.loss, r.lr, r.grad_norm, s.st.tokens, tok_per_s, mfu,
                           (int64_t)tsr_ops_mem_bytes(), dt * 1e3, s.st.skipped,
                           r.phase_s[0] * 1e3, r.phase_s[1] * 1e3, r.phase_s[2] * 1e3, r.scale,
                           r.skipped, 0, NULL, NULL};
    int64_t set_samples[TSR_MAX_DATASETS];
    const char *set_names[TSR_MAX_DATASETS];
    if (s.rank == 0) /* a mixture: the samples of each dataset */
      sm.n_sets = tsr_session_set_samples(&s, set_names, set_samples);
    sm.set_names = set_names, sm.set_samples = set_samples;
    tsr_metrics_step(s.metrics, &sm);
    if (r.skipped && r.scale > 0) /* expected now and then: the scale searches for its level */
      tsr_log("step %lld: fp16 gradients overflowed at loss scale %g: update skipped, scale "
              "now %g (%lld skipped so far)", (long long)step, r.scale, s.st.loss_scale,
              (long long)s.st.skipped);
    else if (r.skipped)
      tsr_warn("step %lld: non-finite gradient norm; update skipped (%lld skipped so far)",
               (long long)step, (long long)s.st.skipped);
    if (step % cfg->run.log_every == 0 || step == first_step + 1 || step == cfg->run.max_steps) {
      const double now = tsr_now();
      tsr_train_log_step(&s, &r, dt, mfu, (now - t_window) / (double)window_steps,
               step == first_step + 1);
      t_window = now;
      window_steps = 0;
    }
    const int last = step == cfg->run.max_steps;
    if (s.n_valid && cfg->run.eval_every > 0 && (step % cfg->run.eval_every == 0 || last)) {
      double vl, set_loss[TSR_MAX_DATASETS];
      char text[TSR_MAX_DATASETS * (TSR_SET_NAME + 16) + 32];
      tsr_watchdog_activity(step, "an evaluation");
      GO_ALONE(tsr_session_evaluate(&s, &vl, set_loss, NULL));
      tsr_session_val_text(&s, vl, set_loss, text, sizeof text);
      tsr_log("step %6lld | %s", (long long)step, text);
      const char *names[TSR_MAX_DATASETS];
      for (int i = 0; i < s.n_valid; i++) names[i] = cfg->data.valid_names[i];
      tsr_metrics_eval_sets(s.metrics, step, vl, s.n_valid > 1 ? s.n_valid : 0, names, set_loss);
    }
    if (cfg->run.sample_every > 0 && step % cfg->run.sample_every == 0) /* generate.c */
      GO_ALONE(tsr_generate_train_sample(&s));
    if (tsr_session_ckpt_due(&s, dt) || (last && cfg->checkpoint.save_last)) {
      GO(tsr_session_save(&s, deck_text, last)); /* the last one is waited for */
      t_last_ckpt = tsr_now();
    }
  }
  GO(tsr_session_ckpt_wait(&s)); /* a background write still in flight ends, or fails, here */
  tsr_watchdog_activity(s.st.step, NULL);
  tsr_log("done: %lld steps in %.1f s this run, %lld skipped", (long long)(s.st.step - first_step),
          tsr_now() - t_start, (long long)s.st.skipped);
done:
#undef GO
#undef GO_ALONE
  tsr_session_close(&s);
  tsr_log_close();
  return rc;
}
