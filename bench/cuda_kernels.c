/* cuda_kernels.c — throughput of each op of the CUDA backend (tsr_dev_X, cuda/ops_dev.h),
 * per storage type, against the device's peaks measured in the same run.
 *
 * The references, measured first, on the same device:
 *   memory:  a device-to-device cudaMemcpy of 1 GiB (bytes read + written per second);
 *   compute: the backend's own GEMM (cuBLASLt) 8192^3 in bf16 and in fp16 (tensor cores)
 *            and 4096^3 in fp32 (true fp32, the peak the SIMT kernels can hope for).
 * Each op is timed with CUDA events on the backend's stream: 3 warm-up calls, then the
 * median of 21.  Memory-bound ops report GB/s with the bytes each must move at least
 * (stated per row, in the row's storage type); GEMMs and attention report TFLOP/s
 * (attention counts the causal half: forward 2 * 2*B*H*T*T*hd / 2, backward 2.5x that),
 * and every row its share of the matching peak (16-bit rows of the tensor-core peak of
 * their type, fp32 rows of the fp32 one).  The shapes are those of a LLaMA-7B layer with
 * 4096 tokens per micro-batch.  Prints a table; never fails on time.  Exits 77 without a
 * GPU.  Usage: bench/cuda_kernels [tokens (default 4096)] */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev.h"
#include "ops_dev.h"

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

static const tsr_ops_backend *be;
static cudaStream_t st;
static cudaEvent_t ev0, ev1;

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}
static void backend_ok(const char *what) {
  if (be->status() != 0) {
    fprintf(stderr, "cuda_kernels: %s failed\n", what);
    exit(1);
  }
}

