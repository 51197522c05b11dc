/* backend.c — the CUDA device backend (backend.h): its memory, the reserve of scratch,
 * opening and closing it, and the backend tables generated from ops_list.h (plain, and
 * profiled).  The ops themselves live in the .cu files, one kernel family each; the device
 * context they share and the profiler are context.c's. */
#include "backend.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#ifdef TSR_HAVE_CUDNN
#include "sdpa_graphs.h"
#endif
#include "core/util.h"

static struct {
  size_t live_bytes, peak_bytes; /* op memory handed out */
  int oom;                       /* an allocation did not fit (status: TSR_ERR_INPUT) */
  struct alloc_rec {
    void *p;
    size_t bytes;
  } *allocs; /* live allocations (their sizes) */
  int n_allocs, cap_allocs;
  double t_open;
} mem;

/* A failed runtime call of this file is reported here and fails the backend. */
static void fail_rt(cudaError_t e, const char *call, int line) {
  tsr_errorf_at(__FILE__, line, "cuda", "%s: CUDA error %s: %s", call, cudaGetErrorName(e),
                cudaGetErrorString(e));
  tsr_cuda_ctx.failed = 1;
}
#define RT(expr)                                               \
  do {                                                         \
    cudaError_t rt_e_ = (expr);                                \
    if (rt_e_ != cudaSuccess) fail_rt(rt_e_, #expr, __LINE__); \
  } while (0)

/* ---------------------------------------------------------------- memory */

/* What to change in the deck when device memory runs out (exit code 2: bad input). */
static const char oom_keys[] =
    "train.micro_batch (fewer sequences at once), train.recompute = 'selective' or 'full', "
    "parallel.zero_stage (3 shards the parameters too), parallel.tp or parallel.pp (more "
    "GPUs per model copy), model.seq_len; `tessera plan DECK` sizes a layout before a run";

/* bytes as GiB, or MiB below one GiB, into buf */
static const char *human(char *buf, size_t len, size_t bytes) {
  if (bytes >= ((size_t)1 << 30))
    snprintf(buf, len, "%.2f GiB", bytes / 1073741824.0);
  else
    snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

/* An allocation that does not fit: said once, with the numbers, and the backend fails
 * with TSR_ERR_INPUT (the deck asks for more than the GPU has). */
static void out_of_memory(size_t bytes, const char *what, cudaError_t e) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
  cudaGetLastError();
  char h[5][32];
  tsr_error("cuda: out of device memory on GPU %d: %s asks for %zu bytes (%s), %zu bytes (%s) "
            "are free of %s (%s); this rank holds %s of op memory and %s of scratch and "
            "workspaces.  Shrink it with %s",
            c->device, what, bytes, human(h[0], 32, bytes), free_b, human(h[1], 32, free_b),
            human(h[2], 32, total_b), cudaGetErrorString(e), human(h[3], 32, mem.live_bytes),
            human(h[4], 32, c->scratch_bytes + c->attn_ws_bytes + c->lt_ws_bytes), oom_keys);
  c->failed = 1;
  mem.oom = 1;
}

/* Op memory: device memory (cudaMalloc), zeroed on the device.  The host never touches
 * it but through the copy op (tsr_ops_copy); an allocation beyond the device's free
 * memory is refused before it is asked for. */
static void *d_alloc(size_t bytes) {
  void *p = NULL;
  tsr_cuda_context *c = &tsr_cuda_ctx;
  if (c->failed) return NULL;
  const size_t b = bytes ? bytes : 1;
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e == cudaSuccess && b > free_b) e = cudaErrorMemoryAllocation;
  else e = cudaMalloc(&p, b);
  if (e == cudaErrorMemoryAllocation) {
    out_of_memory(b, "an op buffer", e);
    return NULL;
  }
  if (e != cudaSuccess) { /* not the deck's doing: a failure of the device (sticky error) */
    fail_rt(e, "cudaMalloc of an op buffer", __LINE__);
    cudaGetLastError();
    return NULL;
  }
  RT(cudaMemsetAsync(p, 0, b, c->stream));
  if (mem.n_allocs == mem.cap_allocs) {
    const int cap = mem.cap_allocs ? 2 * mem.cap_allocs : 256;
    struct alloc_rec *a = realloc(mem.allocs, (size_t)cap * sizeof *a);
    if (!a) {
      tsr_error("cuda: out of host memory for the allocation table");
      cudaFree(p);
      return NULL;
    }
    mem.allocs = a;
    mem.cap_allocs = cap;
  }
  mem.allocs[mem.n_allocs++] = (struct alloc_rec){p, b};
  mem.live_bytes += b;
  if (mem.live_bytes > mem.peak_bytes) mem.peak_bytes = mem.live_bytes;
  return c->failed ? NULL : p;
}

