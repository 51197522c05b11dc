/* sdpa_graphs.h — cuDNN's fused attention graphs (cuda/sdpa_cudnn.cpp) as attention.cu
 * runs them, on the op's own tensors: Q, K, V (and dQ, dK, dV) in place, rows of stride
 * qkv_stride (the fused qkv buffer), head h at column h*hd; O and dO compact [B, T, H, hd];
 * all bf16 or fp16 (dt); Stats fp32 [B, H, T] (ops_list.h's lse).  Causal, scale
 * 1/sqrt(hd); the backward writes dQ, dK, dV (dK, dV summed over each query group).  A
 * shape is run only once tsr_cuda_cudnn_attention_prepare (cuda/context.h) has accepted it
 * with the same deterministic flag; the workspace is the caller's, of the size prepare
 * checked.  The CPU emulation links emu/sdpa_fake.c instead, which computes the
 * same on the host. */
#ifndef TSR_SDPA_GRAPHS_H
#define TSR_SDPA_GRAPHS_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

int tsr_sdpa_graphs_fwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Q, const void *K, const void *V, void *O, float *stats,
                        void *ws, cudaStream_t stream);
int tsr_sdpa_graphs_bwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Q, const void *K, const void *V, const void *O,
                        const void *dO, const float *stats, void *dQ, void *dK, void *dV,
                        void *ws, cudaStream_t stream);
void tsr_sdpa_graphs_close(void);

#ifdef __cplusplus
}
#endif

#endif
