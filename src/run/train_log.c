/* train_log.c — what the training loop logs (train_log.h). */
#include "train_log.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "comm/grid.h"
#include "core/runctl.h"
#include "core/tsr_build.h" /* PACKAGE_VERSION */
#include "core/util.h"
#include "deck/deck.h"
#include "deck/layout_check.h"
#include "model/layout.h"
#include "model/model.h"
#include "ops/ops.h"
#include "parallel/pp_exec.h"
#include "parallel/zero.h"
#include "plan/plan.h"

static void fmt_eta(char *buf, size_t len, double seconds) {
  long t = (long)(seconds + 0.5);
  if (t >= 3600)
    snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
}

/* What the run is, once, after the effective deck. */
void tsr_train_log_setup(const tsr_session *s) {
  const tsr_config *cfg = s->cfg;
  tsr_layout *whole = NULL; /* the whole model, for its parameter count */
  const int64_t total = tsr_layout_create(&whole, &cfg->model) ? -1 : whole->n_params;
  tsr_layout_destroy(&whole);
  char part[160] = "";
  if (s->grid->tp > 1 || s->grid->pp > 1)
    snprintf(part, sizeof part, "; this rank's part (stage %d of %d, tp rank %d of %d): %lld "
             "(%.2f M) in %d tensors", s->grid->pp_rank, s->grid->pp, s->grid->tp_rank,
             s->grid->tp, (long long)s->lay->n_params, (double)s->lay->n_params / 1e6,
             s->lay->n_tensors);
  char cpx[160] = "";
  if (s->grid->cp > 1)
    snprintf(cpx, sizeof cpx, ", this rank's %lld of each sequence's tokens (cp %d, '%s': chunks "
             "%d and %d of %d)", (long long)(cfg->model.seq_len / s->grid->cp), s->grid->cp,
             tsr_deck_word(cfg, &cfg->parallel.cp_comm), s->grid->cp_rank,
             2 * s->grid->cp - 1 - s->grid->cp_rank, 2 * s->grid->cp);
  tsr_log("model: %s, %lld parameters (%.2f M)%s; activations %.3f MB for micro-batches of "
          "%lld x %lld tokens%s", tsr_deck_word(cfg, &cfg->model.arch), (long long)total,
          (double)total / 1e6, part, (double)tsr_model_activation_bytes(s->model) / 1e6,
          (long long)cfg->train.micro_batch, (long long)cfg->model.seq_len, cpx);
  tsr_session_log_data(s);
  tsr_log("batch: global %lld sequences = %lld micro-batch(es) of %lld x dp %d; precision %s, "
          "recompute %s", (long long)cfg->train.global_batch, (long long)s->grad_accum_steps,
          (long long)cfg->train.micro_batch, s->dp, tsr_deck_word(cfg, &cfg->train.precision),
          tsr_deck_word(cfg, &cfg->train.recompute));
  char why[512];
  if (s->rank == 0 && tsr_batch_tokens_warning(cfg, s->dp, why, sizeof why)) tsr_warn("%s", why);
  tsr_grid_log(s->grid);
  if (s->sched)
    tsr_log("pipeline: schedule %s, %d micro-batches per step, %d chunk(s) per stage; stage "
            "%d keeps %d activation slot(s): %.2f MB (rank 0)",
            tsr_deck_word(cfg, &cfg->parallel.schedule), s->sched->m, s->sched->v,
            s->grid->pp_rank, tsr_model_n_slots(s->model),
            (double)tsr_model_activation_bytes(s->model) / 1e6);
  size_t sdev, shost, sset;
  if (tsr_model_stored_bytes(s->model, &sdev, &shost, &sset))
    tsr_log("activations stored for the backward (rank 0): %zu bytes on the device (a window of "
            "%d layer blocks of %zu bytes and %d slot(s)' chunk outputs), %zu bytes in "
            "page-locked host memory (train.activation_offload)", sdev,
            TSR_MODEL_OFFLOAD_WINDOW, sset, tsr_model_n_slots(s->model), shost);
  else if (tsr_ops_on_device())
    tsr_log("activations stored for the backward (rank 0): %zu bytes on the device", sdev);
  const tsr_zero_memory zm = tsr_zero_memory_of(s->zero);
  char host_grads[128] = "";
  if (tsr_zero_grads_on_host(s->zero))
    snprintf(host_grads, sizeof host_grads, "; the reduced gradient on the host, landing in "
             "%lld elements a gradient slot", (long long)tsr_zero_grads_on_host(s->zero));
  tsr_log("zero stage %lld: per rank params %.2f MB, grads %.2f MB, master %.2f MB, adam "
          "%.2f MB, unit buffers %.2f MB (shard of %lld of %lld elements%s)",
          (long long)cfg->parallel.zero_stage, zm.params / 1e6, zm.grads / 1e6, zm.master / 1e6,
          zm.adam / 1e6, zm.unit_bufs / 1e6,
          (long long)(tsr_zero_shard_end(s->zero) - tsr_zero_shard_begin(s->zero)),
          (long long)s->lay->n_flat, host_grads);
}

