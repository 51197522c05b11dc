/* ops_dev.c — the CUDA device backend: ops.h on a GPU (see ops_dev.h). */
#include "ops_dev.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "ops_cuda.h"
#include "util.h"

#define N_RESULTS 512 /* sums of squares fetched at once (tsr_ops_sumsq_ranges) */
static struct {
  int device;
  cudaStream_t stream;
  tsr_cuda_blas *blas;
  tsr_cuda_scratch ws;
  double *result; /* N_RESULTS device scalars for the functions that return values */
  int failed;
  size_t live_bytes, peak_bytes; /* managed memory handed out */
  struct alloc_rec { void *p; size_t bytes; } *allocs; /* live allocations (their sizes) */
  int n_allocs, cap_allocs;
} g;

/* A failed tsr_cuda_X call has reported itself; a failed runtime call is reported here. */
static void fail_rt(cudaError_t e, const char *call, int line) {
  tsr_errorf_at(__FILE__, line, "ops_dev", "%s: CUDA error %s: %s", call, cudaGetErrorName(e),
                cudaGetErrorString(e));
  g.failed = 1;
}
#define RT(expr)                                                         \
  do {                                                                   \
    cudaError_t rt_e_ = (expr);                                          \
    if (rt_e_ != cudaSuccess) fail_rt(rt_e_, #expr, __LINE__);           \
  } while (0)
/* Queue a kernel unless an earlier call failed (then the ops do nothing). */
#define RUN(call)                                  \
  do {                                             \
    if (!g.failed && (call) != 0) g.failed = 1;    \
  } while (0)

/* ---------------------------------------------------------------- memory */

static void *d_alloc(size_t bytes) {
  void *p = NULL;
  if (g.failed) return NULL;
  const size_t b = bytes ? bytes : 1;
  cudaError_t e = cudaMallocManaged(&p, b, cudaMemAttachGlobal);
  if (e != cudaSuccess) {
    tsr_error("cuda: out of memory allocating %zu bytes of managed memory on GPU %d (%s); %zu "
              "bytes allocated so far",
              bytes, g.device, cudaGetErrorString(e), g.live_bytes);
    cudaGetLastError();
    return NULL;
  }
#if CUDART_VERSION >= 13000
  struct cudaMemLocation loc = {cudaMemLocationTypeDevice, g.device};
  RT(cudaMemAdvise(p, b, cudaMemAdviseSetPreferredLocation, loc));
#else
  RT(cudaMemAdvise(p, b, cudaMemAdviseSetPreferredLocation, g.device));
#endif
  RT(cudaMemsetAsync(p, 0, b, g.stream)); /* zeroed, and first touched on the GPU */
  if (g.n_allocs == g.cap_allocs) {
    const int cap = g.cap_allocs ? 2 * g.cap_allocs : 256;
    struct alloc_rec *a = realloc(g.allocs, (size_t)cap * sizeof *a);
    if (!a) {
      tsr_error("cuda: out of host memory for the allocation table");
      cudaFree(p);
      return NULL;
    }
    g.allocs = a;
    g.cap_allocs = cap;
  }
  g.allocs[g.n_allocs++] = (struct alloc_rec){p, b};
  g.live_bytes += b;
  if (g.live_bytes > g.peak_bytes) g.peak_bytes = g.live_bytes;
  return g.failed ? NULL : p;
}

static void d_free(void *p) {
  if (!p) return;
  RT(cudaStreamSynchronize(g.stream)); /* nothing queued may still use it */
  RT(cudaFree(p));
  for (int i = 0; i < g.n_allocs; i++)
    if (g.allocs[i].p == p) {
      g.live_bytes -= g.allocs[i].bytes;
      g.allocs[i] = g.allocs[--g.n_allocs];
      break;
    }
}

static size_t d_mem_bytes(int what) {
  if (what == 2) g.peak_bytes = g.live_bytes;
  return (what == 1 ? g.peak_bytes : g.live_bytes) + g.ws.bytes;
}

static void d_set_matmul_inputs(int mode) { tsr_cuda_blas_set_inputs(g.blas, mode); }

static void d_copy(void *dst, const void *src, size_t bytes) {
  if (g.failed || !bytes || dst == src) return;
  RT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream));
}

static void d_zero(void *dst, size_t bytes) {
  if (g.failed || !bytes) return;
  RT(cudaMemsetAsync(dst, 0, bytes, g.stream));
}

static void d_sync(void) {
  if (!g.failed) RT(cudaStreamSynchronize(g.stream));
}