static void d_free(void *p) {
  if (!p) return;
  RT(cudaStreamSynchronize(tsr_cuda_ctx.stream)); /* nothing queued may still use it */
  if (tsr_cuda_ctx.copy_stream) RT(cudaStreamSynchronize(tsr_cuda_ctx.copy_stream));
  RT(cudaFree(p));
  for (int i = 0; i < mem.n_allocs; i++)
    if (mem.allocs[i].p == p) {
      mem.live_bytes -= mem.allocs[i].bytes;
      mem.allocs[i] = mem.allocs[--mem.n_allocs];
      break;
    }
}

/* page-locked host memory: copies between it and the device run at full speed */
static void *d_host_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    tsr_error("cuda: cannot allocate %zu bytes of page-locked host memory: %s", bytes,
              cudaGetErrorString(e));
    cudaGetLastError();
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

static void d_host_free(void *p) {
  if (!p) return;
  RT(cudaStreamSynchronize(tsr_cuda_ctx.stream)); /* no copy queued may still use it */
  if (tsr_cuda_ctx.copy_stream) RT(cudaStreamSynchronize(tsr_cuda_ctx.copy_stream));
  RT(cudaFreeHost(p));
}

/* ---------------------------------------------------------------- the copy queue
 * tsr_ops_copy_async: a copy on the copy stream behind a fence recorded on the ops'
 * stream (it starts once everything queued there so far is done), with the caller's event
 * recorded after it; tsr_ops_event_wait makes the ops' stream wait for that event.  An
 * event is recorded once when it is made, so that a wait on one never used is a no-op. */
static void *d_event_create(void) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  cudaEvent_t e = NULL;
  if (c->failed) return NULL;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r != cudaSuccess) {
    fail_rt(r, "cudaEventCreateWithFlags", __LINE__);
    return NULL;
  }
  RT(cudaEventRecord(e, c->stream));
  return c->failed ? NULL : e;
}

static void d_event_destroy(void *ev) {
  if (!ev) return;
  if (tsr_cuda_ctx.copy_stream) RT(cudaStreamSynchronize(tsr_cuda_ctx.copy_stream));
  RT(cudaEventDestroy((cudaEvent_t)ev));
}

static void d_copy_async(void *dst, const void *src, size_t bytes, void *ev) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  if (c->failed || !bytes) return;
  RT(cudaEventRecord(c->fence, c->stream));
  RT(cudaStreamWaitEvent(c->copy_stream, c->fence, 0));
  RT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->copy_stream));
  if (ev) RT(cudaEventRecord((cudaEvent_t)ev, c->copy_stream));
}

static void d_event_wait(void *ev) {
  if (tsr_cuda_ctx.failed || !ev) return;
  RT(cudaStreamWaitEvent(tsr_cuda_ctx.stream, (cudaEvent_t)ev, 0));
}

static void d_event_sync(void *ev) {
  if (tsr_cuda_ctx.failed || !ev) return;
  RT(cudaEventSynchronize((cudaEvent_t)ev));
}

