/* ops.c — the dispatch of ops.h: each op runs on the installed device backend, or on the
 * host backend (the CPU kernels of src/cpu/, installed by tsr_cpu_open) when there is
 * none.  The op functions are generated from ops_list.h; the memory functions are written
 * out below.  This file knows the backends only as tables (ops_backend.h). */
#include "ops.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops_backend.h"
#include "core/util.h"

static const tsr_ops_backend *host_backend, *dev;
tsr_ops_device_opener tsr_ops_cuda_open;

void tsr_ops_set_backend(const tsr_ops_backend *b) { dev = b; }
void tsr_ops_set_host(const tsr_ops_backend *b) { host_backend = b; }
int tsr_ops_on_device(void) { return dev != NULL; }

/* The backend an op runs on: the device's, else the host's; an op called before either
 * is installed is a bug of the caller, stopped here rather than at a NULL call. */
static const tsr_ops_backend *no_backend(void) {
  tsr_error("an op was called with no backend installed (tsr_cpu_open first)");
  abort();
}
static inline const tsr_ops_backend *backend(void) {
  return dev ? dev : host_backend ? host_backend : no_backend();
}
/* ---- the ops ---- */
#define TSR_OP(name, params, args) \
  void tsr_ops_##name params { backend()->name args; }
#define TSR_OP_RET(type, name, params, args) \
  type tsr_ops_##name params { return backend()->name args; }
#include "ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET

void tsr_ops_host_adamw(float *p, float *m, float *v, const float *g, long n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, long t,
                        float grad_scale, void *out, tsr_dtype out_dt) {
  (host_backend ? host_backend : no_backend())
      ->adamw(p, m, v, g, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale, out, out_dt);
}
void tsr_ops_host_cast(tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src,
                       long n_elem) {
  (host_backend ? host_backend : no_backend())->cast(dst_dt, dst, src_dt, src, n_elem);
}
double tsr_ops_host_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  return (host_backend ? host_backend : no_backend())->sumsq_ranges(x, r, n_ranges);
}

/* ---- memory ---- */
size_t tsr_ops_mem_bytes(void) { return dev ? dev->mem_bytes(0) : tsr_mem_bytes(); }
size_t tsr_ops_mem_peak_bytes(void) { return dev ? dev->mem_bytes(1) : tsr_mem_peak_bytes(); }
void tsr_ops_mem_reset_peak(void) {
  if (dev) dev->mem_bytes(2);
}

void *tsr_ops_alloc(size_t count, size_t size) {
  if (!dev) return tsr_calloc(count, size);
  if (count != 0 && size > SIZE_MAX / count) {
    tsr_error("%s: allocation of %zu x %zu bytes overflows", dev->name, count, size);
    return NULL;
  }
  return dev->alloc(count * size);
}
void tsr_ops_free_(void **p) {
  if (!p || !*p) return;
  if (dev)
    dev->free(*p);
  else
    tsr_free_(p);
  *p = NULL;
}
void *tsr_ops_host_alloc(size_t bytes) {
  if (dev && dev->host_alloc) return dev->host_alloc(bytes);
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) {
    tsr_error("out of host memory allocating %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, bytes); /* every page touched now, not at the first copy */
  return p;
}
void tsr_ops_host_free_(void **p) {
  if (!p || !*p) return;
  if (dev && dev->host_free)
    dev->host_free(*p);
  else
    free(*p);
  *p = NULL;
}
void tsr_ops_copy(void *dst, const void *src, size_t bytes) {
  if (dev)
    dev->copy(dst, src, bytes);
  else if (dst != src && bytes)
    memmove(dst, src, bytes);
}
void tsr_ops_read(void *host, const void *op, size_t bytes) {
  tsr_ops_copy(host, op, bytes);
  tsr_ops_sync();
  if (tsr_ops_status() != 0 && bytes) memset(host, 0, bytes); /* a failed device: no copy */
}
void tsr_ops_zero(void *dst, size_t bytes) {
  if (dev)
    dev->zero(dst, bytes);
  else if (bytes)
    memset(dst, 0, bytes);
}
/* On the host an event is a token: every copy is done when it returns. */
static char host_event;
void *tsr_ops_event_create(void) {
  return dev && dev->event_create ? dev->event_create() : &host_event;
}
void tsr_ops_event_destroy_(void **ev) {
  if (!ev || !*ev) return;
  if (dev && dev->event_destroy) dev->event_destroy(*ev);
  *ev = NULL;
}
void tsr_ops_copy_async(void *dst, const void *src, size_t bytes, void *ev) {
  if (dev && dev->copy_async)
    dev->copy_async(dst, src, bytes, ev);
  else
    tsr_ops_copy(dst, src, bytes);
}
void tsr_ops_event_wait(void *ev) {
  if (dev && dev->event_wait && ev) dev->event_wait(ev);
}
void tsr_ops_event_sync(void *ev) {
  if (dev && dev->event_sync && ev) dev->event_sync(ev);
}
void tsr_ops_sync(void) {
  if (dev) dev->sync();
}
int tsr_ops_status(void) { return dev ? dev->status() : 0; }
int tsr_ops_reserve(const tsr_ops_shapes *s) { return backend()->reserve(s); }
