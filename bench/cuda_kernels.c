/* cuda_kernels.c — throughput of each CUDA kernel against the device's measured peak.
 *
 * The references are measured in the same run, on the same device:
 *   memory:  a device-to-device cudaMemcpy of 1 GiB (bytes read + written per second);
 *   compute: a cuBLASLt GEMM 8192^3 in bf16 (tensor cores) and 4096^3 in fp32 (true
 *            fp32, the peak the SIMT kernels can hope for).
 * Each kernel is timed with CUDA events: 3 warm-up calls, then the median of 21.
 * Memory-bound kernels report GB/s with the bytes each must move at least (stated per
 * row); GEMMs and attention report TFLOP/s (attention counts the causal half:
 * forward 2 * 2*B*H*T*T*hd / 2, backward 2.5x that).  The shapes are those of a
 * LLaMA-7B layer with 4096 tokens per micro-batch.  Prints a table; never fails on time.
 * Exits 77 without a GPU.  Usage: bench/cuda_kernels [tokens (default 4096)] */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h" /* tsr_ops_shapes: the staging of cuDNN attention */
#include "ops_cuda.h"

#define WARMUP 3
#define REPS 21

#define CK(expr)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)
#define OK(expr)                                                                    \
  do {                                                                              \
    if ((expr) != 0) {                                                              \
      fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr);             \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static cudaStream_t st;
static cudaEvent_t ev0, ev1;

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* median milliseconds of `expr` (an int-returning call) on stream st */
#define TIME_MS(result, expr)                                     \
  do {                                                            \
    float ms_[REPS];                                              \
    for (int w_ = 0; w_ < WARMUP; w_++) OK(expr);                 \
    for (int r_ = 0; r_ < REPS; r_++) {                           \
      CK(cudaEventRecord(ev0, st));                               \
      OK(expr);                                                   \
      CK(cudaEventRecord(ev1, st));                               \
      CK(cudaEventSynchronize(ev1));                              \
      CK(cudaEventElapsedTime(&ms_[r_], ev0, ev1));               \
    }                                                             \
    qsort(ms_, REPS, sizeof(float), cmp_float);                   \
    (result) = ms_[REPS / 2];                                     \
  } while (0)

static void *dev(size_t bytes) { /* random-ish, finite contents: never zeros */
  void *p;
  CK(cudaMalloc(&p, bytes));
  const size_t n = bytes / 4;
  float *h = malloc(n * 4 > (1 << 24) ? (1 << 24) : n * 4);
  const size_t chunk = (n * 4 > (1 << 24) ? (1 << 24) : n * 4) / 4;
  uint32_t s = 12345u;
  for (size_t i = 0; i < chunk; i++) { /* two bf16 in [-0.25, 0.25): also a finite fp32 */
    uint32_t word = 0;
    for (int half = 0; half < 2; half++) {
      s = s * 1664525u + 1013904223u;
      const float x = ((s >> 9) * (1.0f / 8388608.0f) - 0.5f) * 0.5f;
      uint32_t u;
      memcpy(&u, &x, 4);
      word |= half ? (u >> 16) : (u & 0xffff0000u);
    }
    memcpy(&h[i], &word, 4);
  }
  for (size_t off = 0; off < n; off += chunk)
    CK(cudaMemcpy((float *)p + off, h, (n - off < chunk ? n - off : chunk) * 4, cudaMemcpyHostToDevice));
  free(h);
  return p;
}

static double peak_gbs, peak_bf16, peak_f32;

/* The trainer's bf16 'fast' GEMMs on its fp32 storage, both ways cuda/ops_dev.c can run
 * them: the inputs copied to bf16 (bx, bw, bdy: the staging) for a bf16 GEMM with fp32
 * output, the copies timed with it; or cuBLASLt rounding the fp32 inputs itself
 * (COMPUTE_32F_FAST_16BF, tsr_cuda_blas_set_inputs(blas, 1) around the call). */
static int staged_fwd(tsr_cuda_blas *blas, float *y, const float *x, const float *w,
                      tsr_bf16 *bx, tsr_bf16 *bw, int n, int in, int out) {
  if (tsr_cuda_cast_f32_bf16(bx, x, (long)n * in, st) ||
      tsr_cuda_cast_f32_bf16(bw, w, (long)out * in, st))
    return 1;
  return tsr_cuda_matmul_fwd_bf16(blas, y, TSR_CUDA_F32, bx, bw, NULL, TSR_CUDA_ACT_NONE, NULL, n,
                                  in, out, st);
}
static int staged_bwd(tsr_cuda_blas *blas, float *dx, float *dw, const float *dy, const float *x,
                      const float *w, tsr_bf16 *bdy, tsr_bf16 *bx, tsr_bf16 *bw, int n, int in,
                      int out, const tsr_cuda_scratch *ws) {
  if (tsr_cuda_cast_f32_bf16(bdy, dy, (long)n * out, st) ||
      tsr_cuda_cast_f32_bf16(bx, x, (long)n * in, st) ||
      tsr_cuda_cast_f32_bf16(bw, w, (long)out * in, st))
    return 1;
  return tsr_cuda_matmul_bwd_bf16(blas, dx, TSR_CUDA_F32, dw, NULL, bdy, bx, bw, n, in, out, ws,
                                  st);
}
static int fast_fwd(tsr_cuda_blas *blas, float *y, const float *x, const float *w, int n, int in,
                    int out) {
  tsr_cuda_blas_set_inputs(blas, 1);
  const int rc = tsr_cuda_matmul_fwd(blas, y, x, w, NULL, n, in, out, st);
  tsr_cuda_blas_set_inputs(blas, 0);
  return rc;
}
static int fast_bwd(tsr_cuda_blas *blas, float *dx, float *dw, const float *dy, const float *x,
                    const float *w, int n, int in, int out, const tsr_cuda_scratch *ws) {
  tsr_cuda_blas_set_inputs(blas, 1);
  const int rc = tsr_cuda_matmul_bwd(blas, dx, dw, NULL, dy, x, w, n, in, out, ws, st);
  tsr_cuda_blas_set_inputs(blas, 0);
  return rc;
}

static void row(const char *name, const char *shape, double ms, double amount, int is_flops,
                const char *model) {
  const double rate = amount / (ms * 1e-3) / (is_flops ? 1e12 : 1e9);
  const double peak = is_flops ? (strstr(name, "bf16") ? peak_bf16 : peak_f32) : peak_gbs;
  printf("%-26s %-28s %9.1f %9.1f %-7s %6.1f%%  %s\n", name, shape, ms * 1e3, rate,
         is_flops ? "TFLOP/s" : "GB/s", 100.0 * rate / peak, model);
}

int main(int argc, char **argv) {
  int n_dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0) {
    printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const int N = argc > 1 ? atoi(argv[1]) : 4096; /* tokens per micro-batch */
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaStreamCreate(&st));
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  tsr_cuda_blas *blas;
  OK(tsr_cuda_blas_create(&blas, 0));
  float ms;
  const int C = 4096, F = 11008, H = 32, KV = 8, hd = 128, V = 32000;
  /* one scratch for every kernel below, sized by the query for the largest shapes */
  tsr_cuda_scratch ws_buf;
  const tsr_cuda_scratch *ws = &ws_buf;
  {
    const long T = 2048, B = N / T > 0 ? N / T : 1;
    const tsr_cuda_scratch_dims d = {.rows = N > B * T ? N : B * T, .cols = 2 * F, .vocab_local = V,
                                     .attn_bht = B * H * T, .sumsq_elems = 100L * 1000 * 1000,
                                     .attn_part = 2L * B * H * T * 128};
    OK(tsr_cuda_scratch_bytes(&d, &ws_buf.bytes));
    ws_buf.base = dev(ws_buf.bytes);
  }

  /* ---- the references ---- */
  const size_t big = (size_t)1 << 30;
  void *a = dev(big), *b = dev(big);
  TIME_MS(ms, (int)cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, st));
  peak_gbs = 2.0 * big / (ms * 1e-3) / 1e9;
  CK(cudaFree(a));
  CK(cudaFree(b));
  {
    const int M = 8192;
    void *x = dev((size_t)M * M * 2), *w = dev((size_t)M * M * 2), *y = dev((size_t)M * M * 2);
    TIME_MS(ms, tsr_cuda_matmul_fwd_bf16(blas, y, TSR_CUDA_BF16, x, w, NULL, TSR_CUDA_ACT_NONE, NULL, M, M, M, st));
    peak_bf16 = 2.0 * M * M * (double)M / (ms * 1e-3) / 1e12;
    CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(y));
    const int K = 4096;
    float *xf = dev((size_t)K * K * 4), *wf = dev((size_t)K * K * 4), *yf = dev((size_t)K * K * 4);
    TIME_MS(ms, tsr_cuda_matmul_fwd(blas, yf, xf, wf, NULL, K, K, K, st));
    peak_f32 = 2.0 * K * K * (double)K / (ms * 1e-3) / 1e12;
    CK(cudaFree(xf)); CK(cudaFree(wf)); CK(cudaFree(yf));
  }
  printf("device %s (sm_%d%d, %d SMs); %d tokens per micro-batch\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, N);
  printf("measured peaks: memory %.0f GB/s (D2D copy 1 GiB), bf16 GEMM %.1f TFLOP/s (8192^3), "
         "fp32 GEMM %.1f TFLOP/s (4096^3)\n\n",
         peak_gbs, peak_bf16, peak_f32);
  printf("%-26s %-28s %9s %9s %-7s %7s  %s\n", "kernel", "shape", "us", "achieved", "", "of peak",
         "counted");

  char shape[64];
  /* ---- GEMMs (bf16 tensor cores, fp32 accumulate) ---- */
  {
    const int shapes[][2] = {{C, (H + 2 * KV) * hd}, {C, 2 * F}, {F, C}, {C, V}};
    const char *names[] = {"qkv", "gate_up", "down", "lm_head"};
    for (int i = 0; i < 4; i++) {
      const int in = shapes[i][0], out = shapes[i][1];
      void *x = dev((size_t)N * in * 2), *w = dev((size_t)out * in * 2), *y = dev((size_t)N * out * 2);
      void *dx = dev((size_t)N * in * 2);
      float *dw = dev((size_t)out * in * 4);
      snprintf(shape, sizeof shape, "%s %dx%d->%d", names[i], N, in, out);
      TIME_MS(ms, tsr_cuda_matmul_fwd_bf16(blas, y, TSR_CUDA_BF16, x, w, NULL, TSR_CUDA_ACT_NONE, NULL, N, in, out, st));
      row("matmul fwd bf16", shape, ms, 2.0 * N * in * out, 1, "2 n in out");
      TIME_MS(ms, tsr_cuda_matmul_bwd_bf16(blas, dx, TSR_CUDA_BF16, dw, NULL, y, x, w, N, in, out, ws, st));
      row("matmul bwd bf16 (dx,dw)", shape, ms, 4.0 * N * in * out, 1, "4 n in out");
      CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(y)); CK(cudaFree(dx)); CK(cudaFree(dw));
    }
    /* the trainer's fp32 storage in bf16 'fast' mode: staged (the default) vs rounded in
     * cuBLASLt (what runs where a product does not fit the staging) */
    for (int i = 0; i < 4; i++) {
      const int in = shapes[i][0], out = shapes[i][1];
      float *x = dev((size_t)N * in * 4), *w = dev((size_t)out * in * 4);
      float *y = dev((size_t)N * out * 4), *dx = dev((size_t)N * in * 4);
      float *dw = dev((size_t)out * in * 4);
      tsr_bf16 *bx = dev((size_t)N * in * 2), *bw = dev((size_t)out * in * 2);
      tsr_bf16 *by = dev((size_t)N * out * 2);
      snprintf(shape, sizeof shape, "%s %dx%d->%d", names[i], N, in, out);
      TIME_MS(ms, staged_fwd(blas, y, x, w, bx, bw, N, in, out));
      row("matmul fwd bf16 staged", shape, ms, 2.0 * N * in * out, 1, "2 n in out, casts in");
      TIME_MS(ms, fast_fwd(blas, y, x, w, N, in, out));
      row("matmul fwd bf16 on fp32", shape, ms, 2.0 * N * in * out, 1, "2 n in out");
      TIME_MS(ms, staged_bwd(blas, dx, dw, y, x, w, by, bx, bw, N, in, out, ws));
      row("matmul bwd bf16 staged", shape, ms, 4.0 * N * in * out, 1, "4 n in out, casts in");
      TIME_MS(ms, fast_bwd(blas, dx, dw, y, x, w, N, in, out, ws));
      row("matmul bwd bf16 on fp32", shape, ms, 4.0 * N * in * out, 1, "4 n in out");
      CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(y)); CK(cudaFree(dx)); CK(cudaFree(dw));
      CK(cudaFree(bx)); CK(cudaFree(bw)); CK(cudaFree(by));
    }
    float *x = dev((size_t)N * C * 4), *w = dev((size_t)C * C * 4), *y = dev((size_t)N * C * 4);
    snprintf(shape, sizeof shape, "%dx%d->%d", N, C, C);
    TIME_MS(ms, tsr_cuda_matmul_fwd(blas, y, x, w, NULL, N, C, C, st));
    row("matmul fwd fp32", shape, ms, 2.0 * N * C * C, 1, "2 n in out");
    CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(y));
  }
  /* ---- attention (our flash-style kernel) ---- */
  {
    const int T = 2048, B = N / T > 0 ? N / T : 1;
    const long rows = (long)B * T, stride = (H + 2 * KV) * hd;
    const double flops = 2.0 * 2.0 * B * H * (double)T * T * hd / 2;
    snprintf(shape, sizeof shape, "B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    for (int bf = 0; bf < 2; bf++) {
      const size_t es = bf ? 2 : 4;
      void *qkv = dev(rows * stride * es), *dqkv = dev(rows * stride * es);
      void *out = dev(rows * H * hd * es), *dout = dev(rows * H * hd * es);
      float *lse = dev(rows * H * 4);
      const char *q = qkv, *k = (char *)qkv + (size_t)H * hd * es, *v = (char *)qkv + (size_t)(H + KV) * hd * es;
      char *dq = dqkv, *dk = (char *)dqkv + (size_t)H * hd * es, *dv = (char *)dqkv + (size_t)(H + KV) * hd * es;
      if (bf) {
        TIME_MS(ms, tsr_cuda_attention_fwd_bf16(out, lse, (const tsr_bf16 *)q, (const tsr_bf16 *)k,
                                                (const tsr_bf16 *)v, B, T, H, KV, hd, (int)stride, st));
        row("attention fwd bf16", shape, ms, flops, 1, "causal 4 B H T^2 hd / 2");
        TIME_MS(ms, tsr_cuda_attention_bwd_bf16((tsr_bf16 *)dq, (tsr_bf16 *)dk, (tsr_bf16 *)dv, dout, out, lse,
                                                (const tsr_bf16 *)q, (const tsr_bf16 *)k, (const tsr_bf16 *)v,
                                                B, T, H, KV, hd, (int)stride, ws, st));
        row("attention bwd bf16", shape, ms, 2.5 * flops, 1, "2.5 x forward");
      } else {
        OK(tsr_cuda_attention_fwd(out, lse, (const float *)q, (const float *)k, (const float *)v, B, T, H,
                                  KV, hd, (int)stride, st)); /* a valid lse for the backward */
        TIME_MS(ms, tsr_cuda_attention_fwd(out, lse, (const float *)q, (const float *)k, (const float *)v,
                                           B, T, H, KV, hd, (int)stride, st));
        row("attention fwd fp32", shape, ms, flops, 1, "causal 4 B H T^2 hd / 2");
        TIME_MS(ms, tsr_cuda_attention_bwd((float *)dq, (float *)dk, (float *)dv, dout, out, lse,
                                           (const float *)q, (const float *)k, (const float *)v, B, T, H,
                                           KV, hd, (int)stride, ws, st));
        row("attention bwd fp32", shape, ms, 2.5 * flops, 1, "2.5 x forward");
        /* the tensor-core path (fp32 storage, bf16 products), at this head_dim and at 64 */
        for (int hd2 = hd; hd2 >= 64; hd2 /= 2) {
          char shape2[64];
          snprintf(shape2, sizeof shape2, "B%d T%d H%d KV%d hd%d", B, T, H, KV, hd2);
          const int stride2 = (H + 2 * KV) * hd2;
          const float *q2 = (const float *)qkv, *k2 = q2 + (size_t)H * hd2, *v2 = q2 + (size_t)(H + KV) * hd2;
          float *dq2 = (float *)dqkv, *dk2 = dq2 + (size_t)H * hd2, *dv2 = dq2 + (size_t)(H + KV) * hd2;
          const double flops2 = flops * hd2 / hd;
          for (int kern = TSR_CUDA_TC_WMMA; kern <= TSR_CUDA_TC_MMA; kern++) {
            tsr_cuda_attention_tc_use(kern);
            if (!tsr_cuda_attention_tc_supported(hd2)) continue;
            TIME_MS(ms, tsr_cuda_attention_tc_fwd(out, lse, q2, k2, v2, B, T, H, KV, hd2, stride2, st));
            row(kern ? "attention fwd tc mma" : "attention fwd tc wmma", shape2, ms, flops2, 1,
                "causal 4 B H T^2 hd / 2");
            TIME_MS(ms, tsr_cuda_attention_tc_bwd(dq2, dk2, dv2, dout, out, lse, q2, k2, v2, B, T, H,
                                                  KV, hd2, stride2, ws, st));
            row(kern ? "attention bwd tc mma" : "attention bwd tc wmma", shape2, ms, 2.5 * flops2,
                1, "2.5 x forward");
          }
          tsr_cuda_attention_tc_use(TSR_CUDA_TC_WMMA);
#ifdef TSR_HAVE_CUDNN
          /* cuDNN's fused attention, with the bf16 copies in and out the trainer pays */
          tsr_ops_shapes sh = {.attn_bht = (long)B * H * T, .attn_io = rows * (H + KV) * hd2,
                               .attn_t = T};
          const long n_stage = tsr_ops_cudnn_attention_staging_elems(&sh);
          char why[600];
          tsr_bf16 *staging = dev(n_stage * 2);
          const int rc = tsr_cuda_cudnn_attention_prepare(B, T, H, KV, hd2, n_stage, why, sizeof why);
          printf("# cuDNN attention %s: %s\n", shape2, why);
          if (rc == 0) {
            TIME_MS(ms, tsr_cuda_cudnn_attention_fwd(out, lse, q2, k2, v2, B, T, H, KV, hd2,
                                                     stride2, staging, n_stage, st));
            row("attention fwd cudnn", shape2, ms, flops2, 1, "causal 4 B H T^2 hd / 2; casts in");
            TIME_MS(ms, tsr_cuda_cudnn_attention_bwd(dq2, dk2, dv2, dout, out, lse, q2, k2, v2, B, T,
                                                     H, KV, hd2, stride2, staging, n_stage, st));
            row("attention bwd cudnn", shape2, ms, 2.5 * flops2, 1, "2.5 x forward; casts in");
          }
          CK(cudaFree(staging));
#endif
        }
      }
      CK(cudaFree(qkv)); CK(cudaFree(dqkv)); CK(cudaFree(out)); CK(cudaFree(dout)); CK(cudaFree(lse));
    }
  }
  /* ---- memory-bound kernels (fp32 unless named) ---- */
  {
    const long nc = (long)N * C;
    float *x = dev(nc * 4), *y = dev(nc * 4), *dy = dev(nc * 4), *dx = dev(nc * 4), *w = dev(C * 4);
    float *dw = dev(C * 4), *rstd = dev(N * 4), *mean = dev(N * 4), *bb = dev(C * 4), *db = dev(C * 4);
    snprintf(shape, sizeof shape, "%dx%d", N, C);
    TIME_MS(ms, tsr_cuda_rmsnorm_fwd(y, rstd, x, w, N, C, 1e-5f, st));
    row("rmsnorm fwd", shape, ms, 2.0 * nc * 4, 0, "x in, y out");
    TIME_MS(ms, tsr_cuda_rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C, ws, st));
    row("rmsnorm bwd", shape, ms, 4.0 * nc * 4, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_cuda_rmsnorm_fwd_bf16((tsr_bf16 *)y, rstd, (tsr_bf16 *)x, (tsr_bf16 *)w, N, C, 1e-5f, st));
    row("rmsnorm fwd bf16", shape, ms, 2.0 * nc * 2, 0, "x in, y out");
    TIME_MS(ms, tsr_cuda_layernorm_fwd(y, mean, rstd, x, w, bb, N, C, 1e-5f, st));
    row("layernorm fwd", shape, ms, 2.0 * nc * 4, 0, "x in, y out");
    TIME_MS(ms, tsr_cuda_layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, N, C, ws, st));
    row("layernorm bwd", shape, ms, 4.0 * nc * 4, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_cuda_add(y, x, dy, nc, st));
    row("add (residual)", shape, ms, 3.0 * nc * 4, 0, "2 in, 1 out");
    /* the bf16 trainer's residual add: the branch output and the sum rounded (stored) */
    TIME_MS(ms, tsr_cuda_round_bf16(dy, dy, nc, st) || tsr_cuda_add(y, x, dy, nc, st) ||
                    tsr_cuda_round_bf16(y, y, nc, st));
    row("round, add, round (bf16)", shape, ms, 7.0 * nc * 4, 0, "three passes");
    TIME_MS(ms, tsr_cuda_residual(y, x, dy, nc, TSR_PREC_BF16, st));
    row("residual bf16 fused", shape, ms, 3.0 * nc * 4, 0, "2 in, 1 out");
    TIME_MS(ms, tsr_cuda_cast_f32_bf16((tsr_bf16 *)y, x, nc, st));
    row("cast fp32->bf16", shape, ms, 6.0 * nc, 0, "4 in, 2 out bytes");
    int32_t *tok = dev(N * 4);
    { /* spread token ids */
      int32_t *h = malloc(N * 4);
      for (int r = 0; r < N; r++) h[r] = (int32_t)((r * 7919u) % V);
      CK(cudaMemcpy(tok, h, N * 4, cudaMemcpyHostToDevice));
      free(h);
    }
    float *wte = dev((size_t)V * C * 4);
    TIME_MS(ms, tsr_cuda_embedding_fwd(y, tok, wte, NULL, N, N, C, 0, V, st));
    row("embedding fwd", shape, ms, 2.0 * nc * 4, 0, "rows in, out");
    TIME_MS(ms, tsr_cuda_embedding_bwd(wte, NULL, dy, tok, N, N, C, 0, V, ws, st));
    row("embedding bwd", shape, ms, 3.0 * nc * 4, 0, "dy in; rows in+out");
    CK(cudaFree(wte)); CK(cudaFree(tok));
    const long nq = (long)N * (H + 2 * KV) * hd;
    float *qkv = dev(nq * 4);
    snprintf(shape, sizeof shape, "%d x %d heads x %d", N, H, hd);
    TIME_MS(ms, tsr_cuda_rope_fwd(qkv, N, N, H, hd, (H + 2 * KV) * hd, 10000.0f, st));
    row("rope fwd (q)", shape, ms, 2.0 * N * H * hd * 4, 0, "in+out");
    CK(cudaFree(qkv));
    CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(dy)); CK(cudaFree(dx)); CK(cudaFree(w)); CK(cudaFree(dw));
    CK(cudaFree(rstd)); CK(cudaFree(mean)); CK(cudaFree(bb)); CK(cudaFree(db));
  }
  {
    const long nf = (long)N * F;
    float *gu = dev(2 * nf * 4), *o = dev(nf * 4), *dgu = dev(2 * nf * 4);
    snprintf(shape, sizeof shape, "%dx%d", N, F);
    TIME_MS(ms, tsr_cuda_swiglu_fwd(o, gu, N, F, st));
    row("swiglu fwd", shape, ms, 3.0 * nf * 4, 0, "2F in, F out");
    TIME_MS(ms, tsr_cuda_swiglu_bwd(dgu, o, gu, N, F, st));
    row("swiglu bwd", shape, ms, 5.0 * nf * 4, 0, "3F in, 2F out");
    TIME_MS(ms, tsr_cuda_gelu_fwd(o, gu, (int)nf, st));
    row("gelu fwd", shape, ms, 2.0 * nf * 4, 0, "in, out");
    CK(cudaFree(gu)); CK(cudaFree(o)); CK(cudaFree(dgu));
  }
  {
    float *logits = dev((size_t)N * V * 4);
    int32_t *tgt = dev(N * 4);
    CK(cudaMemset(tgt, 0, N * 4));
    double *loss = dev(8);
    snprintf(shape, sizeof shape, "%dx%d", N, V);
    TIME_MS(ms, tsr_cuda_xent_fwd_bwd(loss, logits, tgt, N, V, 1.0f / N, ws, st));
    row("xent fwd_bwd (fused)", shape, ms, 4.0 * N * V * 4, 0, "3 reads + 1 write");
    CK(cudaFree(logits)); CK(cudaFree(tgt)); CK(cudaFree(loss));
  }
  {
    const long n = 100L * 1000 * 1000;
    float *p = dev(n * 4), *m = dev(n * 4), *v = dev(n * 4), *g = dev(n * 4);
    double *s = dev(8);
    snprintf(shape, sizeof shape, "%ld", n);
    TIME_MS(ms, tsr_cuda_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL,
                               TSR_PREC_FP32, st));
    row("adamw", shape, ms, 7.0 * n * 4, 0, "p,m,v,g in; p,m,v out");
    /* the bf16 parameter refresh: a second pass after AdamW, or fused into it */
    float *c = dev(n * 4);
    TIME_MS(ms, tsr_cuda_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL,
                               TSR_PREC_FP32, st) ||
                    tsr_cuda_round_bf16(c, p, n, st));
    row("adamw, then round_bf16", shape, ms, 9.0 * n * 4, 0, "two passes");
    TIME_MS(ms, tsr_cuda_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, c,
                               TSR_PREC_BF16, st));
    row("adamw + bf16 refresh fused", shape, ms, 8.0 * n * 4, 0, "p,m,v,g in; p,m,v,copy out");
    CK(cudaFree(c));
    TIME_MS(ms, tsr_cuda_sumsq(s, g, n, ws, st));
    row("sumsq", shape, ms, 4.0 * n, 0, "x in");
    CK(cudaFree(p)); CK(cudaFree(m)); CK(cudaFree(v)); CK(cudaFree(g)); CK(cudaFree(s));
  }
  CK(cudaFree(ws_buf.base));
  tsr_cuda_blas_destroy(&blas);
  CK(cudaStreamDestroy(st));
  return 0;
}
