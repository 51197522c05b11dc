/* ops_dev.c — the CUDA device backend: ops.h on a GPU (see ops_dev.h). */
#include "ops_dev.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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
  tsr_bf16 *staging;   /* bf16 copies of the GEMM inputs (TSR_MATMUL_BF16; tsr_ops_staging_elems) */
  long staging_elems;
  long gemm_staged, gemm_unstaged; /* bf16-mode products with/without room in the staging */
  double *result; /* N_RESULTS device scalars for the functions that return values */
  int failed;
  size_t live_bytes, peak_bytes; /* managed memory handed out */
  struct alloc_rec { void *p; size_t bytes; } *allocs; /* live allocations (their sizes) */
  int n_allocs, cap_allocs;
  int matmul_inputs; /* TSR_MATMUL_*: bf16 also puts attention on the tensor cores */
  int attn_key[5];      /* B, T, H, KV, hd attention was last decided for (B 0: none) */
  int attn_how;         /* and how: ATT_* */
  int attn_cudnn;       /* TSR_CUDA_ATTENTION=cudnn: cuDNN's fused attention where it can */
  int profile; /* TSR_CUDA_PROFILE set: time every op (see prof_begin) */
  double t_open;
} g;

/* ---------------------------------------------------------------- op profile
 * With TSR_CUDA_PROFILE=1 every op waits for the stream before and after its kernels and
 * adds the time to its line (matrix products one line per shape, with their rate); rank 0
 * prints the table, longest first, when the backend closes.  The waits serialise host and
 * device, so steps run slower than without: the shares are what it is for. */
#define N_PROF 96
static struct prof_rec {
  char name[56];
  double s, flops;
  long calls;
} prof[N_PROF];
static int n_prof;
typedef struct {
  char name[56];
  double t0, flops;
} prof_scope;
static prof_scope prof_begin(double flops, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static prof_scope prof_begin(double flops, const char *fmt, ...) {
  prof_scope sc = {"", 0, flops};
  if (!g.profile || g.failed) return sc;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sc.name, sizeof sc.name, fmt, ap);
  va_end(ap);
  cudaStreamSynchronize(g.stream);
  sc.t0 = tsr_now();
  return sc;
}
static void prof_end(prof_scope *sc) {
  if (!sc->name[0]) return;
  cudaStreamSynchronize(g.stream);
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
  prof[k].s += dt;
  prof[k].flops += k == N_PROF - 1 ? 0 : sc->flops; /* no rate for a mix of ops */
  prof[k].calls++;
}
static int prof_cmp(const void *a, const void *b) {
  const double x = ((const struct prof_rec *)a)->s, y = ((const struct prof_rec *)b)->s;
  return (x < y) - (x > y);
}
static void prof_print(void) {
  if (!n_prof || tsr_rank() != 0) return;
  double total = 0;
  for (int k = 0; k < n_prof; k++) total += prof[k].s;
  qsort(prof, (size_t)n_prof, sizeof prof[0], prof_cmp);
  tsr_log("cuda profile (TSR_CUDA_PROFILE): %.3f s in ops of %.3f s since the device opened",
          total, tsr_now() - g.t_open);
  tsr_log("  %-44s %8s %10s %6s %9s", "op", "calls", "ms", "share", "TFLOP/s");
  for (int k = 0; k < n_prof; k++) {
    char rate[16] = "";
    if (prof[k].flops > 0) snprintf(rate, sizeof rate, "%9.1f", prof[k].flops / prof[k].s / 1e12);
    tsr_log("  %-44s %8ld %10.2f %5.1f%% %9s", prof[k].name, prof[k].calls, prof[k].s * 1e3,
            100 * prof[k].s / total, rate);
  }
  n_prof = 0;
}
#define PROF(flops, ...) \
  prof_scope prof_ __attribute__((cleanup(prof_end))) = prof_begin(flops, __VA_ARGS__)

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
  return (what == 1 ? g.peak_bytes : g.live_bytes) + g.ws.bytes +
         (size_t)g.staging_elems * sizeof(tsr_bf16);
}