static int d_status(void) {
  if (!g.failed) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail_rt(e, "a queued kernel", __LINE__);
  }
  return g.failed ? TSR_ERR : 0;
}

static int d_reserve(const tsr_ops_shapes *s) {
  tsr_cuda_scratch_dims d = {s->rows, s->cols, s->vocab_local, s->attn_bht, s->sumsq_elems};
  size_t bytes = 0;
  TSR_CALL(tsr_cuda_scratch_bytes(&d, &bytes));
  if (bytes <= g.ws.bytes) return 0;
  if (g.ws.base) RT(cudaFree(g.ws.base));
  g.ws.base = NULL;
  g.ws.bytes = 0;
  cudaError_t e = cudaMalloc(&g.ws.base, bytes);
  TSR_CHECK(e == cudaSuccess, TSR_ERR, "cuda: allocating %zu bytes of scratch: %s", bytes,
            cudaGetErrorString(e));
  g.ws.bytes = bytes;
  if (tsr_rank() == 0) /* beside what tessera plan counts: its reserved_gb covers these */
    tsr_log("cuda: kernel scratch %.3f MB and cuBLASLt workspace 32 MiB, allocated once "
            "(tessera plan counts them in hardware.reserved_gb)", (double)bytes / 1e6);
  return 0;
}

static void d_close(void) {
  if (g.stream) cudaStreamSynchronize(g.stream);
  if (g.ws.base) cudaFree(g.ws.base);
  if (g.result) cudaFree(g.result);
  tsr_cuda_blas_destroy(&g.blas);
  if (g.stream) cudaStreamDestroy(g.stream);
  free(g.allocs);
  memset(&g, 0, sizeof g);
}

/* The device scalar the last op computed, copied to the host (the one synchronisation);
 * 0 on success. */
static int fetch(void *host, size_t bytes) {
  if (g.failed) return TSR_ERR;
  RT(cudaMemcpyAsync(host, g.result, bytes, cudaMemcpyDeviceToHost, g.stream));
  RT(cudaStreamSynchronize(g.stream));
  return g.failed ? TSR_ERR : 0;
}
static double fetch_double(void) {
  double h;
  return fetch(&h, sizeof h) ? NAN : h;
}

/* ---------------------------------------------------------------- the ops */

