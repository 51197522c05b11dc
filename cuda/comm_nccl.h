/* comm_nccl.h — the NCCL device transport of comm (src/comm/comm_dev.h).
 *
 * Each group that gets it (the trainer attaches it to its intra-node groups, and to the
 * inter-node ones only under &parallel inter_node = 'nccl') has its own NCCL communicator,
 * set up from a unique id that the group's rank 0 broadcasts over the group's MPI
 * communicator, and its own non-blocking stream.  An operation waits (on the device)
 * for the compute stream's work so far, runs on the group's stream, and completing it
 * makes the compute stream wait for it: no host synchronisation anywhere, and a
 * gradient reduce-scatter started during the backward pass runs beside it.
 *
 * Uneven blocks (ZeRO buckets that cut shard boundaries) become one fused NCCL group of
 * reduces (reduce-scatter) or broadcasts (all-gather), one per rank's block.  bf16 and
 * fp16 data go as ncclBfloat16 / ncclFloat16 (NCCL 2.10 or later for bf16), whose sums
 * add in fp32 and round each partial sum, like comm.c's MPI operation.
 *
 * NCCL cannot put two ranks of a communicator on one GPU: a group whose ranks share a
 * GPU (run.gpu_share) gets no NCCL communicator, and its collectives stay on MPI. */
#ifndef TSR_CUDA_COMM_NCCL_H
#define TSR_CUDA_COMM_NCCL_H

#include "comm/comm_dev.h"

extern const tsr_comm_transport tsr_cuda_nccl_transport;

#endif
