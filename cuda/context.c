/* context.c — the device context the CUDA backend's files share (context.h): the context itself,
 * the scratch lookup, and the op profiler that the profiled table of backend.c and the
 * ops' notes (tsr_cuda_prof_note) feed.  Depends on nothing of the backend: the kernel
 * files and backend.c use it, not the other way round. */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "core/util.h"

tsr_cuda_context tsr_cuda_ctx;

void *tsr_cuda_scratch(size_t need, const char *who) {
  if (tsr_cuda_ctx.scratch && need <= tsr_cuda_ctx.scratch_bytes) return tsr_cuda_ctx.scratch;
  tsr_error("cuda: %s needs %zu bytes of scratch, the backend reserved %zu (tsr_ops_reserve "
            "was given smaller shapes than this call's)",
            who, need, tsr_cuda_ctx.scratch_bytes);
  return NULL;
}

/* ---------------------------------------------------------------- op profile
 * With TSR_CUDA_PROFILE=1 the table of profiled wrappers is installed: each op waits for
 * the stream before and after its kernels and adds the time to the line of its name,
 * plus the detail the op gives (tsr_cuda_prof_note: GEMMs one line per shape and type,
 * with their rate); rank 0 prints the table, longest first, when the backend closes.  The
 * waits serialise host and device, so steps run slower than without: the shares are what
 * it is for.  Each line's first call is kept apart (`first ms`): it pays what only the
 * first step does (cuDNN's graphs built, cuBLASLt's heuristics, first touches), so the
 * other calls' time, share and rate are the steady state. */
#define N_PROF 96
static struct prof_rec {
  char name[72];
  double s, flops; /* the calls after the first */
  double first_s;  /* the first call */
  long calls;
} prof[N_PROF];
static int n_prof;
static tsr_cuda_prof_scope *prof_current; /* the scope of the op running now */

void tsr_cuda_prof_begin(tsr_cuda_prof_scope *sc, const char *op) {
  memset(sc, 0, sizeof *sc);
  if (tsr_cuda_ctx.failed) return;
  snprintf(sc->name, sizeof sc->name, "%s", op);
  cudaStreamSynchronize(tsr_cuda_ctx.stream);
  sc->t0 = tsr_now();
  sc->open = 1;
  prof_current = sc;
}

void tsr_cuda_prof_note(double flops, const char *fmt, ...) {
  tsr_cuda_prof_scope *sc = prof_current;
  if (!sc || !sc->open) return;
  const size_t len = strlen(sc->name);
  if (len + 2 < sizeof sc->name) {
    sc->name[len] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->name + len + 1, sizeof sc->name - len - 1, fmt, ap);
    va_end(ap);
  }
  sc->flops = flops;
}

void tsr_cuda_prof_end(tsr_cuda_prof_scope *sc) {
  prof_current = NULL;
  if (!sc->open) return;
  cudaStreamSynchronize(tsr_cuda_ctx.stream);
  const double dt = tsr_now() - sc->t0;
  int k = 0;
  while (k < n_prof && strcmp(prof[k].name, sc->name)) k++;
  if (k == n_prof) { /* a new line; the last one takes every op that finds no room */
    if (n_prof < N_PROF - 1) {
      snprintf(prof[n_prof++].name, sizeof prof[k].name, "%s", sc->name);
    } else {
      k = N_PROF - 1;
      if (n_prof < N_PROF) snprintf(prof[n_prof++].name, sizeof prof[k].name, "(other ops)");
    }
  }
  if (prof[k].calls++ == 0) {
    prof[k].first_s = dt;
    return;
  }
  prof[k].s += dt;
  prof[k].flops += k == N_PROF - 1 ? 0 : sc->flops; /* no rate for a mix of ops */
}

static int prof_cmp(const void *a, const void *b) {
  const double x = ((const struct prof_rec *)a)->s, y = ((const struct prof_rec *)b)->s;
  return (x < y) - (x > y);
}
void tsr_cuda_prof_print(double t_open) {
  if (!n_prof || tsr_rank() != 0) return;
  double total = 0, first = 0;
  for (int k = 0; k < n_prof; k++) total += prof[k].s, first += prof[k].first_s;
  qsort(prof, (size_t)n_prof, sizeof prof[0], prof_cmp);
  tsr_log("cuda profile (TSR_CUDA_PROFILE): %.3f s in ops of %.3f s since the device opened: "
          "%.3f s in each line's first call, %.3f s in the calls after it (ms, share, rate)",
          total + first, tsr_now() - t_open, first, total);
  tsr_log("  %-56s %8s %10s %6s %9s %10s", "op", "calls", "ms", "share", "TFLOP/s", "first ms");
  for (int k = 0; k < n_prof; k++) {
    char rate[16] = "";
    if (prof[k].flops > 0 && prof[k].s > 0)
      snprintf(rate, sizeof rate, "%9.1f", prof[k].flops / prof[k].s / 1e12);
    tsr_log("  %-56s %8ld %10.2f %5.1f%% %9s %10.2f", prof[k].name, prof[k].calls,
            prof[k].s * 1e3, total > 0 ? 100 * prof[k].s / total : 0.0, rate,
            prof[k].first_s * 1e3);
  }
  n_prof = 0;
}

