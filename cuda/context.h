/* context.h — what the files of the CUDA backend share, and nothing else: the device context
 * (one per process: the GPU, its stream and copy stream, the cuBLASLt handle, the scratch, the result
 * scalars, the sticky failure flag), how a failed call marks it, the scratch each kernel
 * family needs, and the cuDNN attention calls the tests reach.  cuda/context.c defines the
 * context; every .cu file includes this header (through cuda_common.cuh).
 *
 * The op functions tsr_cuda_<name> (cuda/backend.h) return nothing, as ops_list.h says: a
 * failing CUDA or cuBLASLt call is reported where it happens ("file:line func: call:
 * error"), the op sets tsr_cuda_ctx.failed, and from then on every op returns at once and
 * the backend's status() says TSR_ERR.  Kernel faults are asynchronous: they surface at
 * the next checked synchronising call.
 *
 * Scratch: one device buffer, sized once by the backend's reserve for the largest shapes
 * (the maximum of the families' needs below), used by the ops in stream order.  An op
 * whose shapes need more reports both sizes and launches nothing. */
#ifndef TSR_CUDA_CONTEXT_H
#define TSR_CUDA_CONTEXT_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ops/ops.h"

#define TSR_CUDA_RESULTS 512 /* device doubles for values the host fetches at once */

/* Which attention TSR_CUDA_ATTENTION asked for (16-bit storage; fp32 runs its own kernel):
 * cuDNN's fused attention, the default of a build with cuDNN, or our mma.sync kernels, the
 * default of one without */
enum { TSR_ATT_MMA = 0, TSR_ATT_CUDNN = 1 };

typedef struct {
  int device;
  cudaStream_t stream;
  cudaStream_t copy_stream; /* the copy queue (tsr_ops_copy_async): copies beside the ops */
  cudaEvent_t fence;        /* recorded on stream before each of its copies */
  cublasLtHandle_t lt;  /* the GEMMs' handle and workspace */
  void *lt_ws;
  size_t lt_ws_bytes;
  void *scratch;        /* the kernels' temporaries (reserve) */
  size_t scratch_bytes;
  void *attn_ws;        /* cuDNN attention's workspace (reserve, TSR_ATT_CUDNN only) */
  size_t attn_ws_bytes;
  double *result;       /* TSR_CUDA_RESULTS doubles */
  int failed;           /* sticky */
  tsr_ops_shapes shapes; /* as reserved: dt, deterministic, the largest shapes */
  int attention;        /* TSR_ATT_* */
  int profile;          /* TSR_CUDA_PROFILE */
} tsr_cuda_context;
extern tsr_cuda_context tsr_cuda_ctx;

/* Queue nothing once a call has failed; mark the failure of one that returned nonzero. */
#define TSR_CUDA_SKIP() \
  if (tsr_cuda_ctx.failed) return
#define TSR_CUDA_RUN(call)                          \
  do {                                             \
    if ((call) != 0) tsr_cuda_ctx.failed = 1;       \
  } while (0)

/* The scratch when it holds `need` bytes; otherwise NULL after reporting `who` and both
 * sizes. */
void *tsr_cuda_scratch(size_t need, const char *who);

/* The op profile (TSR_CUDA_PROFILE): a profiled op opens a scope named after it, which
 * waits for the stream, and closes it, which waits again and adds the time to the line of
 * its name (and detail); print writes the table on rank 0, longest first, and empties it
 * (t_open: when the device opened). */
typedef struct {
  char name[72];
  double t0, flops;
  int open;
} tsr_cuda_prof_scope;
void tsr_cuda_prof_begin(tsr_cuda_prof_scope *sc, const char *op);
void tsr_cuda_prof_end(tsr_cuda_prof_scope *sc);
void tsr_cuda_prof_print(double t_open);

/* Inside an op under TSR_CUDA_PROFILE: the op's line of the profile gets this detail
 * (shape, storage type) and counts `flops` for its rate.  Nothing otherwise. */
