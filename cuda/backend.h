/* backend.h — the CUDA backend of ops.h as a device backend table (src/ops_backend.h).
 *
 * Installed by the trainer when run.device is 'cuda' (or 'auto' and every rank sees a
 * GPU): every tsr_ops_X call then runs tsr_cuda_X on one stream of this rank's GPU, with
 * one cuBLASLt handle and one scratch buffer sized at setup (tsr_ops_reserve), so nothing
 * is allocated inside a step.  tsr_cuda_X has the parameters and the semantics of the
 * list's entry X (src/ops_list.h), on device memory; each is defined in the .cu file of
 * its kernel family, next to its kernels, and queues them without waiting, except the
 * ops that return a value to the host (they fetch it: the only synchronisations besides
 * tsr_ops_sync).  A failing CUDA call is reported where it happens; from then on the ops
 * do nothing and the backend's status() returns TSR_ERR (cuda/context.h).
 *
 * Storage: dt = TSR_F32 runs fp32 kernels and true fp32 GEMMs; TSR_BF16 and TSR_F16 run
 * the same kernels on 2-byte arrays (fp32 arithmetic and statistics, one rounding to
 * nearest even per stored value) and tensor-core GEMMs reading the 16-bit arrays in place.
 *
 * Memory: tsr_ops_alloc gives device memory (cudaMalloc), zeroed on the device; the
 * host never reads or writes it but through the copy op (tsr_ops_copy, to and from host
 * memory, page-locked where it comes from tsr_ops_host_alloc), after which tsr_ops_sync
 * makes the copy complete.  An allocation beyond the GPU's free memory is refused with
 * the numbers and the deck keys that shrink the run, and the backend's status is then
 * TSR_ERR_INPUT.  Collectives on op memory go through NCCL (comm_nccl.c), CUDA-aware MPI,
 * or MPI on pinned host copies (comm_stage.c).
 *
 * Environment, read when the backend opens: TSR_CUDA_ATTENTION = cudnn | mma picks the
 * 16-bit attention (cuda/context.h): cudnn, cuDNN's fused attention, is the default of a build
 * with cuDNN and refused in one without; mma, our mma.sync tensor-core kernels, the
 * default otherwise, runs them even where cuDNN is built; any other value (wmma: those
 * kernels were removed) is refused.  TSR_CUDA_PROFILE=1 times every op and prints the
 * table on rank 0 when the backend closes. */
#ifndef TSR_CUDA_BACKEND_H
#define TSR_CUDA_BACKEND_H

#include "ops_backend.h"

/* The ops: tsr_cuda_<name> for each entry of ops_list.h */
#define TSR_OP(name, params, args) void tsr_cuda_##name params;
#define TSR_OP_RET(type, name, params, args) type tsr_cuda_##name params;
#include "ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET

/* The tsr_ops_device_opener of this build (main.c installs it as tsr_ops_cuda_open;
 * cuda/select.c, collective over the MPI communicator comm points to). */
int tsr_cuda_ops_open(const void *comm, const char *mode, int share, const tsr_ops_backend **b);

/* The same without MPI, on GPU `device` (tests and benchmarks, single processes): the
 * backend's table in *b, or an error code after reporting why.  The table's close()
 * ends it (then it may be opened again). */
int tsr_cuda_ops_open_device(int device, const tsr_ops_backend **b);

/* The stream the ops run on (a cudaStream_t; NULL before the backend opens), for the
 * device transport of comm (comm_nccl.c) to order its streams against. */
void *tsr_cuda_ops_stream(void);
/* The device this rank drives (valid once the backend is open). */
int tsr_cuda_ops_device(void);
/* 1 when p (any address inside an allocation) is device memory: what the device
 * transports of comm (comm_nccl.c, comm_stage.c) take. */
int tsr_cuda_is_device_memory(const void *p);

#endif
