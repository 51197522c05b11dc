/* sdpa_fake.c — a stand-in for cuDNN's attention (cuda/sdpa_graphs.h and the prepare of
 * cuda/context.h) in the CPU emulation, where there is no cuDNN: the same results, computed
 * on the host in fp32 from the 16-bit tensors in place (the emulation's device memory,
 * opened to the host for the call), so that tests/cuda/test_kernels and the emulated trainer run attention.cu's
 * cuDNN path: the decision and its log, the strides of q, k, v and of their gradients in
 * the fused buffer, lse passed through, the gradients written, the fallback.  It declines
 * what cuDNN 9.19 declines (one-token sequences; head dimensions that are not a multiple
 * of 8, or over 256) and asks for a workspace of an fp32 dq accumulator, which its
 * backward overwrites whole, so that a workspace overlapping anything shows in the
 * results.  Its "deterministic" backward is the only one it has.
 * What it cannot show is anything of cuDNN itself: tests/cuda_cudnn_offline.sh checks the
 * graphs against cuDNN, tests/cuda/test_kernels their numbers on a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "sdpa_graphs.h"
#include "util.h"

long tsr_cuda_cudnn_version(void) { return 0; }

static long long ws_bytes(int B, int T, int H, int hd) { return 4LL * B * T * H * hd; }

int tsr_cuda_cudnn_attention_prepare(tsr_dtype dt, int B, int T, int H, int KV, int hd,
                                     int qkv_stride, int deterministic, long long ws_limit,
                                     char *why, size_t why_len) {
  TSR_CHECK(B > 0 && T > 0 && KV > 0 && H % KV == 0 && hd > 0 && qkv_stride >= H * hd &&
                (dt == TSR_BF16 || dt == TSR_F16),
            TSR_ERR, "cuDNN attention: %s B %d T %d H %d KV %d hd %d stride %d",
            tsr_dtype_name(dt), B, T, H, KV, hd, qkv_stride);
  if (T == 1 || hd % 8 || hd > 256) {
    snprintf(why, why_len, "emulated cuDNN cannot run it: %s",
             T == 1 ? "s_q = s_kv = 1 is not supported"
                    : "hidden_dim should be a multiple of 8, at most 256");
    return TSR_CUDA_CUDNN_CANNOT;
  }
  const long long ws = ws_bytes(B, T, H, hd);
  if (ws > ws_limit) {
    snprintf(why, why_len, "its deterministic backward's workspace needs %lld bytes, %lld "
             "were reserved (tsr_ops_cudnn_attention_workspace_bytes)", ws, ws_limit);
    return TSR_CUDA_CUDNN_CANNOT;
  }
  snprintf(why, why_len, "emulated cuDNN (emu/sdpa_fake.c), deterministic "
           "backward%s, workspace 0 + %lld of %lld bytes",
           deterministic ? "" : " (the only one it has)", ws, ws_limit);
  return 0;
}

/* element (b, t, head, i) of a [B, T, heads, hd] tensor in rows of `row` elements */
static float at(tsr_dtype dt, const void *x, long row, int T, int hd, int b, int t, int h, int i) {
  return tsr_load(dt, x, ((size_t)b * T + t) * row + (size_t)h * hd + i);
}
#define Q(b, t, h, i) at(dt, Qp, qkv_stride, T, hd, b, t, h, i)
#define K(b, t, g, i) at(dt, Kp, qkv_stride, T, hd, b, t, g, i)
#define V(b, t, g, i) at(dt, Vp, qkv_stride, T, hd, b, t, g, i)

static int graphs_fwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Qp, const void *Kp, const void *Vp, void *O, float *stats,
                        void *ws, cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return TSR_ERR;
  const float scale = (float)(1.0 / sqrt((double)hd));
  float *s = malloc((size_t)T * sizeof(float)), *o = malloc((size_t)hd * sizeof(float));
  TSR_CHECK(s && o, TSR_ERR, "out of memory");
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const int g = h / (H / KV);
      for (int t = 0; t < T; t++) {
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
          float d = 0;
          for (int i = 0; i < hd; i++) d += Q(b, t, h, i) * K(b, j, g, i);
          s[j] = d * scale;
          mx = fmaxf(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; j++) sum += exp((double)(s[j] - mx));
        for (int i = 0; i < hd; i++) o[i] = 0;
        for (int j = 0; j <= t; j++) {
          const float p = (float)(exp((double)(s[j] - mx)) / sum);
          for (int i = 0; i < hd; i++) o[i] += p * V(b, j, g, i);
        }
        for (int i = 0; i < hd; i++)
          tsr_store(dt, O, (((size_t)b * T + t) * H + h) * hd + i, o[i]);
        stats[((size_t)b * H + h) * T + t] = mx + (float)log(sum);
      }
    }
  free(s), free(o);
  (void)ws;
  return 0;
}

