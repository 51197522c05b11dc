/* ops.h — the kernel interface.  The model, ZeRO and the optimizer call only these.
 *
 * The ops themselves are declared once, in ops_list.h (read its conventions: storage
 * types, what is written and what accumulates, determinism); this header turns the list
 * into the prototypes tsr_ops_<name>.  Each call runs the op on the CPU (the src/cpu_
 * files) or, once a device backend is installed (ops_backend.h; CUDA: cuda/backend.c),
 * queues it on the device: ops.c is the dispatch between them.  Model code never
 * branches on the backend.
 *
 * Memory.  Every buffer an op reads or writes comes from tsr_ops_alloc (parameters,
 * gradients, activations, ZeRO's master weights and Adam moments, pipeline buffers).
 * With the CPU backend that is host memory (tsr_calloc).  With a device backend it is
 * device memory, and the ops are queued on the device in call order: host code never
 * dereferences it.  The host reaches it only through tsr_ops_copy (either side may be
 * host memory; queued in order with the ops; it completes before it returns when the
 * source is host memory) and tsr_ops_read (a copy to the host, then tsr_ops_sync);
 * fills go through tsr_ops_zero.  MPI gets it only through a device transport of comm
 * (NCCL, staged pinned copies, or a CUDA-aware MPI). */
#ifndef TSR_OPS_H
#define TSR_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/rope.h"

void *tsr_ops_alloc(size_t count, size_t size); /* zeroed; NULL (reported) on failure */
void tsr_ops_free_(void **p);                   /* NULLs *p */
#define tsr_ops_free(pp) tsr_ops_free_((void **)(pp))
/* Host memory that copies of op memory go to (the checkpoint snapshot, ckpt_async.c):
 * page-locked with a device backend, so that its copies are fast and asynchronous, plain
 * 64-byte aligned host memory on the CPU; zeroed.  It is not op memory: neither
 * tsr_ops_mem_bytes nor tsr_mem_bytes counts it.  NULL (reported) on failure; free it with
 * tsr_ops_host_free under the same backend. */
void *tsr_ops_host_alloc(size_t bytes);
void tsr_ops_host_free_(void **p); /* NULLs *p */
#define tsr_ops_host_free(pp) tsr_ops_host_free_((void **)(pp))
void tsr_ops_copy(void *dst, const void *src, size_t bytes);
/* host[0, bytes) = op[0, bytes), complete when it returns (a copy, then tsr_ops_sync) */
void tsr_ops_read(void *host, const void *op, size_t bytes);
void tsr_ops_zero(void *dst, size_t bytes);
void tsr_ops_sync(void);
/* A second queue beside the ops, for copies that overlap them (the activation offload of
 * model.c), and events that order the two.  tsr_ops_copy_async queues on the copy queue a
 * copy that starts once every op and copy queued so far has finished, records ev after it
 * (NULL: no event) and returns at once: its host side must be tsr_ops_host_alloc's memory
 * and must stay untouched until the copy is known done.  tsr_ops_event_wait(ev): the ops
 * queued from now on start only once the copy ev was last recorded after has finished (an
 * event never recorded after a copy is complete).  tsr_ops_sync waits for both queues.  On
 * the CPU the copy is done when it returns and an event is only a token.  Events come from
 * tsr_ops_event_create (NULL, reported, on failure) and are freed under the same backend. */
void *tsr_ops_event_create(void);
void tsr_ops_event_destroy_(void **ev); /* NULLs *ev */
#define tsr_ops_event_destroy(pp) tsr_ops_event_destroy_((void **)(pp))
void tsr_ops_copy_async(void *dst, const void *src, size_t bytes, void *ev);
void tsr_ops_event_wait(void *ev);
/* The host waits until the copy ev was last recorded after has finished (the ops queue
 * goes on meanwhile); on the CPU it returns at once. */
void tsr_ops_event_sync(void *ev);
/* 0, or once a device call has failed (reported when it happened; sticky) TSR_ERR, or
 * TSR_ERR_INPUT when it was an allocation beyond the device's memory (the deck asks too
 * much): the trainer checks it once per step. */
int tsr_ops_status(void);
/* Bytes of op memory allocated now / at most (CPU: every tsr_calloc of the process). */
size_t tsr_ops_mem_bytes(void);
size_t tsr_ops_mem_peak_bytes(void);
void tsr_ops_mem_reset_peak(void); /* the peak restarts from what is in use */
int tsr_ops_on_device(void);
/* The host's kernels on host memory whatever backend runs the other ops: the optimizer
 * offload (parallel.offload) updates a GPU run's shard on the CPU.  As the ops adamw and
 * cast (ops_list.h); every pointer host memory. */
void tsr_ops_host_adamw(float *p, float *m, float *v, const float *g, long n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, long t,
                        float grad_scale, void *out, tsr_dtype out_dt);
void tsr_ops_host_cast(tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src,
                       long n_elem);
/* As the op sumsq_ranges on host memory: the same bits as every backend's (the order of
 * ops/sumsq_order.h), for the offload's gradient norm. */
double tsr_ops_host_sumsq_ranges(const float *x, const int64_t *r, int n_ranges);

