/* kernels_util.c — the utilities of tests/cuda/test_kernels (kernels_util.h): the backend
 * opened and reserved per test, tensors on both sides, and the checks, which count into
 * one summary for both of the test's files. */
#include "kernels_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "core/util.h"

static uint64_t g_seed, g_next;
const tsr_ops_backend *kb;

void kseed(uint64_t seed) { g_seed = seed, g_next = 0; }
int ksummary(const char *name) { return tu_summary(name); }


void kcheck(int ok, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TU_CHECK(ok, "%s", msg);
}

double tol_of(tsr_dtype dt) {
  return dt == TSR_BF16 ? TOL_BF16 : dt == TSR_F16 ? TOL_F16 : TOL_F32;
}

float urand(float lo, float hi) {
  return lo + (hi - lo) * (float)tsr_rand_uniform(g_seed, g_next++);
}

void kreserve(tsr_ops_shapes s) {
  if (kb) kb->close();
  kb = NULL;
  if (tsr_cuda_ops_open_device(0, &kb) != 0 || !kb) {
    printf("FAIL: the backend does not open\n");
    exit(1);
  }
  if (kb->reserve(&s) != 0 || tsr_cpu_reserve(&s) != 0) {
    printf("FAIL: reserve for rows %ld cols %ld\n", s.rows, s.cols);
    exit(1);
  }
}

void ksync(const char *after) {
  kb->sync();
  if (kb->status() != 0) kcheck(0, "%s: the backend failed (status TSR_ERR)", after);
}

tsr_ops_shapes shapes_of(tsr_dtype dt) {
  tsr_ops_shapes s;
  memset(&s, 0, sizeof s);
  s.dt = dt;
  s.deterministic = 1;
  return s;
}

void *dmalloc(size_t bytes) {
  void *p = NULL;
  CUDA_CK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}
void *hmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) exit(1);
  return p;
}

