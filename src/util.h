/* util.h — error propagation, logging and checked allocation shared by every module.
 *
 * Error model (CONVENTIONS.md): a function that can fail returns int, 0 on success,
 * otherwise one of the TSR_ERR_* codes (which are also the process exit codes), or a
 * pointer that is NULL on failure.  Callers propagate through TSR_CALL, which adds a
 * "file:line func" trace line; user-facing checks go through TSR_CHECK with a message. */
#ifndef TSR_UTIL_H
#define TSR_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum {
  TSR_OK = 0,
  TSR_ERR = 1,        /* anything else */
  TSR_ERR_INPUT = 2,  /* bad deck, data or checkpoint: fix the input */
  TSR_ERR_SIGNAL = 3, /* stopped on signal after a checkpoint: requeue */
  TSR_ERR_WATCHDOG = 4
};

#if defined(__GNUC__)
#define TSR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TSR_PRINTF(a, b)
#endif

/* Hot loops get one compiled copy per x86-64 level, picked at load time from the CPU
 * (GCC function multiversioning): baseline x86-64 (SSE2), AVX2+FMA (x86-64-v3) and
 * AVX-512 (x86-64-v4).  Integer loops give the same result on every level; floating-point
 * ones may round differently where FMA is used. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 12
#define TSR_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define TSR_CLONES
#endif

/* Rank of this process in MPI_COMM_WORLD, set once by the driver (0 before MPI). */
void tsr_set_rank(int rank);
int tsr_rank(void);

/* Log sink: rank 0 writes to stdout and, once opened, to <out_dir>/tessera.log. */
int tsr_log_open(const char *path);
void tsr_log_close(void);
void tsr_log(const char *fmt, ...) TSR_PRINTF(1, 2);       /* rank 0 only */
void tsr_warn(const char *fmt, ...) TSR_PRINTF(1, 2);      /* any rank, "warning:" */
void tsr_error(const char *fmt, ...) TSR_PRINTF(1, 2);     /* any rank, "error:" */
void tsr_trace(const char *file, int line, const char *func, const char *what);
void tsr_errorf_at(const char *file, int line, const char *func, const char *fmt, ...)
    TSR_PRINTF(4, 5);

/* Propagate a failure from a callee, adding one trace line. */
#define TSR_CALL(expr)                                         \
  do {                                                         \
    int tsr_rc_ = (expr);                                      \
    if (tsr_rc_ != 0) {                                        \
      tsr_trace(__FILE__, __LINE__, __func__, #expr);          \
      return tsr_rc_;                                          \
    }                                                          \
  } while (0)

/* Check a condition; on failure print the formatted message and return `code`. */
#define TSR_CHECK(cond, code, ...)                             \
  do {                                                         \
    if (!(cond)) {                                             \
      tsr_errorf_at(__FILE__, __LINE__, __func__, __VA_ARGS__); \
      return (code);                                           \
    }                                                          \
  } while (0)

/* Checked, zeroed, 64-byte aligned allocation.  Counts live bytes so the step line
 * can report memory as allocated.  tsr_free NULLs the pointer. */
void *tsr_calloc(size_t count, size_t size);
void tsr_free_(void **p);
#define tsr_free(pp) tsr_free_((void **)(pp))
size_t tsr_mem_bytes(void);      /* bytes currently allocated through tsr_calloc */
size_t tsr_mem_peak_bytes(void); /* high-water mark */

/* Counter-based random numbers: a pure function of (key, index), so every layout
 * can generate the same value for the same logical element. */
/* splitmix64 finaliser; inline because checkpoint checksums call it per element */
static inline uint64_t tsr_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t tsr_hash_str(const char *s); /* FNV-1a 64 */
double tsr_rand_uniform(uint64_t key, uint64_t index);  /* in (0, 1) */
double tsr_rand_normal(uint64_t key, uint64_t index);   /* N(0, 1) */

/* Storage roundings, inline and host-and-device (the CUDA kernels call the same code, so
 * the CPU and the GPU round bit for bit alike). */
#ifdef __CUDACC__
#define TSR_HOST_DEVICE __host__ __device__
#else
#define TSR_HOST_DEVICE
#endif

/* bf16 round-to-nearest-even of a float, returned as float (exactly representable);
 * inf stays inf, NaN a quiet NaN with its payload's upper bits. */
TSR_HOST_DEVICE static inline float tsr_round_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) { /* inf / nan: keep, quiet nan */
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

/* IEEE fp16 (binary16) round-to-nearest-even of a float, returned as float: 10 mantissa
 * bits, subnormals down to 2^-24, magnitudes from 65520 up become inf; NaN stays NaN. */
TSR_HOST_DEVICE static inline float tsr_round_fp16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) { /* inf / nan: keep, quiet nan */
    if (a > 0x7f800000u) u |= 0x00400000u;
  } else if (a >= 0x38800000u) { /* fp16 normal range (from 2^-14): keep 10 mantissa bits */
    const uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
    u = sign | (r >= 0x47800000u ? 0x7f800000u : r); /* rounded past 65504: inf */
  } else { /* fp16 subnormals: multiples of 2^-24 */
    const uint32_t e = a >> 23;
    uint32_t q = 0;
    if (e >= 102) { /* from 2^-25 (which rounds to even, 0) */
      const uint32_t mant = (a & 0x7fffffu) | 0x800000u, sh = 126 - e; /* 14..24 */
      const uint32_t rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);
      q = mant >> sh;
      q += rem > half || (rem == half && (q & 1u));
    }
    const float f = (float)q * 5.9604644775390625e-8f; /* q 2^-24, exact: q <= 1024 */
    memcpy(&u, &f, 4);
    u |= sign;
  }
  memcpy(&x, &u, 4);
  return x;
}

double tsr_now(void); /* monotonic seconds */

#endif