/* The largest shapes the ops will be called with.  A backend sizes its scratch memory
 * from them once, at setup, so no op allocates inside a step (the CPU's conversion
 * buffers for 16-bit storage, a device's kernel scratch and cuDNN's workspace). */
typedef struct {
  tsr_dtype dt;      /* the storage type of the run */
  int deterministic; /* 1: every op bitwise reproducible (train.deterministic); 0: a device
                      * may take faster non-deterministic kernels (cuDNN's attention bwd) */
  long rows;         /* tokens of a micro-batch (norms, biases, cross-entropy, embedding) */
  long cols;         /* widest norm or GEMM output or input (C, qkv, fc, the vocab slice) */
  long vocab_local;  /* embedding rows held by this rank */
  long attn_bht;     /* B * H * T of the attention */
  long sumsq_elems;  /* longest range of a sum of squares over ranges */
  long attn_part;    /* grouped-query attention (KV < H): 2 * B * H * T * hd, else 0 */
  long attn_io;      /* B * T * (H + KV) * hd: the attention's q-sized plus k-sized elements */
  long attn_t;       /* T of the attention */
  long attn_hd;      /* head_dim of the attention */
} tsr_ops_shapes;
int tsr_ops_reserve(const tsr_ops_shapes *s);

/* The attention backward's device scratch (cuda/attention.cu) for attn_bht and attn_part:
 * D (one float per query row and head, padded to 256 bytes), then the grouped-query
 * partial sums.  tessera plan counts it from here too. */
static inline size_t tsr_ops_attention_scratch_bytes(long attn_bht, long attn_part) {
  if (attn_bht <= 0) return 0;
  return ((size_t)attn_bht * sizeof(float) + 255) / 256 * 256 + (size_t)attn_part * sizeof(float);
}

/* cuDNN's fused attention workspace, as counted before cuDNN has built its plans on the GPU
 * (then cuDNN says; an estimate not yet checked on a GPU): its deterministic backward on
 * Hopper with cuDNN before 9.25 keeps dP, bf16 [B, H, T', T'] with T' = T rounded up to
 * 128, plus an fp32 dq accumulator [B, T, H, hd] and two floats per query row. */
static inline size_t tsr_ops_cudnn_attention_workspace_bytes(const tsr_ops_shapes *s) {
  if (s->attn_bht <= 0 || s->attn_t <= 0) return 0;
  const size_t tp = (size_t)(s->attn_t + 127) / 128 * 128;
  return 2 * (size_t)(s->attn_bht / s->attn_t) * tp * tp +
         4 * (size_t)s->attn_bht * (size_t)s->attn_hd + 8 * (size_t)s->attn_bht + 1024;
}

/* ---- the ops (ops_list.h) ---- */
#define TSR_OP(name, params, args) void tsr_ops_##name params;
#define TSR_OP_RET(type, name, params, args) type tsr_ops_##name params;
#include "ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET

/* What a causal attention block (attention_block_fwd: Tq queries at global positions
 * q0.., Tk keys at k0..) holds: SKIP, every key right of every query (the block is fully
 * masked: nothing to compute, no call needed); FULL, every key at or left of every query
 * (the same as causal 0); PARTIAL, the mask cuts through it (the diagonal block). */
enum { TSR_ATT_BLOCK_SKIP, TSR_ATT_BLOCK_FULL, TSR_ATT_BLOCK_PARTIAL };
static inline int tsr_ops_attn_block_kind(long q0, int Tq, long k0, int Tk) {
  if (Tq <= 0 || Tk <= 0 || k0 > q0 + Tq - 1) return TSR_ATT_BLOCK_SKIP;
  return k0 + Tk - 1 <= q0 ? TSR_ATT_BLOCK_FULL : TSR_ATT_BLOCK_PARTIAL;
}

/* attention_merge's weights of two partial results with log-sum-exps l1, l2, and the
 * merged log-sum-exp *l: with hi the larger and e = exp(lo - hi) <= 1, the larger side
 * weighs 1 / (1 + e), the other e / (1 + e), and *l = hi + log1p(e).  Both -inf: weights
 * 0, *l -inf.  One formula for every backend (host and device). */
TSR_HOST_DEVICE static inline void tsr_ops_attn_merge_weights(float l1, float l2, float *w1,
                                                              float *w2, float *l) {
  const int first = l1 > l2;
  const float hi = first ? l1 : l2, lo = first ? l2 : l1;
  if (hi == -INFINITY) {
    *w1 = *w2 = 0.0f, *l = -INFINITY;
    return;
  }
  const float e = expf(lo - hi), inv = 1.0f / (1.0f + e);
  *w1 = first ? inv : e * inv;
  *w2 = first ? e * inv : inv;
  *l = hi + log1pf(e);
}

/* AdamW's per-step scalars, formed as torch forms them (Python doubles, cast to fp32
 * where they meet a tensor): p *= decay;  p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
 * Every backend's adamw takes them from here, so all round alike. */
typedef struct {
  float decay, step_size, bc2_sqrt, one_m_b1, one_m_b2;
} tsr_adamw_scalars;
tsr_adamw_scalars tsr_ops_adamw_scalars(float lr, float beta1, float beta2, float weight_decay,
                                        long t);

#endif