int32_t *docs_make(int n, int T, int every, int32_t **dev) {
  int32_t *d = hmalloc((size_t)n * sizeof(int32_t));
  const int B = n / T;
  for (int b = 0; b < B; b++) {
    int start = 0;
    for (int t = 0; t < T; t++) {
      const int cut = urand(0.0f, 1.0f) * every < 1.0f ||
                      (b == 0 && (t == 1 || t % 64 == 0 || t == T - 1));
      if (t > 0 && cut && !(B > 1 && b == B - 1)) start = t;
      d[(long)b * T + t] = start;
    }
  }
  if (dev) {
    *dev = dmalloc((size_t)n * sizeof(int32_t));
    CUDA_CK(cudaMemcpy(*dev, d, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  return d;
}
static size_t tb_bytes(const tbuf *t) { return (size_t)t->n * tsr_dtype_size(t->dt); }

void tb_upload(tbuf *t) { CUDA_CK(cudaMemcpy(t->d, t->h, tb_bytes(t), cudaMemcpyHostToDevice)); }
void tb_download(const tbuf *t, void *host) {
  CUDA_CK(cudaStreamSynchronize((cudaStream_t)tsr_cuda_ops_stream()));
  CUDA_CK(cudaMemcpy(host, t->d, tb_bytes(t), cudaMemcpyDeviceToHost));
}
tbuf tb_alloc(tsr_dtype dt, long n) {
  tbuf t = {dt, n, NULL, NULL};
  t.h = hmalloc(tb_bytes(&t));
  t.d = dmalloc(tb_bytes(&t));
  return t;
}
tbuf tb_rand(tsr_dtype dt, long n, float lo, float hi) {
  tbuf t = tb_alloc(dt, n);
  for (long i = 0; i < n; i++) tsr_store(dt, t.h, (size_t)i, urand(lo, hi));
  tb_upload(&t);
  return t;
}
tbuf tb_from(tsr_dtype dt, const float *x, long n) {
  tbuf t = tb_alloc(dt, n);
  for (long i = 0; i < n; i++) tsr_store(dt, t.h, (size_t)i, x[i]);
  tb_upload(&t);
  return t;
}
tbuf tb_out(tsr_dtype dt, long n) { /* all-ones bytes: NaN in every storage type */
  tbuf t = tb_alloc(dt, n);
  memset(t.h, 0xff, tb_bytes(&t));
  CUDA_CK(cudaMemset(t.d, 0xff, tb_bytes(&t) ? tb_bytes(&t) : 1));
  return t;
}
tbuf tb_dup(const tbuf *s) {
  tbuf t = tb_alloc(s->dt, s->n);
  memcpy(t.h, s->h, tb_bytes(s));
  CUDA_CK(cudaMemcpy(t.d, s->d, tb_bytes(s), cudaMemcpyDeviceToDevice));
  return t;
}
void tb_free(tbuf *t) {
  free(t->h);
  if (t->d) CUDA_CK(cudaFree(t->d));
  t->h = t->d = NULL;
}
float tb_get(const tbuf *t, long i) { return tsr_load(t->dt, t->h, (size_t)i); }
void *tb_hat(const tbuf *t, long i) { return tsr_dtype_at(t->h, t->dt, i); }
void *tb_dat(const tbuf *t, long i) { return tsr_dtype_at(t->d, t->dt, i); }

double tb_err(const tbuf *t) {
  void *got = hmalloc(tb_bytes(t));
  tb_download(t, got);
  double max_ref = 0.0, max_diff = 0.0;
  for (long i = 0; i < t->n; i++) {
    const double r = tsr_load(t->dt, t->h, (size_t)i), g = tsr_load(t->dt, got, (size_t)i);
    if (!isfinite(r)) continue; /* untouched poison on both sides */
    if (!isfinite(g)) {
      max_diff = INFINITY;
      break;
    }
    max_diff = fmax(max_diff, fabs(g - r));
    max_ref = fmax(max_ref, fabs(r));
  }
  free(got);
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

void check_close(const char *name, const tbuf *t, double tol) {
  const double e = tb_err(t);
  kcheck(e <= tol, "%-58s %s rel err %.2e (tol %.0e)", name, tsr_dtype_name(t->dt), e, tol);
}
void check_bits(const char *name, const tbuf *t) {
  void *got = hmalloc(tb_bytes(t));
  tb_download(t, got);
  long bad = 0;
  for (size_t i = 0; i < tb_bytes(t); i++) bad += ((char *)got)[i] != ((char *)t->h)[i];
  kcheck(bad == 0, "%-58s %s bitwise the CPU's (%ld bytes differ)", name, tsr_dtype_name(t->dt),
         bad);
  free(got);
}
void check_same_runs(const char *name, const tbuf *a, const tbuf *b) {
  void *x = hmalloc(tb_bytes(a)), *y = hmalloc(tb_bytes(b));
  tb_download(a, x);
  tb_download(b, y);
  kcheck(tb_bytes(a) == tb_bytes(b) && !memcmp(x, y, tb_bytes(a)),
         "%-58s %s deterministic (two runs bitwise)", name, tsr_dtype_name(a->dt));
  free(x), free(y);
}
void check_lse(const char *name, const tbuf *t, double tol) {
  float *got = hmalloc(tb_bytes(t));
  tb_download(t, got);
  double e = 0.0;
  for (long i = 0; i < t->n; i++) {
    const float r = ((const float *)t->h)[i];
    const double d = fabs((double)got[i] - (double)r) / fmax(1.0, fabs((double)r));
    if (isnan(d)) { /* a NaN anywhere fails (a later max would forget it) */
      e = INFINITY;
      break;
    }
    e = fmax(e, d);
  }
  kcheck(e <= tol, "%-58s err %.2e (tol %.0e of max(1, |lse|))", name, e, tol);
  free(got);
}
void check_double(const char *name, const double *d, double ref, double tol) {
  double got = NAN;
  CUDA_CK(cudaStreamSynchronize((cudaStream_t)tsr_cuda_ops_stream()));
  CUDA_CK(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
  const double e = fabs(got - ref) / (fabs(ref) > 0 ? fabs(ref) : 1.0);
  kcheck(isfinite(got) && e <= tol, "%-58s %.10g vs %.10g, rel err %.2e (tol %.0e)", name, got,
         ref, e, tol);
}
