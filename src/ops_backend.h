/* ops_backend.h — a device backend of ops.h, as a table of functions.
 *
 * ops_cpu.c implements ops.h on the host.  A device backend (cuda/ops_dev.c) fills one
 * of these tables; once it is installed with tsr_ops_set_backend, every tsr_ops_X call
 * goes to its X member instead, with the same arguments and the same semantics
 * (ops.h), on memory from its alloc.  The model, ZeRO and the trainer never see which
 * backend runs: DESIGN.md's "model code never branches on backend".
 *
 * A table member may report a failure by returning nonzero from status() afterwards;
 * the ops.h functions keep their void / value signatures, and the trainer checks
 * tsr_ops_status() once per step (a failed device call is reported where it happens). */
#ifndef TSR_OPS_BACKEND_H
#define TSR_OPS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

typedef struct tsr_ops_backend {
  const char *name;
  /* memory */
  void *(*alloc)(size_t bytes); /* zeroed */
  void (*free)(void *p);
  void (*copy)(void *dst, const void *src, size_t bytes);
  void (*zero)(void *dst, size_t bytes);
  void (*sync)(void);
  int (*status)(void);
  int (*reserve)(const tsr_ops_shapes *s);
  void (*close)(void); /* at the end of the run, with no memory of it left */
  /* bytes allocated through alloc: 0 now, 1 the high-water mark; 2 restarts the
   * high-water mark from now (and returns it) */
  size_t (*mem_bytes)(int what);
  void (*set_matmul_inputs)(int mode); /* TSR_MATMUL_* (ops.h) */
  /* the ops, as in ops.h */
  void (*matmul_fwd)(float *y, const float *x, const float *w, const float *bias, int n, int in,
                     int out);
  void (*matmul_bwd)(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                     const float *w, int n, int in, int out);
  void (*embedding_fwd)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                        int n, int T, int C, int vocab_start, int vocab_local);
  void (*embedding_bwd)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                        int n, int T, int C, int vocab_start, int vocab_local);
  void (*rmsnorm_fwd)(float *out, float *rstd, const float *x, const float *w, int n, int C,
                      float eps);
  void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int n, int C);
  void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *x, const float *w,
                        const float *b, int n, int C, float eps);
  void (*layernorm_bwd)(float *dx, float *dw, float *db, const float *dout, const float *x,
                        const float *w, const float *mean, const float *rstd, int n, int C);
  void (*rope_fwd)(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta);
  void (*rope_bwd)(float *dx, int n, int T, int n_heads, int head_dim, int stride, float theta);
  void (*attention_fwd)(float *out, float *lse, const float *q, const float *k, const float *v,
                        int B, int T, int H, int KV, int hd, int qkv_stride);
  void (*attention_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, int B,
                        int T, int H, int KV, int hd, int qkv_stride);
  void (*swiglu_fwd)(float *out, const float *gate_up, int n, int F);
  void (*swiglu_bwd)(float *dgate_up, const float *dout, const float *gate_up, int n, int F);
  void (*gelu_fwd)(float *out, const float *x, int n_elem);
  void (*gelu_bwd)(float *dx, const float *dout, const float *x, int n_elem);
  void (*add)(float *out, const float *a, const float *b, long n_elem);
  void (*acc)(float *out, const float *a, long n_elem);
  void (*residual)(float *out, const float *x, const float *y, long n_elem, tsr_prec prec);
  void (*scale)(float *x, float s, long n_elem);
  double (*xent_fwd_bwd)(float *logits, const int32_t *targets, int n, int V, float dloss);
  double (*xent_fwd)(const float *logits, const int32_t *targets, int n, int V);
  void (*xent_local_stats)(double *row_max, double *target_logit, const float *logits,
                           const int32_t *targets, int n, int V, int vocab_start);
  void (*xent_local_sumexp)(double *sumexp, const float *logits, const double *row_max, int n,
                            int V);
  double (*xent_rows)(const double *row_max, const double *sumexp, const double *target_logit,
                      int n);
  void (*xent_grad)(float *logits, const int32_t *targets, const double *row_max,
                    const double *sumexp, int n, int V, int vocab_start, float dloss);
  void (*xent_fwd_bwd_acc)(double *acc, double div, float *logits, const int32_t *targets, int n,
                           int V, float dloss);
  void (*xent_fwd_acc)(double *acc, double div, const float *logits, const int32_t *targets,
                       int n, int V);
  void (*xent_rows_acc)(double *acc, double div, const double *row_max, const double *sumexp,
                        const double *target_logit, int n);
  void (*adamw)(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                float beta2, float eps, float weight_decay, long t, float grad_scale, float *out,
                tsr_prec out_prec);
  void (*round_bf16)(float *dst, const float *src, long n_elem);
  void (*round_fp16)(float *dst, const float *src, long n_elem);
  double (*sumsq)(const float *x, long n_elem);
  double (*sumsq_ranges)(const float *x, const int64_t *r, int n_ranges);
  int (*all_finite)(const float *x, long n_elem);
} tsr_ops_backend;

/* Install a device backend (NULL: back to the CPU).  Memory allocated under one backend
 * must be freed under the same one. */
void tsr_ops_set_backend(const tsr_ops_backend *b);

/* How a build that has a device backend opens it: set by the driver (main.c) in builds
 * linked with one, NULL otherwise.  Collective over comm (the job's MPI communicator,
 * an MPI_Comm passed by address so this header needs no mpi.h).  mode "cuda": a device
 * per rank or an error; "auto": the same when every rank sees a device, otherwise
 * returns 0 with *b = NULL on every rank (run on the CPU).  share: several ranks of a
 * node may drive one device.  Returns 0 (with *b set unless "auto" found no device) or
 * an error code (util.h) after reporting why. */
typedef int (*tsr_ops_device_opener)(const void *comm, const char *mode, int share,
                                     const tsr_ops_backend **b);
extern tsr_ops_device_opener tsr_ops_cuda_open;

#endif