static size_t d_mem_bytes(int what) {
  if (what == 2) mem.peak_bytes = mem.live_bytes;
  return (what == 1 ? mem.peak_bytes : mem.live_bytes) + tsr_cuda_ctx.scratch_bytes +
         tsr_cuda_ctx.attn_ws_bytes;
}

static void d_copy(void *dst, const void *src, size_t bytes) {
  if (tsr_cuda_ctx.failed || !bytes || dst == src) return;
  RT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, tsr_cuda_ctx.stream));
  /* ops.h: a copy from host memory is done when it returns.  From pageable memory the
   * runtime returns once it has staged the bytes; from page-locked memory it returns at
   * once, so wait for it */
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeHost)
    RT(cudaStreamSynchronize(tsr_cuda_ctx.stream)); /* (unregistered memory: no error) */
}

static void d_zero(void *dst, size_t bytes) {
  if (tsr_cuda_ctx.failed || !bytes) return;
  RT(cudaMemsetAsync(dst, 0, bytes, tsr_cuda_ctx.stream));
}

static void d_sync(void) {
  if (tsr_cuda_ctx.failed) return;
  RT(cudaStreamSynchronize(tsr_cuda_ctx.stream));
  if (tsr_cuda_ctx.copy_stream) RT(cudaStreamSynchronize(tsr_cuda_ctx.copy_stream));
}

static int d_status(void) {
  if (!tsr_cuda_ctx.failed) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail_rt(e, "a queued kernel", __LINE__);
  }
  return !tsr_cuda_ctx.failed ? 0 : mem.oom ? TSR_ERR_INPUT : TSR_ERR;
}

/* *buf grown to hold `bytes` (never shrunk) */
static int grow(void **buf, size_t *have, size_t bytes, const char *what) {
  if (bytes <= *have) return 0;
  if (*buf) RT(cudaFree(*buf));
  *buf = NULL;
  *have = 0;
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e == cudaSuccess && bytes > free_b) e = cudaErrorMemoryAllocation;
  else e = cudaMalloc(buf, bytes);
  if (e == cudaErrorMemoryAllocation) {
    out_of_memory(bytes, what, e);
    return TSR_ERR_INPUT;
  }
  if (e != cudaSuccess) {
    fail_rt(e, what, __LINE__);
    cudaGetLastError();
    return TSR_ERR;
  }
  *have = bytes;
  return 0;
}

/* The scratch for the largest of every family's needs at shapes *s, and cuDNN attention's
 * workspace where it was asked for on 16-bit storage; grown, never shrunk. */
static int d_reserve(const tsr_ops_shapes *s) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  int (*const need[])(const tsr_ops_shapes *, size_t *) = {
      tsr_cuda_scratch_gemm,  tsr_cuda_scratch_embedding, tsr_cuda_scratch_norms,
      tsr_cuda_scratch_crossent, tsr_cuda_scratch_optim, tsr_cuda_scratch_attention};
  TSR_CHECK(s->dt == TSR_F32 || s->dt == TSR_BF16 || s->dt == TSR_F16, TSR_ERR,
            "cuda: reserve for storage type %d", (int)s->dt);
  size_t bytes = 0;
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
    size_t b = 0;
    TSR_CALL(need[i](s, &b));
    if (b > bytes) bytes = b;
  }
  const size_t before = c->scratch_bytes;
  TSR_CALL(grow(&c->scratch, &c->scratch_bytes, bytes, "kernel scratch"));
  if (c->scratch_bytes > before && tsr_rank() == 0) /* tessera plan's reserved_gb covers it */
    tsr_log("cuda: kernel scratch %.3f MB and cuBLASLt workspace %.0f MiB, allocated once "
            "(tessera plan counts them in hardware.reserved_gb)",
            (double)c->scratch_bytes / 1e6, (double)c->lt_ws_bytes / (1 << 20));
  if (c->attention == TSR_ATT_CUDNN && s->dt != TSR_F32) {
    const size_t ws = tsr_ops_cudnn_attention_workspace_bytes(s), had = c->attn_ws_bytes;
    TSR_CALL(grow(&c->attn_ws, &c->attn_ws_bytes, ws, "cuDNN attention workspace"));
    if (c->attn_ws_bytes > had && tsr_rank() == 0)
      tsr_log("cuda: cuDNN attention workspace %.3f MB, allocated once "
              "(tsr_ops_cudnn_attention_workspace_bytes)", (double)c->attn_ws_bytes / 1e6);
  }
  c->shapes = *s;
  tsr_cuda_attention_use(c->attention); /* its decisions may change: made again */
  return 0;
}

