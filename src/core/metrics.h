/* metrics.h — <out_dir>/metrics.jsonl: one JSON object per line, appended across restarts.
 * Only rank 0 writes; on other ranks the handle is NULL and every call is a no-op. */
#ifndef TSR_METRICS_H
#define TSR_METRICS_H

#include <stdint.h>

typedef struct tsr_metrics tsr_metrics;

typedef struct {
  int64_t step;
  double loss, lr, grad_norm;
  int64_t tokens;
  double tokens_per_s, mfu; /* mfu < 0: unknown (written as null) */
  int64_t mem_bytes;
  double step_ms;
  int64_t skipped;
  double forward_ms, backward_ms, optimizer_ms; /* phases of the step; NAN: not separable */
  double loss_scale; /* fp16: the dynamic loss scale the step ran at; 0: not written */
  int step_skipped;  /* 1: this step's update was skipped (skipped counts them all) */
  /* a mixture of datasets: the samples of each consumed so far, written as
   * "samples":{"<name>":n,...} (n_sets 0: not written) */
  int n_sets;
  const char *const *set_names;
  const int64_t *set_samples;
} tsr_step_metrics;

int tsr_metrics_open(tsr_metrics **out, const char *path);
void tsr_metrics_close(tsr_metrics **mt);
void tsr_metrics_step(tsr_metrics *mt, const tsr_step_metrics *s);
void tsr_metrics_eval(tsr_metrics *mt, int64_t step, double val_loss);
/* Several validation sets: {"step":…, "val_loss":<total>, "val_losses":{"<name>":…}} */
void tsr_metrics_eval_sets(tsr_metrics *mt, int64_t step, double val_loss, int n,
                           const char *const *names, const double *losses);
/* {"step":…, "event":"<what>", "detail":"<detail>"}: starts, resumes. */
void tsr_metrics_event(tsr_metrics *mt, int64_t step, const char *what, const char *detail);
/* A checkpoint's event, once its write has ended: {"step":…, "event":"checkpoint",
 * "detail":"<write_s> s", "async":true|false, "blocked_s":…, "write_s":…}.  blocked_s:
 * how long training was held up for it (a synchronous write: all of it; an asynchronous
 * one: the snapshot copy and any wait for the write before); write_s: the write itself. */
void tsr_metrics_checkpoint(tsr_metrics *mt, int64_t step, int async, double blocked_s,
                            double write_s);

#endif
