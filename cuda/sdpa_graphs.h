/* sdpa_graphs.h — cuDNN's fused attention graphs on bf16 tensors (cuda/sdpa_cudnn.cpp),
 * as cuda/sdpa_stage.c uses them.  Q, O, dO, dQ are compact [B, T, H, hd], K, V, dK, dV
 * [B, T, KV, hd], all bf16; stats is fp32 [B, H, T] (ops.h's lse).  Causal, scale
 * 1/sqrt(hd); the backward writes (does not add to) dQ, dK, dV.  The CPU emulation links
 * tests/cuda/emu/sdpa_fake.c instead, which computes the same on the host. */
#ifndef TSR_SDPA_GRAPHS_H
#define TSR_SDPA_GRAPHS_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  long long ws_fwd, ws_bwd; /* workspace bytes each direction needs */
  int deterministic;        /* the backward is cuDNN's deterministic one */
} tsr_sdpa_info;

/* Builds the shape's graphs (once) with at most ws_limit bytes of workspace: the
 * deterministic backward, or the other one where the deterministic one needs more (said
 * in why).  0 (info and why filled), TSR_CUDA_CUDNN_CANNOT (why says what), TSR_ERR. */
int tsr_sdpa_graphs_prepare(int B, int T, int H, int KV, int hd, long long ws_limit,
                            tsr_sdpa_info *info, char *why, size_t why_len);
/* Run a prepared shape's graphs (TSR_ERR, reported, for one not prepared). */
int tsr_sdpa_graphs_fwd(int B, int T, int H, int KV, int hd, const void *Q, const void *K,
                        const void *V, void *O, float *stats, void *ws, cudaStream_t stream);
int tsr_sdpa_graphs_bwd(int B, int T, int H, int KV, int hd, const void *Q, const void *K,
                        const void *V, const void *O, const void *dO, const float *stats,
                        void *dQ, void *dK, void *dV, void *ws, cudaStream_t stream);
long tsr_sdpa_graphs_version(void);
void tsr_sdpa_graphs_close(void);

#ifdef __cplusplus
}
#endif

#endif
