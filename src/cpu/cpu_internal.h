/* cpu_internal.h — what the CPU kernels (src/cpu/) share: tile sizes, the
 * vectorisable math (exp, tanh, fixed-order sums), the 16-bit conversions of whole rows,
 * and the per-thread conversion buffers.  Internal to those files.
 *
 * Determinism.  The CPU kernels are the reference the CUDA kernels are tested against,
 * so each output element (or each reduction) is owned by one task and summed in a fixed
 * order.  Where gradients are reduced over rows (dw, dbias, dwpe, dwte) the work is split
 * over columns, never over rows, so no two threads add into the same element.
 * Everything but the fp32 GEMMs gives the same bits for every thread count.
 *
 * Speed.  The element-wise loops are written so the compiler vectorises them at -O2 with
 * the baseline x86-64 instruction set (SSE2): `omp simd` loops without branches,
 * fixed-width lanes for sums, and an exp of our own (expf_vec) because libm's expf and
 * tanhf are scalar calls — they were 15% of a tiny-model step.  The kernels heavy in exp
 * or in conversions are TSR_CLONES (util.h), compiled once per x86-64 level.
 *
 * 16-bit storage.  A kernel widens the bf16 / fp16 values it reads into fp32 buffers, a
 * row or a tile at a time, runs the same fp32 code as for fp32 storage on them and
 * rounds each output once when it stores it.  The conversions below give the bits of
 * dtype.h's (test_ops sweeps them) but are written without branches, so that a loop of
 * them vectorises. */
#ifndef TSR_CPU_INTERNAL_H
#define TSR_CPU_INTERNAL_H

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ops_cpu.h"
#include "core/util.h"

#ifdef _OPENMP
#include <omp.h>
#else /* serial build: the pragmas are ignored, the results are the same */
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_in_parallel(void) { return 0; }
#endif

/* Columns per task for column-split reductions (dw, dbias, dwte, ...). */
#define COL_BLOCK 64
/* Attention tiles: query rows per block, keys per chunk. */
#define ATT_QB 64
#define ATT_KC 256
/* Fixed number of partial sums for scalar reductions (sums of squares, the loss): the split
 * depends on n only, so the result is identical for every thread count. */
#define N_PARTIAL 64
/* Element-wise loops shorter than this are not worth waking the thread team. */
#define PAR_MIN 16384
/* GEMMs below this many flops run on one thread. */
#define GEMM_PAR_MIN_FLOPS 2e6
/* AdamW works in blocks of this many elements (the square roots of one block). */
#define ADAM_BLOCK 512
/* Element-wise work per task in the flat (not row-wise) kernels. */
#define ELEM_BLOCK 4096

/* ------------------------------------------------------------ fp32 math */

/* Dot product with eight independent partial sums: the compiler vectorises it without
 * reassociation, and the summation order is fixed by n alone. */
