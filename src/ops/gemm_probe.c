/* gemm_probe.c — the GEMM rate of this rank (gemm_probe.h). */
#include "gemm_probe.h"

#include <stdlib.h>

#include "core/dtype.h"
#include "ops.h"
#include "core/util.h"

/* The probe's buffers: op memory on a device, plain host memory on the CPU (outside the
 * counted allocations, like the planner's figures). */
static void *probe_alloc(size_t n, tsr_dtype dt) {
  return tsr_ops_on_device() ? tsr_ops_alloc(n, tsr_dtype_size(dt))
                             : malloc(n * tsr_dtype_size(dt));
}
static void probe_free(void *p) {
  if (tsr_ops_on_device())
    tsr_ops_free(&p);
  else
    free(p);
}

/* The probe's product y[n, out] = x[n, in] w[out, in]^T: a GPU needs one big enough to
 * fill it; TSR_GEMM_PROBE_N shrinks it (the emulated-GPU tests, where a GEMM is a plain
 * loop). */
static void probe_shape(int *n, int *in, int *out) {
  const char *probe = getenv("TSR_GEMM_PROBE_N");
  const int dev = tsr_ops_on_device();
  *n = probe && atoi(probe) > 0 ? atoi(probe) : dev ? 4096 : 256;
  *in = *out = dev ? *n : 2 * *n;
}

/* Values i % period * 0.01 stored in dt at op memory dst (rounded on the host, copied). */
static void probe_fill(void *dst, tsr_dtype dt, size_t n, int period) {
  void *h = malloc(n * tsr_dtype_size(dt));
  if (!h) return;
  for (size_t i = 0; i < n; i++) tsr_store(dt, h, i, (float)(i % (size_t)period) * 0.01f);
  if (h != dst) tsr_ops_copy(dst, h, n * tsr_dtype_size(dt));
  tsr_ops_sync();
  free(h);
}

double tsr_gemm_probe_rate(tsr_dtype dt) {
  int n, in, out;
  probe_shape(&n, &in, &out);
  const char *probe = getenv("TSR_GEMM_PROBE_N");
  const int dev = tsr_ops_on_device();
  void *x = probe_alloc((size_t)n * in, dt), *w = probe_alloc((size_t)out * in, dt);
  void *y = probe_alloc((size_t)n * out, dt);
  double best = 0.0;
  if (x && w && y) {
    probe_fill(x, dt, (size_t)n * in, 7);
    probe_fill(w, dt, (size_t)out * in, 5);
    /* the first calls wake threads and touch pages: take the best of >= 30 calls, 0.1 s
     * (on a device: each call timed to its completion) */
    const double start = tsr_now();
    const int min_calls = dev && probe ? 3 : 30;
    for (int r = 0; r < min_calls || (tsr_now() - start < 0.1 && r < 1000); r++) {
      const double t0 = tsr_now();
      tsr_ops_matmul_fwd(dt, y, x, w, NULL, n, in, out);
      tsr_ops_sync();
      const double dt_s = tsr_now() - t0;
      if (dt_s > 0 && 2.0 * n * in * out / dt_s > best) best = 2.0 * n * in * out / dt_s;
    }
  }
  probe_free(x);
  probe_free(w);
  probe_free(y);
  tsr_ops_mem_reset_peak(); /* the probe is not the run's memory */
  return best;
}