/* median milliseconds of the statements `body` (ops queued on the backend's stream) */
#define TIME_MS(result, ...)                                      \
  do {                                                            \
    float ms_[REPS];                                              \
    for (int w_ = 0; w_ < WARMUP; w_++) { __VA_ARGS__; }          \
    for (int r_ = 0; r_ < REPS; r_++) {                           \
      CK(cudaEventRecord(ev0, st));                               \
      __VA_ARGS__;                                                \
      CK(cudaEventRecord(ev1, st));                               \
      CK(cudaEventSynchronize(ev1));                              \
      CK(cudaEventElapsedTime(&ms_[r_], ev0, ev1));               \
    }                                                             \
    backend_ok(#__VA_ARGS__);                                     \
    qsort(ms_, REPS, sizeof(float), cmp_float);                   \
    (result) = ms_[REPS / 2];                                     \
  } while (0)

/* Device memory of random-ish, finite contents (never zeros): bf16 pairs in
 * [-0.25, 0.25), which read as finite fp32 and fp16 values too. */
static void *dev(size_t bytes) {
  void *p;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  const size_t n = bytes / 4, chunk = (n > (1 << 22) ? (1 << 22) : n);
  uint32_t *h = malloc((chunk ? chunk : 1) * 4), s = 12345u;
  for (size_t i = 0; i < chunk; i++) {
    uint32_t word = 0;
    for (int half = 0; half < 2; half++) {
      s = s * 1664525u + 1013904223u;
      const float x = ((s >> 9) * (1.0f / 8388608.0f) - 0.5f) * 0.5f;
      uint32_t u;
      memcpy(&u, &x, 4);
      word |= half ? (u >> 16) : (u & 0xffff0000u);
    }
    h[i] = word & 0xbfffbfffu; /* exponents below the top: finite in fp16 too */
  }
  for (size_t off = 0; off < n; off += chunk)
    CK(cudaMemcpy((uint32_t *)p + off, h, (n - off < chunk ? n - off : chunk) * 4,
                  cudaMemcpyHostToDevice));
  free(h);
  return p;
}

static void dfree(void *p) { CK(cudaFree(p)); }

static double peak_gbs, peak_tc[3], peak_f32; /* peak_tc by dtype (bf16, fp16) */
static const tsr_dtype all_dt[3] = {TSR_F32, TSR_BF16, TSR_F16};

static void row(const char *name, tsr_dtype dt, const char *shape, double ms, double amount,
                int is_flops, const char *model) {
  const double rate = amount / (ms * 1e-3) / (is_flops ? 1e12 : 1e9);
  const double peak = !is_flops ? peak_gbs : dt == TSR_F32 ? peak_f32 : peak_tc[dt];
  printf("%-26s %-5s %-28s %9.1f %9.1f %-7s %6.1f%%  %s\n", name, tsr_dtype_name(dt), shape,
         ms * 1e3, rate, is_flops ? "TFLOP/s" : "GB/s", 100.0 * rate / peak, model);
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
  const int C = 4096, F = 11008, H = 32, KV = 8, V = 32000, T = 2048;
  const int B = N / T > 0 ? N / T : 1;
#ifdef TSR_HAVE_CUDNN
  setenv("TSR_CUDA_ATTENTION", "cudnn", 1); /* its workspace reserved; kinds switched below */
#endif
  unsetenv("TSR_CUDA_PROFILE");
  if (tsr_cuda_ops_open_device(0, &be) != 0) return 1;
  st = (cudaStream_t)tsr_cuda_ops_stream();
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  float ms;
  const long SUMSQ = 100L * 1000 * 1000;

  /* ---- the references ---- */
  {
    tsr_ops_shapes s = {.dt = TSR_BF16, .deterministic = 1, .rows = 8192, .cols = 8192};
    if (be->reserve(&s) != 0) return 1;
    const size_t big = (size_t)1 << 30;
    void *a = dev(big), *b = dev(big);
    TIME_MS(ms, CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, st)));
    peak_gbs = 2.0 * big / (ms * 1e-3) / 1e9;
    CK(cudaFree(a));
    CK(cudaFree(b));
    const int M = 8192, K = 4096;
    void *x = dev((size_t)M * M * 2), *w = dev((size_t)M * M * 2), *y = dev((size_t)M * M * 2);
    for (int d = 1; d < 3; d++) {
      TIME_MS(ms, tsr_dev_matmul_fwd(all_dt[d], y, x, w, NULL, M, M, M));
      peak_tc[d] = 2.0 * M * M * (double)M / (ms * 1e-3) / 1e12;
    }
    TIME_MS(ms, tsr_dev_matmul_fwd(TSR_F32, y, x, w, NULL, K, K, K));
    peak_f32 = 2.0 * K * K * (double)K / (ms * 1e-3) / 1e12;
    dfree(x), dfree(w), dfree(y);
  }
  /* every op below fits this reserve (the deterministic kernels) */
  tsr_ops_shapes s = {.dt = TSR_BF16, .deterministic = 1, .rows = N, .cols = 2L * F,
                      .vocab_local = V, .attn_bht = (long)B * H * T, .sumsq_elems = SUMSQ,
                      .attn_part = 2L * B * H * T * 128, .attn_io = (long)B * T * (H + KV) * 128,
                      .attn_t = T, .attn_hd = 128};
  if (be->reserve(&s) != 0) return 1;
  printf("device %s (sm_%d%d, %d SMs); %d tokens per micro-batch\n", prop.name, prop.major,
         prop.minor, prop.multiProcessorCount, N);
  printf("measured peaks: memory %.0f GB/s (D2D copy 1 GiB), GEMM bf16 %.1f, fp16 %.1f "
         "TFLOP/s (8192^3), fp32 %.1f TFLOP/s (4096^3)\n\n",
         peak_gbs, peak_tc[TSR_BF16], peak_tc[TSR_F16], peak_f32);
  printf("%-26s %-5s %-28s %9s %9s %-7s %7s  %s\n", "op", "type", "shape", "us", "achieved", "",
         "of peak", "counted");

  char shape[64];
  /* ---- GEMMs: 16-bit on the tensor cores (fp32 accumulation), fp32 true fp32 ---- */
  {
    const int shapes[][2] = {{C, (H + 2 * KV) * 128}, {C, 2 * F}, {F, C}, {C, V}};
    const char *names[] = {"qkv", "gate_up", "down", "lm_head"};
    for (int i = 0; i < 4; i++)
      for (int d = 0; d < 3; d++) {
        const tsr_dtype dt = all_dt[d];
        const size_t es = tsr_dtype_size(dt);
        const int in = shapes[i][0], out = shapes[i][1];
        void *x = dev((size_t)N * in * es), *w = dev((size_t)out * in * es);
        void *y = dev((size_t)N * out * es), *dx = dev((size_t)N * in * es);
        float *dw = dev((size_t)out * in * 4);
        snprintf(shape, sizeof shape, "%s %dx%d->%d", names[i], N, in, out);
        TIME_MS(ms, tsr_dev_matmul_fwd(dt, y, x, w, NULL, N, in, out));
        row("matmul_fwd", dt, shape, ms, 2.0 * N * in * out, 1, "2 n in out");
        TIME_MS(ms, tsr_dev_matmul_bwd(dt, dx, dw, NULL, y, x, w, NULL, N, in, out));
        row("matmul_bwd (dx, dw)", dt, shape, ms, 4.0 * N * in * out, 1, "4 n in out");
        if (i == 2) { /* the MLP's down projection of GPT-2: the GELU's backward fused in */
          void *pre = dev((size_t)N * in * es);
          TIME_MS(ms, tsr_dev_matmul_bwd(dt, dx, dw, NULL, y, x, w, pre, N, in, out));
          row("matmul_bwd +gelu_pre", dt, shape, ms, 4.0 * N * in * out, 1, "4 n in out");
          CK(cudaFree(pre));
        }
        dfree(x), dfree(w), dfree(y), dfree(dx), dfree(dw);
      }
  }
  /* ---- attention: each kernel family the storage type has ---- */
  for (int hd = 128; hd >= 64; hd /= 2) {
    const long rows = (long)B * T, stride = (H + 2 * KV) * hd;
    const double flops = 2.0 * 2.0 * B * H * (double)T * T * hd / 2;
    snprintf(shape, sizeof shape, "B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    for (int d = 0; d < 3; d++) {
      const tsr_dtype dt = all_dt[d];
      const size_t es = tsr_dtype_size(dt);
      char *qkv = dev(rows * stride * es), *dqkv = dev(rows * stride * es);
      void *out = dev(rows * H * hd * es), *dout = dev(rows * H * hd * es);
      float *lse = dev(rows * H * 4);
      char *q = qkv, *k = qkv + (size_t)H * hd * es, *v = qkv + (size_t)(H + KV) * hd * es;
      char *dq = dqkv, *dk = dqkv + (size_t)H * hd * es, *dv = dqkv + (size_t)(H + KV) * hd * es;
      const int kinds[] = {TSR_ATT_WMMA, TSR_ATT_MMA, TSR_ATT_CUDNN};
      for (int ki = 0; ki < (dt == TSR_F32 ? 1 : 3); ki++) {
        tsr_cuda_attention_use(kinds[ki]);
        const int path = tsr_cuda_attention_path(dt, B, T, H, KV, hd, (int)stride);
        if (dt != TSR_F32 && path == TSR_ATT_PATH_F32 && ki) continue; /* shown once */
        if (ki == 2 && path != TSR_ATT_PATH_CUDNN) continue;
        static const char *const fwd_name[] = {"attention_fwd fp32-arith", "attention_fwd wmma",
                                               "attention_fwd mma", "attention_fwd cudnn"};
        static const char *const bwd_name[] = {"attention_bwd fp32-arith", "attention_bwd wmma",
                                               "attention_bwd mma", "attention_bwd cudnn"};
        tsr_dev_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride);
        TIME_MS(ms, tsr_dev_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride));
        row(fwd_name[path], dt, shape, ms, flops, 1, "causal 4 B H T^2 hd / 2");
        TIME_MS(ms, tsr_dev_attention_bwd(dt, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,
                                          hd, (int)stride));
        row(bwd_name[path], dt, shape, ms, 2.5 * flops, 1, "2.5 x forward");
      }
      dfree(qkv), dfree(dqkv), dfree(out), dfree(dout);
      CK(cudaFree(lse));
    }
  }
  tsr_cuda_attention_use(TSR_ATT_WMMA);
  /* ---- memory-bound ops, per storage type (bytes counted in it) ---- */
  for (int d = 0; d < 3; d++) {
    const tsr_dtype dt = all_dt[d];
    const double es = (double)tsr_dtype_size(dt);
    const long nc = (long)N * C, nf = (long)N * F;
    void *x = dev(nc * es), *y = dev(nc * es), *h = dev(nc * es), *o = dev(nc * es);
    void *dy = dev(nc * es), *dx = dev(nc * es), *w = dev(C * es), *bb = dev(C * es);
    float *dw = dev(C * 4), *db = dev(C * 4), *rstd = dev(N * 4), *mean = dev(N * 4);
    snprintf(shape, sizeof shape, "%dx%d", N, C);
    TIME_MS(ms, tsr_dev_rmsnorm_fwd(dt, o, rstd, NULL, x, NULL, w, N, C, 1e-5f));
    row("rmsnorm_fwd", dt, shape, ms, 2.0 * nc * es, 0, "x in, out out");
    TIME_MS(ms, tsr_dev_rmsnorm_fwd(dt, o, rstd, h, x, y, w, N, C, 1e-5f));
    row("rmsnorm_fwd x+y fused", dt, shape, ms, 4.0 * nc * es, 0, "x, y in; h, out out");
    TIME_MS(ms, tsr_dev_rmsnorm_bwd(dt, dx, dw, dy, x, w, rstd, N, C, 1));
    row("rmsnorm_bwd (acc)", dt, shape, ms, 4.0 * nc * es, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_dev_layernorm_fwd(dt, o, mean, rstd, NULL, x, NULL, w, bb, N, C, 1e-5f));
    row("layernorm_fwd", dt, shape, ms, 2.0 * nc * es, 0, "x in, out out");
    TIME_MS(ms, tsr_dev_layernorm_bwd(dt, dx, dw, db, dy, x, w, mean, rstd, N, C, 1));
    row("layernorm_bwd (acc)", dt, shape, ms, 4.0 * nc * es, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_dev_residual(dt, o, x, y, nc));
    row("residual", dt, shape, ms, 3.0 * nc * es, 0, "2 in, 1 out");
    if (dt != TSR_F32) {
      TIME_MS(ms, tsr_dev_cast(dt, o, TSR_F32, x, nc / 2));
      row("cast from fp32", dt, shape, ms, (4.0 + es) * nc / 2, 0, "fp32 in, out out");
    } else {
      TIME_MS(ms, tsr_dev_add((float *)o, (const float *)x, (const float *)y, nc));
      row("add", dt, shape, ms, 3.0 * nc * 4, 0, "2 in, 1 out");
    }
    int32_t *tok = dev(N * 4);
    { /* spread token ids */
      int32_t *t = malloc(N * 4);
      for (int r = 0; r < N; r++) t[r] = (int32_t)((r * 7919u) % V);
      CK(cudaMemcpy(tok, t, N * 4, cudaMemcpyHostToDevice));
      free(t);
    }
    void *wte = dev((size_t)V * C * es);
    float *dwte = dev((size_t)V * C * 4);
    TIME_MS(ms, tsr_dev_embedding_fwd(dt, o, tok, wte, NULL, N, N, C, 0, V));
    row("embedding_fwd", dt, shape, ms, 2.0 * nc * es, 0, "rows in, out");
    TIME_MS(ms, tsr_dev_embedding_bwd(dt, dwte, NULL, dy, tok, N, N, C, 0, V));
    row("embedding_bwd", dt, shape, ms, nc * (es + 8.0), 0, "dy in; fp32 rows in+out");
    dfree(wte), dfree(dwte), dfree(tok);
    void *qkv = dev((long)N * (H + 2 * KV) * 128 * es);
    snprintf(shape, sizeof shape, "%d x %d heads x %d", N, H, 128);
    TIME_MS(ms, tsr_dev_rope_fwd(dt, qkv, N, N, H, 128, (H + 2 * KV) * 128, 10000.0f));
    row("rope_fwd (q)", dt, shape, ms, 2.0 * N * H * 128 * es, 0, "in+out");
    CK(cudaFree(qkv));
    dfree(x), dfree(y), dfree(h), dfree(o), dfree(dy);
    dfree(dx), dfree(w), dfree(bb), dfree(dw), dfree(db);
    dfree(rstd), dfree(mean);

    void *gu = dev(2 * nf * es), *a = dev(nf * es), *dgu = dev(2 * nf * es);
    snprintf(shape, sizeof shape, "%dx%d", N, F);
    TIME_MS(ms, tsr_dev_swiglu_fwd(dt, a, gu, N, F));
    row("swiglu_fwd", dt, shape, ms, 3.0 * nf * es, 0, "2F in, F out");
    TIME_MS(ms, tsr_dev_swiglu_bwd(dt, dgu, a, gu, N, F));
    row("swiglu_bwd", dt, shape, ms, 5.0 * nf * es, 0, "3F in, 2F out");
    TIME_MS(ms, tsr_dev_gelu_fwd(dt, a, gu, nf));
    row("gelu_fwd", dt, shape, ms, 2.0 * nf * es, 0, "in, out");
    dfree(gu), dfree(a), dfree(dgu);

    void *logits = dev((size_t)N * V * es);
    int32_t *tgt = dev(N * 4);
    CK(cudaMemset(tgt, 0, N * 4));
    double *loss = dev(8);
    snprintf(shape, sizeof shape, "%dx%d", N, V);
    TIME_MS(ms, tsr_dev_xent(dt, loss, 1.0, logits, tgt, N, V, 1.0f / N, 1));
    row("xent +grad (fused)", dt, shape, ms, 4.0 * N * V * es, 0, "3 reads + 1 write");
    dfree(logits), dfree(tgt), dfree(loss);
  }
  {
    const long n = SUMSQ;
    float *p = dev(n * 4), *m = dev(n * 4), *v = dev(n * 4), *g = dev(n * 4);
    void *c = dev(n * 4);
    snprintf(shape, sizeof shape, "%ld", n);
    TIME_MS(ms, tsr_dev_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL,
                              TSR_F32));
    row("adamw", TSR_F32, shape, ms, 7.0 * n * 4, 0, "p,m,v,g in; p,m,v out");
    for (int d = 1; d < 3; d++) {
      TIME_MS(ms, tsr_dev_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, c,
                                all_dt[d]));
      row("adamw + refresh", all_dt[d], shape, ms, 7.0 * n * 4 + 2.0 * n, 0,
          "p,m,v,g in; p,m,v, copy out");
    }
    const int64_t r[2] = {0, n};
    double sq = 0;
    TIME_MS(ms, sq += tsr_dev_sumsq_ranges(g, r, 1));
    row("sumsq_ranges (1 range)", TSR_F32, shape, ms, 4.0 * n, 0, "x in; + one fetch");
    dfree(p), dfree(m), dfree(v), dfree(g), dfree(c);
    if (sq != sq) printf("# sumsq_ranges gave NaN\n");
  }
  be->close();
  return 0;
}