static int graphs_bwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Qp, const void *Kp, const void *Vp, const void *Op,
                        const void *dOp, const float *stats, void *dQ, void *dK, void *dV,
                        void *ws, cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return TSR_ERR;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const long orow = (long)H * hd;
  const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
  /* the workspace: the fp32 dq accumulator, overwritten whole */
  float *dqa = ws;
  float *dka = calloc(nk, sizeof(float)), *dva = calloc(nk, sizeof(float));
  float *p = malloc((size_t)T * sizeof(float)), *dp = malloc((size_t)T * sizeof(float));
  TSR_CHECK(dka && dva && p && dp, TSR_ERR, "out of memory");
  memset(dqa, 0, nq * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const int g = h / (H / KV);
      for (int t = 0; t < T; t++) {
        const float L = stats[((size_t)b * H + h) * T + t];
        float D = 0;
        for (int i = 0; i < hd; i++)
          D += at(dt, dOp, orow, T, hd, b, t, h, i) * at(dt, Op, orow, T, hd, b, t, h, i);
        for (int j = 0; j <= t; j++) {
          float d = 0, e = 0;
          for (int i = 0; i < hd; i++) {
            d += Q(b, t, h, i) * K(b, j, g, i);
            e += at(dt, dOp, orow, T, hd, b, t, h, i) * V(b, j, g, i);
          }
          p[j] = expf(d * scale - L);
          dp[j] = p[j] * (e - D) * scale; /* dS */
        }
        for (int j = 0; j <= t; j++)
          for (int i = 0; i < hd; i++) {
            const size_t kj = (((size_t)b * T + j) * KV + g) * hd + i;
            dqa[(((size_t)b * T + t) * H + h) * hd + i] += dp[j] * K(b, j, g, i);
            dka[kj] += dp[j] * Q(b, t, h, i);
            dva[kj] += p[j] * at(dt, dOp, orow, T, hd, b, t, h, i);
          }
      }
    }
  /* written into the strided gradients, as cuDNN's backward writes them */
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const size_t row = ((size_t)b * T + t) * qkv_stride;
      for (int e = 0; e < H * hd; e++)
        tsr_store(dt, dQ, row + e, dqa[((size_t)b * T + t) * H * hd + e]);
      for (int e = 0; e < KV * hd; e++) {
        tsr_store(dt, dK, row + e, dka[((size_t)b * T + t) * KV * hd + e]);
        tsr_store(dt, dV, row + e, dva[((size_t)b * T + t) * KV * hd + e]);
      }
    }
  free(dka), free(dva), free(p), free(dp);
  return 0;
}

void tsr_sdpa_graphs_close(void) {}

int tsr_sdpa_graphs_fwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Qp, const void *Kp, const void *Vp, void *O, float *stats,
                        void *ws, cudaStream_t stream) {
  emu_device_enter(); /* the tensors are device memory */
  const int rc = graphs_fwd(dt, B, T, H, KV, hd, qkv_stride, Qp, Kp, Vp, O, stats, ws, stream);
  emu_device_leave();
  return rc;
}

int tsr_sdpa_graphs_bwd(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride,
                        const void *Qp, const void *Kp, const void *Vp, const void *Op,
                        const void *dOp, const float *stats, void *dQ, void *dK, void *dV,
                        void *ws, cudaStream_t stream) {
  emu_device_enter(); /* the tensors are device memory */
  const int rc = graphs_bwd(dt, B, T, H, KV, hd, qkv_stride, Qp, Kp, Vp, Op, dOp, stats, dQ, dK, dV, ws, stream);
  emu_device_leave();
  return rc;
}
