/* cpu_buf.c — what the CPU kernels of 16-bit storage share: the per-thread conversion
 * buffers and the row conversions (cpu_internal.h). */
#include "cpu_internal.h"

/* The conversion instructions, where the compiler can target them (chosen at run time). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_PATH 1
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define HAVE_AVX512BF16_PATH 1
#endif
#endif

/* ---- conversion buffers: one allocation, the shared part then one part per thread ---- */

static float *buf;          /* tsr_calloc'd; NULL until a 16-bit op or reserve asks */
static size_t buf_shared;   /* floats of the shared part */
static size_t buf_each;     /* floats per thread (a multiple of 16: 64-byte aligned parts) */
static int buf_threads;     /* thread parts allocated */

void cpu_buf_need(size_t shared, size_t each) {
  const int threads = omp_get_max_threads();
  shared = (shared + 15) / 16 * 16;
  each = (each + 15) / 16 * 16;
  if (omp_in_parallel()) { /* threads of an outer team would share the buffers */
    tsr_error("cpu: a 16-bit op called inside a parallel region");
    abort();
  }
  if (buf && shared <= buf_shared && each <= buf_each && threads <= buf_threads) return;
  if (shared < buf_shared) shared = buf_shared;
  if (each < buf_each) each = buf_each;
  const int n = threads > buf_threads ? threads : buf_threads;
  tsr_free(&buf);
  buf = tsr_calloc(shared + (size_t)n * each, sizeof(float));
  if (!buf) { /* tsr_calloc said how much */
    tsr_error("cpu: no memory for the 16-bit conversion buffers");
    abort();
  }
  buf_shared = shared, buf_each = each, buf_threads = n;
}

float *cpu_buf_shared(void) { return buf; }
float *cpu_buf_thread(void) { return buf + buf_shared + (size_t)omp_get_thread_num() * buf_each; }

/* ---- row conversions ----
 * The branch-free conversions of cpu_internal.h, one compiled copy per x86-64 level; and
 * where the CPU has them, the instructions: fp16 with F16C (x86-64-v3 and up) through
 * vcvtph2ps / vcvtps2ph (round to nearest even, subnormals kept), bf16's rounding with
 * AVX512-BF16 through vcvtneps2bf16, several times faster (measured per element, one
 * thread: fp16 widen 0.43 -> 0.06 ns, round 1.0 -> 0.035 ns in baseline code; bf16 round
 * 0.10 -> 0.066 ns against the AVX-512 copy).  Their bits are dtype.h's, which test_ops
 * checks over every 16-bit value and a sweep of fp32 ones, except where an instruction
 * differs: vcvtph2ps quiets a signalling NaN and vcvtneps2bf16 flushes fp32 subnormals,
 * so those vectors are redone by the exact code. */

TSR_CLONES static void widen_bf16(float *restrict dst, const uint16_t *restrict src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = cvt_bf16_f32(src[i]);
}
TSR_CLONES static void narrow_bf16(uint16_t *restrict dst, const float *restrict src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = cvt_f32_bf16(src[i]);
}
TSR_CLONES static void widen_f16(float *restrict dst, const uint16_t *restrict src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = cvt_f16_f32(src[i]);
}
TSR_CLONES static void narrow_f16(uint16_t *restrict dst, const float *restrict src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = cvt_f32_f16(src[i]);
}

TSR_CLONES static void add_bf16(uint16_t *out, const uint16_t *x, const uint16_t *y, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) out[i] = cvt_f32_bf16(cvt_bf16_f32(x[i]) + cvt_bf16_f32(y[i]));
}
TSR_CLONES static void add_f16(uint16_t *out, const uint16_t *x, const uint16_t *y, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) out[i] = cvt_f32_f16(cvt_f16_f32(x[i]) + cvt_f16_f32(y[i]));
}

#ifdef HAVE_F16C_PATH
__attribute__((target("avx2,f16c"))) static void widen_f16_hw(float *restrict dst,
                                                               const uint16_t *restrict src,
                                                               long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm256_storeu_ps(dst + i, f);
    if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q))) /* NaN lanes: payload as is */
      for (int u = 0; u < 8; u++) dst[i + u] = cvt_f16_f32(src[i + u]);
  }
  for (; i < n; i++) dst[i] = cvt_f16_f32(src[i]);
}
__attribute__((target("avx2,f16c"))) static void narrow_f16_hw(uint16_t *restrict dst,
                                                                const float *restrict src,
                                                                long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = cvt_f32_f16(src[i]);
}
#ifdef HAVE_AVX512BF16_PATH
/* vcvtneps2bf16 rounds to nearest even and quiets NaN as dtype.h does, but flushes fp32
 * subnormals to zero: a vector holding one is redone by the exact code. */
