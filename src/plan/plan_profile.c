/* plan_profile.c — the machine of a plan (plan_profile.h): the built-in GPU figures and
 * kernel profiles, the deck's figures on top, the measured profile of this host ('cpu'),
 * and the prices of one kernel, one message and one ring collective.
 *
 * Where the built-in numbers come from.
 *  - Peaks, memory and links: NVIDIA's SXM datasheets.  Dense bf16 tensor-core peaks and
 *    dense fp32 peaks without tensor cores (an fp32 run computes in CUBLAS_COMPUTE_32F,
 *    TF32 off: cuda/gemm.cu).  Links per GPU and direction: NVLink 4 (H100, H200) 900 GB/s
 *    and NVLink 3 (A100) 600 GB/s counting both directions; one 400 Gb/s NDR (H100, H200)
 *    or 200 Gb/s HDR (A100) InfiniBand port per GPU.
 *  - Fitted to published runs (bench/plan_calibration.sh; bench/RESULTS.md "The planner
 *    against published runs"): the GEMM curve, gemm_efficiency 0.70 with gemm_half_dim
 *    128, the network at 1.0 of its port rate, and the reference stack's tp_overlap 0.9.
 *    The bench on one H100 measured cuBLASLt bf16 at 794 TFLOP/s for 8192^3 (0.803 of 989)
 *    and 0.78-0.79 for llama-7B shapes of 4096 tokens, and fp32 4096^3 at 50.5 of 67: short
 *    bursts, above what a training step sustains; the fp32 and A100 figures below take
 *    the bf16 fit's ratio, 0.70 / 0.82, of their measured or published burst rate.  The
 *    GEMM curve and the network are the machine's: both implementations share them.
 *  - Tessera's kernels ('tessera'): bench/cuda_kernels on one H100 SXM (bench/RESULTS.md
 *    "CUDA backend on an H100", tree b476917).  Attention: the WMMA tensor-core kernels
 *    of that tree (since removed; cuDNN's fused attention is now the default, the
 *    mma.sync kernels ours, neither profiled here yet) at B 2, T 2048, 32 heads: forward
 *    63.7 TFLOP/s at hd 128 and 55.4 at hd 64 (attention_half_hd 22 from their ratio),
 *    backward 33.5 at hd 128; fp32 9.0 and 6.7.
 *    How efficiency grows with T was not measured: attention_half_seq 256 is assumed, and
 *    the asymptotes are set so that the measured rows come out at T 2048.  Memory-bound
 *    kernels: SwiGLU backward, fused cross-entropy, AdamW and RMSNorm backward at 0.78,
 *    0.67, 0.79 and 0.39 of the 3350 GB/s datasheet rate, 0.66 on average.  No overlap of
 *    tp collectives or of ZeRO's gather with compute: Tessera does neither.
 *  - A well-tuned stack ('reference'): attention at FlashAttention-3 / cuDNN-9 levels as
 *    their authors plot them for H100 bf16, head dim 128, causal, 4k tokens (about 600
 *    TFLOP/s forward and 450 backward): the asymptotes 0.84 and 0.65 with
 *    attention_half_seq 512 and attention_half_hd 32 give those at T 4096; element-wise
 *    kernels fused and at 0.8 of the datasheet (the device copy reached 0.895);
 *    tensor-parallel collectives overlapped with the GEMMs they feed (Megatron-LM's
 *    --tp-comm-overlap) and ZeRO's parameter gather with the next forward
 *    (--overlap-param-gather).  A100: FlashAttention-2's paper reports up to 73% of
 *    peak forward and 63% backward.
 *  - NVLink: no multi-GPU machine was measured here.  Collectives inside a node are
 *    taken at 0.8 of NVLink's bandwidth, with 10 us per message (20 us between nodes):
 *    assumptions of the order NCCL's own tests report, stated as such.
 *  - H200: the H100's chip with more and faster HBM; Tessera on an A100 (never measured):
 *    the H100's fractions.  'custom': the H100 profile of the implementation.
 *  - The host side of the optimizer offload (parallel.offload), per node as NVIDIA's DGX
 *    datasheets give it: DGX H100 and DGX H200 2 x Xeon Platinum 8480C (112 cores) and 2
 *    TB of DDR5, DGX A100 (640 GB) 2 x EPYC 7742 (128 cores) and 2 TB of DDR4; the host
 *    memory taken as 2048 GB.  Host memory bandwidth: 0.7 of the DDR peak, about what
 *    STREAM's triad reaches on two-socket servers (an assumption, not measured here): 16
 *    channels of DDR5 at 4400 MT/s (two DIMMs a channel for 2 TB) 563 GB/s -> 394; 16 of
 *    DDR4-3200 410 GB/s -> 287.  Copies between a GPU and page-locked host memory: PCIe
 *    Gen5 x16 (H100, H200) 64 GB/s and Gen4 x16 (A100) 32 GB/s per direction on the wire,
 *    taken at 50 and 25, about what CUDA's bandwidthTest reports for pinned copies (where
 *    two GPUs share a switch's uplink to the CPU, each gets about half when both copy:
 *    set hardware.pcie_gbps).  One core's AdamW (src/cpu/cpu_optim.c, the host kernel
 *    the offload runs): 11.5 GB/s, bench/cpu_adamw.sh on one core of the development
 *    VM's Xeon with 64 Mi parameters and the bf16 copy (bench/RESULTS.md "The CPU half of
 *    optimizer offload": 382 Mparam/s x 30 bytes by the wall clock, 426 per core-second;
 *    without the copy 440-484 x 28 bytes, 12.3-13.6 GB/s), the lower figure, until a GPU
 *    node's cores are measured; on an 8-GPU node the memory bandwidth binds before it (14
 *    cores x 11.5 = 161 GB/s against 394 / 8 = 49). */
