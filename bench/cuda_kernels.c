/* cuda_kernels.c — throughput of each op of the CUDA backend (tsr_cuda_X, cuda/backend.h),
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
 * 4096 tokens per micro-batch.  Our attention kernels are timed again with document
 * masking (the ops' doc: documents of T / 8 tokens each), counting the pairs of each
 * document only (the causal count times (T/8 + 1) / (T + 1)).  Prints a table; never fails
 * on time.  Exits 77 without a GPU.  Usage: bench/cuda_kernels [tokens (default 4096)]
 *
 * bench/cuda_kernels --profile > profile.nml instead measures what `tessera plan` prices
 * (src/plan/plan_profile.h: GEMMs over sizes, attention over sequence lengths and head sizes,
 * memory-bound kernels, a kernel's fixed cost), fits the profile's curves and prints them
 * as a &hardware group for `tessera plan --profile profile.nml` (the measurements on
 * stderr). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "backend.h"

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

/* Device document starts (ops_list.h "Documents") of B sequences of T rows cut into
 * documents of len rows. */
static int32_t *dev_docs(int B, int T, int len) {
  int32_t *h = malloc((size_t)B * T * sizeof(int32_t)), *d = dev((size_t)B * T * sizeof(int32_t));
  if (!h) exit(1);
  for (long r = 0; r < (long)B * T; r++) h[r] = (int32_t)(r % T / len * len);
  CK(cudaMemcpy(d, h, (size_t)B * T * sizeof(int32_t), cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static double peak_gbs, peak_tc[3], peak_f32; /* peak_tc by dtype (bf16, fp16) */
static const tsr_dtype all_dt[3] = {TSR_F32, TSR_BF16, TSR_F16};

static void row(const char *name, tsr_dtype dt, const char *shape, double ms, double amount,
                int is_flops, const char *model) {
  const double rate = amount / (ms * 1e-3) / (is_flops ? 1e12 : 1e9);
  const double peak = !is_flops ? peak_gbs : dt == TSR_F32 ? peak_f32 : peak_tc[dt];
  printf("%-26s %-5s %-28s %9.1f %9.1f %-7s %6.1f%%  %s\n", name, tsr_dtype_name(dt), shape,
         ms * 1e3, rate, is_flops ? "TFLOP/s" : "GB/s", 100.0 * rate / peak, model);
}

/* ---- --profile: the planner's kernel profile (src/plan/plan_profile.h) of this GPU ---- */

static double sat(double x, double half) { return x / (x + half); }

/* The half h and asymptote e of rate = e x peak x s(a) s(b) s(c) (s(x) = x / (x + h)) that
 * fit n measured rates best in the log (a grid over h; e then in closed form). */
static void fit_curve(int n, const double dims[][3], const double *rate, double peak,
                      double *e_out, double *h_out) {
  double best = 1e300;
  for (double h = 1; h <= 16384; h *= 1.05) {
    double sum = 0, err = 0;
    for (int i = 0; i < n; i++)
      sum += log(rate[i] / (peak * sat(dims[i][0], h) * sat(dims[i][1], h) * sat(dims[i][2], h)));
    const double e = exp(sum / n);
    for (int i = 0; i < n; i++) {
      const double d = log(rate[i] / (e * peak * sat(dims[i][0], h) * sat(dims[i][1], h) *
                                      sat(dims[i][2], h)));
      err += d * d;
    }
    if (err < best) best = err, *e_out = e, *h_out = h;
  }
}

/* Measures what the planner prices (GEMMs by shape, attention by sequence length and head
 * size, memory-bound kernels, one kernel's fixed cost) and prints it as a &hardware group
 * against the datasheet figures tessera plan has for this GPU: `tessera plan --profile`. */
static int write_profile(const struct cudaDeviceProp *prop) {
  float ms;
  const char *name = strstr(prop->name, "H100") ? "h100" : strstr(prop->name, "H200") ? "h200"
                     : strstr(prop->name, "A100") ? "a100" : "custom";
  /* the datasheet peaks tessera plan's built-in table holds (src/plan/plan_profile.c) */
  const double sheet_tc = !strcmp(name, "a100") ? 312 : !strcmp(name, "custom") ? peak_tc[1] : 989;
  const double sheet_f32 = !strcmp(name, "a100") ? 19.5 : !strcmp(name, "custom") ? peak_f32 : 67;
  const double sheet_gbs = !strcmp(name, "a100") ? 2039 : !strcmp(name, "h200") ? 4800
                           : !strcmp(name, "custom") ? peak_gbs : 3350;
  /* GEMMs, forward and backward (6 m n k), over sizes from 1024 to 8192 */
  const double g[][3] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {2048, 2048, 2048},
                         {1024, 1024, 1024}, {4096, 4096, 6144}, {4096, 11008, 4096},
                         {4096, 4096, 22016}, {4096, 1024, 4096}, {2048, 4096, 4096}};
  const int ng = (int)(sizeof g / sizeof g[0]);
  const size_t most = (size_t)4096 * 22016;
  void *x = dev(most * 2), *w = dev(most * 2), *y = dev(most * 2), *dx = dev(most * 2);
  float *dw = dev(most * 4);
  double rate[16], e16 = 0, h16 = 0;
  for (int i = 0; i < ng; i++) {
    const int n = (int)g[i][0], in = (int)g[i][1], out = (int)g[i][2];
    TIME_MS(ms, tsr_cuda_matmul_fwd(TSR_BF16, y, x, w, NULL, n, in, out);
                tsr_cuda_matmul_bwd(TSR_BF16, dx, dw, NULL, y, x, w, NULL, n, in, out));
    rate[i] = 6.0 * n * in * out / (ms * 1e-3) / 1e12;
    fprintf(stderr, "gemm bf16 %5d x %5d -> %5d  fwd+bwd %8.1f TFLOP/s\n", n, in, out, rate[i]);
  }
  fit_curve(ng, g, rate, sheet_tc, &e16, &h16);
  TIME_MS(ms, tsr_cuda_matmul_fwd(TSR_F32, y, x, w, NULL, 4096, 4096, 4096);
              tsr_cuda_matmul_bwd(TSR_F32, dx, dw, NULL, y, x, w, NULL, 4096, 4096, 4096));
  const double s4 = sat(4096, h16) * sat(4096, h16) * sat(4096, h16);
  const double e32 = 6.0 * 4096 * 4096 * 4096.0 / (ms * 1e-3) / 1e12 / (sheet_f32 * s4);
  dfree(x), dfree(w), dfree(y), dfree(dx), dfree(dw);
  /* attention, the path the trainer takes: 4096 tokens as B x T, 32 heads, 8 KV heads */
  const int H = 32, KV = 8, NT = 4096;
  tsr_ops_shapes s = {.dt = TSR_BF16, .deterministic = 1, .rows = NT, .cols = 4L * 11008,
                      .vocab_local = 32000, .attn_bht = (long)NT * H, .sumsq_elems = 1 << 20,
                      .attn_part = 2L * NT * H * 128, .attn_io = (long)NT * (H + KV) * 128,
                      .attn_t = 4096, .attn_hd = 128};
  if (be->reserve(&s) != 0) return 1;
  const int shapes[][2] = {{1024, 128}, {2048, 128}, {4096, 128}, {2048, 64}}; /* T, hd */
  double af[4][2], ab[4][2]; /* [shape][fp32, 16-bit] TFLOP/s */
  for (int k = 0; k < 4; k++)
    for (int d = 0; d < 2; d++) {
      const tsr_dtype dt = d ? TSR_BF16 : TSR_F32;
      const int T = shapes[k][0], hd = shapes[k][1], B = NT / T, stride = (H + 2 * KV) * hd;
      const size_t es = tsr_dtype_size(dt), rows = (size_t)NT;
      char *qkv = dev(rows * stride * es), *dqkv = dev(rows * stride * es);
      void *out = dev(rows * H * hd * es), *dout = dev(rows * H * hd * es);
      float *lse = dev(rows * H * 4);
      char *q = qkv, *kk = qkv + (size_t)H * hd * es, *v = qkv + (size_t)(H + KV) * hd * es;
      char *dq = dqkv, *dk = dqkv + (size_t)H * hd * es, *dv = dqkv + (size_t)(H + KV) * hd * es;
      const double flops = 2.0 * B * H * (double)T * T * hd; /* causal forward, as counted */
      tsr_cuda_attention_fwd(dt, out, lse, q, kk, v, B, T, H, KV, hd, stride, NULL);
      TIME_MS(ms, tsr_cuda_attention_fwd(dt, out, lse, q, kk, v, B, T, H, KV, hd, stride, NULL));
      af[k][d] = flops / (ms * 1e-3) / 1e12;
      TIME_MS(ms, tsr_cuda_attention_bwd(dt, dq, dk, dv, dout, out, lse, q, kk, v, B, T, H, KV,
                                        hd, stride, NULL));
      ab[k][d] = 2.5 * flops / (ms * 1e-3) / 1e12;
      fprintf(stderr, "attention %s T %4d hd %3d  fwd %7.1f  bwd %7.1f TFLOP/s\n",
              tsr_dtype_name(dt), T, hd, af[k][d], ab[k][d]);
      dfree(qkv), dfree(dqkv), dfree(out), dfree(dout);
      CK(cudaFree(lse));
    }
  /* the sequence curve from T 1024..4096 (forward and backward together, hd 128), the
   * head-size one from hd 64 against 128 at T 2048 */
  double t_half = 0, best = 1e300;
  for (double h = 1; h <= 65536; h *= 1.05) {
    double sum = 0, err = 0;
    for (int k = 0; k < 3; k++) sum += log((af[k][1] + ab[k][1]) / sat(shapes[k][0], h));
    for (int k = 0; k < 3; k++) {
      const double d = log((af[k][1] + ab[k][1]) / sat(shapes[k][0], h)) - sum / 3;
      err += d * d;
    }
    if (err < best) best = err, t_half = h;
  }
  const double r = (af[3][1] + ab[3][1]) / (af[1][1] + ab[1][1]); /* s(64) / s(128) */
  const double hd_half = r < 1 && r > 0.5 ? 64 * 128 * (r - 1) / (64 - r * 128) : 0;
  const double shape = sat(2048, t_half) * sat(128, hd_half);
  /* memory-bound kernels in bf16, and AdamW in fp32: their share of the datasheet rate */
  const long nc = (long)NT * 4096, nf = (long)NT * 11008, na = 50L * 1000 * 1000;
  void *a = dev(2 * nf * 2), *b = dev(2 * nf * 2), *c = dev(2 * nf * 2), *wt = dev(4096 * 2);
  float *rs = dev(NT * 4), *p = dev(na * 4), *m = dev(na * 4), *vv = dev(na * 4), *gg = dev(na * 4);
  double gbs = 0;
  TIME_MS(ms, tsr_cuda_residual(TSR_BF16, c, a, b, nc));
  gbs += 3.0 * nc * 2 / (ms * 1e-3) / 1e9;
  TIME_MS(ms, tsr_cuda_rmsnorm_fwd(TSR_BF16, c, rs, NULL, a, NULL, wt, NT, 4096, 1e-5f));
  gbs += 2.0 * nc * 2 / (ms * 1e-3) / 1e9;
  TIME_MS(ms, tsr_cuda_swiglu_fwd(TSR_BF16, c, a, NT, 11008));
  gbs += 3.0 * nf * 2 / (ms * 1e-3) / 1e9;
  TIME_MS(ms, tsr_cuda_swiglu_bwd(TSR_BF16, c, b, a, NT, 11008));
  gbs += 5.0 * nf * 2 / (ms * 1e-3) / 1e9;
  TIME_MS(ms, tsr_cuda_adamw(p, m, vv, gg, na, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL,
                            TSR_F32));
  gbs += 7.0 * na * 4 / (ms * 1e-3) / 1e9;
  TIME_MS(ms, tsr_cuda_residual(TSR_BF16, c, a, b, 256)); /* a kernel that moves nothing */
  const double kernel_us = ms * 1e3;
  dfree(a), dfree(b), dfree(c), dfree(wt), dfree(rs), dfree(p), dfree(m), dfree(vv), dfree(gg);
  printf("! The planner's profile of Tessera's kernels on %s (sm_%d%d, %d SMs), measured by\n"
         "! bench/cuda_kernels --profile: GEMMs forward + backward at 1024..8192 (a size curve\n"
         "! fitted to %d shapes), attention as the trainer runs it at T 1024..4096 and hd 64,\n"
         "! 128, memory-bound kernels against the datasheet's %.0f GB/s (copy: %.0f).  Links\n"
         "! are not measured here: tessera plan keeps its built-in figures for them.\n"
         "! Use: tessera plan DECK --profile FILE\n&hardware\n", prop->name, prop->major,
         prop->minor, prop->multiProcessorCount, ng, sheet_gbs, peak_gbs);
  printf("  name = '%s'\n  implementation = 'tessera'\n", name);
  if (!strcmp(name, "custom"))
    printf("  peak_tflops = %.1f\n  peak_fp32_tflops = %.1f\n  hbm_gb = %.1f\n"
           "  hbm_gbps = %.0f\n  ! set intra_node_gbps, inter_node_gbps and gpus_per_node\n",
           peak_tc[1], peak_f32, prop->totalGlobalMem / 1e9, peak_gbs);
  printf("  gemm_efficiency = %.4f\n  gemm_fp32_efficiency = %.4f\n  gemm_half_dim = %.1f\n",
         e16, e32, h16);
  printf("  attention_efficiency = %.4f\n  attention_bwd_efficiency = %.4f\n"
         "  attention_fp32_efficiency = %.4f\n  attention_fp32_bwd_efficiency = %.4f\n"
         "  attention_half_seq = %.1f\n  attention_half_hd = %.1f\n",
         af[1][1] / (sheet_tc * shape), ab[1][1] / (sheet_tc * shape),
         af[1][0] / (sheet_f32 * shape), ab[1][0] / (sheet_f32 * shape), t_half, hd_half);
  printf("  memory_efficiency = %.4f\n  kernel_us = %.2f\n/\n", gbs / 5 / sheet_gbs, kernel_us);
  return 0;
}

int main(int argc, char **argv) {
  int n_dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev == 0) {
    printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const int profile = argc > 1 && !strcmp(argv[1], "--profile");
  const int N = argc > 1 && !profile ? atoi(argv[1]) : 4096; /* tokens per micro-batch */
  const int C = 4096, F = 11008, H = 32, KV = 8, V = 32000, T = 2048;
  const int B = N / T > 0 ? N / T : 1;
#ifdef TSR_HAVE_CUDNN
  if (!profile) /* the profile measures the attention the trainer would take */
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
      TIME_MS(ms, tsr_cuda_matmul_fwd(all_dt[d], y, x, w, NULL, M, M, M));
      peak_tc[d] = 2.0 * M * M * (double)M / (ms * 1e-3) / 1e12;
    }
    TIME_MS(ms, tsr_cuda_matmul_fwd(TSR_F32, y, x, w, NULL, K, K, K));
    peak_f32 = 2.0 * K * K * (double)K / (ms * 1e-3) / 1e12;
    dfree(x), dfree(w), dfree(y);
  }
  /* every op below fits this reserve (the deterministic kernels) */
  tsr_ops_shapes s = {.dt = TSR_BF16, .deterministic = 1, .rows = N, .cols = 2L * F,
                      .vocab_local = V, .attn_bht = (long)B * H * T, .sumsq_elems = SUMSQ,
                      .attn_part = 2L * B * H * T * 128, .attn_io = (long)B * T * (H + KV) * 128,
                      .attn_t = T, .attn_hd = 128};
  if (be->reserve(&s) != 0) return 1;
  if (profile) {
    const int rc = write_profile(&prop);
    be->close();
    return rc;
  }
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
        TIME_MS(ms, tsr_cuda_matmul_fwd(dt, y, x, w, NULL, N, in, out));
        row("matmul_fwd", dt, shape, ms, 2.0 * N * in * out, 1, "2 n in out");
        TIME_MS(ms, tsr_cuda_matmul_bwd(dt, dx, dw, NULL, y, x, w, NULL, N, in, out));
        row("matmul_bwd (dx, dw)", dt, shape, ms, 4.0 * N * in * out, 1, "4 n in out");
        if (i == 2) { /* the MLP's down projection of GPT-2: the GELU's backward fused in */
          void *pre = dev((size_t)N * in * es);
          TIME_MS(ms, tsr_cuda_matmul_bwd(dt, dx, dw, NULL, y, x, w, pre, N, in, out));
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
      const int kinds[] = {TSR_ATT_MMA, TSR_ATT_CUDNN};
      for (int ki = 0; ki < (dt == TSR_F32 ? 1 : 2); ki++) {
        tsr_cuda_attention_use(kinds[ki]);
        const int path = tsr_cuda_attention_path(dt, B, T, H, KV, hd, (int)stride, 0);
        if (dt != TSR_F32 && path == TSR_ATT_PATH_F32 && ki) continue; /* shown once */
        if (ki == 1 && path != TSR_ATT_PATH_CUDNN) continue;
        static const char *const fwd_name[] = {"attention_fwd fp32-arith", "attention_fwd mma",
                                               "attention_fwd cudnn"};
        static const char *const bwd_name[] = {"attention_bwd fp32-arith", "attention_bwd mma",
                                               "attention_bwd cudnn"};
        tsr_cuda_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride, NULL);
        TIME_MS(ms, tsr_cuda_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride, NULL));
        row(fwd_name[path], dt, shape, ms, flops, 1, "causal 4 B H T^2 hd / 2");
        TIME_MS(ms, tsr_cuda_attention_bwd(dt, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,
                                          hd, (int)stride, NULL));
        row(bwd_name[path], dt, shape, ms, 2.5 * flops, 1, "2.5 x forward");
        if (ki == 0) { /* document masking on our kernels: documents of T / 8 tokens */
          const int len = T / 8 > 0 ? T / 8 : 1;
          const double share = (len + 1.0) / (T + 1.0);
          int32_t *doc = dev_docs(B, T, len);
          char name[64];
          tsr_cuda_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride, doc);
          TIME_MS(ms, tsr_cuda_attention_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, (int)stride,
                                            doc));
          snprintf(name, sizeof name, "%s docs", fwd_name[path]);
          row(name, dt, shape, ms, share * flops, 1, "documents of T/8: their pairs");
          TIME_MS(ms, tsr_cuda_attention_bwd(dt, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,
                                            hd, (int)stride, doc));
          snprintf(name, sizeof name, "%s docs", bwd_name[path]);
          row(name, dt, shape, ms, 2.5 * share * flops, 1, "2.5 x forward");
          dfree(doc);
        }
      }
      dfree(qkv), dfree(dqkv), dfree(out), dfree(dout);
      CK(cudaFree(lse));
    }
  }
  tsr_cuda_attention_use(tsr_cuda_ctx.attention); /* what the backend opened with */
  /* ---- memory-bound ops, per storage type (bytes counted in it) ---- */
  for (int d = 0; d < 3; d++) {
    const tsr_dtype dt = all_dt[d];
    const double es = (double)tsr_dtype_size(dt);
    const long nc = (long)N * C, nf = (long)N * F;
    void *x = dev(nc * es), *y = dev(nc * es), *h = dev(nc * es), *o = dev(nc * es);
    void *dy = dev(nc * es), *dx = dev(nc * es), *w = dev(C * es), *bb = dev(C * es);
    float *dw = dev(C * 4), *db = dev(C * 4), *rstd = dev(N * 4), *mean = dev(N * 4);
    snprintf(shape, sizeof shape, "%dx%d", N, C);
    TIME_MS(ms, tsr_cuda_rmsnorm_fwd(dt, o, rstd, NULL, x, NULL, w, N, C, 1e-5f));
    row("rmsnorm_fwd", dt, shape, ms, 2.0 * nc * es, 0, "x in, out out");
    TIME_MS(ms, tsr_cuda_rmsnorm_fwd(dt, o, rstd, h, x, y, w, N, C, 1e-5f));
    row("rmsnorm_fwd x+y fused", dt, shape, ms, 4.0 * nc * es, 0, "x, y in; h, out out");
    TIME_MS(ms, tsr_cuda_rmsnorm_bwd(dt, dx, dw, dy, x, w, rstd, N, C, 1));
    row("rmsnorm_bwd (acc)", dt, shape, ms, 4.0 * nc * es, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_cuda_layernorm_fwd(dt, o, mean, rstd, NULL, x, NULL, w, bb, N, C, 1e-5f));
    row("layernorm_fwd", dt, shape, ms, 2.0 * nc * es, 0, "x in, out out");
    TIME_MS(ms, tsr_cuda_layernorm_bwd(dt, dx, dw, db, dy, x, w, mean, rstd, N, C, 1));
    row("layernorm_bwd (acc)", dt, shape, ms, 4.0 * nc * es, 0, "dy, x in; dx in+out");
    TIME_MS(ms, tsr_cuda_residual(dt, o, x, y, nc));
    row("residual", dt, shape, ms, 3.0 * nc * es, 0, "2 in, 1 out");
    if (dt != TSR_F32) {
      TIME_MS(ms, tsr_cuda_cast(dt, o, TSR_F32, x, nc / 2));
      row("cast from fp32", dt, shape, ms, (4.0 + es) * nc / 2, 0, "fp32 in, out out");
    } else {
      TIME_MS(ms, tsr_cuda_add((float *)o, (const float *)x, (const float *)y, nc));
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
    TIME_MS(ms, tsr_cuda_embedding_fwd(dt, o, tok, wte, NULL, N, N, C, 0, V, NULL));
    row("embedding_fwd", dt, shape, ms, 2.0 * nc * es, 0, "rows in, out");
    TIME_MS(ms, tsr_cuda_embedding_bwd(dt, dwte, NULL, dy, tok, N, N, C, 0, V, NULL));
    row("embedding_bwd", dt, shape, ms, nc * (es + 8.0), 0, "dy in; fp32 rows in+out");
    dfree(wte), dfree(dwte), dfree(tok);
    void *qkv = dev((long)N * (H + 2 * KV) * 128 * es);
    snprintf(shape, sizeof shape, "%d x %d heads x %d", N, H, 128);
    TIME_MS(ms, tsr_cuda_rope_fwd(dt, qkv, N, N, H, 128, (H + 2 * KV) * 128, tsr_rope_plain(10000.0f), NULL));
    row("rope_fwd (q)", dt, shape, ms, 2.0 * N * H * 128 * es, 0, "in+out");
    CK(cudaFree(qkv));
    dfree(x), dfree(y), dfree(h), dfree(o), dfree(dy);
    dfree(dx), dfree(w), dfree(bb), dfree(dw), dfree(db);
    dfree(rstd), dfree(mean);

    void *gu = dev(2 * nf * es), *a = dev(nf * es), *dgu = dev(2 * nf * es);
    snprintf(shape, sizeof shape, "%dx%d", N, F);
    TIME_MS(ms, tsr_cuda_swiglu_fwd(dt, a, gu, N, F));
    row("swiglu_fwd", dt, shape, ms, 3.0 * nf * es, 0, "2F in, F out");
    TIME_MS(ms, tsr_cuda_swiglu_bwd(dt, dgu, a, gu, N, F));
    row("swiglu_bwd", dt, shape, ms, 5.0 * nf * es, 0, "3F in, 2F out");
    TIME_MS(ms, tsr_cuda_gelu_fwd(dt, a, gu, nf));
    row("gelu_fwd", dt, shape, ms, 2.0 * nf * es, 0, "in, out");
    dfree(gu), dfree(a), dfree(dgu);

    void *logits = dev((size_t)N * V * es);
    int32_t *tgt = dev(N * 4);
    CK(cudaMemset(tgt, 0, N * 4));
    double *loss = dev(8);
    snprintf(shape, sizeof shape, "%dx%d", N, V);
    TIME_MS(ms, tsr_cuda_xent(dt, loss, 1.0, logits, tgt, N, V, 1.0f / N, 1));
    row("xent +grad (fused)", dt, shape, ms, 4.0 * N * V * es, 0, "3 reads + 1 write");
    dfree(logits), dfree(tgt), dfree(loss);
  }
  {
    const long n = SUMSQ;
    float *p = dev(n * 4), *m = dev(n * 4), *v = dev(n * 4), *g = dev(n * 4);
    void *c = dev(n * 4);
    snprintf(shape, sizeof shape, "%ld", n);
    TIME_MS(ms, tsr_cuda_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, NULL,
                              TSR_F32));
    row("adamw", TSR_F32, shape, ms, 7.0 * n * 4, 0, "p,m,v,g in; p,m,v out");
    for (int d = 1; d < 3; d++) {
      TIME_MS(ms, tsr_cuda_adamw(p, m, v, g, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, c,
                                all_dt[d]));
      row("adamw + refresh", all_dt[d], shape, ms, 7.0 * n * 4 + 2.0 * n, 0,
          "p,m,v,g in; p,m,v, copy out");
    }
    const int64_t r[2] = {0, n};
    double sq = 0;
    TIME_MS(ms, sq += tsr_cuda_sumsq_ranges(g, r, 1));
    row("sumsq_ranges (1 range)", TSR_F32, shape, ms, 4.0 * n, 0, "x in; + one fetch");
    dfree(p), dfree(m), dfree(v), dfree(g), dfree(c);
    if (sq != sq) printf("# sumsq_ranges gave NaN\n");
  }
  be->close();
  return 0;
}