static inline float dotf(const float *restrict a, const float *restrict b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
  for (int u = 0; i < n; i++, u++) acc[u] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Sums in double over eight lanes, in an order fixed by n: sum x_i, sum x_i^2,
 * sum x_i y_i. */
#define LANES_SUM(expr)                                                                    \
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
  long i = 0;                                                                              \
  for (; i + 8 <= n; i += 8)                                                               \
    for (int u = 0; u < 8; u++) {                                                          \
      const long k = i + u;                                                                \
      acc[u] += (expr);                                                                    \
    }                                                                                      \
  for (int u = 0; i < n; i++, u++) {                                                       \
    const long k = i;                                                                      \
    acc[u] += (expr);                                                                      \
  }                                                                                        \
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
static inline double sum_d(const float *restrict x, long n) { LANES_SUM((double)x[k]); }
static inline double sumsq_d(const float *restrict x, long n) {
  LANES_SUM((double)x[k] * x[k]);
}
static inline double dot_d(const float *restrict x, const float *restrict y, long n) {
  LANES_SUM((double)x[k] * y[k]);
}

/* y += a * x */
static inline void axpyf(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp(x) for |x| <= 87.33 to 1.5 ulp (measured 1.4 over the range); larger |x| is clamped
 * to 87.33 (results 1.2e-38 .. 8.5e37: the float range without subnormals), NaN stays NaN.
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-5 polynomial for e^r,
 * 2^n built in the exponent bits.  Plain arithmetic without branches, so `omp simd` loops
 * that call it vectorise; libm's expf is a scalar call.  The clamp is done on the bits
 * (an integer select): a float compare-and-select here makes the compiler duplicate the
 * whole body for the clamped value and give up vectorising. */
static inline float expf_vec(float x) {
  int32_t bits;
  memcpy(&bits, &x, sizeof bits);
  int32_t mag = bits & 0x7fffffff;
  mag = mag > 0x42aeac50 && mag <= 0x7f800000 ? 0x42aeac50 : mag; /* 87.3365 */
  bits = (bits & (int32_t)0x80000000) | mag;
  memcpy(&x, &bits, sizeof x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float y = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                      4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * r) * r +
                  r + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof scale);
  return y * scale;
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = (1 - e) / (1 + e), e = exp(-2u): -1 and 1 at the ends of the clamp; near 0 the
 * absolute error is ~1e-7, which is all that 1 + tanh (GELU) can see. */
static inline float tanhf_vec(float u) {
  const float e = expf_vec(-2.0f * u);
  return (1.0f - e) / (1.0f + e);
}

/* GELU's derivative at x times d: the one expression both GELU backward paths use (the
 * GEMM's fused epilogue for fp32 and for 16-bit storage), so they round alike. */
static inline float gelu_grad(float d, float xi) {
  const float th = tanhf_vec(GELU_C * (xi + GELU_A * xi * xi * xi));
  const float du = GELU_C * (1.0f + 3.0f * GELU_A * xi * xi);
  return d * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
}

/* ---------------------------------------------------- 16-bit conversions */

static inline uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* bf16 -> fp32: the upper half. */
static inline float cvt_bf16_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* fp32 -> bf16, tsr_f32_to_bf16's bits (nearest even; inf kept; NaN quieted) as selects. */
static inline uint16_t cvt_f32_bf16(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const uint32_t special = u | ((u & 0x007fffffu) ? 0x00400000u : 0u);
  return (uint16_t)(((u & 0x7f800000u) == 0x7f800000u ? special : rounded) >> 16);
}

/* fp16 -> fp32, tsr_f16_to_f32's values.  Normal numbers rebias the exponent; subnormals
 * are m 2^-24 formed from the integer m (exact, and no subnormal fp32 operand, which
 * would cost a microcode assist per element); inf and NaN keep their mantissa. */
static inline float cvt_f16_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, e = em >> 10;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t sub = f32_bits((float)(int32_t)em * 5.9604644775390625e-8f);
  const uint32_t special = (em << 13) | 0x7f800000u;
  /* selects spelled as masks: a chain of ?: here is compiled to branches, not vectorised */
  const uint32_t is_sub = 0u - (uint32_t)(e == 0), is_special = 0u - (uint32_t)(e == 31);
  const uint32_t u = (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
  return bits_f32(u | sign);
}

/* fp32 -> fp16, tsr_f32_to_f16's bits.  Normal range: round the 13 dropped bits to even
 * (past 65504 the carry reaches the inf pattern); below 2^-14, adding 0.5 makes the fp32
 * adder round |x| to a multiple of 2^-24, to nearest even, which leaves the fp16
 * subnormal's bits in the low mantissa; NaN keeps its upper payload, quieted. */
static inline uint16_t cvt_f32_f16(float x) {
  const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  const uint32_t big = 0u - (uint32_t)(r >= 0x47800000u);
  const uint32_t normal = (0x7c00u & big) | (((r - (112u << 23)) >> 13) & ~big);
  const uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint32_t is_nan = 0u - (uint32_t)(a > 0x7f800000u);
  const uint32_t is_sub = 0u - (uint32_t)(a < 0x38800000u);
  const uint32_t v = (nan & is_nan) | (sub & is_sub) | (normal & ~(is_nan | is_sub));
  return (uint16_t)(sign | v);
}

/* A row of n values of dt widened into fp32, and a row of n fp32 values rounded and
 * stored as dt (dt F32: copied).  Out of line (cpu_buf.c): compiled per x86-64 level, and
 * through the conversion instructions where the CPU has them (F16C, AVX512-BF16). */
void widen_row(tsr_dtype dt, float *restrict dst, const void *restrict src, long n);
void narrow_row(tsr_dtype dt, void *restrict dst, const float *restrict src, long n);
/* out = x + y over n values of dt, in fp32, rounded once (the residual add); out may be
 * x or y. */
void add_row(tsr_dtype dt, void *out, const void *x, const void *y, long n);

/* A rows x cols block of a dt matrix (leading dimension lds, in elements) widened into
 * a dense fp32 block (leading dimension ldd). */
static inline void widen_block(tsr_dtype dt, float *dst, int ldd, const void *src, long lds,
                               int rows, int cols) {
  for (int r = 0; r < rows; r++)
    widen_row(dt, dst + (size_t)r * ldd, tsr_dtype_at_c(src, dt, (int64_t)r * lds), cols);
}

/* ------------------------------------------------------ GEMMs (cpu_gemm.c)
 * matmul_fwd and matmul_bwd under names of their own, for a kernel of another family
 * that runs a linear layer inside it (the fused LM head, cpu_xent.c): the same arguments,
 * results and bits. */
void cpu_linear_fwd(tsr_dtype dt, void *y, const void *x, const void *w, const void *bias, int n,
                    int in, int out);
void cpu_linear_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                    const void *x, const void *w, const void *gelu_pre, int n, int in, int out);

/* ------------------------------------------------- conversion buffers (cpu_buf.c)
 *
 * Each thread has a buffer of fp32 values for its conversions, plus one buffer shared by
 * all (a parameter widened once per call, read by every thread).  An op asks for what it
 * needs with cpu_buf_need before its parallel region; the buffers grow there (through
 * tsr_calloc, so the run's memory counts them) and are never shrunk, so once warm (or
 * after tsr_cpu_reserve) no op allocates.  They are bounded by model dimensions and tile
 * sizes, never by the tokens of a micro-batch. */

/* At least `shared` floats shared and `each` floats per thread, for omp_get_max_threads()
 * threads.  Outside parallel regions only; aborts, after saying why, if memory runs out
 * (an op cannot return an error). */
void cpu_buf_need(size_t shared, size_t each);
float *cpu_buf_shared(void);
float *cpu_buf_thread(void); /* the calling thread's, by omp_get_thread_num() */

/* Per-thread floats each family needs for 16-bit storage at these sizes (the family's
 * file says how they are used): tsr_cpu_reserve asks for their maximum. */
size_t cpu_gemm_buf_floats(void);
size_t cpu_attention_buf_floats(int T, int group, int hd);
size_t cpu_norm_buf_floats(int C);
size_t cpu_elem_buf_floats(int C);
size_t cpu_xent_buf_floats(int V);

#endif
