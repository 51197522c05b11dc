/* kernels_util.h — what the parts of tests/cuda/test_kernels share (kernels_util.c): the
 * device backend opened without MPI, random inputs in a storage type, poisoned outputs,
 * and the checks against the CPU kernels.
 *
 * A tbuf is one tensor twice: its host copy h (the CPU kernel's operand) and its device
 * copy d (the device op's), both in storage type dt.  Inputs start equal on both sides;
 * outputs start poisoned on the device (all-ones bytes: NaN in fp32, bf16 and fp16) or,
 * where an op accumulates, from the same random values on both sides.  A check downloads
 * d and compares it with h. */
#ifndef TSR_TEST_KERNELS_UTIL_H
#define TSR_TEST_KERNELS_UTIL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "context.h"
#include "ops/ops_backend.h"
#include "cpu/ops_cpu.h"
#include "backend.h"

/* Tolerances (normwise: max |device - cpu| / max |cpu| over the tensor).  fp32 1e-5 (same
 * arithmetic, another summation order); 16-bit outputs one or two roundings of their type
 * (bf16 2^-8 relative, fp16 2^-11) plus rounded intermediates: bf16 1e-2, fp16 2e-3; fp32
 * outputs of 16-bit GEMMs 1e-4 (the same 16-bit inputs, tensor cores sum in their own
 * order); doubles 1e-10; conversions bitwise. */
#define TOL_F32 1e-5
#define TOL_BF16 1e-2
#define TOL_F16 2e-3
#define TOL_GEMM16_F32 1e-4
#define TOL_DOUBLE 1e-10
double tol_of(tsr_dtype dt);

/* A failed runtime call of the test itself ends it. */
#define CUDA_CK(expr)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      printf("FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* ---- the backend (cuda/backend.c) ---- */
extern const tsr_ops_backend *kb;
/* The backend closed and opened again (a clean context) and reserved for exactly *s
 * (deterministic), and the CPU kernels' buffers for it too: a scratch size the query gets
 * wrong fails the op that needs more. */
void kreserve(tsr_ops_shapes s);
/* The backend's stream drained and its status 0 (a failed op fails the run here). */
void ksync(const char *after);

/* deterministic, the reserved flag set: what each test reserves from */
tsr_ops_shapes shapes_of(tsr_dtype dt);

/* ---- checks (they count in the one summary) ---- */
void kcheck(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ksummary(const char *name); /* the exit status: 0 when every check passed */

/* ---- random numbers: a pure function of (seed, draw number) ---- */
void kseed(uint64_t seed);
float urand(float lo, float hi);
void *hmalloc(size_t bytes); /* exits on failure */
void *dmalloc(size_t bytes);

/* ---- tensors ---- */
typedef struct {
  tsr_dtype dt;
  long n;
  void *h, *d;
} tbuf;
tbuf tb_alloc(tsr_dtype dt, long n);                    /* contents undefined */
tbuf tb_rand(tsr_dtype dt, long n, float lo, float hi); /* the same random values */
tbuf tb_from(tsr_dtype dt, const float *x, long n);     /* x rounded to dt, both sides */
tbuf tb_out(tsr_dtype dt, long n);                      /* poisoned, both sides */
tbuf tb_dup(const tbuf *t);                             /* a second pair, same contents */
void tb_free(tbuf *t);
void tb_upload(tbuf *t);                /* d = h */
void tb_download(const tbuf *t, void *host); /* host = d (n elements of dt) */
float tb_get(const tbuf *t, long i);    /* h[i], widened */
void *tb_hat(const tbuf *t, long i);    /* &h[i], &d[i] */
void *tb_dat(const tbuf *t, long i);

/* max |d - h| / max |h| (h finite, d not: inf) */
double tb_err(const tbuf *t);
/* d within tol of h; the name gets " (dt)" */
void check_close(const char *name, const tbuf *t, double tol);
/* d bitwise h */
void check_bits(const char *name, const tbuf *t);
/* d and e (two device runs) bitwise alike */
void check_same_runs(const char *name, const tbuf *a, const tbuf *b);
/* softmax statistics: each element within tol x max(1, |h|) (a logarithm's error) */
void check_lse(const char *name, const tbuf *t, double tol);
/* a device double against the host's */
void check_double(const char *name, const double *d, double ref, double tol);

/* Document starts (ops_list.h "Documents") of n / T sequences of T rows: a new document
 * after about one row in `every`, and in sequence 0 also at row 1, at every 64th row (the
 * tiles) and at its last row; the last sequence (of several) is one document.  On the
 * host (free()) and, when dev, the device (*dev, cudaFree). */
int32_t *docs_make(int n, int T, int every, int32_t **dev);

/* the attention group (test_kernels_attention.c) */
void test_attention_group(void);

#endif