static void d_close(void) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  if (c->stream) cudaStreamSynchronize(c->stream);
  if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
  tsr_cuda_prof_print(mem.t_open);
#ifdef TSR_HAVE_CUDNN
  tsr_sdpa_graphs_close();
#endif
  if (c->scratch) cudaFree(c->scratch);
  if (c->attn_ws) cudaFree(c->attn_ws);
  if (c->result) cudaFree(c->result);
  if (c->lt_ws) cudaFree(c->lt_ws);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->fence) cudaEventDestroy(c->fence);
  if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(mem.allocs);
  memset(&mem, 0, sizeof mem);
  memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- the tables */

/* the profiled forms of the ops: the op's name is its line's name */
#define TSR_OP(name, params, args) \
  static void prof_##name params { \
    tsr_cuda_prof_scope sc;         \
    tsr_cuda_prof_begin(&sc, #name); \
    tsr_cuda_##name args;           \
    tsr_cuda_prof_end(&sc);         \
  }
#define TSR_OP_RET(type, name, params, args) \
  static type prof_##name params {           \
    tsr_cuda_prof_scope sc;                   \
    tsr_cuda_prof_begin(&sc, #name);          \
    const type r_ = tsr_cuda_##name args;     \
    tsr_cuda_prof_end(&sc);                   \
    return r_;                               \
  }
#include "ops/ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET

static void prof_copy(void *dst, const void *src, size_t bytes) {
  tsr_cuda_prof_scope sc;
  tsr_cuda_prof_begin(&sc, "copy");
  d_copy(dst, src, bytes);
  tsr_cuda_prof_end(&sc);
}
static void prof_zero(void *dst, size_t bytes) {
  tsr_cuda_prof_scope sc;
  tsr_cuda_prof_begin(&sc, "zero");
  d_zero(dst, bytes);
  tsr_cuda_prof_end(&sc);
}

#define BACKEND_MEMORY                                                                      \
  .name = "cuda", .alloc = d_alloc, .free = d_free, .sync = d_sync, .status = d_status,     \
  .reserve = d_reserve, .close = d_close, .mem_bytes = d_mem_bytes,                         \
  .host_alloc = d_host_alloc, .host_free = d_host_free, .event_create = d_event_create,     \
  .event_destroy = d_event_destroy, .copy_async = d_copy_async, .event_wait = d_event_wait, \
  .event_sync = d_event_sync

static const tsr_ops_backend table = {
    BACKEND_MEMORY,
    .copy = d_copy,
    .zero = d_zero,
#define TSR_OP(name, params, args) .name = tsr_cuda_##name,
#define TSR_OP_RET(type, name, params, args) .name = tsr_cuda_##name,
#include "ops/ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET
};

static const tsr_ops_backend table_profiled = {
    BACKEND_MEMORY,
    .copy = prof_copy,
    .zero = prof_zero,
#define TSR_OP(name, params, args) .name = prof_##name,
#define TSR_OP_RET(type, name, params, args) .name = prof_##name,
#include "ops/ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET
};

/* ---------------------------------------------------------------- opening */

void *tsr_cuda_ops_stream(void) { return tsr_cuda_ctx.stream; }
int tsr_cuda_ops_device(void) { return tsr_cuda_ctx.device; }