static void d_set_matmul_inputs(int mode) {
  tsr_cuda_blas_set_inputs(g.blas, mode);
  g.matmul_inputs = mode;
  g.attn_key[0] = 0; /* decide attention's kernel again */
}

static void d_copy(void *dst, const void *src, size_t bytes) {
  if (g.failed || !bytes || dst == src) return;
  PROF(0, "copy");
  RT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream));
}

static void d_zero(void *dst, size_t bytes) {
  if (g.failed || !bytes) return;
  PROF(0, "zero");
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

/* The bf16 GEMM staging, in bf16 mode only (set_matmul_inputs comes first): grown, never
 * shrunk, like the scratch. */
static int reserve_staging(const tsr_ops_shapes *s) {
  long elems = g.matmul_inputs == TSR_MATMUL_BF16 ? tsr_ops_staging_elems(s) : 0;
  const long attn = tsr_ops_cudnn_attention_staging_elems(s);
  if (elems && g.attn_cudnn && attn > elems) elems = attn;
  if (elems <= g.staging_elems) return 0;
  if (g.staging) RT(cudaFree(g.staging));
  g.staging = NULL;
  g.staging_elems = 0;
  const size_t bytes = (size_t)elems * sizeof(tsr_bf16);
  cudaError_t e = cudaMalloc((void **)&g.staging, bytes);
  TSR_CHECK(e == cudaSuccess, TSR_ERR, "cuda: allocating %zu bytes of bf16 GEMM staging: %s",
            bytes, cudaGetErrorString(e));
  g.staging_elems = elems;
  g.attn_key[0] = 0; /* cuDNN attention's fit may change: decide again */
  if (tsr_rank() == 0)
    tsr_log("cuda: bf16 GEMM staging %.3f MB (bf16 copies of x, dy and a weight for the "
            "tensor cores%s), allocated once (tessera plan counts it in the workspace)",
            (double)bytes / 1e6, g.attn_cudnn ? "; and of cuDNN attention's tensors" : "");
  return 0;
}

static int d_reserve(const tsr_ops_shapes *s) {
  tsr_cuda_scratch_dims d = {s->rows,    s->cols,        s->vocab_local,
                             s->attn_bht, s->sumsq_elems, s->attn_part};
  size_t bytes = 0;
  TSR_CALL(tsr_cuda_scratch_bytes(&d, &bytes));
  if (bytes > g.ws.bytes) {
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
  }
  return reserve_staging(s);
}

static void d_close(void) {
  if (g.stream) cudaStreamSynchronize(g.stream);
  prof_print();
  if (g.gemm_staged + g.gemm_unstaged > 0 && tsr_rank() == 0)
    tsr_log("gemm: %ld of %ld products ran on bf16 copies of their inputs%s", g.gemm_staged,
            g.gemm_staged + g.gemm_unstaged,
            g.gemm_unstaged ? "; the others did not fit the bf16 staging and had cuBLASLt "
                              "round their fp32 inputs (slower)" : "");
#ifdef TSR_HAVE_CUDNN
  tsr_cuda_cudnn_attention_close();
#endif
  if (g.ws.base) cudaFree(g.ws.base);
  if (g.staging) cudaFree(g.staging);
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

/* In bf16 mode: places in the staging for bf16 copies of k fp32 matrices of elems[i]
 * elements (0: not needed, place NULL); 0 when the mode is another or they do not fit
 * (the product then runs on the fp32 storage, cuBLASLt rounding its inputs). */
static int stage_places(const long *elems, int k, tsr_bf16 **place) {
  if (g.matmul_inputs != TSR_MATMUL_BF16) return 0;
  long used = 0;
  for (int i = 0; i < k; i++) used += tsr_ops_staging_part(elems[i]);
  if (!g.staging || used > g.staging_elems) {
    g.gemm_unstaged++;
    return 0;
  }
  used = 0;
  for (int i = 0; i < k; i++) {
    place[i] = elems[i] ? g.staging + used : NULL;
    used += tsr_ops_staging_part(elems[i]);
  }
  g.gemm_staged++;
  return 1;
}
/* The bf16 copy of src (n_elem fp32 values, rounded to nearest even) at place, if any. */
static void stage(tsr_bf16 *place, const float *src, long n_elem) {
  if (place) RUN(tsr_cuda_cast_f32_bf16(place, src, n_elem, g.stream));
}

static void d_matmul_fwd(float *y, const float *x, const float *w, const float *bias, int n,
                         int in, int out) {
  PROF(2.0 * n * in * out, "matmul_fwd %d x %d -> %d", n, in, out);
  tsr_bf16 *b[2];
  if (n > 0 && in > 0 && out > 0 && stage_places((long[]){(long)n * in, (long)out * in}, 2, b)) {
    stage(b[0], x, (long)n * in);
    stage(b[1], w, (long)out * in);
    RUN(tsr_cuda_matmul_fwd_bf16(g.blas, y, TSR_CUDA_F32, b[0], b[1], bias, TSR_CUDA_ACT_NONE,
                                 NULL, n, in, out, g.stream));
    return;
  }
  RUN(tsr_cuda_matmul_fwd(g.blas, y, x, w, bias, n, in, out, g.stream));
}
static void d_matmul_bwd(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                         const float *w, int n, int in, int out) {
  PROF((dx ? 4.0 : 2.0) * n * in * out, "matmul_bwd %d x %d -> %d", n, in, out);
  tsr_bf16 *b[3]; /* dy, x (for dw), w (for dx) */
  if ((dx || dw) && n > 0 && in > 0 && out > 0 &&
      stage_places((long[]){(long)n * out, dw ? (long)n * in : 0, dx ? (long)out * in : 0}, 3,
                   b)) {
    stage(b[0], dy, (long)n * out);
    stage(b[1], x, (long)n * in);
    stage(b[2], w, (long)out * in);
    RUN(tsr_cuda_matmul_bwd_bf16(g.blas, dx, TSR_CUDA_F32, dw, NULL, b[0], b[1], b[2], n, in,
                                 out, &g.ws, g.stream));
    /* the bias gradient summed from the fp32 dy, as without the staging */
    if (dbias)
      RUN(tsr_cuda_matmul_bwd(g.blas, NULL, NULL, dbias, dy, x, w, n, in, out, &g.ws, g.stream));
    return;
  }
  RUN(tsr_cuda_matmul_bwd(g.blas, dx, dw, dbias, dy, x, w, n, in, out, &g.ws, g.stream));
}
static void d_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int n, int T, int C, int vocab_start,
                            int vocab_local) {
  PROF(0, "embedding_fwd");
  RUN(tsr_cuda_embedding_fwd(out, tokens, wte, wpe, n, T, C, vocab_start, vocab_local,
                             g.stream));
}
static void d_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int n, int T, int C, int vocab_start, int vocab_local) {
  PROF(0, "embedding_bwd");
  RUN(tsr_cuda_embedding_bwd(dwte, dwpe, dout, tokens, n, T, C, vocab_start, vocab_local, &g.ws,
                             g.stream));
}
static void d_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int n, int C,
                          float eps) {
  PROF(0, "rmsnorm_fwd");
  RUN(tsr_cuda_rmsnorm_fwd(out, rstd, x, w, n, C, eps, g.stream));
}
static void d_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                          const float *w, const float *rstd, int n, int C) {
  PROF(0, "rmsnorm_bwd");
  RUN(tsr_cuda_rmsnorm_bwd(dx, dw, dout, x, w, rstd, n, C, &g.ws, g.stream));
}
static void d_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                            const float *b, int n, int C, float eps) {
  PROF(0, "layernorm_fwd");
  RUN(tsr_cuda_layernorm_fwd(out, mean, rstd, x, w, b, n, C, eps, g.stream));
}
static void d_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int n, int C) {
  PROF(0, "layernorm_bwd");
  RUN(tsr_cuda_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, n, C, &g.ws, g.stream));
}
static void d_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride,
                       float theta) {
  PROF(0, "rope_fwd");
  RUN(tsr_cuda_rope_fwd(x, n, T, n_heads, head_dim, stride, theta, g.stream));
}
static void d_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                       float theta) {
  PROF(0, "rope_bwd");
  RUN(tsr_cuda_rope_bwd(dx, n, T, n_heads, head_dim, stride, theta, g.stream));
}
/* How attention runs: in bf16 mode (the GEMMs take bf16 inputs) on cuDNN's fused flash
 * attention when TSR_CUDA_ATTENTION=cudnn asked for it and cuDNN can (cuda/sdpa_cudnn.cpp),
 * else on the tensor-core kernels where the head dimension has one on this GPU, else (and
 * in fp32 mode) on the fp32 kernel.  Decided, and said on rank 0, once per shape, not at
 * every call; forward and backward of a shape always take the same path (lse is the
 * path's own). */
