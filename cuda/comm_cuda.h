/* comm_cuda.h — what the device transports of comm (comm_nccl.c, comm_stage.c) share:
 * the check macros (check.h) and the compute stream they order their own streams against. */
#ifndef TSR_CUDA_COMM_CUDA_H
#define TSR_CUDA_COMM_CUDA_H

#include <cuda_runtime_api.h>

#include "check.h"
#include "backend.h"

/* The stream the ops run on. */
static inline cudaStream_t tsr_cuda_compute_stream(void) {
  return (cudaStream_t)tsr_cuda_ops_stream();
}

#endif
