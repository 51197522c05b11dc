/* check.h — the CUDA backend's members of the check-macro family of src/core/util.h: one per
 * foreign library, each reporting "file:line func: expression: the library's error"
 * (tsr_errorf_at) and returning TSR_ERR from the calling function, as TSR_MPI_CALL does
 * for MPI.  The _GOTO form sets `rc` and jumps to the function's `done:`
 * cleanup instead, as TSR_H5_GOTO does.  The user includes the library's header; this one
 * includes none, so it serves C and C++ files alike.
 *
 *   TSR_CUDA_CALL(expr)          a CUDA runtime call (cudaError_t)
 *   TSR_CUDA_LAUNCHED()          after a kernel launch: a bad launch configuration
 *                                (asynchronous faults surface at the next checked
 *                                synchronising call)
 *   TSR_CUDA_ARG(cond)           an argument check of a device op (a caller's error)
 *   TSR_CUBLAS_GOTO(expr)        a cuBLAS / cuBLASLt call (cublasStatus_t)
 *   TSR_CUDNN_CALL(expr)         a cuDNN call (cudnnStatus_t)
 *   TSR_NCCL_CALL(d, expr)       an NCCL call on the device group d (its name and
 *                                ncclGetLastError of d->nccl are added)
 * cuDNN's frontend declining a graph is not an error: sdpa_cudnn.cpp turns that into the
 * reason the log gives (TSR_CUDNN_FE_WHY there). */
#ifndef TSR_CUDA_CHECK_H
#define TSR_CUDA_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif
#include "core/util.h"
#ifdef __cplusplus
}
#endif

#define TSR_CUDA_CALL(expr)                                                                 \
  do {                                                                                      \
    cudaError_t tsr_e_ = (expr);                                                            \
    if (tsr_e_ != cudaSuccess) {                                                            \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: CUDA error %s: %s",        \
                    __FILE__, __LINE__, __func__, #expr, cudaGetErrorName(tsr_e_),          \
                    cudaGetErrorString(tsr_e_));                                            \
      return TSR_ERR;                                                                       \
    }                                                                                       \
  } while (0)

#define TSR_CUDA_LAUNCHED() TSR_CUDA_CALL(cudaGetLastError())

#define TSR_CUDA_ARG(cond)                                                                  \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: invalid argument: %s",         \
                    __FILE__, __LINE__, __func__, #cond);                                   \
      return TSR_ERR;                                                                       \
    }                                                                                       \
  } while (0)

#define TSR_CUBLAS_GOTO(expr)                                                               \
  do {                                                                                      \
    cublasStatus_t tsr_s_ = (expr);                                                         \
    if (tsr_s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: cuBLAS error %d: %s",      \
                    __FILE__, __LINE__, __func__, #expr, (int)tsr_s_,                       \
                    cublasGetStatusString(tsr_s_));                                         \
      rc = TSR_ERR;                                                                         \
      goto done;                                                                            \
    }                                                                                       \
  } while (0)

#define TSR_CUDNN_CALL(expr)                                                                \
  do {                                                                                      \
    cudnnStatus_t tsr_st_ = (expr);                                                         \
    if (tsr_st_ != CUDNN_STATUS_SUCCESS) {                                                  \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: cuDNN error: %s", __FILE__, \
                    __LINE__, __func__, #expr, cudnnGetErrorString(tsr_st_));               \
      return TSR_ERR;                                                                       \
    }                                                                                       \
  } while (0)

#define TSR_NCCL_CALL(d, expr)                                                              \
  do {                                                                                      \
    ncclResult_t tsr_r_ = (expr);                                                           \
    if (tsr_r_ != ncclSuccess) {                                                            \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s on '%s': NCCL error %d: %s " \
                    "(%s)", __FILE__, __LINE__, __func__, #expr, (d)->name, (int)tsr_r_,    \
                    ncclGetErrorString(tsr_r_), ncclGetLastError((d)->nccl));               \
      return TSR_ERR;                                                                       \
    }                                                                                       \
  } while (0)

#endif