__attribute__((target("avx512f,avx512bf16"))) static void narrow_bf16_hw(uint16_t *restrict dst,
                                                                          const float *restrict src,
                                                                          long n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i below_normal = _mm512_set1_epi32(0x007fffff);
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(v), magnitude);
    const __m256bh b = _mm512_cvtneps_pbh(v);
    memcpy(dst + i, &b, sizeof b);
    /* 0 < |x| < 2^-126: a - 1 below 0x7fffff, unsigned */
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, one), below_normal))
      for (int u = 0; u < 16; u++) dst[i + u] = cvt_f32_bf16(src[i + u]);
  }
  for (; i < n; i++) dst[i] = cvt_f32_bf16(src[i]);
}

#endif

/* The fused adds: sums of widened values rounded once, the vector forms of add_bf16 and
 * add_f16 (a NaN operand gives the same quieted NaN either way: the adder quiets it). */
__attribute__((target("avx2,f16c"))) static void add_f16_hw(uint16_t *out, const uint16_t *x,
                                                             const uint16_t *y, long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
    _mm_storeu_si128((__m128i *)(out + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  add_f16(out + i, x + i, y + i, n - i);
}
#ifdef HAVE_AVX512BF16_PATH
__attribute__((target("avx512f,avx512bf16"))) static void add_bf16_hw(uint16_t *out,
                                                                       const uint16_t *x,
                                                                       const uint16_t *y,
                                                                       long n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i below_normal = _mm512_set1_epi32(0x007fffff);
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i xa = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
    const __m512i ya = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(y + i)));
    const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(xa, 16)),
                                   _mm512_castsi512_ps(_mm512_slli_epi32(ya, 16)));
    const __m256bh b = _mm512_cvtneps_pbh(v);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(v), magnitude);
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, one), below_normal))
      add_bf16(out + i, x + i, y + i, 16); /* a subnormal sum: the exact rounding */
    else
      memcpy(out + i, &b, sizeof b);
  }
  add_bf16(out + i, x + i, y + i, n - i);
}
#endif

/* Whether to use the instructions: decided at the first conversion (every thread decides
 * the same), from CPUID where not every compiler's __builtin_cpu_supports knows the name.
 * TSR_CPU_CONVERT=portable keeps to the portable code, as on a CPU without them (test_ops
 * checks both). */
static int portable_only(void) {
  static int known = -1;
  if (known < 0) {
    const char *e = getenv("TSR_CPU_CONVERT");
    known = e && !strcmp(e, "portable");
  }
  return known;
}
static int have_f16c(void) {
  static int known = -1;
  if (known < 0) { /* F16C: CPUID leaf 1, ECX bit 29 */
    unsigned a = 0, b = 0, c = 0, d = 0;
    known = !portable_only() && __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
            (c >> 29 & 1u);
  }
  return known;
}
#ifdef HAVE_AVX512BF16_PATH
static int have_avx512bf16(void) {
  static int known = -1;
  if (known < 0) { /* AVX512-BF16: CPUID leaf 7 sub-leaf 1, EAX bit 5; avx512f also says that
                    * the OS saves the vector state */
    unsigned a = 0, b = 0, c = 0, d = 0;
    known = !portable_only() && __builtin_cpu_supports("avx512f") &&
            __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u);
  }
  return known;
}
#endif
#endif

void widen_row(tsr_dtype dt, float *restrict dst, const void *restrict src, long n) {
  if (dt == TSR_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
  } else if (dt == TSR_BF16) {
    widen_bf16(dst, src, n);
  } else {
#ifdef HAVE_F16C_PATH
    if (have_f16c()) {
      widen_f16_hw(dst, src, n);
      return;
    }
#endif
    widen_f16(dst, src, n);
  }
}

void narrow_row(tsr_dtype dt, void *restrict dst, const float *restrict src, long n) {
  if (dt == TSR_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
  } else if (dt == TSR_BF16) {
#ifdef HAVE_AVX512BF16_PATH
    if (have_avx512bf16()) {
      narrow_bf16_hw(dst, src, n);
      return;
    }
#endif
    narrow_bf16(dst, src, n);
  } else {
#ifdef HAVE_F16C_PATH
    if (have_f16c()) {
      narrow_f16_hw(dst, src, n);
      return;
    }
#endif
    narrow_f16(dst, src, n);
  }
}

void add_row(tsr_dtype dt, void *out, const void *x, const void *y, long n) {
  if (dt == TSR_F32) {
    float *o = out;
    const float *a = x, *b = y;
    for (long i = 0; i < n; i++) o[i] = a[i] + b[i];
  } else if (dt == TSR_BF16) {
#ifdef HAVE_AVX512BF16_PATH
    if (have_avx512bf16()) {
      add_bf16_hw(out, x, y, n);
      return;
    }
#endif
    add_bf16(out, x, y, n);
  } else {
#ifdef HAVE_F16C_PATH
    if (have_f16c()) {
      add_f16_hw(out, x, y, n);
      return;
    }
#endif
    add_f16(out, x, y, n);
  }
}
