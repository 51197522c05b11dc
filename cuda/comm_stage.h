/* comm_stage.h — MPI on GPU memory staged through pinned host buffers: a device
 * transport of comm (src/comm/comm_dev.h) for groups that stay on MPI when the MPI library is
 * not CUDA-aware (MPIX_Query_cuda_support() == 0, or &parallel mpi_gpu = 'staged').
 *
 * Without it MPI would be handed device memory, which a host-only MPI cannot read (the
 * trainer refuses mpi_gpu = 'direct' there).  Here an operation copies its input to a pinned buffer with one cudaMemcpyAsync on the
 * group's copy stream (after the compute stream's work so far), waits for that copy,
 * and posts the non-blocking MPI call on the pinned buffers at once, so MPI matches
 * operations exactly as it would without staging (no deadlock a plain MPI code would
 * not have).  Completing it (tsr_comm_wait, or tsr_comm_test seeing MPI done) queues
 * the copy back on the copy stream and makes the compute stream wait for it.
 *
 * Collectives (all-reduce of fp32, bf16, fp16, double and int; reduce-scatter and
 * all-gather of fp32, bf16 and fp16 with even or uneven blocks; broadcast) and
 * point-to-point send/recv with tags run on a duplicate of the group's communicator;
 * 16-bit sums use comm.c's MPI operations (comm_mpi.h), as unstaged MPI does.  Each
 * operation in flight has its own pinned buffers, kept and reused by later operations
 * (grown when one needs more), so after the first step nothing is allocated. */
#ifndef TSR_CUDA_COMM_STAGE_H
#define TSR_CUDA_COMM_STAGE_H

#include "comm/comm_dev.h"

extern const tsr_comm_transport tsr_cuda_staged_transport;

#endif