#include "plan_profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/gemm_probe.h"
#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "core/util.h"

/* Datasheet figures, in the order of tsr_hw_name ('custom' and 'cpu': none built in). */
static const struct {
  const char *name;
  double bf16_tflops, fp32_tflops, hbm_gb, hbm_gbps, nvlink_gbps, network_gbps;
  int per_node;
  double host_gb, host_mem_gbps, pcie_gbps; /* the node's host side ('custom': the h100's) */
  int cores;
} builtin[] = {
    {"h100", 989.0, 67.0, 80.0, 3350.0, 450.0, 50.0, 8, 2048.0, 394.0, 50.0, 112},
    {"h200", 989.0, 67.0, 141.0, 4800.0, 450.0, 50.0, 8, 2048.0, 394.0, 50.0, 112},
    {"a100", 312.0, 19.5, 80.0, 2039.0, 300.0, 25.0, 8, 2048.0, 287.0, 25.0, 128},
    {"custom", 0, 0, 0, 0, 0, 0, 0, 2048.0, 394.0, 50.0, 112},
    {"cpu", 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
};
/* GB/s one core's AdamW moves (the comment above) */
static const double cpu_adam_core_gbps = 11.5;

/* gemm_eff {fp32, 16-bit}, gemm_half_dim, attn_fwd {fp32, 16}, attn_bwd {fp32, 16},
 * attn_half_seq, attn_half_hd, mem_eff, kernel_s, link_eff {intra, inter}, link_latency_s
 * {intra, inter}, tp_overlap, gather_overlap, slowdown, source */
static const tsr_plan_profile tessera_h100 = {
    {0.66, 0.70}, 128, {0.177, 0.0849}, {0.132, 0.0447}, 256, 22, 0.66, 3e-6, {0.80, 1.0},
    {10e-6, 20e-6}, 0.0, 0.0, 1.0,
    "Tessera's kernels as measured on one H100 (bench/RESULTS.md), GEMMs and network as "
    "calibrated"};
static const tsr_plan_profile reference_h100 = {
    {0.66, 0.70}, 128, {0.50, 0.84}, {0.40, 0.65}, 512, 32, 0.80, 3e-6, {0.80, 1.0},
    {10e-6, 20e-6}, 0.9, 1.0, 1.0,
    "a well-tuned stack: cuBLAS GEMMs, FlashAttention-3-class attention, overlapped tp"};
static const tsr_plan_profile reference_a100 = {
    {0.73, 0.73}, 128, {0.50, 0.80}, {0.40, 0.70}, 512, 32, 0.80, 3e-6, {0.80, 1.0},
    {10e-6, 20e-6}, 0.9, 1.0, 1.0,
    "a well-tuned stack on an A100: cuBLAS GEMMs, FlashAttention-2 attention, overlapped tp"};

/* ---------------------------------------------------------------- this host */

/* Open MPI 4.1's shared memory between two ranks of the 2-core development VM, a
 * ping-pong measured by hand: 8 bytes one way in 0.27 us, 64 KiB in 22.7 us (2.9 GB/s),
 * the size of the CPU benchmarks' messages.  `mpirun -np 2 tessera plan` measures it. */
static double cpu_link_latency = 0.3e-6, cpu_link_bw = 2.9e9;
static int cpu_link_measured;

void tsr_plan_set_cpu_link(double latency_s, double bytes_per_s) {
  if (latency_s > 0 && bytes_per_s > 0)
    cpu_link_latency = latency_s, cpu_link_bw = bytes_per_s, cpu_link_measured = 1;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of repeated calls (a warm-up first), at least 7 and up to `budget` seconds:
 * what a kernel takes inside a run, where the caches are as warm as here. */
static double median_s(void (*fn)(void *), void *arg, double budget) {
  double t[101];
  int n = 0;
  fn(arg);
  const double start = tsr_now();
  while (n < 101 && (n < 7 || tsr_now() - start < budget)) {
    const double t0 = tsr_now();
    fn(arg);
    t[n++] = tsr_now() - t0;
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return t[n / 2];
}

typedef struct {
  tsr_dtype dt;
  int n, in, out, B, T, H, hd;
  void *x, *w, *y, *dx;
  float *dw, *lse;
} probe;

static void gemm_fb(void *a) {
  probe *p = a;
  tsr_ops_matmul_fwd(p->dt, p->y, p->x, p->w, NULL, p->n, p->in, p->out);
  tsr_ops_matmul_bwd(p->dt, p->dx, p->dw, NULL, p->y, p->x, p->w, NULL, p->n, p->in, p->out);
}
static void attn_fwd(void *a) {
  probe *p = a;
  const size_t es = tsr_dtype_size(p->dt), q = (size_t)p->H * p->hd * es;
  tsr_ops_attention_fwd(p->dt, p->y, p->lse, p->x, (char *)p->x + q, (char *)p->x + 2 * q, p->B,
                        p->T, p->H, p->H, p->hd, 3 * p->H * p->hd, NULL);
}
static void attn_bwd(void *a) {
  probe *p = a;
  const size_t es = tsr_dtype_size(p->dt), q = (size_t)p->H * p->hd * es;
  char *x = p->x, *dx = p->dx;
  tsr_ops_attention_bwd(p->dt, dx, dx + q, dx + 2 * q, p->w, p->y, p->lse, x, x + q, x + 2 * q,
                        p->B, p->T, p->H, p->H, p->hd, 3 * p->H * p->hd, NULL);
}
/* a residual add and an RMSNorm over [n, in]: 5 n in values moved (streaming) */
static void elementwise(void *a) {
  probe *p = a;
  tsr_ops_residual(p->dt, p->y, p->x, p->w, (long)p->n * p->in);
  tsr_ops_rmsnorm_fwd(p->dt, p->dx, p->lse, NULL, p->y, NULL, p->w, p->n, p->in, 1e-5f);
}
/* a layer's element-wise kernels over [n, in]: the residual add and the norm above, RoPE
 * on heads of 64 in place and SwiGLU of width in/2 from dx's [n, in] gate and up: 10 n in
 * values moved */
static void layer_mix(void *a) {
  probe *p = a;
  elementwise(a);
  tsr_ops_rope_fwd(p->dt, p->y, p->n, p->n, p->in / 64, 64, p->in, tsr_rope_plain(10000.0f), NULL);
  tsr_ops_swiglu_fwd(p->dt, p->w, p->dx, p->n, p->in / 2);
  tsr_ops_swiglu_fwd(p->dt, p->x, p->dx, p->n, p->in / 2);
}

/* GEMM operands in rotation: `sets` copies, so that each call finds its weights as a
 * layer of a training step does, not in the cache from the call before */
enum { GEMM_SETS = 16 };
typedef struct {
  probe set[GEMM_SETS];
  int next;
} rotation;
static void gemm_rotating(void *a) {
  rotation *r = a;
  gemm_fb(&r->set[r->next]);
  r->next = (r->next + 1) % GEMM_SETS;
}

/* Buffers for a probe of `elems` elements each in op memory, filled with small values. */
static int probe_alloc(probe *p, size_t elems) {
  const size_t es = tsr_dtype_size(p->dt);
  void **bufs[] = {&p->x, &p->w, &p->y, &p->dx};
  for (int i = 0; i < 4; i++) {
    if (!(*bufs[i] = tsr_ops_alloc(elems, es))) return TSR_ERR;
    for (size_t j = 0; j < elems; j++) tsr_store(p->dt, *bufs[i], j, (float)(j % 7) * 0.01f);
  }
  if (!(p->dw = tsr_ops_alloc(elems, sizeof(float))) ||
      !(p->lse = tsr_ops_alloc(elems, sizeof(float))))
    return TSR_ERR;
  return 0;
}
static void probe_free(probe *p) {
  tsr_ops_free(&p->x), tsr_ops_free(&p->w), tsr_ops_free(&p->y), tsr_ops_free(&p->dx);
  tsr_ops_free(&p->dw), tsr_ops_free(&p->lse);
}

/* FLOP/s of a GEMM's forward and backward together (6 n in out), operands in rotation. */
static double gemm_rate(tsr_dtype dt, int n, int in, int out) {
  rotation *rot = calloc(1, sizeof *rot);
  double r = 0;
  int ok = rot != NULL;
  for (int i = 0; ok && i < GEMM_SETS; i++) {
    rot->set[i] = (probe){.dt = dt, .n = n, .in = in, .out = out};
    ok = !probe_alloc(&rot->set[i], (size_t)(n > out ? n : out) * (size_t)(in > out ? in : out));
  }
  if (ok) r = 6.0 * n * in * out / median_s(gemm_rotating, rot, 0.05);
  for (int i = 0; rot && i < GEMM_SETS; i++) probe_free(&rot->set[i]);
  free(rot);
  return r;
}

/* FLOP/s of causal attention (counted as plan_profile.h says), forward or backward. */
static double attention_rate(tsr_dtype dt, int T, int H, int hd, int backward) {
  probe p = {.dt = dt, .B = 1, .T = T, .H = H, .hd = hd};
  double r = 0;
  if (!probe_alloc(&p, (size_t)T * 3 * H * hd)) {
    attn_fwd(&p); /* the saved statistics the backward reads */
    const double flops = 2.0 * H * (double)T * T * hd * (backward ? 2.5 : 1.0);
    r = flops / median_s(backward ? attn_bwd : attn_fwd, &p, 0.03);
  }
  probe_free(&p);
  return r;
}

static double sat(double x, double half) { return x / (x + half); }

/* The half such that sat(a, half) / sat(b, half) = r for a < b: from a (b + h) = r b (a +
 * h), h = a b (r - 1) / (a - r b).  r >= 1 shows no growth (0); r <= a / b would need an
 * unbounded half (growth as fast as x itself): capped. */
static double fit_half(double a, double b, double r) {
  if (!(r < 1)) return 0;
  if (r <= a / b * 1.001) return 1e6;
  return a * b * (r - 1) / (a - r * b);
}

void tsr_plan_cpu_probe(const tsr_hardware_config *d, tsr_hardware *hw, int ranks) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
  const char *omp = getenv("OMP_NUM_THREADS");
  int threads = omp && atoi(omp) > 0 ? atoi(omp) : (int)(cores / (ranks > 0 ? ranks : 1));
  if (threads < 1) threads = 1;
  tsr_cpu_open(threads);
  tsr_plan_profile *pr = &hw->prof;
  memset(pr, 0, sizeof *pr);
  /* the peaks: the trainer's own probe (its MFU denominator) */
  hw->peak_fp32_tflops = tsr_gemm_probe_rate(TSR_F32) / 1e12;
  hw->peak_tflops = tsr_gemm_probe_rate(TSR_BF16) / 1e12;
  /* the size curve, from a small GEMM against the probe's shape, forward and backward */
  const int big[3] = {256, 512, 512}, small[3] = {64, 128, 128};
  const double rb = gemm_rate(TSR_F32, big[0], big[1], big[2]);
  const double rs = gemm_rate(TSR_F32, small[0], small[1], small[2]);
  double lo = 0, hi = 4096; /* bisect: the half dimension giving the measured ratio */
  for (int i = 0; i < 60; i++) {
    const double h = 0.5 * (lo + hi);
    const double r = sat(small[0], h) * sat(small[1], h) * sat(small[2], h) /
                     (sat(big[0], h) * sat(big[1], h) * sat(big[2], h));
    if (r > rs / rb) lo = h; else hi = h;
  }
  pr->gemm_half_dim = rs < rb ? 0.5 * (lo + hi) : 0;
  const double s_big = sat(big[0], pr->gemm_half_dim) * sat(big[1], pr->gemm_half_dim) *
                       sat(big[2], pr->gemm_half_dim);
  pr->gemm_eff[0] = rb / (hw->peak_fp32_tflops * 1e12 * s_big);
  pr->gemm_eff[1] = gemm_rate(TSR_BF16, big[0], big[1], big[2]) / (hw->peak_tflops * 1e12 * s_big);
  /* attention: T 64 and 256 at hd 32 give the sequence curve, hd 64 the head-size one */
  const double f64 = attention_rate(TSR_F32, 64, 4, 32, 0);
  const double f256 = attention_rate(TSR_F32, 256, 4, 32, 0);
  const double fhd = attention_rate(TSR_F32, 64, 2, 64, 0);
  pr->attn_half_seq = fit_half(64, 256, f64 / f256);
  pr->attn_half_hd = fit_half(32, 64, f64 / fhd);
  const double shape = sat(64, pr->attn_half_seq) * sat(32, pr->attn_half_hd);
  pr->attn_fwd[0] = f64 / (hw->peak_fp32_tflops * 1e12 * shape);
  pr->attn_bwd[0] = attention_rate(TSR_F32, 64, 4, 32, 1) / (hw->peak_fp32_tflops * 1e12 * shape);
  pr->attn_fwd[1] = attention_rate(TSR_BF16, 64, 4, 32, 0) / (hw->peak_tflops * 1e12 * shape);
  pr->attn_bwd[1] = attention_rate(TSR_BF16, 64, 4, 32, 1) / (hw->peak_tflops * 1e12 * shape);
  /* memory: a residual add and an RMSNorm over 4096 x 512 fp32 (8 MiB arrays: the rate of
   * streaming what no cache holds, AdamW's), a layer's element-wise kernels on 64 x 512
   * (128 KiB arrays, in the cache, as a small micro-batch's activations are:
   * memory_efficiency, the ratio, may exceed 1 here), and two kernels of 16 values: the
   * fixed cost of a kernel */
  probe e = {.dt = TSR_F32, .n = 4096, .in = 512};
  if (!probe_alloc(&e, 4096 * 512)) {
    hw->hbm_gbps = 5.0 * 4096 * 512 * 4 / median_s(elementwise, &e, 0.05) / 1e9;
    e.n = 64;
    pr->mem_eff = 10.0 * 64 * 512 * 4 / median_s(layer_mix, &e, 0.03) / 1e9 / hw->hbm_gbps;
    e.n = 1, e.in = 16;
    pr->kernel_s = 0.5 * median_s(elementwise, &e, 0.01);
  }
  probe_free(&e);
  hw->intra_node_gbps = hw->inter_node_gbps = cpu_link_bw / 1e9;
  pr->link_eff[0] = pr->link_eff[1] = 1;
  pr->link_latency_s[0] = pr->link_latency_s[1] = cpu_link_latency;
  pr->tp_overlap = pr->gather_overlap = 0;
  pr->slowdown = (double)ranks * threads > (double)cores ? (double)ranks * threads / cores : 1;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  hw->hbm_gb = pages > 0 && page > 0 ? (double)pages * page / 1e9 / (ranks > 0 ? ranks : 1) : 1;
  /* the host side: this host (a CPU run offloads nothing; the figures are for the output) */
  hw->host_memory_gb = hw->hbm_gb * (ranks > 0 ? ranks : 1);
  hw->cpu_cores = (int)cores;
  hw->host_mem_gbps = hw->pcie_gbps = hw->hbm_gbps;
  snprintf(pr->source, sizeof pr->source,
           "this host, measured at start-up with %d thread(s) per rank on %ld core(s); link %s",
           threads, cores, cpu_link_measured ? "measured by ping-pong" : "Open MPI shared "
           "memory as measured on the development VM");
  (void)d;
  tsr_ops_mem_reset_peak();
}

/* ---------------------------------------------------------------- the deck's machine */

int tsr_plan_hardware(const tsr_hardware_config *d, tsr_hardware *hw) {
  TSR_CHECK(d->name >= 0 && d->name <= TSR_HW_CPU, TSR_ERR_INPUT,
            "hardware.name %d is not one of h100, h200, a100, custom, cpu", (int)d->name);
  memset(hw, 0, sizeof *hw);
  snprintf(hw->name, sizeof hw->name, "%s", builtin[d->name].name);
  hw->peak_tflops = builtin[d->name].bf16_tflops;
  hw->peak_fp32_tflops = builtin[d->name].fp32_tflops;
  hw->hbm_gb = builtin[d->name].hbm_gb;
  hw->hbm_gbps = builtin[d->name].hbm_gbps;
  hw->intra_node_gbps = builtin[d->name].nvlink_gbps;
  hw->inter_node_gbps = builtin[d->name].network_gbps;
  hw->gpus_per_node = builtin[d->name].per_node;
  hw->host_memory_gb = builtin[d->name].host_gb;
  hw->host_mem_gbps = builtin[d->name].host_mem_gbps;
  hw->pcie_gbps = builtin[d->name].pcie_gbps;
  hw->cpu_cores = builtin[d->name].cores;
  hw->cpu_adam_gbps = cpu_adam_core_gbps;
  hw->impl = d->implementation;
  const int ref = d->implementation == TSR_IMPL_REFERENCE;
  hw->prof = d->name == TSR_HW_A100 && ref ? reference_a100 : ref ? reference_h100 : tessera_h100;
  if (d->name == TSR_HW_CPU)
    tsr_plan_cpu_probe(d, hw, d->gpus_per_node > 0 ? (int)d->gpus_per_node : 1);
  struct {
    double *dst, src;
    const char *key;
  } fig[] = {{&hw->peak_tflops, d->peak_tflops, "peak_tflops"},
             {&hw->peak_fp32_tflops, d->peak_fp32_tflops, "peak_fp32_tflops"},
             {&hw->hbm_gb, d->hbm_gb, "hbm_gb"},
             {&hw->hbm_gbps, d->hbm_gbps, "hbm_gbps"},
             {&hw->intra_node_gbps, d->intra_node_gbps, "intra_node_gbps"},
             {&hw->inter_node_gbps, d->inter_node_gbps, "inter_node_gbps"}};
  for (size_t i = 0; i < sizeof fig / sizeof fig[0]; i++) {
    if (fig[i].src > 0) *fig[i].dst = fig[i].src;
    TSR_CHECK(*fig[i].dst > 0, TSR_ERR_INPUT,
              "hardware.name = 'custom' needs hardware.%s > 0 in the deck", fig[i].key);
  }
  if (d->gpus_per_node > 0) hw->gpus_per_node = (int)d->gpus_per_node;
  if (d->host_memory_gb > 0) hw->host_memory_gb = d->host_memory_gb;
  if (d->host_mem_gbps > 0) hw->host_mem_gbps = d->host_mem_gbps;
  if (d->pcie_gbps > 0) hw->pcie_gbps = d->pcie_gbps;
  if (d->cpu_cores > 0) hw->cpu_cores = (int)d->cpu_cores;
  if (d->cpu_adam_gbps > 0) hw->cpu_adam_gbps = d->cpu_adam_gbps;
  TSR_CHECK(hw->gpus_per_node > 0, TSR_ERR_INPUT,
            "hardware.name = 'custom' needs hardware.gpus_per_node (or --gpus-per-node)");
  hw->compute_efficiency = d->compute_efficiency;
  hw->comm_efficiency = d->comm_efficiency;
  hw->reserved_gb = d->name == TSR_HW_CPU ? 0 : d->reserved_gb; /* no GPU runtime */
  hw->max_mem_frac = 1.0;
  /* the profile's figures the deck sets */
  tsr_plan_profile *p = &hw->prof;
  const struct {
    double *dst, src, scale;
  } prof[] = {{&p->gemm_eff[1], d->gemm_efficiency, 1},
              {&p->gemm_eff[0], d->gemm_fp32_efficiency, 1},
              {&p->gemm_half_dim, d->gemm_half_dim, 1},
              {&p->attn_fwd[1], d->attention_efficiency, 1},
              {&p->attn_bwd[1], d->attention_bwd_efficiency, 1},
              {&p->attn_fwd[0], d->attention_fp32_efficiency, 1},
              {&p->attn_bwd[0], d->attention_fp32_bwd_efficiency, 1},
              {&p->attn_half_seq, d->attention_half_seq, 1},
              {&p->attn_half_hd, d->attention_half_hd, 1},
              {&p->mem_eff, d->memory_efficiency, 1},
              {&p->kernel_s, d->kernel_us, 1e-6},
              {&p->link_eff[0], d->intra_node_efficiency, 1},
              {&p->link_eff[1], d->inter_node_efficiency, 1},
              {&p->link_latency_s[0], d->intra_node_latency_us, 1e-6},
              {&p->link_latency_s[1], d->inter_node_latency_us, 1e-6}};
  int set = 0;
  for (size_t i = 0; i < sizeof prof / sizeof prof[0]; i++)
    if (prof[i].src > 0) *prof[i].dst = prof[i].src * prof[i].scale, set++;
  if (d->tp_overlap >= 0) p->tp_overlap = d->tp_overlap, set++;
  if (d->gather_overlap >= 0) p->gather_overlap = d->gather_overlap, set++;
  if (set && d->name != TSR_HW_CPU)
    snprintf(p->source, sizeof p->source, "%s implementation's built-in profile with %d "
             "figure(s) from the deck or a profile file", ref ? "the reference" : "Tessera's",
             set);
  return 0;
}

/* ---------------------------------------------------------------- prices */

static double peak_of(const tsr_hardware *hw, int half) {
  return (half ? hw->peak_tflops : hw->peak_fp32_tflops) * 1e12;
}
static double mem_rate(const tsr_hardware *hw) { return hw->hbm_gbps * 1e9 * hw->prof.mem_eff; }

double tsr_plan_gemm_s(const tsr_hardware *hw, int half, double m, double n, double k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const tsr_plan_profile *p = &hw->prof;
  const double h = p->gemm_half_dim;
  const double eff = hw->compute_efficiency > 0
                         ? hw->compute_efficiency
                         : p->gemm_eff[half != 0] * sat(m, h) * sat(n, h) * sat(k, h);
  const double flops = 2 * m * n * k / (peak_of(hw, half) * eff);
  const double bytes = (m * k + k * n + m * n) * (half ? 2 : 4) / mem_rate(hw);
  return fmax(flops, bytes) * p->slowdown + p->kernel_s;
}

double tsr_plan_attention_s(const tsr_hardware *hw, int half, int backward, double B, double H,
                            double T, double hd) {
  if (B <= 0 || H <= 0 || T <= 0) return 0;
  const tsr_plan_profile *p = &hw->prof;
  const double top = backward ? p->attn_bwd[half != 0] : p->attn_fwd[half != 0];
  const double eff = hw->compute_efficiency > 0
                         ? hw->compute_efficiency
                         : top * sat(T, p->attn_half_seq) * sat(hd, p->attn_half_hd);
  const double flops = 2 * B * H * T * T * hd * (backward ? 2.5 : 1.0);
  return flops / (peak_of(hw, half) * eff) * p->slowdown + p->kernel_s;
}

double tsr_plan_memory_s(const tsr_hardware *hw, double bytes, double kernels) {
  return bytes / mem_rate(hw) * hw->prof.slowdown + kernels * hw->prof.kernel_s;
}

double tsr_plan_stream_s(const tsr_hardware *hw, double bytes) {
  return bytes / (hw->hbm_gbps * 1e9 * fmin(1.0, hw->prof.mem_eff)) * hw->prof.slowdown +
         hw->prof.kernel_s;
}

double tsr_plan_cpu_adam_s(const tsr_hardware *hw, double bytes) {
  if (bytes <= 0) return 0;
  const double per_node = hw->gpus_per_node > 0 ? hw->gpus_per_node : 1;
  const double rate = fmin(hw->cpu_adam_gbps * hw->cpu_cores, hw->host_mem_gbps) / per_node;
  return rate > 0 ? bytes / (rate * 1e9) : INFINITY;
}

double tsr_plan_pcie_s(const tsr_hardware *hw, double bytes) {
  if (bytes <= 0) return 0;
  return hw->pcie_gbps > 0 ? bytes / (hw->pcie_gbps * 1e9) : INFINITY;
}

double tsr_plan_link_s(const tsr_hardware *hw, int link, double bytes, double messages) {
  if (bytes <= 0 && messages <= 0) return 0;
  const int inter = link == TSR_LINK_INTER;
  const double gbps = inter ? hw->inter_node_gbps : hw->intra_node_gbps;
  const double eff = hw->comm_efficiency > 0 ? hw->comm_efficiency : hw->prof.link_eff[inter];
  return messages * hw->prof.link_latency_s[inter] + bytes / (gbps * 1e9 * eff);
}

/* The ring's bytes, and the latency of ceil(log2 t) message rounds each way: what the
 * tree and recursive-doubling algorithms libraries pick for small messages cost; a ring's
 * t - 1 latencies only matter next to bytes that dwarf them. */
static double rounds(int t) { return ceil(log2((double)t)); }

double tsr_plan_all_reduce_s(const tsr_hardware *hw, int link, int t, double bytes) {
  if (t < 2 || bytes <= 0) return 0;
  return tsr_plan_link_s(hw, link, 2.0 * (t - 1) / t * bytes, 2 * rounds(t));
}

double tsr_plan_host_all_reduce_s(const tsr_hardware *hw, int link, int t, double bytes) {
  if (t < 2 || bytes <= 0) return 0;
  const int inter = link == TSR_LINK_INTER;
  const double wire = 2.0 * (t - 1) / t * bytes;
  /* a ring's reduce-scatter half: each byte sent read, each received written, then the
   * sum reads it and its own operand and writes the result (5 passes); the all-gather
   * half: sent and received (2); through a node's shared memory every byte is also copied
   * into the shared segment first (one read and one write more) */
  const double passes = inter ? 3.5 : 4.5;
  const double gpus = hw->gpus_per_node > 0 ? hw->gpus_per_node : 1;
  const double memory =
      hw->host_mem_gbps > 0 ? wire * passes / (hw->host_mem_gbps / gpus * 1e9) : INFINITY;
  /* the rank's one thread adds the reduce-scatter half's bytes: 12 bytes of memory an
   * element, at one core's streaming rate */
  const double adds = hw->cpu_adam_gbps > 0 ? wire / 2 * 3 / (hw->cpu_adam_gbps * 1e9) : INFINITY;
  const double network = inter ? tsr_plan_link_s(hw, link, wire, 0) : 0;
  return 2 * rounds(t) * hw->prof.link_latency_s[inter] + fmax(network, fmax(memory, adds));
}

double tsr_plan_replica_host_elems(const tsr_plan_offload *o, double own) {
  return o && o->where == TSR_PLAN_UPDATE_HOST_GRADS ? fmin(own, o->elements) : 0;
}

double tsr_plan_replica_all_reduce_s(const tsr_hardware *hw, int link, int t, double own,
                                     const tsr_plan_offload *o) {
  const double host = tsr_plan_replica_host_elems(o, own);
  return tsr_plan_all_reduce_s(hw, link, t, 4 * (own - host)) +
         tsr_plan_host_all_reduce_s(hw, link, t, 4 * host);
}

double tsr_plan_gather_s(const tsr_hardware *hw, int link, int t, double bytes) {
  if (t < 2 || bytes <= 0) return 0;
  return tsr_plan_link_s(hw, link, (double)(t - 1) / t * bytes, rounds(t));
}

/* ---------------------------------------------------------------- the offload's update */

double tsr_plan_offload_fraction(const tsr_config *cfg) {
  return cfg->parallel.offload == TSR_OFFLOAD_OPTIMIZER ? cfg->parallel.offload_fraction : 0;
}

double tsr_plan_offloaded(double own, double f) {
  if (f <= 0 || own <= 0) return 0;
  return fmin(own, ceil(f * own / 64) * 64);
}

/* Two or three stages of t[] seconds in all, pipelined in pieces of `share` of the whole:
 * the slowest, plus one piece of each of the others (the fill and the drain). */
static double pipelined(const double *t, int n, double share) {
  int slow = 0;
  for (int i = 1; i < n; i++)
    if (t[i] > t[slow]) slow = i;
  double s = t[slow];
  for (int i = 0; i < n; i++)
    if (i != slow) s += t[i] * share;
  return s;
}

tsr_plan_offload tsr_plan_offload_of(const tsr_config *cfg, const tsr_hardware *hw, double own) {
  tsr_plan_offload o;
  memset(&o, 0, sizeof o);
  o.units = 1;
  o.fraction = strcmp(hw->name, "cpu") ? tsr_plan_offload_fraction(cfg) : 0;
  if (o.fraction <= 0) return o;
  const int half = cfg->train.precision != TSR_F32;
  const double e = half ? 2 : 4, x = tsr_plan_offloaded(own, o.fraction);
  o.elements = x;
  o.piece = fmin(TSR_PLAN_OFFLOAD_PIECE, x);
  o.d2h_bytes = 4 * x;
  o.h2d_bytes = e * x;
  o.cpu_bytes = (half ? 30 : 28) * x; /* the 16-bit copy written in AdamW's pass */
  o.d2h_s = tsr_plan_pcie_s(hw, o.d2h_bytes);
  o.h2d_s = tsr_plan_pcie_s(hw, o.h2d_bytes);
  o.cpu_s = tsr_plan_cpu_adam_s(hw, o.cpu_bytes);
  o.serial_s = o.d2h_s + o.cpu_s + o.h2d_s;
  const double three[3] = {o.d2h_s, o.cpu_s, o.h2d_s};
  o.pipelined_s = x > 0 ? pipelined(three, 3, o.piece / x) : 0;
  o.update_s = o.tail_s = o.pipelined_s;
  return o;
}

void tsr_plan_offload_place(tsr_plan_offload *o, int zero_stage, int units, double first_forward,
                            double micro, int micro_batches) {
  o->units = units > 0 ? units : 1;
  o->where = zero_stage < 2 ? TSR_PLAN_UPDATE_DEVICE_GRADS : TSR_PLAN_UPDATE_HOST_GRADS;
  o->last_d2h_s = 0;
  o->first_forward_s = first_forward;
  o->update_s = o->tail_s = o->pipelined_s;
  if (o->fraction <= 0 || o->elements <= 0) return;
  o->accum_s = o->accum_exposed_s = o->host_norm_s = 0;
  o->micro_s = micro, o->micro_batches = micro_batches;
  if (zero_stage >= 2) { /* host_grads: the gradient crossed during the backward, unit by unit */
    const double two[2] = {o->cpu_s, o->h2d_s};
    o->last_d2h_s = o->d2h_s / o->units;
    o->update_s = pipelined(two, 2, o->piece / o->elements);
    const double per_byte = o->cpu_bytes > 0 ? o->cpu_s / o->cpu_bytes : 0;
    o->accum_s = 12 * o->elements * per_byte;
    o->accum_exposed_s = micro_batches * fmax(0, o->accum_s - micro);
    o->host_norm_s = 4 * o->elements * per_byte;
  }
  /* unit by unit as the next step's first forward first asks for each */
  o->tail_s = o->last_d2h_s + fmax(0, o->update_s - first_forward);
}

double tsr_plan_update_s(const tsr_hardware *hw, const tsr_plan_offload *o, double own, double e,
                         double *unhidden) {
  const double device = o->elements < own ? tsr_plan_stream_s(hw, (own - o->elements) * (28 + e)) : 0;
  if (unhidden) *unhidden = device + o->last_d2h_s;
  return fmax(device + o->last_d2h_s, o->tail_s);
}

double tsr_plan_act_offload_s(const tsr_hardware *hw, double t, int layers, double block) {
  if (layers <= 0 || block <= 0) return t;
  return t + layers * fmax(0, tsr_plan_pcie_s(hw, block) - t / layers);
}

/* ---------------------------------------------------------------- as a profile file */

void tsr_plan_profile_print(FILE *out, const tsr_hardware *hw) {
  static const char *const names[] = {"h100", "h200", "a100", "custom", "cpu"};
  const tsr_plan_profile *p = &hw->prof;
  int name = 3;
  for (int i = 0; i < 5; i++)
    if (!strcmp(hw->name, names[i])) name = i;
  fprintf(out, "! the machine tessera plan used: %s\n&hardware\n", p->source);
  fprintf(out, "  name = '%s'\n  implementation = '%s'\n", names[name],
          hw->impl == TSR_IMPL_REFERENCE ? "reference" : "tessera");
  fprintf(out, "  peak_tflops = %.6g\n  peak_fp32_tflops = %.6g\n  hbm_gb = %.6g\n"
          "  hbm_gbps = %.6g\n  intra_node_gbps = %.6g\n  inter_node_gbps = %.6g\n"
          "  gpus_per_node = %d\n", hw->peak_tflops, hw->peak_fp32_tflops, hw->hbm_gb,
          hw->hbm_gbps, hw->intra_node_gbps, hw->inter_node_gbps, hw->gpus_per_node);
  fprintf(out, "  host_memory_gb = %.6g\n  pcie_gbps = %.6g\n  cpu_cores = %d\n"
          "  cpu_adam_gbps = %.6g\n  host_mem_gbps = %.6g\n", hw->host_memory_gb,
          hw->pcie_gbps, hw->cpu_cores, hw->cpu_adam_gbps, hw->host_mem_gbps);
  fprintf(out, "  gemm_efficiency = %.6g\n  gemm_fp32_efficiency = %.6g\n  gemm_half_dim = %.6g\n",
          p->gemm_eff[1], p->gemm_eff[0], p->gemm_half_dim);
  fprintf(out, "  attention_efficiency = %.6g\n  attention_bwd_efficiency = %.6g\n"
          "  attention_fp32_efficiency = %.6g\n  attention_fp32_bwd_efficiency = %.6g\n"
          "  attention_half_seq = %.6g\n  attention_half_hd = %.6g\n", p->attn_fwd[1],
          p->attn_bwd[1], p->attn_fwd[0], p->attn_bwd[0], p->attn_half_seq, p->attn_half_hd);
  fprintf(out, "  memory_efficiency = %.6g\n  kernel_us = %.6g\n  intra_node_efficiency = %.6g\n"
          "  inter_node_efficiency = %.6g\n  intra_node_latency_us = %.6g\n"
          "  inter_node_latency_us = %.6g\n  tp_overlap = %.6g\n  gather_overlap = %.6g\n/\n",
          p->mem_eff, p->kernel_s * 1e6, p->link_eff[0], p->link_eff[1],
          p->link_latency_s[0] * 1e6, p->link_latency_s[1] * 1e6, p->tp_overlap,
          p->gather_overlap);
}
