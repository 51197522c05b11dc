/* comm_cuda.h — what the device transports of comm (comm_nccl.c, comm_stage.c) share:
 * their CUDA error check and the compute stream they order their own streams against. */
#ifndef TSR_CUDA_COMM_CUDA_H
#define TSR_CUDA_COMM_CUDA_H

#include <cuda_runtime_api.h>

#include "ops_dev.h"
#include "util.h"

/* Report a failing CUDA runtime call (where, what, the error) and return TSR_ERR. */
#define CUDA_OK(expr)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      tsr_error("%s:%d %s: %s: CUDA error %s: %s", __FILE__, __LINE__, __func__, #expr,       \
                cudaGetErrorName(e_), cudaGetErrorString(e_));                                \
      return TSR_ERR;                                                                         \
    }                                                                                         \
  } while (0)

/* The stream the ops run on. */
static inline cudaStream_t tsr_cuda_compute_stream(void) {
  return (cudaStream_t)tsr_cuda_ops_stream();
}

#endif