enum { ATT_FP32, ATT_TC, ATT_CUDNN };
static int attention_how(int B, int T, int H, int KV, int hd) {
  const int key[5] = {B, T, H, KV, hd};
  if (!memcmp(key, g.attn_key, sizeof key)) return g.attn_how;
  int how = ATT_FP32;
  char why[600] = "";
#ifdef TSR_HAVE_CUDNN
  if (g.matmul_inputs == TSR_MATMUL_BF16 && g.attn_cudnn) {
    const int rc = tsr_cuda_cudnn_attention_prepare(B, T, H, KV, hd, g.staging_elems, why,
                                                    sizeof why);
    if (rc == TSR_ERR) g.failed = 1;
    if (rc == 0) how = ATT_CUDNN;
  }
#endif
  if (how != ATT_CUDNN && g.matmul_inputs == TSR_MATMUL_BF16 && tsr_cuda_attention_tc_supported(hd))
    how = ATT_TC;
  if (tsr_rank() == 0 && how == ATT_CUDNN)
    tsr_log("attention: cuDNN fused flash attention on bf16 copies of q, k, v (%s)", why);
  else if (tsr_rank() == 0) {
    const char *what =
        how == ATT_TC && tsr_cuda_attention_tc_kernel() == TSR_CUDA_TC_MMA
            ? "tensor cores, mma.sync kernels (TSR_CUDA_ATTENTION=mma; bf16 q, k, v, P and dS; "
              "fp32 softmax and accumulation)"
        : how == ATT_TC ? "tensor cores, WMMA kernels (bf16 q, k, v, P and dS; fp32 softmax and "
                          "accumulation)"
        : g.matmul_inputs == TSR_MATMUL_BF16
            ? "fp32 kernel (no tensor-core kernel for this head_dim on this GPU: 32, 64, 96, "
              "128 have one, where its shared memory fits)"
            : "fp32 kernel";
    tsr_log("attention: %s%s%s", what, why[0] ? "; not cuDNN: " : "", why);
  }
  memcpy(g.attn_key, key, sizeof key);
  g.attn_how = how;
  return how;
}
static void d_attention_fwd(float *out, float *lse, const float *q, const float *k,
                            const float *v, int B, int T, int H, int KV, int hd, int qkv_stride) {
  PROF(2.0 * B * H * (double)T * T * hd, "attention_fwd T %d hd %d", T, hd);
  const int how = attention_how(B, T, H, KV, hd);
#ifdef TSR_HAVE_CUDNN
  if (how == ATT_CUDNN)
    RUN(tsr_cuda_cudnn_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, g.staging,
                                     g.staging_elems, g.stream));
  else