static void d_matmul_fwd(float *y, const float *x, const float *w, const float *bias, int n,
                         int in, int out) {
  RUN(tsr_cuda_matmul_fwd(g.blas, y, x, w, bias, n, in, out, g.stream));
}
static void d_matmul_bwd(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                         const float *w, int n, int in, int out) {
  RUN(tsr_cuda_matmul_bwd(g.blas, dx, dw, dbias, dy, x, w, n, in, out, &g.ws, g.stream));
}
static void d_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int n, int T, int C, int vocab_start,
                            int vocab_local) {
  RUN(tsr_cuda_embedding_fwd(out, tokens, wte, wpe, n, T, C, vocab_start, vocab_local,
                             g.stream));
}
static void d_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int n, int T, int C, int vocab_start, int vocab_local) {
  RUN(tsr_cuda_embedding_bwd(dwte, dwpe, dout, tokens, n, T, C, vocab_start, vocab_local, &g.ws,
                             g.stream));
}
static void d_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int n, int C,
                          float eps) {
  RUN(tsr_cuda_rmsnorm_fwd(out, rstd, x, w, n, C, eps, g.stream));
}
static void d_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                          const float *w, const float *rstd, int n, int C) {
  RUN(tsr_cuda_rmsnorm_bwd(dx, dw, dout, x, w, rstd, n, C, &g.ws, g.stream));
}
static void d_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                            const float *b, int n, int C, float eps) {
  RUN(tsr_cuda_layernorm_fwd(out, mean, rstd, x, w, b, n, C, eps, g.stream));
}
static void d_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int n, int C) {
  RUN(tsr_cuda_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, n, C, &g.ws, g.stream));
}
static void d_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride,
                       float theta) {
  RUN(tsr_cuda_rope_fwd(x, n, T, n_heads, head_dim, stride, theta, g.stream));
}
static void d_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                       float theta) {
  RUN(tsr_cuda_rope_bwd(dx, n, T, n_heads, head_dim, stride, theta, g.stream));
}
static void d_attention_fwd(float *out, float *lse, const float *q, const float *k,
                            const float *v, int B, int T, int H, int KV, int hd, int qkv_stride) {
  RUN(tsr_cuda_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, g.stream));
}
static void d_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v,
                            int B, int T, int H, int KV, int hd, int qkv_stride) {
  RUN(tsr_cuda_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride,
                             &g.ws, g.stream));
}
static void d_swiglu_fwd(float *out, const float *gate_up, int n, int F) {
  RUN(tsr_cuda_swiglu_fwd(out, gate_up, n, F, g.stream));
}
static void d_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n, int F) {
  RUN(tsr_cuda_swiglu_bwd(dgate_up, dout, gate_up, n, F, g.stream));
}
static void d_gelu_fwd(float *out, const float *x, int n_elem) {
  RUN(tsr_cuda_gelu_fwd(out, x, n_elem, g.stream));
}
static void d_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem) {
  RUN(tsr_cuda_gelu_bwd(dx, dout, x, n_elem, g.stream));
}
static void d_add(float *out, const float *a, const float *b, long n_elem) {
  RUN(tsr_cuda_add(out, a, b, n_elem, g.stream));
}
static void d_acc(float *out, const float *a, long n_elem) {
  RUN(tsr_cuda_acc(out, a, n_elem, g.stream));
}
static void d_scale(float *x, float s, long n_elem) {
  RUN(tsr_cuda_scale(x, s, n_elem, g.stream));
}
static double d_xent_fwd_bwd(float *logits, const int32_t *targets, int n, int V, float dloss) {
  RUN(tsr_cuda_xent_fwd_bwd(g.result, logits, targets, n, V, dloss, &g.ws, g.stream));
  return fetch_double();
}
static double d_xent_fwd(const float *logits, const int32_t *targets, int n, int V) {
  RUN(tsr_cuda_xent_fwd(g.result, logits, targets, n, V, &g.ws, g.stream));
  return fetch_double();
}
static void d_xent_local_stats(double *row_max, double *target_logit, const float *logits,
                               const int32_t *targets, int n, int V, int vocab_start) {
  RUN(tsr_cuda_xent_local_stats(row_max, target_logit, logits, targets, n, V, vocab_start,
                                g.stream));
}
static void d_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max, int n,
                                int V) {
  RUN(tsr_cuda_xent_local_sumexp(sumexp, logits, row_max, n, V, g.stream));
}
static double d_xent_rows(const double *row_max, const double *sumexp, const double *target_logit,
                          int n) {
  RUN(tsr_cuda_xent_rows(g.result, row_max, sumexp, target_logit, n, g.stream));
  return fetch_double();
}
/* The _acc forms: the sum lands in a device scalar and is added to *acc on the stream. */
static void d_xent_fwd_bwd_acc(double *acc, double div, float *logits, const int32_t *targets,
                               int n, int V, float dloss) {
  RUN(tsr_cuda_xent_fwd_bwd(g.result, logits, targets, n, V, dloss, &g.ws, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_fwd_acc(double *acc, double div, const float *logits, const int32_t *targets,
                           int n, int V) {
  RUN(tsr_cuda_xent_fwd(g.result, logits, targets, n, V, &g.ws, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_rows_acc(double *acc, double div, const double *row_max, const double *sumexp,
                            const double *target_logit, int n) {
  RUN(tsr_cuda_xent_rows(g.result, row_max, sumexp, target_logit, n, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                        const double *sumexp, int n, int V, int vocab_start, float dloss) {
  RUN(tsr_cuda_xent_grad(logits, targets, row_max, sumexp, n, V, vocab_start, dloss, g.stream));
}
static void d_adamw(float *p, float *m, float *v, const float *grad, long n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, long t, float grad_scale) {
  RUN(tsr_cuda_adamw(p, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                     g.stream));
}
static void d_round_bf16(float *dst, const float *src, long n_elem) {
  RUN(tsr_cuda_round_bf16(dst, src, n_elem, g.stream));
}
static void d_round_fp16(float *dst, const float *src, long n_elem) {
  RUN(tsr_cuda_round_fp16(dst, src, n_elem, g.stream));
}
/* One kernel per range into its own device scalar, one fetch per N_RESULTS ranges; the
 * host adds them in order, as the CPU's loop does. */
static double d_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  double s = 0.0, h[N_RESULTS];
  for (int k0 = 0; k0 < n_ranges; k0 += N_RESULTS) {
    const int n = n_ranges - k0 < N_RESULTS ? n_ranges - k0 : N_RESULTS;
    for (int k = 0; k < n; k++)
      RUN(tsr_cuda_sumsq(g.result + k, x + r[2 * (k0 + k)],
                         (long)(r[2 * (k0 + k) + 1] - r[2 * (k0 + k)]), &g.ws, g.stream));
    if (fetch(h, sizeof(double) * (size_t)n)) return NAN;
    for (int k = 0; k < n; k++) s += h[k];
  }
  return s;
}

static double d_sumsq(const float *x, long n_elem) {
  RUN(tsr_cuda_sumsq(g.result, x, n_elem, &g.ws, g.stream));
  return fetch_double();
}
static int d_all_finite(const float *x, long n_elem) {
  int h;
  RUN(tsr_cuda_all_finite((int *)g.result, x, n_elem, g.stream));
  return fetch(&h, sizeof h) ? 0 : h;
}

static const tsr_ops_backend table = {
    .name = "cuda",
    .mem_bytes = d_mem_bytes,
    .set_matmul_inputs = d_set_matmul_inputs,
    .alloc = d_alloc,
    .free = d_free,
    .copy = d_copy,
    .zero = d_zero,
    .sync = d_sync,
    .status = d_status,
    .reserve = d_reserve,
    .close = d_close,
    .matmul_fwd = d_matmul_fwd,
    .matmul_bwd = d_matmul_bwd,
    .embedding_fwd = d_embedding_fwd,
    .embedding_bwd = d_embedding_bwd,
    .rmsnorm_fwd = d_rmsnorm_fwd,
    .rmsnorm_bwd = d_rmsnorm_bwd,
    .layernorm_fwd = d_layernorm_fwd,
    .layernorm_bwd = d_layernorm_bwd,
    .rope_fwd = d_rope_fwd,
    .rope_bwd = d_rope_bwd,
    .attention_fwd = d_attention_fwd,
    .attention_bwd = d_attention_bwd,
    .swiglu_fwd = d_swiglu_fwd,
    .swiglu_bwd = d_swiglu_bwd,
    .gelu_fwd = d_gelu_fwd,
    .gelu_bwd = d_gelu_bwd,
    .add = d_add,
    .acc = d_acc,
    .scale = d_scale,
    .xent_fwd_bwd = d_xent_fwd_bwd,
    .xent_fwd = d_xent_fwd,
    .xent_local_stats = d_xent_local_stats,
    .xent_local_sumexp = d_xent_local_sumexp,
    .xent_rows = d_xent_rows,
    .xent_grad = d_xent_grad,
    .xent_fwd_bwd_acc = d_xent_fwd_bwd_acc,
    .xent_fwd_acc = d_xent_fwd_acc,
    .xent_rows_acc = d_xent_rows_acc,
    .adamw = d_adamw,
    .round_bf16 = d_round_bf16,
    .round_fp16 = d_round_fp16,
    .sumsq = d_sumsq,
    .sumsq_ranges = d_sumsq_ranges,
    .all_finite = d_all_finite,
};

/* ---------------------------------------------------------------- opening */

void *tsr_cuda_ops_stream(void) { return g.stream; }
int tsr_cuda_ops_device(void) { return g.device; }

int tsr_cuda_is_device_memory(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int tsr_cuda_ops_open(const void *comm_p, const char *mode, int share,
                      const tsr_ops_backend **b) {
  const MPI_Comm comm = *(const MPI_Comm *)comm_p;
  *b = NULL;
  if (!strcmp(mode, "auto")) { /* a GPU on every rank, or the CPU everywhere */
    const int here = tsr_cuda_device_count(NULL, 0) > 0;
    int all = here;
    MPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, comm);
    if (!all) return 0;
  }
  memset(&g, 0, sizeof g);
  TSR_CALL(tsr_cuda_select_device(comm, share, &g.device));
  int rc = 0;
  cudaError_t e = cudaStreamCreate(&g.stream);
  if (e != cudaSuccess) {
    tsr_error("cuda: creating a stream on GPU %d: %s", g.device, cudaGetErrorString(e));
    rc = TSR_ERR;
  }
  if (!rc) rc = tsr_cuda_blas_create(&g.blas, 0);
  if (!rc && (e = cudaMalloc((void **)&g.result, sizeof(double) * N_RESULTS)) != cudaSuccess) {
    tsr_error("cuda: allocating on GPU %d: %s", g.device, cudaGetErrorString(e));
    rc = TSR_ERR;
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, comm);
  if (worst) {
    d_close();
    return worst;
  }
  struct cudaDeviceProp prop;
  if (tsr_rank() == 0 && cudaGetDeviceProperties(&prop, g.device) == cudaSuccess)
    tsr_log("device: cuda, rank 0 on GPU %d (%s, sm_%d%d, %d SMs)%s", g.device, prop.name,
            prop.major, prop.minor, prop.multiProcessorCount,
            share ? "; ranks may share a GPU (run.gpu_share)" : "");
  *b = &table;
  return 0;
}
