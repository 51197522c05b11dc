/* metrics.c — the metrics.jsonl writer (rank 0). */
#include "metrics.h"

#include <math.h>
#include <stdio.h>

#include "util.h"

struct tsr_metrics {
  FILE *f;
};

int tsr_metrics_open(tsr_metrics **out, const char *path) {
  *out = NULL;
  tsr_metrics *mt = tsr_calloc(1, sizeof *mt);
  if (!mt) return TSR_ERR;
  mt->f = fopen(path, "a");
  if (!mt->f) {
    tsr_error("cannot open metrics file '%s' for appending", path);
    tsr_free(&mt);
    return TSR_ERR_INPUT;
  }
  *out = mt;
  return 0;
}

void tsr_metrics_close(tsr_metrics **mt) {
  if (!mt || !*mt) return;
  fclose((*mt)->f);
  tsr_free(mt);
}

/* Every record ends with the wall-clock time it was written (UTC, ISO 8601), after the
 * fields it always had, so that readers matching a record's start see no change. */
static void end_record(FILE *f) {
  char when[40];
  tsr_iso_time(when, sizeof when);
  fprintf(f, "\"time\":\"%s\"}\n", when);
  fflush(f);
}

/* JSON has no NaN or Infinity: write null for them. */
static void num(FILE *f, const char *key, double x, int last) {
  if (isfinite(x))
    fprintf(f, "\"%s\":%.17g%s", key, x, last ? "" : ",");
  else
    fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

void tsr_metrics_step(tsr_metrics *mt, const tsr_step_metrics *s) {
  if (!mt) return;
  FILE *f = mt->f;
  fprintf(f, "{\"step\":%lld,", (long long)s->step);
  num(f, "loss", s->loss, 0);
  num(f, "lr", s->lr, 0);
  num(f, "grad_norm", s->grad_norm, 0);
  fprintf(f, "\"tokens\":%lld,", (long long)s->tokens);
  num(f, "tokens_per_s", s->tokens_per_s, 0);
  num(f, "mfu", s->mfu >= 0 ? s->mfu : NAN, 0);
  fprintf(f, "\"mem_bytes\":%lld,", (long long)s->mem_bytes);
  num(f, "step_ms", s->step_ms, 0);
  num(f, "forward_ms", s->forward_ms, 0);
  num(f, "backward_ms", s->backward_ms, 0);
  num(f, "optimizer_ms", s->optimizer_ms, 0);
  if (s->loss_scale > 0) num(f, "loss_scale", s->loss_scale, 0);
  fprintf(f, "\"skipped\":%lld,\"step_skipped\":%d,", (long long)s->skipped, s->step_skipped);
  if (s->n_sets > 0) {
    fprintf(f, "\"samples\":{");
    for (int i = 0; i < s->n_sets; i++) /* the deck's names need no escaping */
      fprintf(f, "%s\"%s\":%lld", i ? "," : "", s->set_names[i], (long long)s->set_samples[i]);
    fprintf(f, "},");
  }
  end_record(f);
}

void tsr_metrics_eval(tsr_metrics *mt, int64_t step, double val_loss) {
  tsr_metrics_eval_sets(mt, step, val_loss, 0, NULL, NULL);
}

void tsr_metrics_eval_sets(tsr_metrics *mt, int64_t step, double val_loss, int n,
                           const char *const *names, const double *losses) {
  if (!mt) return;
  fprintf(mt->f, "{\"step\":%lld,", (long long)step);
  num(mt->f, "val_loss", val_loss, 0);
  if (n > 0) {
    fprintf(mt->f, "\"val_losses\":{");
    for (int i = 0; i < n; i++) {
      char key[96];
      snprintf(key, sizeof key, "%s", names[i]);
      num(mt->f, key, losses[i], i == n - 1);
    }
    fprintf(mt->f, "},");
  }
  end_record(mt->f);
}

/* The record up to its detail, without the closing quote. */
static void event_start(FILE *f, int64_t step, const char *what, const char *detail) {
  fprintf(f, "{\"step\":%lld,\"event\":\"%s\",\"detail\":\"", (long long)step, what);
  for (const char *c = detail; *c; c++) { /* JSON string escape */
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if ((unsigned char)*c < 0x20)
      fprintf(f, "\\u%04x", (unsigned char)*c);
    else
      fputc(*c, f);
  }
  fprintf(f, "\",");
}

void tsr_metrics_event(tsr_metrics *mt, int64_t step, const char *what, const char *detail) {
  if (!mt) return;
  event_start(mt->f, step, what, detail);
  end_record(mt->f);
}

void tsr_metrics_checkpoint(tsr_metrics *mt, int64_t step, int async, double blocked_s,
                            double write_s) {
  if (!mt) return;
  char detail[64];
  snprintf(detail, sizeof detail, "%.3f s", write_s);
  event_start(mt->f, step, "checkpoint", detail);
  fprintf(mt->f, "\"async\":%s,", async ? "true" : "false");
  num(mt->f, "blocked_s", blocked_s, 0);
  num(mt->f, "write_s", write_s, 0);
  end_record(mt->f);
}
