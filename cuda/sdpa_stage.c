/* sdpa_stage.c — cuDNN attention in Tessera's terms (ops_cuda.h: tsr_cuda_cudnn_attention_*):
 * cuDNN's fused attention takes 16-bit tensors and ours are fp32 containers (bf16 values
 * in bf16 training), so each call copies its inputs to bf16 in the staging buffer the
 * caller gives (tsr_ops_cudnn_attention_staging_elems), runs the graphs of sdpa_graphs.h
 * (cuda/sdpa_cudnn.cpp) on the copies and copies the results back:
 *   forward:  q, k, v -> bf16;  O (bf16) -> out;  Stats (fp32, written straight into lse)
 *   backward: q, k, v, out, dout -> bf16;  dQ, dK, dV (bf16) added into dq, dk, dv.
 * The staging holds, in order, Q [B,T,H,hd], K and V [B,T,KV,hd], O and dO [B,T,H,hd], dQ
 * [B,T,H,hd], dK and dV [B,T,KV,hd] (each on a 256-byte boundary), then the graphs'
 * workspace: what the staging has beyond the copies is the workspace's limit.
 * Apart from the frontend so that the CPU emulation runs this file with stand-in graphs
 * (tests/cuda/emu/sdpa_fake.c). */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "ops.h" /* tsr_ops_staging_part */
#include "ops_cuda.h"
#include "sdpa_graphs.h"
#include "util.h"

typedef struct {
  long q, kv; /* elements of a query-sized and a key-sized copy, rounded to 256 bytes */
} parts;

static parts parts_of(int B, int T, int H, int KV, int hd) {
  return (parts){tsr_ops_staging_part((long)B * T * H * hd),
                 tsr_ops_staging_part((long)B * T * KV * hd)};
}
static long copies(parts n) { return 4 * n.q + 4 * n.kv; } /* Q K V O dO dQ dK dV */

long tsr_cuda_cudnn_attention_version(void) { return tsr_sdpa_graphs_version(); }

int tsr_cuda_cudnn_attention_prepare(int B, int T, int H, int KV, int hd, long staging_elems,
                                     char *why, size_t why_len) {
  if (why_len) why[0] = 0;
  TSR_CHECK(B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0, TSR_ERR,
            "cuDNN attention: B %d T %d H %d KV %d hd %d", B, T, H, KV, hd);
  const long need = copies(parts_of(B, T, H, KV, hd));
  if (need > staging_elems) {
    snprintf(why, why_len, "its bf16 copies need %ld elements, the staging holds %ld", need,
             staging_elems);
    return TSR_CUDA_CUDNN_CANNOT;
  }
  tsr_sdpa_info info;
  return tsr_sdpa_graphs_prepare(B, T, H, KV, hd, 2LL * (staging_elems - need), &info, why,
                                 why_len);
}

/* Both directions' first steps: the shape prepared (once, in the graphs; an error saying
 * why not), q, k, v copied into the staging's first three parts (Q, K, V). */
static int stage_qkv(const float *q, const float *k, const float *v, int B, int T, int H, int KV,
                     int hd, int qkv_stride, tsr_bf16 *staging, long staging_elems,
                     cudaStream_t stream) {
  TSR_CHECK(staging && qkv_stride >= H * hd && qkv_stride >= KV * hd, TSR_ERR,
            "cuDNN attention: no staging, or qkv_stride %d under %d heads of %d", qkv_stride,
            H, hd);
  char why[600];
  const int rc = tsr_cuda_cudnn_attention_prepare(B, T, H, KV, hd, staging_elems, why, sizeof why);
  if (rc == TSR_CUDA_CUDNN_CANNOT)
    tsr_error("cuDNN attention: B %d T %d H %d KV %d hd %d: %s", B, T, H, KV, hd, why);
  if (rc) return TSR_ERR;
  const parts n = parts_of(B, T, H, KV, hd);
  const long rows = (long)B * T;
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(staging, q, rows, H * hd, qkv_stride, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(staging + n.q, k, rows, KV * hd, qkv_stride, stream));
  return tsr_cuda_cast_rows_f32_bf16(staging + n.q + n.kv, v, rows, KV * hd, qkv_stride, stream);
}

int tsr_cuda_cudnn_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                 const float *v, int B, int T, int H, int KV, int hd,
                                 int qkv_stride, tsr_bf16 *staging, long staging_elems,
                                 cudaStream_t stream) {
  TSR_CALL(stage_qkv(q, k, v, B, T, H, KV, hd, qkv_stride, staging, staging_elems, stream));
  const parts n = parts_of(B, T, H, KV, hd);
  tsr_bf16 *Qb = staging, *Kb = Qb + n.q, *Vb = Kb + n.kv, *Ob = Vb + n.kv;
  TSR_CALL(tsr_sdpa_graphs_fwd(B, T, H, KV, hd, Qb, Kb, Vb, Ob, lse, staging + copies(n), stream));
  return tsr_cuda_cast_rows_bf16_f32(out, (long)H * hd, Ob, (long)B * T, H * hd, 0, stream);
}

int tsr_cuda_cudnn_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, int B, int T, int H, int KV,
                                 int hd, int qkv_stride, tsr_bf16 *staging, long staging_elems,
                                 cudaStream_t stream) {
  TSR_CALL(stage_qkv(q, k, v, B, T, H, KV, hd, qkv_stride, staging, staging_elems, stream));
  const parts n = parts_of(B, T, H, KV, hd);
  const long rows = (long)B * T, od = (long)H * hd;
  tsr_bf16 *Qb = staging, *Kb = Qb + n.q, *Vb = Kb + n.kv, *Ob = Vb + n.kv, *dOb = Ob + n.q,
           *dQb = dOb + n.q, *dKb = dQb + n.q, *dVb = dKb + n.kv;
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(Ob, out, rows, H * hd, od, stream));
  TSR_CALL(tsr_cuda_cast_rows_f32_bf16(dOb, dout, rows, H * hd, od, stream));
  TSR_CALL(tsr_sdpa_graphs_bwd(B, T, H, KV, hd, Qb, Kb, Vb, Ob, dOb, lse, dQb, dKb, dVb,
                               staging + copies(n), stream));
  if (dq) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dq, qkv_stride, dQb, rows, H * hd, 1, stream));
  if (dk) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dk, qkv_stride, dKb, rows, KV * hd, 1, stream));
  if (dv) TSR_CALL(tsr_cuda_cast_rows_bf16_f32(dv, qkv_stride, dVb, rows, KV * hd, 1, stream));
  return 0;
}

void tsr_cuda_cudnn_attention_close(void) { tsr_sdpa_graphs_close(); }
