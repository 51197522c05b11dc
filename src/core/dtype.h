/* dtype.h — the storage types of tensors, and the conversions between them.
 *
 * A tensor is stored as fp32, bf16 or fp16 (IEEE binary16); arithmetic is always fp32.
 * A 16-bit value is widened exactly on load and a result is rounded to nearest even on
 * store, the same way on the CPU and in the CUDA kernels (these functions are host and
 * device code), so both backends store the same kinds of bits.  In a bf16 or fp16 run the
 * compute copy of the parameters, the activations and the activation gradients are 16-bit
 * arrays; the fp32 master weights, Adam's moments, the parameter gradients and every
 * statistic (norms, softmax, loss) stay fp32 (docs/model.md "Mixed precision").
 *
 * Header only, no dependencies beyond the C library: the CUDA kernels, the CPU kernels,
 * comm and the planner all include it. */
#ifndef TSR_DTYPE_H
#define TSR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TSR_HOST_DEVICE __host__ __device__
#else
#define TSR_HOST_DEVICE
#endif

typedef enum { TSR_F32 = 0, TSR_BF16 = 1, TSR_F16 = 2 } tsr_dtype;
enum { TSR_N_DTYPES = 3 };

/* Bytes per element. */
TSR_HOST_DEVICE static inline size_t tsr_dtype_size(tsr_dtype t) { return t == TSR_F32 ? 4 : 2; }
/* "fp32", "bf16", "fp16": the deck's spelling of train.precision. */
static inline const char *tsr_dtype_name(tsr_dtype t) {
  return t == TSR_BF16 ? "bf16" : t == TSR_F16 ? "fp16" : "fp32";
}
/* p advanced by i elements of type t. */
static inline void *tsr_dtype_at(void *p, tsr_dtype t, int64_t i) {
  return p ? (char *)p + (size_t)i * tsr_dtype_size(t) : NULL;
}
static inline const void *tsr_dtype_at_c(const void *p, tsr_dtype t, int64_t i) {
  return p ? (const char *)p + (size_t)i * tsr_dtype_size(t) : NULL;
}

/* bf16 is the upper half of an fp32: widening is a shift. */
TSR_HOST_DEVICE static inline float tsr_bf16_to_f32(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
/* Round to nearest even; inf stays inf, NaN a quiet NaN with its payload's upper bits. */
TSR_HOST_DEVICE static inline uint16_t tsr_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) { /* inf / nan: keep, quiet nan */
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> fp32, exact (subnormals included). */
TSR_HOST_DEVICE static inline float tsr_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1fu) {
    u = sign | 0x7f800000u | (m << 13); /* inf / nan */
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13); /* normal: rebias 15 -> 127 */
  } else { /* zero or subnormal: m 2^-24, exact in fp32 */
    float f = (float)m * 5.9604644775390625e-8f;
    memcpy(&u, &f, 4);
    u |= sign;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}
/* fp32 -> IEEE binary16, round to nearest even: 10 mantissa bits, subnormals down to
 * 2^-24, magnitudes from 65520 up become inf; NaN stays a (quiet) NaN. */
TSR_HOST_DEVICE static inline uint16_t tsr_f32_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) /* inf / nan */
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x38800000u) { /* normal range of fp16 (from 2^-14) */
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round the 13 dropped bits */
    if (r >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* past 65504: inf */
    return (uint16_t)(sign | (((r >> 23) - 112u) << 10) | ((r >> 13) & 0x3ffu));
  }
  /* subnormals: multiples of 2^-24 */
  const uint32_t e = a >> 23;
  uint32_t q = 0;
  if (e >= 102) { /* from 2^-25 (which rounds to even, 0) */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, sh = 126 - e; /* 14..24 */
    const uint32_t rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);
    q = mant >> sh;
    q += rem > half || (rem == half && (q & 1u));
  }
  return (uint16_t)(sign | q); /* q = 1024 is the smallest normal, 2^-14: same bits */
}

/* Element i of p (type t) widened to fp32; v rounded to t and stored at element i. */
TSR_HOST_DEVICE static inline float tsr_load(tsr_dtype t, const void *p, size_t i) {
  if (t == TSR_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return t == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
}
TSR_HOST_DEVICE static inline void tsr_store(tsr_dtype t, void *p, size_t i, float v) {
  if (t == TSR_F32)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = t == TSR_BF16 ? tsr_f32_to_bf16(v) : tsr_f32_to_f16(v);
}
/* v rounded to t and widened back: the value storing it would keep. */
TSR_HOST_DEVICE static inline float tsr_round_to(tsr_dtype t, float v) {
  return t == TSR_F32 ? v : t == TSR_BF16 ? tsr_bf16_to_f32(tsr_f32_to_bf16(v))
                                          : tsr_f16_to_f32(tsr_f32_to_f16(v));
}

#endif
