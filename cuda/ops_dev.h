/* ops_dev.h — the CUDA backend of ops.h as a device backend table (src/ops_backend.h).
 *
 * Installed by the trainer when run.device is 'cuda' (or 'auto' and every rank sees a
 * GPU): every tsr_ops_X call then runs the tsr_cuda_X kernel of ops_cuda.h on one
 * stream of this rank's GPU, with one cuBLASLt handle and one scratch buffer (in bf16
 * mode also the staging for bf16 copies of the GEMM inputs) sized at setup
 * (tsr_ops_reserve), so nothing is allocated inside a step.
 *
 * Memory: tsr_ops_alloc gives CUDA managed memory with the GPU as its preferred
 * location.  Kernels keep it on the GPU; host code that must read it (checkpoint I/O,
 * the loss once per step) calls tsr_ops_sync first and the pages it touches move to the
 * host and back.  Collectives on it go through NCCL (comm_nccl.c), CUDA-aware MPI, or
 * MPI on pinned host copies (comm_stage.c); only &parallel mpi_gpu = 'direct' with an
 * MPI that is not CUDA-aware has MPI fault the pages over (correct, slow).
 *
 * Functions returning a value (losses, sums of squares, all_finite) compute it into a
 * device scalar and copy it to the host: these are the only synchronisations besides
 * tsr_ops_sync.  A failing CUDA call is reported where it happens; from then on the ops
 * do nothing and tsr_ops_status() returns TSR_ERR. */
#ifndef TSR_CUDA_OPS_DEV_H
#define TSR_CUDA_OPS_DEV_H

#include "ops_backend.h"

/* The tsr_ops_device_opener of this build (main.c installs it as tsr_ops_cuda_open). */
int tsr_cuda_ops_open(const void *comm, const char *mode, int share, const tsr_ops_backend **b);

/* The stream the ops run on (a cudaStream_t; NULL before tsr_cuda_ops_open), for the
 * device transport of comm (comm_nccl.c) to order its streams against. */
void *tsr_cuda_ops_stream(void);
/* The device this rank drives (valid after tsr_cuda_ops_open). */
int tsr_cuda_ops_device(void);
/* 1 when p (any address inside an allocation) is device or managed memory: what the
 * device transports of comm (comm_nccl.c, comm_stage.c) take. */
int tsr_cuda_is_device_memory(const void *p);

#endif
