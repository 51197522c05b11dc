/* util.h — error propagation, logging and checked allocation shared by every module.
 *
 * Error model (docs/conventions.md "Errors"): a function that can fail returns int, 0 on
 * success, otherwise one of the TSR_ERR_* codes (which are also the process exit codes),
 * or a pointer that is NULL on failure.  One family of check macros, each reporting
 * "file:line func" with the failing expression:
 *   TSR_CALL(expr)           one of our calls: on failure add a trace line and return its code
 *   TSR_CHECK(cond, code, fmt, ...)   a condition: on failure print the message, return code
 *   TSR_MPI_CALL(call)       MPI (comm_mpi.h): report the MPI error, return TSR_ERR
 *   TSR_H5_GOTO(expr), TSR_MPI_GOTO(expr), TSR_H5_TRY(expr, fmt, ...)   HDF5 and MPI in
 *                            the checkpoint code (ckpt_internal.h): set rc and jump to the
 *                            function's `done:` cleanup
 *   TSR_CUDA_CALL, TSR_CUDA_LAUNCHED, TSR_CUDA_ARG, TSR_CUBLAS_GOTO, TSR_CUDNN_CALL,
 *   TSR_NCCL_CALL            the CUDA backend's calls, launches, arguments and libraries
 *                            (cuda/check.h), each reporting file:line the same way. */
#ifndef TSR_UTIL_H
#define TSR_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"

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
/* The stream tsr_log writes to: stdout (NULL) unless a command keeps stdout for its own
 * output (tessera generate sends the log to stderr). */
void tsr_log_to(FILE *stream);
void tsr_log(const char *fmt, ...) TSR_PRINTF(1, 2);       /* rank 0 only */
void tsr_warn(const char *fmt, ...) TSR_PRINTF(1, 2);      /* any rank, "warning:" */
void tsr_error(const char *fmt, ...) TSR_PRINTF(1, 2);     /* any rank, "error:" */
/* Between tsr_error_hold and tsr_error_release the first tsr_error message is written
 * into buf (len bytes, NUL-terminated) instead of being printed, and later ones are
 * dropped: the caller decides who reports it (runctl.h, tsr_run_agree_report).  For the
 * main thread's checks only; not nested. */
void tsr_error_hold(char *buf, size_t len);
void tsr_error_release(void);
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

double tsr_now(void); /* monotonic seconds */
/* Bytes of memory this process may still take: MemAvailable, lowered to what the memory
 * cgroup (v2 memory.max, or v1's limit) leaves (the checkpoint's host snapshot, the
 * optimizer offload's page-locked state). */
double tsr_host_available(void);
/* The wall-clock time in UTC as ISO 8601 with milliseconds, "2026-11-24T15:40:01.123Z"
 * (the stamp of every tessera.log line and metrics.jsonl record). */
void tsr_iso_time(char *buf, size_t len);

#endif