void tsr_cuda_prof_note(double flops, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Scratch bytes each kernel family needs for shapes up to *s (gemm.cu, embed.cu, norm.cu,
 * the cross-entropy and optimizer files, attention.cu).  0 on success. */
int tsr_cuda_scratch_gemm(const tsr_ops_shapes *s, size_t *bytes);
int tsr_cuda_scratch_embedding(const tsr_ops_shapes *s, size_t *bytes);
int tsr_cuda_scratch_norms(const tsr_ops_shapes *s, size_t *bytes);
int tsr_cuda_scratch_crossent(const tsr_ops_shapes *s, size_t *bytes);
int tsr_cuda_scratch_optim(const tsr_ops_shapes *s, size_t *bytes);
int tsr_cuda_scratch_attention(const tsr_ops_shapes *s, size_t *bytes);

/* matmul_fwd and matmul_bwd (gemm.cu) under names of their own, for an op of another
 * family that runs a linear layer inside it (xent_head, xent.cu): the same arguments and
 * results, queued on the stream; 0 or TSR_ERR (reported).  Without gelu_pre or dbias
 * they use none of the scratch. */
int tsr_cuda_linear_fwd(tsr_dtype dt, void *y, const void *x, const void *w, const void *bias,
                        int n, int in, int out);
int tsr_cuda_linear_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                        const void *x, const void *w, const void *gelu_pre, int n, int in,
                        int out);

/* ---- attention's paths (attention.cu) ----
 * For 16-bit storage: cuDNN's fused attention where TSR_ATT_CUDNN asked for it (the
 * default where built with cuDNN) and cuDNN takes the shape, else the mma.sync
 * tensor-core kernels where the head dimension has one on this GPU, else the
 * fp32-arithmetic kernel on the 16-bit storage; fp32 storage always the fp32 kernel.
 * Decided once per shape (and said on rank 0); forward and backward of a shape take the
 * same path (a call whose tensors cuDNN cannot take, not 16-byte aligned, runs that
 * shape's fallback instead).  Document masking (docs != 0: the ops' doc argument) never
 * takes cuDNN's, whose graphs here have the causal mask only: the tensor-core kernels or
 * the fp32-arithmetic kernel run it, and the log says why. */
enum { TSR_ATT_PATH_F32 = 0, TSR_ATT_PATH_MMA, TSR_ATT_PATH_CUDNN };
void tsr_cuda_attention_use(int kind); /* TSR_ATT_*: what TSR_CUDA_ATTENTION says */
int tsr_cuda_attention_path(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                            int docs);
/* Shared memory per block the mma.sync tensor-core kernels need at head_dim hd (0: none
 * for hd), and whether this GPU gives it (and has 16-bit MMA). */
size_t tsr_cuda_attention_tc_smem(int hd);
int tsr_cuda_attention_tc_supported(int hd);

/* ---- cuDNN's fused attention (sdpa_cudnn.cpp, where configure found cuDNN) ----
 * The decision of attention.cu, reached by the tests: 0 when cuDNN runs the shape (both
 * graphs built, deterministic backward unless deterministic is 0, workspace within
 * ws_limit bytes), TSR_CUDA_CUDNN_CANNOT with the reason in why, TSR_ERR on a failure.
 * why says which backward was taken. */
enum { TSR_CUDA_CUDNN_CANNOT = 2 };
long tsr_cuda_cudnn_version(void); /* cudnnGetVersion() of the library loaded */
int tsr_cuda_cudnn_attention_prepare(tsr_dtype dt, int B, int T, int H, int KV, int hd,
                                     int qkv_stride, int deterministic, long long ws_limit,
                                     char *why, size_t why_len);
/* Without a GPU: whether cuDNN accepts both graphs for the shape on the GPU device_json
 * describes (cuDNN's device-property JSON; tests/cuda/cudnn_h100.json) with compute
 * capability sm_version (90) and sm_count SMs: validation, cuDNN's heuristics and support
 * checks, all but compiling the kernels (which needs the driver).  Returns as prepare. */
int tsr_cuda_cudnn_attention_check_offline(const char *device_json, int sm_version,
                                           int sm_count, tsr_dtype dt, int B, int T, int H,
                                           int KV, int hd, int qkv_stride, int deterministic,
                                           char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