int tsr_cuda_is_device_memory(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice;
}

/* The cuBLASLt workspace: enough for the heuristics' split-K and stream-K choices. */
#define LT_WORKSPACE ((size_t)32 << 20)

int tsr_cuda_ops_open_device(int device, const tsr_ops_backend **b) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  *b = NULL;
  memset(c, 0, sizeof *c);
  memset(&mem, 0, sizeof mem);
  c->device = device;
  c->shapes.deterministic = 1; /* until a reserve says otherwise */
  int rc = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreate(&c->stream);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->fence, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMalloc((void **)&c->result, sizeof(double) * TSR_CUDA_RESULTS);
  const int result_ok = e == cudaSuccess;
  if (e == cudaSuccess) e = cudaMalloc(&c->lt_ws, LT_WORKSPACE);
  if (e == cudaErrorMemoryAllocation) {
    out_of_memory(result_ok ? LT_WORKSPACE : sizeof(double) * TSR_CUDA_RESULTS,
                  result_ok ? "the cuBLASLt workspace" : "the device's result scalars", e);
    rc = TSR_ERR_INPUT;
  } else if (e != cudaSuccess) {
    tsr_error("cuda: setting up GPU %d: %s", device, cudaGetErrorString(e));
    cudaGetLastError();
    rc = TSR_ERR;
  } else {
    c->lt_ws_bytes = LT_WORKSPACE;
    const cublasStatus_t s = cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      tsr_error("cuda: cublasLtCreate: cuBLAS error %d: %s", (int)s, cublasGetStatusString(s));
      c->lt = NULL;
      rc = TSR_ERR;
    }
  }
  /* attention on 16-bit storage (attention.cu): cuDNN's fused attention (sdpa_cudnn.cpp),
   * the default where it was built, or our mma.sync tensor-core kernels, the default
   * otherwise (and where cuDNN declines a shape) */
#ifdef TSR_HAVE_CUDNN
  const int att_default = TSR_ATT_CUDNN;
#define ATT_DEFAULT "cudnn"
#else
  const int att_default = TSR_ATT_MMA;
#define ATT_DEFAULT "mma"
#endif
  const char *ak = getenv("TSR_CUDA_ATTENTION");
  if (ak && !strcmp(ak, "wmma")) {
    tsr_error("TSR_CUDA_ATTENTION='wmma': the WMMA attention kernels were removed (slower "
              "than the mma.sync kernels and cuDNN's); expected 'cudnn' or 'mma' (the "
              "default here: '" ATT_DEFAULT "')");
    rc = TSR_ERR;
  } else if (ak && *ak && strcmp(ak, "mma") && strcmp(ak, "cudnn")) {
    tsr_error("TSR_CUDA_ATTENTION='%s': expected 'cudnn' or 'mma' (the default here: '"
              ATT_DEFAULT "')", ak);
    rc = TSR_ERR;
  }
#undef ATT_DEFAULT
  c->attention = !ak || !*ak            ? att_default
                 : !strcmp(ak, "cudnn") ? TSR_ATT_CUDNN
                                        : TSR_ATT_MMA;
#ifndef TSR_HAVE_CUDNN
  if (c->attention == TSR_ATT_CUDNN) {
    tsr_error("TSR_CUDA_ATTENTION=cudnn: this build has no cuDNN attention (configure found "
              "no cuDNN 9 with its frontend headers: run tools/fetch-cudnn-frontend.sh and "
              "configure again)");
    rc = TSR_ERR;
  }
#endif
  if (rc) {
    d_close();
    return rc;
  }
  tsr_cuda_attention_use(c->attention);
  const char *pe = getenv("TSR_CUDA_PROFILE");
  c->profile = pe && *pe && strcmp(pe, "0");
  mem.t_open = tsr_now();
  *b = c->profile ? &table_profiled : &table;
  return 0;
}