/* The step line (every log_every steps, the first and the last), the measured pipeline
 * bubble; after the first step of this run, the traffic and the measured memory beside
 * the plan's.  avg_s: the mean step time since the last line. */
void tsr_train_log_step(const tsr_session *s, const tsr_step_result *r, double dt, double mfu,
                        double avg_s, int first) {
  const tsr_config *cfg = s->cfg;
  const int64_t step = s->st.step;
  const double tok_per_s = (double)(cfg->train.global_batch * cfg->model.seq_len) / dt;
  char eta[32], phases[96] = "", scale[48] = "";
  fmt_eta(eta, sizeof eta, avg_s * (double)(cfg->run.max_steps - step));
  if (isfinite(r->phase_s[0]))
    snprintf(phases, sizeof phases, " (fwd %.1f bwd %.1f opt %.1f)", r->phase_s[0] * 1e3,
             r->phase_s[1] * 1e3, r->phase_s[2] * 1e3);
  if (r->scale > 0) snprintf(scale, sizeof scale, " | scale %g", r->scale);
  tsr_log("step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.4f%s | %8.0f tok/s | %7.1f ms%s "
          "| %.2f GFLOP/s/rank, MFU %.2f | mem %.1f MB | ETA %s", (long long)step,
          (long long)cfg->run.max_steps, r->loss, r->lr, r->grad_norm, scale, tok_per_s,
          dt * 1e3, phases, tok_per_s * s->flops_per_token / 1e9 / s->world_size, mfu,
          (double)tsr_ops_mem_bytes() / 1e6, eta);
  if (s->sched) {
    char line[1024];
    size_t used = 0;
    for (int i = 0; i < s->grid->pp && used < sizeof line; i++)
      used += (size_t)snprintf(line + used, sizeof line - used, " %.3f", s->bubble[i]);
    tsr_log("pipeline bubble (measured idle / step time, stages 0..%d):%s | theory %s %.3f "
            "(p %d, m %d, v %d)", s->grid->pp - 1, line,
            tsr_deck_word(cfg, &cfg->parallel.schedule),
            tsr_pp_ideal_bubble(cfg->parallel.schedule, s->grid->pp, s->sched->m, s->sched->v),
            s->grid->pp, s->sched->m, s->sched->v);
  }
  if (!first) return;
  if (s->world_size > 1) {
    char comm[1024];
    tsr_grid_describe_traffic(s->grid, comm, sizeof comm);
    tsr_log("comm per step (rank 0, ring-algorithm bytes): %s", comm);
  }
  /* measured memory next to tessera plan's (src/plan/plan.c); a collective */
  size_t sdev, shost, sset; /* the activation offload's page-locked blocks */
  tsr_model_stored_bytes(s->model, &sdev, &shost, &sset);
  double mem[3] = {(double)tsr_ops_mem_bytes(), (double)tsr_ops_mem_peak_bytes(),
                   (double)tsr_zero_memory_of(s->zero).host + (double)shost};
  MPI_Allreduce(MPI_IN_PLACE, mem, 3, MPI_DOUBLE, MPI_MAX, s->world);
  tsr_plan_log_memory(cfg, s->grid, tsr_ops_on_device() ? TSR_PLAN_GPU : TSR_PLAN_CPU,
                      s->st.step, mem[0], mem[1], mem[2]);
}

/* Who runs what, where: the first lines of every run in tessera.log. */
void tsr_train_log_start(MPI_Comm world) {
  int n;
  MPI_Comm_size(world, &n);
  char host[256] = "?", when[40];
  gethostname(host, sizeof host - 1);
  tsr_iso_time(when, sizeof when);
  tsr_log("tessera %s started %s on %s (rank 0 of %d)", PACKAGE_VERSION, when, host, n);
  tsr_log("command: %s", tsr_run_command());
}