#endif
  if (how == ATT_TC)
    RUN(tsr_cuda_attention_tc_fwd(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, g.stream));
  else
    RUN(tsr_cuda_attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, g.stream));
}
static void d_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v,
                            int B, int T, int H, int KV, int hd, int qkv_stride) {
  PROF(5.0 * B * H * (double)T * T * hd, "attention_bwd T %d hd %d", T, hd);
  const int how = attention_how(B, T, H, KV, hd);
#ifdef TSR_HAVE_CUDNN
  if (how == ATT_CUDNN)
    RUN(tsr_cuda_cudnn_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd,
                                     qkv_stride, g.staging, g.staging_elems, g.stream));
  else
#endif
  if (how == ATT_TC)
    RUN(tsr_cuda_attention_tc_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd,
                                  qkv_stride, &g.ws, g.stream));
  else
    RUN(tsr_cuda_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride,
                               &g.ws, g.stream));
}
static void d_swiglu_fwd(float *out, const float *gate_up, int n, int F) {
  PROF(0, "swiglu_fwd");
  RUN(tsr_cuda_swiglu_fwd(out, gate_up, n, F, g.stream));
}
static void d_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n, int F) {
  PROF(0, "swiglu_bwd");
  RUN(tsr_cuda_swiglu_bwd(dgate_up, dout, gate_up, n, F, g.stream));
}
static void d_gelu_fwd(float *out, const float *x, int n_elem) {
  PROF(0, "gelu_fwd");
  RUN(tsr_cuda_gelu_fwd(out, x, n_elem, g.stream));
}
static void d_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem) {
  PROF(0, "gelu_bwd");
  RUN(tsr_cuda_gelu_bwd(dx, dout, x, n_elem, g.stream));
}
static void d_add(float *out, const float *a, const float *b, long n_elem) {
  PROF(0, "add");
  RUN(tsr_cuda_add(out, a, b, n_elem, g.stream));
}
static void d_residual(float *out, const float *x, const float *y, long n_elem, tsr_prec prec) {
  PROF(0, "residual");
  RUN(tsr_cuda_residual(out, x, y, n_elem, prec, g.stream));
}
static void d_acc(float *out, const float *a, long n_elem) {
  PROF(0, "acc");
  RUN(tsr_cuda_acc(out, a, n_elem, g.stream));
}
static void d_scale(float *x, float s, long n_elem) {
  PROF(0, "scale");
  RUN(tsr_cuda_scale(x, s, n_elem, g.stream));
}
static double d_xent_fwd_bwd(float *logits, const int32_t *targets, int n, int V, float dloss) {
  PROF(0, "xent_fwd_bwd");
  RUN(tsr_cuda_xent_fwd_bwd(g.result, logits, targets, n, V, dloss, &g.ws, g.stream));
  return fetch_double();
}
static double d_xent_fwd(const float *logits, const int32_t *targets, int n, int V) {
  PROF(0, "xent_fwd");
  RUN(tsr_cuda_xent_fwd(g.result, logits, targets, n, V, &g.ws, g.stream));
  return fetch_double();
}
static void d_xent_local_stats(double *row_max, double *target_logit, const float *logits,
                               const int32_t *targets, int n, int V, int vocab_start) {
  PROF(0, "xent_local_stats");
  RUN(tsr_cuda_xent_local_stats(row_max, target_logit, logits, targets, n, V, vocab_start,
                                g.stream));
}
static void d_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max, int n,
                                int V) {
  PROF(0, "xent_local_sumexp");
  RUN(tsr_cuda_xent_local_sumexp(sumexp, logits, row_max, n, V, g.stream));
}
static double d_xent_rows(const double *row_max, const double *sumexp, const double *target_logit,
                          int n) {
  PROF(0, "xent_rows");
  RUN(tsr_cuda_xent_rows(g.result, row_max, sumexp, target_logit, n, g.stream));
  return fetch_double();
}
/* The _acc forms: the sum lands in a device scalar and is added to *acc on the stream. */
static void d_xent_fwd_bwd_acc(double *acc, double div, float *logits, const int32_t *targets,
                               int n, int V, float dloss) {
  PROF(0, "xent_fwd_bwd_acc");
  RUN(tsr_cuda_xent_fwd_bwd(g.result, logits, targets, n, V, dloss, &g.ws, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_fwd_acc(double *acc, double div, const float *logits, const int32_t *targets,
                           int n, int V) {
  PROF(0, "xent_fwd_acc");
  RUN(tsr_cuda_xent_fwd(g.result, logits, targets, n, V, &g.ws, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_rows_acc(double *acc, double div, const double *row_max, const double *sumexp,
                            const double *target_logit, int n) {
  PROF(0, "xent_rows_acc");
  RUN(tsr_cuda_xent_rows(g.result, row_max, sumexp, target_logit, n, g.stream));
  RUN(tsr_cuda_add_quotient(acc, g.result, div, g.stream));
}
static void d_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                        const double *sumexp, int n, int V, int vocab_start, float dloss) {
  PROF(0, "xent_grad");
  RUN(tsr_cuda_xent_grad(logits, targets, row_max, sumexp, n, V, vocab_start, dloss, g.stream));
}
static void d_adamw(float *p, float *m, float *v, const float *grad, long n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, long t, float grad_scale, float *out,
                    tsr_prec out_prec) {
  PROF(0, "%s", out ? "adamw+refresh" : "adamw");
  RUN(tsr_cuda_adamw(p, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale, out,
                     out_prec, g.stream));
}
static void d_round_bf16(float *dst, const float *src, long n_elem) {
  PROF(0, "round_bf16");
  RUN(tsr_cuda_round_bf16(dst, src, n_elem, g.stream));
}
static void d_round_fp16(float *dst, const float *src, long n_elem) {
  PROF(0, "round_fp16");
  RUN(tsr_cuda_round_fp16(dst, src, n_elem, g.stream));
}
/* One kernel per range into its own device scalar, one fetch per N_RESULTS ranges; the
 * host adds them in order, as the CPU's loop does. */
static double d_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  PROF(0, "sumsq_ranges");
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
  PROF(0, "sumsq");
  RUN(tsr_cuda_sumsq(g.result, x, n_elem, &g.ws, g.stream));
  return fetch_double();
}
static int d_all_finite(const float *x, long n_elem) {
  PROF(0, "all_finite");
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
    .residual = d_residual,
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
  /* attention in bf16 mode: the tensor-core kernels of cuda/attention.cu, WMMA (default)
   * or mma.sync, or cuDNN's fused attention (cuda/sdpa_cudnn.cpp) where it was built */
  const char *ak = getenv("TSR_CUDA_ATTENTION");
  if (ak && *ak && strcmp(ak, "wmma") && strcmp(ak, "mma") && strcmp(ak, "cudnn")) {
    tsr_error("TSR_CUDA_ATTENTION='%s': expected 'wmma' (the default), 'mma' or 'cudnn'", ak);
    rc = TSR_ERR;
  }
  g.attn_cudnn = ak && !strcmp(ak, "cudnn");
#ifndef TSR_HAVE_CUDNN
  if (g.attn_cudnn) {
    tsr_error("TSR_CUDA_ATTENTION=cudnn: this build has no cuDNN attention (configure found "
              "no cuDNN 9 with its frontend headers: run tools/fetch-cudnn-frontend.sh and "
              "configure again)");
    rc = TSR_ERR;
  }
#endif
  tsr_cuda_attention_tc_use(ak && !strcmp(ak, "mma") ? TSR_CUDA_TC_MMA : TSR_CUDA_TC_WMMA);
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
  const char *pe = getenv("TSR_CUDA_PROFILE");
  g.profile = pe && *pe && strcmp(pe, "0");
  g.t_open = tsr_now();
  *b = &table;
  return 0;
}
